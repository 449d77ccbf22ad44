"""``systemctl show -p TimeoutStopUSec UNIT`` → seconds. Pure (issue 20).

systemd prints a time span as its own words, not microseconds: ``TimeoutStopUSec=1min 30s`` (the
default 90 s), ``TimeoutStopUSec=15s``, ``TimeoutStopUSec=500ms``, ``TimeoutStopUSec=infinity``
(systemd's ``format_timespan``). Anything else — garbage, another property, an empty answer — is
``None``: not known, never a guess.
"""

from __future__ import annotations

import math
import re

# systemd's format_timespan units (src/basic/time-util.c), largest first
UNITS_S = {"y": 31557600.0, "M": 2629800.0, "w": 604800.0, "d": 86400.0, "h": 3600.0, "min": 60.0,
           "s": 1.0, "ms": 1e-3, "us": 1e-6}
_PART = re.compile(r"(\d+(?:\.\d+)?)(y|M|w|d|h|min|s|ms|us)")


def parse_timespan_s(text: str) -> float | None:
    """``"1min 30s"`` → 90.0; ``"infinity"`` → ``math.inf``; anything else → ``None``."""
    text = text.strip()
    if text == "infinity":
        return math.inf
    parts = text.split()
    if not parts or len(parts) > 9:
        return None
    total = 0.0
    for part in parts:
        m = _PART.fullmatch(part)
        if m is None:
            return None
        total += float(m.group(1)) * UNITS_S[m.group(2)]
    return total


def timeout_stop_s(output: str, prop: str = "TimeoutStopUSec") -> float | None:
    """The stop timeout from ``systemctl show -p TimeoutStopUSec UNIT``'s output (one ``KEY=VALUE``
    line; a unit systemd does not know still prints the default)."""
    for line in output.splitlines()[:20]:
        key, sep, value = line.partition("=")
        if sep and key.strip() == prop:
            return parse_timespan_s(value)
    return None


def show_int(output: str, prop: str) -> int | None:
    """An integer property (``KillSignal=15``, ``RestartKillSignal=9``) from ``systemctl show``'s
    output; absent (a systemd too old to know it), garbage or negative: ``None``."""
    for line in output.splitlines()[:20]:
        key, sep, value = line.partition("=")
        if sep and key.strip() == prop:
            value = value.strip()
            return int(value) if value.isascii() and value.isdigit() and len(value) <= 3 else None
    return None
