"""Rule 7: GPU data source unreachable — gpu-monitor (or Prometheus, when it is the source)
unusable (refused, timeout, oversized per L5, invalid, HTTP error) for more than 2 consecutive polls
(fires on the 3rd; one bad poll is a fault, not an issue). gpu ``fleet``. An answer that lists no GPUs,
or lacks a configured GPU, is unusable for the GPUs it lacks (the spec's "returns no GPUs"; contract
"Rule timing"): the same rule, naming them (``obs.lacking``), while they are read through the fallback.
A lacking GPU whose own sidecar does not answer its direct probe either is not gpu-monitor's fault
but its host's, off the network: gpu-monitor cannot reach that host's agent any more than gpuheal can
reach its llama-server. That GPU is Rule 6's (``host-unreachable``, Rule 7's sidecar half, which
escalates "infrastructure alert"), not a reason to restart a monitor that answers for the rest of the
fleet: three such restarts (false actions) and a second page ("networking issue") per lost host was
what the 1,000-GPU chaos day showed (issue 29 item 5; tests/test_chaos_findings.py).

The sidecar half of Rule 7 is ``host-unreachable`` (one issue per GPU). While firing it inhibits
the monitor-fed rules: their issues are frozen and hidden — not known, neither healthy nor hot.
Resolves on the first usable monitor poll; its restart's attempt is resolved only on Rule 7's verify
(``remedy.py``: the source healthy and every sidecar reachable). Without gpu-monitor (readings from smi, issue 12) it is
"not known": each host's smi failure is that GPU's fault.
"""

from __future__ import annotations

from typing import Final

from gpuheal.config.model import RemedyParams
from gpuheal.core.issue import Finding
from gpuheal.core.remedy import Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.rules.data_source_unreachable import remedy
from gpuheal.signals import Need, Signal, needs
from gpuheal.source_kinds import home, spec

ID: Final = "data-source-unreachable"
SCOPE: Final = "fleet"
SEVERITY: Final = "warning"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.SOURCE_HEALTH)
INHIBITS: Final = "monitor"
JUDGED_FROM_BENCH: Final = False
recovered: Final = None  # the first usable poll (detect quiet) resolves it
hold: Final = None  # the engine's: hold_polls (fires on the 3rd consecutive unusable poll)
remember: Final = None


class Params(RemedyParams):
    """Only the engine's and heal's parameters (hold_polls, verify_within_s, ...)."""


def detect(view: FleetView, subject: str, p: Params) -> Detection:
    if view.obs is None:
        return None
    if Signal.SOURCE_HEALTH not in spec(view.obs.source).provides:
        return None  # no gpu-monitor configured (smi): nothing to restart; smi faults are per GPU
    lacking = view.obs.lacking  # its answer listed no GPU for these (the spec's "returns no GPUs")
    if view.obs.monitor_ok:
        lacking = tuple(a for a in lacking if view.reachable(a) is not False)
        if not lacking:
            return False
    # the configured source: "monitor" (gpu-monitor; "smi-fallback" stands in for it while it is
    # down, Rule 7.3) or "prometheus" (issue 13): the same rule
    source = home(view.obs.source)
    faults = view.obs.faults_for(source)
    fault = faults[0].fault if faults else "unusable"
    detail = faults[0].detail[:200] if faults else ""
    name = spec(source).label or source
    found = {"source": source, "fault": fault, "detail": detail, **({"gpus": list(lacking)} if lacking else {})}
    if view.obs.monitor_ok:  # usable for the rest of the fleet (issue 27 defect 1)
        more = f" and {len(lacking) - 3} more" if len(lacking) > 3 else ""
        return Finding(found, f"{name} lists no GPU for {', '.join(lacking[:3])}{more}; read through its fallback")
    return Finding(found, f"{name} unusable ({fault}); monitor-fed rules report unknown")


REMEDY: Final = Remedy(
    ("restart-gpu-monitor",),
    why_escalate="gpu-monitor does not come back after restarts — networking issue (Rule 7)",
    verify=remedy.verify,  # "gpu-monitor returns healthy + all sidecars reachable" before it is resolved
)
