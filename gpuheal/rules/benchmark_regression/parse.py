"""What Rule 4's checks read from the GPU's own tools (issue 22, item 2). Pure; nothing here raises on
input: a field that is a sentinel (``[N/A]``, ``[Not Supported]``), junk, negative or beyond any
board's power is "not known" (``None``), never zero.

- ``nvidia-smi --query-gpu=power.limit,power.default_limit,power.max_limit --format=csv,noheader,nounits``
  → :class:`PowerLimits` (positional, formats.md §2.1; real rows in ../shared/fixtures/smi: an RTX
  2080 Super prints ``250.00, 250.00, 350.00``, an H200 ``700.00, 700.00, 700.00``);
- ``rocm-smi --showmaxpower --json`` → the current power cap only: rocm-smi's "Max Graphics Package
  Power (W)" is the cap in force (hwmon ``power1_cap``), and rocm-smi prints no default cap, so
  whether an AMD GPU is throttled is "not known" from it (formats.md §3, the cap table);

The process lists (``nvidia-smi --query-compute-apps``, ``rocm-smi --showpids``) are read by
:mod:`gpuheal.parse.smi`, which Rule 2's attribution reads them with too.
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
    """One GPU's power limits in watts; ``None`` = not known."""

    current_w: float | None
    default_w: float | None = None
    max_w: float | None = None

    def record(self) -> dict[str, float | None]:
        return {"current_w": self.current_w, "default_w": self.default_w, "max_w": self.max_w}


def _watts(text: str) -> float | None:
    text = text.strip().removesuffix("W").strip()
    if not text or text.startswith("[") or text.upper().startswith("N/A"):
        return None
    value = number_text(text, hi=MAX_WATTS)
    return value if value is not None and value > 0 else None


def parse_power_limits(text: str) -> PowerLimits | None:
    """The first data row of the NVIDIA power query (a header line is skipped); ``None`` when no
    line has the three columns (an error message, an empty answer)."""
    for line in text.splitlines()[:16]:
        parts = line.split(",")
        if len(parts) != 3 or line.lstrip().lower().startswith("power"):
            continue
        current, default, top = (_watts(p) for p in parts)
        return PowerLimits(current, default, top)
    return None


# Read entry by entry rather than as one JSON document: the evidence gpuheal keeps is the tail of a
# long answer (its start cut off), and rocm-smi prints the process list last, under "system".
_CAP = re.compile(r'"card(\d{1,4})"\s*:\s*\{[^{}]*?"Max Graphics Package Power \(W\)"\s*:\s*"([^"]{0,64})"')


def parse_rocm_power_cap(text: str, card: int | None) -> PowerLimits | None:
    """``rocm-smi --showmaxpower --json``: the cap of ``card`` (``card0`` when ``None``); default and
    max not known. ``None`` when the answer has no such card."""
    for m in _CAP.finditer(text[-MAX_TEXT :]):
        if int(m.group(1)) == (card or 0):
            return PowerLimits(_watts(m.group(2)))
    return None
