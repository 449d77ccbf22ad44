"""Rule 10: workload distribution — a GPU's share of requests vs its configured ``weight``, and its
requests vs its configured ``role`` (``info``: a recommendation, never a status change).

Over the trailing ``window_s``, from LiteLLM's spend logs, else LiteLLM's per-deployment counters, else
gpu-monitor's ``requests_60s`` (the last two remembered poll by poll: ``memory.py``; judged by
:mod:`gpuheal.core.routing`): misrouted when the share is
off its target (weight over the sum of weights) by more than ``tolerance_ratio`` of the target, or when
more than ``role_tolerance_ratio`` of its judgeable requests fall outside its role. Needs at least
``min_requests`` requests in the window, else not known. Holds ``hold_s`` before firing; ``heal`` alerts
once per incident and, past ``escalate_after_s`` (the spec's ">48 h"), asks for an agent alias audit
(``remedy.py``).
"""

from __future__ import annotations

from typing import Final

from gpuheal.config.model import EngineParams, Role
from gpuheal.core import routing
from gpuheal.core.issue import Finding
from gpuheal.core.remedy import Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.rules.workload_misrouted import remedy
from gpuheal.rules.workload_misrouted.memory import REMEMBER, fleet_readings
from gpuheal.signals import Need, Signal, needs

ID: Final = "workload-misrouted"
SCOPE: Final = "gpu"
SEVERITY: Final = "info"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.REQUEST_SHARE)
INHIBITS: Final = None
JUDGED_FROM_BENCH: Final = False
recovered: Final = None  # back within the band (detect quiet)
hold: Final = None  # the engine's: hold_s
remember: Final = REMEMBER  # LiteLLM's counters and gpu-monitor's request counts, poll by poll (memory.py)

class Params(EngineParams):
    tolerance_ratio: float  # a share off its target by more than this share of the target is misrouted
    role_tolerance_ratio: float  # more than this share of a GPU's judged requests outside its role: misrouted
    min_requests: int  # fewer requests fleet-wide in the window say nothing (read at fleet level)
    window_s: float  # the trailing window the shares are counted over (read at fleet level)
    escalate_after_s: float  # the spec's "persists >48h -> agent alias audit needed" (remedy.py)


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    gpu = view.gpu(alias)
    if gpu.weight is None and not (gpu.role_kinds and gpu.role_kinds.judged):
        return None
    fleet = view.rule_params(ID, Params, "fleet")
    readings, weights, totals = _fleet(view, fleet.window_s)
    verdict = routing.judge(
        alias, readings, weights, gpu.role,
        tolerance_ratio=p.tolerance_ratio, role_tolerance_ratio=p.role_tolerance_ratio,
        min_requests=float(fleet.min_requests), window_s=fleet.window_s, roles=_roles(view), fleet=totals,
    )
    return Finding(verdict.detected, verdict.summary) if isinstance(verdict, routing.Verdict) else verdict


def _fleet(
    view: FleetView, window_s: float
) -> tuple[dict[str, routing.Reading], dict[str, float], routing.FleetTotals | None]:
    """The fleet's readings, weights and their sums, once per poll (each GPU's share is measured
    against them: once per GPU, a 1,000-GPU poll summed the fleet a thousand times)."""
    key = ("shares", ID, window_s)
    if key not in view.cache:
        readings = fleet_readings(view, window_s)
        weights = {a: g.weight for a, g in view.gpus.items() if g.weight is not None}
        view.cache[key] = (readings, weights, routing.totals(readings, weights))
    cached: tuple[dict[str, routing.Reading], dict[str, float], routing.FleetTotals | None] = view.cache[key]
    return cached


def _roles(view: FleetView) -> dict[str, Role | None]:
    """Every GPU's role, once per poll (where a GPU's outside traffic belongs: ``core/routing``)."""
    key = ("roles", ID)
    if key not in view.cache:
        view.cache[key] = {a: g.role_kinds for a, g in view.gpus.items()}
    roles: dict[str, Role | None] = view.cache[key]
    return roles


REMEDY: Final = Remedy(automatic=False, why_escalate="", recommend=True, remind=False, follow_up=remedy.follow_up)
