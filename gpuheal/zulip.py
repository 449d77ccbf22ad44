"""Zulip delivery: ``POST {site}/api/v1/messages`` (formats.md §5), credentials, Zulip's limits.

Why not the official ``zulip`` client: it imports ``requests`` (~80 ms on every cron start), its
timeouts bound each socket operation rather than the whole exchange, and on a 429 it *sleeps*
for ``retry-after`` inside the call (``retry_on_rate_limit_error``) — a one-shot cron run must
instead record "not before" and leave the alert queued. The API we need is one form-encoded
POST with basic auth, so :func:`gpuheal.sources.http.request` (hard deadline, byte cap, every
failure returned as a value) does it in a few lines and keeps every outcome explicit.

:class:`ZulipSink` is gpuheal's one :class:`gpuheal.sink.AlertSink`: ``escalate`` and ``report
--send`` reach Zulip only through it.

Credentials come from the environment variables the config names (``zulip.email_env``,
``zulip.api_key_env``); Lesson L4's fallback: a ``.env`` file in the working directory, then one
next to the config file (``KEY=VALUE`` lines). They are never written anywhere, and the key is
redacted from every text gpuheal produces, as its declaration says (``gpuheal.sinks.ZULIP.secrets``;
:func:`gpuheal.credentials.secrets_for`).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from gpuheal.credentials import lookup
from gpuheal.sink import Destination, SendOutcome, SendStatus, SinkUnavailable

if TYPE_CHECKING:
    from gpuheal.config.model import Config

log = logging.getLogger("gpuheal")

MAX_CONTENT = 10_000  # Zulip's default MAX_MESSAGE_LENGTH (characters, Python len)
MAX_TOPIC = 60  # MAX_TOPIC_NAME_LENGTH
TRUNCATION_MARKER = "\n\n[… truncated by gpuheal to fit Zulip's {limit}-character limit]"
MAX_RESPONSE_BYTES = 65_536


class CredentialsError(Exception):
    """A credential is missing: the message names the environment variable, never a value."""


@dataclass(frozen=True)
class Credentials:
    email: str
    api_key: str
    source: str  # "environment" or the .env path it came from

    def __repr__(self) -> str:  # never print the key
        return f"Credentials(email={self.email!r}, api_key=<redacted>, source={self.source!r})"

    def auth_headers(self) -> dict[str, str]:
        """HTTP Basic auth as Zulip's API takes it (the bot's email and key): the one builder that
        ``send`` and the doctor's probe both use."""
        token = base64.b64encode(f"{self.email}:{self.api_key}".encode()).decode()
        return {"Authorization": f"Basic {token}"}


# --------------------------------------------------------------------------- credentials


def load_credentials(cfg: Config, environ: dict[str, str] | None = None) -> Credentials:
    """The bot's email and key, or :class:`CredentialsError` naming the missing variable."""
    email_env = str(cfg.zulip.email_env or "ZULIP_EMAIL")
    key_env = str(cfg.zulip.api_key_env or "ZULIP_API_KEY")
    email, src_email = lookup(email_env, getattr(cfg, "path", None), environ)
    if not email:
        raise CredentialsError(
            f"{email_env} is not set (zulip.email_env): the Zulip bot's email address is needed"
        )
    key, src_key = lookup(key_env, getattr(cfg, "path", None), environ)
    if not key:
        raise CredentialsError(
            f"{key_env} is not set (zulip.api_key_env): the Zulip bot's API key is needed"
        )
    return Credentials(email=email.strip(), api_key=key.strip(), source=src_key or src_email)


# --------------------------------------------------------------------------- limits


def fit_topic(topic: str) -> str:
    """Zulip truncates topics over 60 characters to 57 + ``...``; do it ourselves, visibly."""
    topic = " ".join(topic.split()) or "gpuheal"
    return topic if len(topic) <= MAX_TOPIC else topic[: MAX_TOPIC - 3] + "..."


def fit_content(content: str, limit: int = MAX_CONTENT) -> str:
    """Content within ``limit`` characters, with a marker when cut; an open code fence is closed
    so the rest of the message does not render as code; null bytes (a 400) removed."""
    content = content.replace("\x00", "").strip("\n").rstrip()
    if len(content) <= limit:
        return content
    marker = TRUNCATION_MARKER.format(limit=limit)
    room = limit - len(marker) - len("\n```")
    head = content[:room]
    cut = head.rfind("\n")
    if cut > room // 2:
        head = head[:cut]
    if head.count("```") % 2 == 1:
        head += "\n```"
    return head + marker


# --------------------------------------------------------------------------- sending


def send_message(
    site: str,
    creds: Credentials,
    stream: str,
    topic: str,
    content: str,
    timeout_s: float,
    post: Callable[..., Any] | None = None,
) -> SendOutcome:
    """One stream message. Never raises for network or server trouble: see :class:`SendOutcome`.

    ``post`` is :func:`gpuheal.sources.http.request` unless a test injects a fake.
    """
    from gpuheal import __version__
    from gpuheal.sources.http import request

    send = request if post is None else post
    url = site.rstrip("/") + "/api/v1/messages"
    from gpuheal.parse.values import clean_text

    # valid UTF-8 whatever reached the text (urlencode raises on a lone surrogate)
    fields = {"type": "stream", "to": stream, "topic": fit_topic(topic), "content": fit_content(content)}
    body = urlencode({k: clean_text(v) for k, v in fields.items()}).encode()
    headers = {
        **creds.auth_headers(),
        "Content-Type": "application/x-www-form-urlencoded",
        "User-Agent": f"gpuheal/{__version__}",
    }
    res = send(
        "POST",
        url,
        deadline_s=timeout_s,
        connect_timeout_s=min(timeout_s, 5.0),
        max_bytes=MAX_RESPONSE_BYTES,
        headers=headers,
        body=body,
    )
    return interpret(res)


@dataclass(frozen=True)
class ZulipSink:
    """The :class:`gpuheal.sink.AlertSink` for a Zulip stream: one ``send_message`` per message."""

    site: str
    creds: Credentials
    stream: str
    topic: str
    timeout_s: float
    credential_hint: str
    post: Callable[..., Any] | None = None
    name: str = "Zulip"
    max_chars: int = MAX_CONTENT

    @classmethod
    def from_config(cls, cfg: Config, post: Callable[..., Any] | None = None) -> ZulipSink:
        if not cfg.zulip.site:
            raise SinkUnavailable("not-configured", "zulip.site is not set in the config")
        try:
            creds = load_credentials(cfg)
        except CredentialsError as exc:
            raise SinkUnavailable("no-credentials", str(exc)) from None
        names = f"{cfg.zulip.email_env or 'ZULIP_EMAIL'}/{cfg.zulip.api_key_env or 'ZULIP_API_KEY'}"
        to = destination(cfg)
        return cls(str(cfg.zulip.site), creds, to.channel, to.topic, cfg.zulip.timeout_s, names, post)

    @property
    def where(self) -> str:
        return f"#{self.stream} > {self.topic}"

    def send(self, content: str, topic: str | None = None) -> SendOutcome:
        return send_message(self.site, self.creds, self.stream, fit_topic(topic or self.topic), content,
                            self.timeout_s, post=self.post)


# --------------------------------------------------------------------------- named by its declaration (sinks.ZULIP)


def destination(cfg: Config) -> Destination:
    """``#stream > topic`` from ``zulip:``, and Zulip's length limit, without credentials."""
    stream, topic = str(cfg.zulip.stream or "agent-hub"), fit_topic(str(cfg.zulip.topic or "alerts-gpu"))
    return Destination("Zulip", stream, topic, fit_content, MAX_CONTENT)


def open_sink(cfg: Config, post: Callable[..., Any] | None = None) -> ZulipSink:
    return ZulipSink.from_config(cfg, post)


def interpret(res: Any) -> SendOutcome:
    """Map an ``HttpResult``/``HttpFault`` to a :class:`SendOutcome` (check ``code``, not ``msg``:
    ``msg`` is translated to the bot's locale)."""
    status = getattr(res, "status", None)
    if not hasattr(res, "headers"):  # HttpFault
        kind = {"timeout": SendStatus.TIMEOUT, "refused": SendStatus.UNREACHABLE}.get(res.kind, SendStatus.INVALID)
        return SendOutcome(kind, f"{res.kind}: {res.detail}"[:200], status=status)
    doc: dict[str, Any] = {}
    try:
        parsed = json.loads(res.body or b"{}")
        if isinstance(parsed, dict):
            doc = parsed
    except ValueError:
        doc = {}
    code = doc.get("code") if isinstance(doc.get("code"), str) else None
    msg = str(doc.get("msg") or "")[:160]
    if 200 <= res.status < 300:
        if doc.get("result") == "success":
            mid = doc.get("id")
            return SendOutcome(SendStatus.SENT, "", message_id=mid if isinstance(mid, int) else None, status=res.status)
        return SendOutcome(SendStatus.INVALID, f"HTTP {res.status} without a success result", status=res.status)
    if res.status == 429:
        return SendOutcome(
            SendStatus.RATE_LIMITED,
            f"HTTP 429 {code or 'RATE_LIMIT_HIT'}",
            status=429,
            code=code,
            retry_after_s=_retry_after(doc, res.headers),
        )
    detail = f"HTTP {res.status} {code or ''} {msg}".strip()
    if res.status == 401 or code in ("INVALID_API_KEY", "UNAUTHORIZED", "USER_DEACTIVATED", "REALM_DEACTIVATED"):
        return SendOutcome(SendStatus.UNAUTHORIZED, detail, status=res.status, code=code)
    if 400 <= res.status < 500:
        return SendOutcome(SendStatus.REJECTED, detail, status=res.status, code=code)
    return SendOutcome(SendStatus.SERVER_ERROR, detail, status=res.status, code=code)


def _retry_after(doc: dict[str, Any], headers: dict[str, str]) -> float:
    """``max(body retry-after, Retry-After header)`` (formats.md §5); 60 s when neither parses."""
    values: list[float] = []
    for raw in (doc.get("retry-after"), headers.get("retry-after")):
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if value == value and 0 <= value < 86400:  # not NaN, sane
            values.append(value)
    return max(values) if values else 60.0
