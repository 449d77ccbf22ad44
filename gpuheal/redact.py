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
# A flag's value, never the prose after a flag's name: "align --api-key with litellm.api_key" names
# the flag, and masking "with" garbled the L1 alert (issue 9, point 8). A value is the next token
# unless that token is another flag (``--port``: the value is missing) or a word of English prose.
_PROSE = (
    "with|to|and|or|of|in|on|for|from|is|are|was|be|the|a|an|as|at|by|must|should|matches|match|"
    "differs|flag|option|argument|value|that|which|used|given|set"
)
_VALUE = rf"(?!--)(?!(?:{_PROSE})(?=\s|$))"
_PATTERNS = [
    re.compile(rf"(--api-key(?:-file)?(?:= *| +))({_VALUE}\S+)", re.I),
    re.compile(rf"(--(?:hf-)?token(?:= *| +))({_VALUE}\S+)", re.I),
    re.compile(r"(authorization:\s*(?:bearer|basic)\s+)(\S+)", re.I),
    re.compile(r"(\bbearer\s+)([A-Za-z0-9._~+/=-]{8,})", re.I),
    re.compile(rf"((?:api[_-]?key|password|secret|token)\s*[=:]\s*)({_VALUE}[^\s,;&\"']+)", re.I),
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
