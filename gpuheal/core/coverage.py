"""Which rules cannot judge this fleet, and why (issue 12: "check lists which rules are off and
why, once, not as faults every minute"). Pure.

Without gpu-monitor, the data that only it has — LiteLLM's circuit breakers (Rule 5), per-GPU
request shares (Rule 10), its request failure rate (Rule 3's first source), its own availability
(Rule 7) — is not known; a llama-server started without ``--metrics`` gives no decode counters
(Rule 3's second source). These are configuration facts, reported as one line per rule with the
GPUs concerned and the fix, not as a data fault each poll.
"""

from __future__ import annotations

from typing import Any

from gpuheal.model import Observation
from gpuheal.parse.llama_metrics import HOW_TO_ENABLE

NO_MONITOR = "no gpu-monitor configured (monitor:)"


def without_metrics(monitor_configured: bool) -> str:
    """What a GPU whose llama-server serves no ``/metrics`` loses (Rule 3's decode counters), as
    ``check``'s ``rules_off`` and ``doctor`` both say it: it depends on whether gpu-monitor is there."""
    if monitor_configured:
        return ": a hung decode is seen only once gpu-monitor counts failures"
    return f" and {NO_MONITOR}: a stuck model is not detected"


def rules_off(source: str, obs: Observation) -> list[dict[str, Any]]:
    """``[{"rule", "gpus", "why", "fix"}]`` for a poll whose GPU readings came from ``source``
    (``monitor`` | ``prometheus`` | ``smi``); ``gpus`` is ``["fleet"]`` or the aliases concerned."""
    off: list[dict[str, Any]] = []
    fix_monitor = "configure monitor.url to read them from gpu-monitor"
    monitor_configured = source == "monitor"
    if not monitor_configured:
        off.append({"rule": "circuit-breaker-stuck", "gpus": ["fleet"],
                    "why": f"LiteLLM's circuit breakers are read from gpu-monitor; {NO_MONITOR}", "fix": fix_monitor})
        off.append({"rule": "workload-misrouted", "gpus": ["fleet"],
                    "why": f"request shares per GPU come from gpu-monitor; {NO_MONITOR}", "fix": fix_monitor})
        if source == "smi":
            off.append({"rule": "data-source-unreachable", "gpus": ["fleet"],
                        "why": f"{NO_MONITOR}: GPU readings come from nvidia-smi / rocm-smi per host (their "
                               "failures are that GPU's faults)", "fix": ""})
    no_metrics = sorted(a for a, s in obs.gpus.items() if s.metrics == "disabled")
    if no_metrics:
        why = f"llama-server serves no /metrics{without_metrics(monitor_configured)}"
        off.append({"rule": "model-stuck", "gpus": no_metrics, "why": why, "fix": HOW_TO_ENABLE["metrics"]})
    no_slots = sorted(a for a, s in obs.gpus.items() if s.slots == "disabled")
    if no_slots:
        off.append({"rule": "slots (report only)", "gpus": no_slots, "why": "llama-server serves no /slots",
                    "fix": HOW_TO_ENABLE["slots"]})
    return off
