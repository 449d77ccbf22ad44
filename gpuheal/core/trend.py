"""Trend maths over History columns: least-squares rates and sparklines. Pure.

Rule 2 (VRAM leak) fits a least-squares line over the 6 h window; Rule 8 (predictive thermal) fits
the last few minutes of temperature ("computed over a few minutes, not two samples"). Both read the
History's parallel columns (``t`` plus one list per metric) directly, with builtins doing the sums
(no per-sample objects): evaluation of 1000 GPUs × 6.5 h must stay well under 300 ms (issue 3).

Numbers are fitted relative to the window's last sample (``x = t - t_last``, ``y = v - v_last``), so
a constant series has a slope of exactly 0 and epoch-sized times lose no precision.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from itertools import repeat
from operator import mul, sub
from typing import cast

SPARK = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Fit:
    """A least-squares line through ``n`` samples between ``first_t`` and ``last_t`` (epoch s).

    ``slope`` is per ``per_s`` seconds (3600 → per hour, 60 → per minute); ``last_v`` is the last
    known value (the "current" reading of the window).
    """

    slope: float
    n: int
    first_t: float
    last_t: float
    last_v: float
    per_s: float

    @property
    def span_s(self) -> float:
        return self.last_t - self.first_t


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` over ``xs``; ``None`` with fewer than 2 distinct ``xs``."""
    n = len(xs)
    if n < 2:
        return None
    sx = sum(xs)
    sy = sum(ys)
    sxx = sum(map(mul, xs, xs))
    sxy = sum(map(mul, xs, ys))
    den = n * sxx - sx * sx
    if den <= 0 or not math.isfinite(den):
        return None
    value = (n * sxy - sx * sy) / den
    return value if math.isfinite(value) else None


def window_bounds(ts: list[float], start_s: float, end_s: float) -> tuple[int, int]:
    """Indexes ``[lo, hi)`` of the samples with ``start_s <= t <= end_s`` (``ts`` ascending)."""
    return bisect_left(ts, start_s), bisect_right(ts, end_s)


def fit_window(
    ts: list[float],
    vs: list[float | None],
    start_s: float,
    end_s: float,
    per_s: float,
    jump: float | None = None,
) -> Fit | None:
    """Fit the known values in ``[start_s, end_s]``.

    ``jump``: when two consecutive known values differ by at least this much, the window restarts
    after the jump (a llama-server reload drops VRAM and loads it back: that is not a leak, Rule 2).
    ``None`` when fewer than two known samples remain.
    """
    lo, hi = window_bounds(ts, start_s, end_s)
    if hi - lo < 2:
        return None
    tv = ts[lo:hi]
    window = vs[lo:hi]
    if None in window:
        tv, vv = _drop_unknown(tv, window)
        if len(vv) < 2:
            return None
    else:
        vv = cast(list[float], window)  # no None in it: just checked (a copy-free narrowing)
    if jump is not None and len(vv) > 1:
        diffs = list(map(sub, vv[1:], vv[:-1]))
        if max(map(abs, diffs)) >= jump:
            cut = len(diffs) - 1
            while abs(diffs[cut]) < jump:
                cut -= 1
            tv = tv[cut + 1 :]
            vv = vv[cut + 1 :]
            if len(vv) < 2:
                return None
    t_ref = tv[-1]
    v_ref = vv[-1]
    xs = list(map(sub, tv, repeat(t_ref)))  # seconds before the last sample
    ys = list(map(sub, vv, repeat(v_ref)))
    value = slope(xs, ys)
    if value is None:
        return None
    return Fit(slope=value * per_s, n=len(xs), first_t=tv[0], last_t=t_ref, last_v=v_ref, per_s=per_s)


def _drop_unknown(tv: list[float], vv: list[float | None]) -> tuple[list[float], list[float]]:
    """The pairs whose value is known; cheap when only a few are missing (slices, not a loop)."""
    keep_t: list[float] = []
    keep_v: list[float] = []
    start = 0
    while True:
        try:
            j = vv.index(None, start)
        except ValueError:  # no None from start on
            keep_t.extend(tv[start:])
            keep_v.extend(cast(list[float], vv[start:]))
            return keep_t, keep_v
        keep_t.extend(tv[start:j])
        keep_v.extend(cast(list[float], vv[start:j]))  # j is the first None from start
        start = j + 1


def sparkline(
    ts: list[float],
    vs: list[float | None],
    start_s: float,
    end_s: float,
    width: int = 24,
) -> str:
    """``width`` cells over ``[start_s, end_s]``, each the mean of its samples; a blank where no
    sample is known ("not known is not zero"). Scaled between the window's min and max."""
    if width <= 0 or end_s <= start_s:
        return ""
    lo, hi = window_bounds(ts, start_s, end_s)
    sums = [0.0] * width
    counts = [0] * width
    cell_s = (end_s - start_s) / width
    for i in range(lo, hi):
        v = vs[i]
        if v is None:
            continue
        k = min(width - 1, int((ts[i] - start_s) / cell_s))
        sums[k] += v
        counts[k] += 1
    cells = [s / c if c else None for s, c in zip(sums, counts, strict=True)]
    known = [c for c in cells if c is not None]
    if not known:
        return " " * width
    low, high = min(known), max(known)
    span = high - low
    out = []
    for c in cells:
        if c is None:
            out.append(" ")
        elif span <= 0:
            out.append(SPARK[0])
        else:
            out.append(SPARK[min(len(SPARK) - 1, int((c - low) / span * len(SPARK)))])
    return "".join(out)
