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

from gpuheal.core.engine import Finding
from gpuheal.rules._util import num, show
from gpuheal.signals import Need, Signal, needs

ID = "workload-misrouted"
SCOPE = "gpu"
SEVERITY = "info"
NEEDS: tuple[Need, ...] = needs(Signal.REQUEST_SHARE)


def _shares(view, window_s, min_requests):
    key = ("workload", window_s, min_requests)
    if key in view.cache:
        return view.cache[key]
    weights = {a: g.weight for a, g in view.gpus.items() if g.weight is not None}
    result = None
    counts = {}
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


def detect(view, alias, p):
    gpu = view.gpu(alias)
    if gpu.weight is None:
        return None
    fleet = view.params(ID, "fleet")
    shares = _shares(view, float(fleet["window_s"]), int(fleet["min_requests"]))
    if shares is None:
        return None
    requests, share, target, total = shares[alias]
    band = max(float(p["tolerance_ratio"]) * target, 0.02)
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
            "window_s": float(fleet["window_s"]),
            "direction": direction,
            "role": gpu.role,
        },
        f"{alias} gets {show(100 * share, 0)} % of requests, target {show(100 * target, 0)} % "
        f"({gpu.role or 'no role set'}): {direction}-used; review agent alias routing",
    )
