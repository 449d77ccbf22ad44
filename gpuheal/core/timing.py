"""Time as polls: how every window, span and hold compares times, so real clocks give the same answers
as whole-second ones. Pure.

Cron starts gpuheal 0.2–1.5 s after the minute, not on it, and now and then a poll is a couple of
seconds late (issue 9, point 1). The rules' numbers are written for polls every 60 s (contract "Rule
timing"): "the 3rd poll", "a 5-minute window", "more than 10 minutes", "a 120 s startup grace". A
comparison of raw seconds turns such jitter into a changed answer — a fit that spans 119.4 s instead
of 120 s is "too short", a sample 0.4 ms after ``now`` falls out of its own window — so a rule fires
a poll late, or not at all, by sub-second luck.

The one principle, applied everywhere a duration meets a threshold: **an elapsed time within
:data:`TOLERANCE_S` (a quarter of the cadence) of the threshold counts as exactly the threshold**
(:func:`snap`). At whole seconds nothing changes (a duration equal to its threshold keeps the side
the rule gave it: "more than 10 minutes" is still not met at exactly 600 s); a poll up to 15 s early
or late lands on the same side as the poll it stands for. Windows are inclusive of every sample
within the tolerance of their bounds (:func:`window`), so the poll being evaluated is always in its
own window, even when a stored time is later than ``now`` by a rounding.
"""

from __future__ import annotations

CADENCE_S = 60.0
"""The poll cadence the rule timing is written for (cron, every minute; contract "Rule timing")."""

TOLERANCE_S = CADENCE_S / 4
"""How far a poll may be early or late and still stand for its whole-second time: a quarter of the
cadence (far above real start-time jitter of a few seconds, far below one poll). A faster cadence
seen in the history lowers it (:func:`tolerance`), never a slower one raises it."""


def tolerance(poll_times_s: list[float]) -> float:
    """The tolerance for a history whose latest polls were at ``poll_times_s`` (ascending): a
    quarter of their median interval, at most :data:`TOLERANCE_S` (polls every 20 s get 5 s)."""
    recent = poll_times_s[-11:]
    gaps = sorted(b - a for a, b in zip(recent, recent[1:], strict=False) if b > a)
    if not gaps:
        return TOLERANCE_S
    return min(TOLERANCE_S, gaps[len(gaps) // 2] / 4)


def snap(elapsed_s: float, threshold_s: float, tol: float = TOLERANCE_S) -> float:
    """``elapsed_s``, or ``threshold_s`` itself when within ``tol`` of it."""
    return threshold_s if abs(elapsed_s - threshold_s) <= tol else elapsed_s


def more_than(elapsed_s: float, threshold_s: float, tol: float = TOLERANCE_S) -> bool:
    """``elapsed > threshold``, counted in polls (a hold's "more than ``hold_s`` since it started")."""
    return snap(elapsed_s, threshold_s, tol) > threshold_s


def at_least(elapsed_s: float, threshold_s: float, tol: float = TOLERANCE_S) -> bool:
    """``elapsed >= threshold``, counted in polls (a fit's span reaching its ``min_span_s``)."""
    return snap(elapsed_s, threshold_s, tol) >= threshold_s


def less_than(elapsed_s: float, threshold_s: float, tol: float = TOLERANCE_S) -> bool:
    """``elapsed < threshold``, counted in polls (still inside a startup grace)."""
    return snap(elapsed_s, threshold_s, tol) < threshold_s


def past(now_s: float, deadline_s: float, tol: float = TOLERANCE_S) -> bool:
    """``now > deadline``, counted in polls: a poll within the tolerance of a deadline (an attempt's
    ``verify_by``) stands for the poll at it, so it is not past it yet (issue 9, heal side)."""
    return more_than(now_s - deadline_s, 0.0, tol)


def within_last(now_s: float, t_s: float, window_s: float, tol: float = TOLERANCE_S) -> bool:
    """Whether ``t_s`` lies in the trailing ``window_s`` before ``now_s`` — "less than ``window_s``
    ago", and not after ``now_s`` — counted in polls: a restart an hour of polls ago has left the
    restarts-per-hour budget whether the later poll came a second early or late."""
    return t_s <= now_s + tol and less_than(now_s - t_s, window_s, tol)


def window(now_s: float, window_s: float, tol: float = TOLERANCE_S) -> tuple[float, float]:
    """``[start, end]`` of the trailing ``window_s`` ending at the poll ``now_s``, both bounds widened by
    the tolerance: the current poll is always in it (whatever rounding its stored time had) and the
    oldest poll is in or out the same way at any start-time jitter."""
    return now_s - window_s - tol, now_s + tol


def since(start_s: float, tol: float = TOLERANCE_S) -> float:
    """The lower bound for "samples from ``start_s`` on" (fresh data after a restart's grace,
    benchmark results younger than a maximum age), widened by the tolerance."""
    return start_s - tol
