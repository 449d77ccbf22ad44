"""The pure half of ``gpuheal wake`` (issue 22 item 7; contract "Waking on an event"): read one
HTTP/1.1 request head, judge it, summarise its JSON body, decide whether a heal cycle is due.

Values in, values out: the bytes already read, the token, the times. The socket reading, the lock
and the heal cycle are :mod:`gpuheal.steps.wake`'s. Stdlib only and small: a systemd socket unit
with ``Accept=yes`` starts one process per connection.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from typing import Literal

from gpuheal.core.urls import split_url

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024  # contract: "a body over 1 MiB is 400"
READ_DEADLINE_S = 5.0  # contract: "no body within 5 s is 400"
SUMMARY_CHARS = 200
PATH_PREFIX = "/wake/"  # contract: senders that cannot set a header post to /wake/TOKEN
REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 405: "Method Not Allowed",
           429: "Too Many Requests", 500: "Internal Server Error"}  # fmt: skip


#: How the sender proved it knows the token: Alertmanager's ``Authorization: Bearer`` (answered
#: ``202``), or the last path segment, ``POST /wake/TOKEN`` (LiteLLM's alerting, which sets no header
#: and counts only ``200`` as delivered: answered ``200``).
Via = Literal["bearer", "path"]


@dataclass(frozen=True)
class Head:
    """A parsed request head: what the judgement needs, nothing else kept. ``target`` and
    ``authorization`` may hold the token: never in a repr, a log line or a refusal."""

    method: str
    authorization: str = field(repr=False)
    content_length: int | None
    expect_continue: bool = False  # curl sends ``Expect: 100-continue`` for a body over 1 KiB
    target: str = field(default="", repr=False)


@dataclass(frozen=True)
class LiteLLMAlert:
    """What may be kept of one LiteLLM Slack-style alert (formats.md §4.x): its type and level, and
    the deployment it names (model group, model, API base, and the GPU whose endpoint that base is).
    The rest of the text, the user's prompt in ``Messages:`` above all, is never kept. An
    ``outage_alerts`` text names no group: its ``Model Name`` is the deployment's model (measured on
    1.108.7: ``gpu-solo`` for ``openai/gpu-solo`` in group ``solo``)."""

    alert_type: str
    level: str | None = None
    model_group: str | None = None
    model: str | None = None
    api_base: str | None = None
    gpu: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {"alert_type": self.alert_type, "level": self.level, "model_group": self.model_group,
                "model": self.model, "api_base": self.api_base, "gpu": self.gpu}  # fmt: skip


@dataclass(frozen=True)
class Woken:
    """A good request: how it was authorised, and what woke us (one escaped, capped line; the
    LiteLLM alert's fields when the body is one)."""

    via: Via
    summary: str
    litellm: LiteLLMAlert | None = None

    @property
    def ok_status(self) -> int:
        """``202`` for a bearer sender (Alertmanager, unchanged), ``200`` for a path-token sender:
        LiteLLM logs anything else as a failed delivery."""
        return 200 if self.via == "path" else 202


@dataclass(frozen=True)
class Refusal:
    """The request is answered with ``status`` and nothing runs; ``why`` is one printable line."""

    status: int
    why: str


def parse_head(raw: bytes) -> Head | Refusal:
    """``raw``: the bytes before the blank line. Not HTTP/1.x, a bad header or a bad length → 400."""
    lines = raw.decode("latin-1").split("\n")
    parts = lines[0].rstrip("\r").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
        return Refusal(400, "not an HTTP/1.x request")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        line = line.rstrip("\r")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or not name.isprintable():
            return Refusal(400, f"malformed header line {shown(line)}")
        headers.setdefault(name.lower(), []).append(value.strip())
    if "transfer-encoding" in headers:
        return Refusal(400, "Transfer-Encoding is not supported: send Content-Length")
    lengths = set(headers.get("content-length", []))
    if len(lengths) > 1 or (lengths and not next(iter(lengths)).isdigit()):
        return Refusal(400, f"bad Content-Length {shown(', '.join(sorted(lengths)))}")
    length = int(next(iter(lengths))) if lengths else None
    auth = headers.get("authorization", [""])
    expect = [v.lower() for v in headers.get("expect", [])] == ["100-continue"]
    return Head(parts[0], auth[0] if len(auth) == 1 else "", length, expect, parts[1])


def judge(head: Head, token: str | None) -> Refusal | Via:
    """The checks before any body is read: method, token (constant time), length. A :data:`Via`:
    read on. A refusal never quotes the path or the header: either may hold a near-miss token."""
    if head.method != "POST":
        return Refusal(405, f"method {shown(head.method)} is not POST")
    via: Via | None = "bearer" if token_matches(head.authorization, token) else None
    if via is None and path_token_matches(head.target, token):
        via = "path"
    if via is None:
        return Refusal(401, "wrong or missing token (Authorization: Bearer, or POST /wake/TOKEN)")
    if not head.content_length:
        return Refusal(400, "no body (Content-Length missing or 0)")
    if head.content_length > MAX_BODY_BYTES:
        return Refusal(400, f"body of {head.content_length} bytes is over {MAX_BODY_BYTES}")
    return via


def token_matches(authorization: str, token: str | None) -> bool:
    """``Authorization: Bearer TOKEN`` against the configured token, in constant time. No token
    configured: nothing matches."""
    scheme, _, given = authorization.partition(" ")
    if not token or scheme.lower() != "bearer":
        return False
    return _same_secret(given.strip().encode("latin-1"), token)


def path_token_matches(target: str, token: str | None) -> bool:
    """``/wake/TOKEN``, exactly: the request-target as sent, never percent-decoded or normalised, so
    ``/wake/../x``, ``/wake/a%2Fb``, ``/wake/TOKEN?x=1``, ``/x/wake/TOKEN`` or an absolute URL are
    simply other strings, and a wrong token. Compared in constant time, whatever its length."""
    if not token or not target.startswith(PATH_PREFIX):
        return False
    return _same_secret(target[len(PATH_PREFIX):].encode("latin-1"), token)


def _same_secret(given: bytes, token: str) -> bool:
    """:func:`hmac.compare_digest` over SHA-256 digests: no early exit on the first differing byte,
    and the same work for a given value of any length (``compare_digest`` on the raw values would
    tell a wrong length apart)."""
    want = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
    return hmac.compare_digest(hashlib.sha256(given).digest(), want)


def summarise(body: bytes, via: Via = "bearer", endpoints: tuple[tuple[str, str], ...] = ()) -> Woken | Refusal:
    """What woke us, one escaped line of at most :data:`SUMMARY_CHARS`: Alertmanager's status and
    alert names, LiteLLM's event and message, LiteLLM's Slack-style alert (its type, model group,
    API base and the GPU of ``endpoints`` — ``(alias, endpoint)`` pairs — it names), else the JSON's
    top-level keys. Never a whole body (LiteLLM's webhook event carries a hashed key and a user id,
    its Slack-style alert the user's prompt). Not JSON → 400."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return Refusal(400, "body is not JSON")
    if isinstance(doc, dict) and isinstance(doc.get("text"), str) and "alerts" not in doc and "event" not in doc:
        alert = litellm_alert(doc["text"], endpoints)
        return Woken(via, shown(describe_alert(alert, len(doc["text"]))), alert)
    return Woken(via, _summary(doc))


def _summary(doc: object) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("alerts"), list):
        names = []
        for alert in doc["alerts"]:
            labels = alert.get("labels") if isinstance(alert, dict) else None
            name = labels.get("alertname") if isinstance(labels, dict) else None
            if isinstance(name, str) and name not in names:
                names.append(name)
        text = f"alertmanager {doc.get('status', '?')}: {len(doc['alerts'])} alert(s) {', '.join(names[:10])}"
    elif isinstance(doc, dict) and ("event" in doc or "event_message" in doc):
        text = f"litellm {doc.get('event', '?')}: {doc.get('event_message', '')}"
    elif isinstance(doc, dict):
        text = "json keys " + (", ".join(str(k) for k in list(doc)[:10]) or "(none)")
    else:
        text = f"json {type(doc).__name__}"
    return shown(text)


# LiteLLM 1.108.7's alert text (formats.md §4.x), one field a line. The prompt in ``Messages:`` is the
# repr of a Python list, whose newlines are escaped: it cannot start a line, so it cannot forge these.
_ALERT_TYPE = re.compile(r"^Alert type: `([^`\n]{1,80})`", re.M)
_LEVEL = re.compile(r"^Level: `([^`\n]{1,40})`", re.M)
_GROUPS = (re.compile(r"^model_group: `([^`\n]{1,200})`", re.M),
           re.compile(r"^LiteLLM: model group '([^'\n]{1,200})' failed", re.M))  # fmt: skip
_MODELS = (re.compile(r"^Model: ([^`\s]{1,200})$", re.M), re.compile(r"^\*Model Name:\* `([^`\n]{1,200})`", re.M))
_API_BASE = re.compile(r"^\*?API Base:\*? `([^`\s]{1,500})`", re.M)


def litellm_alert(text: str, endpoints: tuple[tuple[str, str], ...] = ()) -> LiteLLMAlert | None:
    """The fields of a LiteLLM Slack-style alert kept for the audit (formats.md §4.x), each escaped
    and capped, or ``None`` when ``text`` is not one. Only these fields are read from the text."""
    kind = _ALERT_TYPE.search(text)
    if kind is None:
        return None
    level = _LEVEL.search(text)
    group = next((m.group(1) for rx in _GROUPS if (m := rx.search(text))), None)
    model = next((m.group(1) for rx in _MODELS if (m := rx.search(text))), None)
    base = _API_BASE.search(text)
    api_base = _clean_base(base.group(1)) if base else None
    return LiteLLMAlert(
        alert_type=shown(kind.group(1))[:80],
        level=shown(level.group(1))[:40] if level else None,
        model_group=shown(group)[:100] if group else None,
        model=shown(model)[:100] if model else None,
        api_base=api_base,
        gpu=gpu_of_base(api_base, endpoints) if api_base else None,
    )


def describe_alert(alert: LiteLLMAlert | None, text_chars: int) -> str:
    if alert is None:  # some other Slack-style sender: its text is not ours to keep
        return f"slack-style text ({text_chars} characters, not a LiteLLM alert)"
    where = ", ".join(f"{k} {v}" for k, v in (("model group", alert.model_group), ("model", alert.model),
                                               ("api base", alert.api_base), ("gpu", alert.gpu)) if v)  # fmt: skip
    level = f" ({alert.level})" if alert.level else ""
    return f"litellm {alert.alert_type}{level}" + (f": {where}" if where else "")


def _clean_base(raw: str) -> str | None:
    """``scheme://host:port/path`` of an API base, without userinfo, query or fragment (they may hold
    a key); ``None`` when it is not an http(s) URL with a host."""
    url = split_url(raw)
    return shown(url.clean)[:200] if url is not None else None


def gpu_of_base(api_base: str, endpoints: tuple[tuple[str, str], ...]) -> str | None:
    """The alias whose ``endpoint`` is this API base (host and port; LiteLLM adds ``/v1``). ``None``
    when none is, or when several are (a guess is worse than "not known")."""
    want = split_url(api_base)
    found = [alias for alias, endpoint in endpoints
             if want is not None and (url := split_url(endpoint)) is not None and url.host_port == want.host_port]
    return found[0] if len(found) == 1 else None


def cycle_due(last_cycle_s: float | None, now_s: float, min_interval_s: float) -> bool:
    """At most one cycle per ``min_interval_s``. A last cycle "in the future" by less than that is
    another process's jittered clock (not due); by more, the clock was stepped back (due)."""
    if last_cycle_s is None:
        return True
    elapsed_s = now_s - last_cycle_s
    return elapsed_s >= min_interval_s or elapsed_s < -min_interval_s


def response(status: int, detail: str) -> bytes:
    """A whole HTTP/1.1 answer: a JSON body, its length, and ``Connection: close``."""
    body = json.dumps({"status": status, "detail": detail}).encode() + b"\n"
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
    return head.encode("ascii") + body


def shown(text: str) -> str:
    """``text`` as one printable line, capped: network strings reach logs and the audit trail."""
    from gpuheal.errors import one_line

    text = one_line(text)
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"
