"""Rule 7: GPU data source unreachable — gpu-monitor (or Prometheus, when it is the source)
unusable (refused, timeout, oversized per L5, invalid, HTTP error) for more than 2 consecutive polls
(fires on the 3rd; one bad poll is a fault, not an issue). gpu ``fleet``.

The sidecar half of Rule 7 is ``host-unreachable`` (one issue per GPU). While firing it inhibits
the monitor-fed rules: their issues are frozen and hidden — not known, neither healthy nor hot.
Resolves on the first usable monitor poll. Without gpu-monitor (readings from smi, issue 12) it is
"not known": each host's smi failure is that GPU's fault.
"""

from __future__ import annotations

from gpuheal.core.engine import Finding
from gpuheal.signals import Need, Signal, needs
from gpuheal.source_kinds import home, spec

ID = "data-source-unreachable"
SCOPE = "fleet"
SEVERITY = "warning"
NEEDS: tuple[Need, ...] = needs(Signal.SOURCE_HEALTH)
INHIBITS = "monitor"


def detect(view, subject, p):
    if view.obs is None:
        return None
    if Signal.SOURCE_HEALTH not in spec(view.obs.source).provides:
        return None  # no gpu-monitor configured (smi): nothing to restart; smi faults are per GPU
    if view.obs.monitor_ok:
        return False
    # the configured source: "monitor" (gpu-monitor; "smi-fallback" stands in for it while it is
    # down, Rule 7.3) or "prometheus" (issue 13): the same rule
    source = home(view.obs.source)
    faults = view.obs.faults_for(source)
    fault = faults[0].fault if faults else "unusable"
    detail = faults[0].detail[:200] if faults else ""
    name = spec(source).label or source
    return Finding(
        {"source": source, "fault": fault, "detail": detail},
        f"{name} unusable ({fault}); monitor-fed rules report unknown",
    )
