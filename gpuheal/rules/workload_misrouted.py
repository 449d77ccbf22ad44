"""Rule 10: workload distribution — a GPU's share of requests vs its configured ``weight``
(``info``: a recommendation, never a status change).

Shares are computed over the trailing ``window_s`` from gpu-monitor's ``requests_60s`` (remembered by
the engine in 5-minute buckets), across the GPUs that have a ``weight``; the target share is the
GPU's weight over the sum of weights. Misrouted when the share is off its target by more than
``tolerance_ratio`` of the target. Needs every weighted GPU's count and at least ``min_requests``
requests in the window, else not known. Holds ``hold_s`` before firing; the spec's ">48 h → agent
alias audit" is an escalation on how long the issue has been open (its ``since``).
"""

from __future__ import annotations

from typing import Final

from gpuheal.config.model import EngineParams
from gpuheal.core.engine import Finding
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.rules._util import num, show
from gpuheal.signals import Need, Signal, needs

ID: Final = "workload-misrouted"
SCOPE: Final = "gpu"
SEVERITY: Final = "info"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.REQUEST_SHARE)
INHIBITS: Final = None
recovered: Final = None  # back within the band (detect quiet)
hold: Final = None  # the engine's: hold_s

# per weighted alias: (its requests, its share, its target share, the fleet's requests)
Shares = dict[str, tuple[int, float, float, int]]


class Params(EngineParams):
    tolerance_ratio: float  # a share off its target by more than this share of the target is misrouted
    min_requests: int  # fewer requests fleet-wide in the window say nothing (read at fleet level)
    window_s: float  # the trailing window the shares are counted over (read at fleet level)


def _shares(view: FleetView, window_s: float, min_requests: int) -> Shares | None:
    key = ("workload", window_s, min_requests)
    if key in view.cache:
        cached: Shares | None = view.cache[key]
        return cached
    weights = {a: g.weight for a, g in view.gpus.items() if g.weight is not None}
    result = None
    counts: dict[str, int] = {}
    for alias in weights:
        n = view.requests_in_window(alias, window_s)
        if n is None:
            break
        counts[alias] = n
    else:
        total = sum(counts.values())
        weight_sum = sum(weights.values())
        if total >= min_requests and weight_sum > 0 and len(weights) > 1:
            result = {
                a: (counts[a], counts[a] / total, weights[a] / weight_sum, total) for a in weights
            }
    view.cache[key] = result
    return result


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    gpu = view.gpu(alias)
    if gpu.weight is None:
        return None
    fleet = view.rule_params(ID, Params, "fleet")
    shares = _shares(view, fleet.window_s, fleet.min_requests)
    if shares is None:
        return None
    requests, share, target, total = shares[alias]
    band = max(p.tolerance_ratio * target, 0.02)
    if abs(share - target) <= band:
        return False
    direction = "over" if share > target else "under"
    return Finding(
        {
            "share_pct": num(100 * share),
            "target_pct": num(100 * target),
            "tolerance_pct": num(100 * band),
            "requests": requests,
            "fleet_requests": total,
            "window_s": fleet.window_s,
            "direction": direction,
            "role": gpu.role,
        },
        f"{alias} gets {show(100 * share, 0)} % of requests, target {show(100 * target, 0)} % "
        f"({gpu.role or 'no role set'}): {direction}-used; review agent alias routing",
    )
