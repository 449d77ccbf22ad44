"""Rule 3: model inference timeout / GPU stuck — more than 50 % of requests failing over the
trailing 60 s, still so after a 30 s grace.

gpu-monitor's ``requests_60s``/``failures_60s`` are the 60 s window; the engine's hold is
``hold_polls`` (2) and ``grace_s`` (30): at a 60 s cadence the issue fires at the 2nd consecutive bad
poll (contract). Fewer than ``min_requests`` requests is not enough to judge (one stuck request is
not a stuck GPU): not known. Needs the llama-server to answer its probe: failures of a host that is
down are Rule 6's. Recovers when the failure rate drops to ``clear_failure_ratio`` (the spec's
verify: 0 %).
"""

from __future__ import annotations

from gpuheal.core.engine import NEEDS_ENDPOINT, NEEDS_MONITOR, Finding
from gpuheal.rules._util import num, show

ID = "model-stuck"
SCOPE = "gpu"
SEVERITY = "critical"
NEEDS = frozenset({NEEDS_MONITOR, NEEDS_ENDPOINT})


def hold(p):
    return int(p["hold_polls"]), float(p["grace_s"])


def _counts(view, alias):
    sample = view.sample(alias)
    if sample is None or sample.requests_60s is None or sample.failures_60s is None:
        return None
    return sample.requests_60s, sample.failures_60s, sample.consecutive_timeouts


def detect(view, alias, p):
    counts = _counts(view, alias)
    if counts is None:
        return None
    requests, failures, timeouts = counts
    if requests < p["min_requests"]:
        return None
    ratio = failures / requests
    if ratio > p["failure_ratio"]:
        return Finding(
            {
                "failure_pct": num(100 * ratio),
                "threshold_pct": num(100 * p["failure_ratio"]),
                "requests_60s": requests,
                "failures_60s": failures,
                "consecutive_timeouts": timeouts,
                "endpoint": view.endpoint(alias),
            },
            f"{alias}: {failures} of {requests} requests failed in 60 s "
            f"({show(100 * ratio, 0)} % > {show(100 * p['failure_ratio'], 0)} %)",
        )
    return False


def recovered(view, alias, p, record):
    counts = _counts(view, alias)
    if counts is None:
        return None
    requests, failures, _ = counts
    if failures == 0:
        return True
    return requests > 0 and failures / requests <= p["clear_failure_ratio"]
