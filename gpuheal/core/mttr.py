"""Time to resolve, per issue, as a product figure (issue 20). Pure: audit records in, figures out.

Every resolved attempt's audit record carries ``time_to_detect_s`` (onset → first action) and
``time_to_resolve_s`` (onset → the poll that proved the fix). The metrics file exports them as a
histogram per issue (``gpuheal_time_to_resolve_seconds``); the weekly report shows the median and
the 90th percentile per rule. Records without the figures (older ones, junk) are skipped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# seconds: a hang healed at the 3rd poll is ~2-4 min; a leak over hours; a stop timeout adds 90 s
BUCKETS_S = (60.0, 120.0, 180.0, 240.0, 300.0, 600.0, 1800.0, 3600.0, 21600.0)


@dataclass(frozen=True)
class Histogram:
    """One issue's cumulative buckets (``le`` → count), sum and count, as Prometheus wants them."""

    buckets: tuple[tuple[float, int], ...]
    sum_s: float
    count: int


def resolve_times(records: Iterable[Any]) -> dict[str, list[float]]:
    """``issue`` → the ``time_to_resolve_s`` of each resolved attempt, in record order."""
    out: dict[str, list[float]] = {}
    for rec in records:
        if not isinstance(rec, dict) or rec.get("result") != "resolved" or rec.get("phase") != "verification":
            continue
        issue, value = rec.get("issue"), rec.get("time_to_resolve_s")
        if not isinstance(issue, str) or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value) and value >= 0:
            out.setdefault(issue, []).append(float(value))
    return out


def histogram(values: list[float], buckets: tuple[float, ...] = BUCKETS_S) -> Histogram:
    cumulative = tuple((le, sum(1 for v in values if v <= le)) for le in buckets)
    return Histogram(cumulative + ((math.inf, len(values)),), float(sum(values)), len(values))


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile, linear between closest ranks (numpy's default); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
