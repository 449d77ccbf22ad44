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

    Rule 2 fits 6 h of every GPU at every poll (issue 29), so the window's spread (max − min) is read
    first: no two consecutive values differ by more than it, so a spread below ``jump`` needs no look
    for a jump; and a flat window — a llama-server's VRAM is allocated at load and stays put — has a
    slope of exactly 0 without a sum (:func:`_flat`). Both give the same numbers, to the bit, as the
    whole computation."""
    lo, hi = window_bounds(ts, start_s, end_s)
    if hi - lo < 2:
        return None
    tv = ts[lo:hi]
    window = vs[lo:hi]
    try:
        spread = _spread(window)  # type: ignore[arg-type]  # a None raises: read once, not scanned for first
        vv = cast(list[float], window)
    except TypeError:  # a value not known in the window
        tv, vv = _drop_unknown(tv, window)
        if len(vv) < 2:
            return None
        spread = _spread(vv)
    if jump is not None and not spread < jump:  # NaN (a NaN or an infinity among them): looked at step by step
        tv, vv = _after_last_jump(tv, vv, jump)
        if len(vv) < 2:
            return None
        spread = _spread(vv)
    if spread == 0 and _flat(len(tv), tv[-1] - tv[0]):
        value = 0.0
    else:
        t_ref, v_ref = tv[-1], vv[-1]
        found = slope([t - t_ref for t in tv], [v - v_ref for v in vv])  # x: seconds before the last sample
        if found is None:
            return None
        value = found
    return Fit(slope=value * per_s, n=len(tv), first_t=tv[0], last_t=tv[-1], last_v=vv[-1], per_s=per_s)


def _spread(values: list[float]) -> float:
    """``max − min`` of the values, or NaN when one of them is NaN or infinite (then no shortcut is
    taken). Sorted, in C: close to one pass over a flat or steady series, and its ends are the min and
    the max once the sum has shown every value finite. Raises ``TypeError`` on a ``None``."""
    total = sum(values)
    if total - total != 0:  # a NaN or an infinity among them (or a sum beyond float range)
        return math.nan
    ordered = sorted(values)
    return ordered[-1] - ordered[0]


def _after_last_jump(tv: list[float], vv: list[float], jump: float) -> tuple[list[float], list[float]]:
    """The samples after the last step of at least ``jump`` between consecutive values (all of them
    when there is none)."""
    diffs = list(map(sub, vv[1:], vv[:-1]))
    if max(map(abs, diffs)) >= jump:
        cut = len(diffs) - 1
        while abs(diffs[cut]) < jump:
            cut -= 1
        return tv[cut + 1 :], vv[cut + 1 :]
    return tv, vv


FLAT_MAX_SAMPLES = 1_000_000


def _flat(n: int, span: float) -> bool:
    """Whether :func:`slope` of ``n`` samples over ``span`` seconds (``t`` ascending), all of one value,
    is surely exactly ``0.0``: every ``y`` is 0, so its numerator is ``n·0 − Σx·0 = 0.0``, and it has a
    slope whenever its denominator ``n·Σx² − (Σx)²`` comes out positive and finite. Exactly, that is
    ``n·Σ(x − x̄)²``, at least ``n·span²/2`` (the first and the last sample alone); the rounding of its
    sums is at most about ``4·(n+1)·ε·n²·span²`` (ε = 2⁻⁵³: recursive summation's bound), so it stays
    positive for any ``n`` up to 3·10⁷ — taken here up to :data:`FLAT_MAX_SAMPLES` — and finite and
    clear of underflow for a span between 1e-100 and 1e100 s. Outside these, the sums decide."""
    return 2 <= n <= FLAT_MAX_SAMPLES and 1e-100 <= span <= 1e100


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
