"""The pure half of ``gpuheal wake`` (issue 22 item 7; contract "Waking on an event"): read one
HTTP/1.1 request head, judge it, summarise its JSON body, decide whether a heal cycle is due.

Values in, values out: the bytes already read, the token, the times. The socket reading, the lock
and the heal cycle are :mod:`gpuheal.steps.wake`'s. Stdlib only and small: a systemd socket unit
with ``Accept=yes`` starts one process per connection.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass

MAX_HEAD_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024  # contract: "a body over 1 MiB is 400"
READ_DEADLINE_S = 5.0  # contract: "no body within 5 s is 400"
SUMMARY_CHARS = 200
REASONS = {202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 405: "Method Not Allowed",
           429: "Too Many Requests", 500: "Internal Server Error"}  # fmt: skip


@dataclass(frozen=True)
class Head:
    """A parsed request head: what the judgement needs, nothing else kept."""

    method: str
    authorization: str
    content_length: int | None
    expect_continue: bool = False  # curl sends ``Expect: 100-continue`` for a body over 1 KiB


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
    return Head(parts[0], auth[0] if len(auth) == 1 else "", length, expect)


def judge(head: Head, token: str | None) -> Refusal | None:
    """The checks before any body is read: method, token (constant time), length. ``None``: read on."""
    if head.method != "POST":
        return Refusal(405, f"method {shown(head.method)} is not POST")
    if not token_matches(head.authorization, token):
        return Refusal(401, "wrong or missing bearer token")
    if not head.content_length:
        return Refusal(400, "no body (Content-Length missing or 0)")
    if head.content_length > MAX_BODY_BYTES:
        return Refusal(400, f"body of {head.content_length} bytes is over {MAX_BODY_BYTES}")
    return None


def token_matches(authorization: str, token: str | None) -> bool:
    """``Authorization: Bearer TOKEN`` against the configured token with :func:`hmac.compare_digest`
    (no early exit on the first differing byte). No token configured: nothing matches."""
    scheme, _, given = authorization.partition(" ")
    if not token or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode("latin-1"), token.encode("utf-8", "surrogateescape"))


def summarise(body: bytes) -> str | Refusal:
    """What woke us, one escaped line of at most :data:`SUMMARY_CHARS`: Alertmanager's status and
    alert names, LiteLLM's event and message, else the JSON's top-level keys. Never a whole body
    (LiteLLM's webhook event carries a hashed key and a user id). Not JSON → 400."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return Refusal(400, "body is not JSON")
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
    elif isinstance(doc, dict) and isinstance(doc.get("text"), str):  # LiteLLM's Slack-style alert
        text = "text: " + doc["text"]
    elif isinstance(doc, dict):
        text = "json keys " + (", ".join(str(k) for k in list(doc)[:10]) or "(none)")
    else:
        text = f"json {type(doc).__name__}"
    return shown(text)


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
