"""Rule 8 tier 2's judgement of its fix (issue 27 item 10): the ``recheck`` hook of ``REMEDY``
(:mod:`gpuheal.core.remedy`). Pure: what it sees in, a reason (or ``None``) out.

Spec Rule 8: "Escalate: If Tier 2 triggers and temp still rising after 5 min → possible hardware
failure". So when the attempt's verification window (``verify_within_s``, 5 min) passes with the GPU
still at or above 80 °C, only a GPU *still rising* fails the attempt (and, after
``escalate_after_failures``, is escalated). One falling — or flat — above 80 °C keeps the load shed
(the mitigation stays while the issue is open) and is judged again one window later. A rise this poll
cannot say (no temperature, too few samples) is not known: the attempt fails as before, so a GPU nobody
can see is never left to itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuheal.clock import format_epoch
from gpuheal.core import timing
from gpuheal.core.remedy import Rechecking


def recheck(r: Rechecking) -> str | None:
    """A reason to keep the fix running one more window, or ``None``: still rising (or not known)."""
    from gpuheal.rules.thermal_rising import ID, Params
    from gpuheal.rules.thermal_rising.memory import RISE

    row = r.memory.get(RISE, r.gpu)
    if row is None or row.rise_c_per_min is None or not timing.at_least(row.at_s - r.now_s, 0.0, r.tol_s):
        return None  # this poll says nothing about the rise: not known, never "falling"
    p = r.cfg.rule_record(Params, _merged(r, ID))
    if row.rise_c_per_min > p.rise_c_per_min:
        return None  # still rising: the spec's possible hardware failure
    again = format_epoch(r.now_s + p.verify_within_s)
    trend = "falling" if row.rise_c_per_min < 0 else "no longer rising"
    return (f"{r.gpu} at {row.temp_c:g} °C, {trend} ({row.rise_c_per_min:+.1f} °C/min): "
            f"the load stays shed, re-checked at {again} (Rule 8 tier 2 escalates only while still rising)")


def _merged(r: Rechecking, rule_id: str) -> Mapping[str, Any]:
    """The rule's parameters as configured for the GPU (``gpus[].rules`` over the fleet's)."""
    gpu = next((g for g in r.cfg.gpus if g.alias == r.gpu), None)
    return (r.cfg.rules if gpu is None else gpu.rules).get(rule_id, {})
