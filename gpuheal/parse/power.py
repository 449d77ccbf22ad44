"""A GPU's board power limits as its vendor's tool prints them (issue 27 items 7 and 12). Pure; nothing
here raises on input: a field that is a sentinel (``[N/A]``, ``[Not Supported]``), junk, negative or
beyond any board's power is "not known" (``None``), never zero.

- ``nvidia-smi --query-gpu=power.limit,power.default_limit,power.min_limit,power.max_limit
  --format=csv,noheader,nounits`` → :class:`PowerRange`, positional (formats.md §2.1; an RTX 3090 prints
  ``350.00, 350.00, 100.00, 400.00``); the three-column query Rule 4.2 asked before is read too;
- ``rocm-smi --showmaxpower --json`` → the cap in force only: rocm-smi's "Max Graphics Package Power (W)"
  is the cap (hwmon ``power1_cap``); it prints no default, min or max (formats.md §3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuheal.parse.gpu_data import LIMITS
from gpuheal.parse.values import number_text

MAX_WATTS = LIMITS["power_limit_w"]
MAX_TEXT = 1024 * 1024  # only the last MiB of an answer is read


@dataclass(frozen=True)
class PowerLimits:
    """One GPU's power limits in watts; ``None`` = not known. ``min_w``: the lowest limit the board takes."""

    current_w: float | None
    default_w: float | None = None
    max_w: float | None = None
    min_w: float | None = None

    def record(self) -> dict[str, float | None]:
        out = {"current_w": self.current_w, "default_w": self.default_w, "max_w": self.max_w}
        if self.min_w is not None:
            out["min_w"] = self.min_w
        return out


def watts(text: str) -> float | None:
    text = text.strip().removesuffix("W").strip()
    if not text or text.startswith("[") or text.upper().startswith("N/A"):
        return None
    value = number_text(text, hi=MAX_WATTS)
    return value if value is not None and value > 0 else None


def parse_power_limits(text: str) -> PowerLimits | None:
    """The first data row of the NVIDIA power query — ``limit, default, max`` or ``limit, default, min,
    max`` (a header line is skipped); ``None`` when no line has those columns (an error, an empty answer)."""
    for line in text[:MAX_TEXT].splitlines()[:16]:
        parts = line.split(",")
        if len(parts) not in (3, 4) or line.lstrip().lower().startswith("power"):
            continue
        values = [watts(p) for p in parts]
        if len(values) == 3:
            return PowerLimits(values[0], values[1], values[2])
        return PowerLimits(values[0], values[1], values[3], values[2])
    return None


# Read entry by entry rather than as one JSON document: the evidence gpuheal keeps is the tail of a
# long answer (its start cut off), and rocm-smi prints the process list last, under "system".
_CAP = re.compile(r'"card(\d{1,4})"\s*:\s*\{[^{}]*?"Max Graphics Package Power \(W\)"\s*:\s*"([^"]{0,64})"')


def parse_rocm_power_cap(text: str, card: int | None) -> PowerLimits | None:
    """``rocm-smi --showmaxpower --json``: the cap of ``card`` (``card0`` when ``None``); default, min and
    max not known. ``None`` when the answer has no such card."""
    for m in _CAP.finditer(text[-MAX_TEXT:]):
        if int(m.group(1)) == (card or 0):
            return PowerLimits(watts(m.group(2)))
    return None
