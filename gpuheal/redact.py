"""Secret redaction for everything gpuheal writes: evidence, audit lines, alerts, logs.

Contract: "No secret ever appears in an alert, a log line, the audit trail or the state."
Evidence is the risky part: ``ps`` shows llama-server's argv, and Lesson L1's incident was a
``--api-key sk-…`` on a command line. Known secret values (the configured api key, the Zulip key)
are removed wherever they occur; key-shaped arguments are masked by pattern as well.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "<redacted>"
_PATTERNS = [
    re.compile(r"(--api-key(?:-file)?[= ]+)(\S+)", re.I),
    re.compile(r"(--(?:hf-)?token[= ]+)(\S+)", re.I),
    re.compile(r"(authorization:\s*(?:bearer|basic)\s+)(\S+)", re.I),
    re.compile(r"(\bbearer\s+)([A-Za-z0-9._~+/=-]{8,})", re.I),
    re.compile(r"((?:api[_-]?key|password|secret|token)\s*[=:]\s*)([^\s,;&\"']+)", re.I),
    re.compile(r"()(\bsk-[A-Za-z0-9._-]{6,})"),
]
# Values this short are not secrets worth hunting for (and would mangle ordinary text).
_MIN_SECRET_LEN = 6
_NOT_SECRETS = {"not-needed", "none", "null"}


def redact_text(text: str, secrets: tuple[str, ...] = ()) -> str:
    for secret in secrets:
        if secret and len(secret) >= _MIN_SECRET_LEN and secret.lower() not in _NOT_SECRETS:
            text = text.replace(secret, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


def redact(value: Any, secrets: tuple[str, ...] = ()) -> Any:
    """Redact every string inside a JSON-like value."""
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, dict):
        return {k: redact(v, secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, secrets) for v in value]
    return value


def describe_key(key: str) -> str:
    """How a key is named in a report (L1): never the key, only its shape — ``sk-…(12 chars)``."""
    if not key:
        return "(empty)"
    if key.lower() in _NOT_SECRETS:
        return key
    return f"{key[:3]}…({len(key)} chars)"
