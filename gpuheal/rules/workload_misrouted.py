"""Rule 10: workload distribution — a GPU's share of requests vs its configured ``weight``, and its
requests vs its configured ``role`` (``info``: a recommendation, never a status change).

Over the trailing ``window_s``, from LiteLLM's spend logs, else LiteLLM's per-deployment counters, else
gpu-monitor's ``requests_60s`` (:mod:`gpuheal.core.routing`, which judges): misrouted when the share is
off its target (weight over the sum of weights) by more than ``tolerance_ratio`` of the target, or when
more than ``role_tolerance_ratio`` of its judgeable requests fall outside its role. Needs at least
``min_requests`` requests in the window, else not known. Holds ``hold_s`` before firing; ``heal`` alerts
once per incident and, past ``escalate_after_s`` (the spec's ">48 h"), asks for an agent alias audit
(:func:`gpuheal.core.routing.followup`).
"""

from __future__ import annotations

from gpuheal.core import routing
from gpuheal.core.engine import Finding
from gpuheal.signals import Need, Signal, needs

ID = "workload-misrouted"
SCOPE = "gpu"
SEVERITY = "info"
NEEDS: tuple[Need, ...] = needs(Signal.REQUEST_SHARE)


def detect(view, alias, p):
    gpu = view.gpu(alias)
    if gpu.weight is None and not (gpu.role_kinds and gpu.role_kinds.judged):
        return None
    fleet = view.params(ID, "fleet")
    weights = {a: g.weight for a, g in view.gpus.items() if g.weight is not None}
    verdict = routing.judge(
        alias, routing.fleet_readings(view, float(fleet["window_s"])), weights, gpu.role,
        tolerance_ratio=float(p["tolerance_ratio"]), role_tolerance_ratio=float(p["role_tolerance_ratio"]),
        min_requests=float(fleet["min_requests"]), window_s=float(fleet["window_s"]),
    )
    return Finding(verdict.detected, verdict.summary) if isinstance(verdict, routing.Verdict) else verdict
