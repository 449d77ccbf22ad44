"""Rule 7's verify, the spec's own: "gpu-monitor returns healthy + all sidecars reachable" — the proof a
restart of gpu-monitor worked, before its attempt is resolved (the ``verify`` hook of ``REMEDY``,
:mod:`gpuheal.core.remedy`). A fleet fix has no GPU to run a completion on; this is its proof instead.

- gpu-monitor (or Prometheus, when it is the source) answered this poll usable — the configured source
  itself, not Rule 7.3's smi stand-in;
- every configured GPU's sidecar (its llama-server: Rule 6 covers Rule 7's sidecar clause) answered its
  direct ``/health`` probe — any HTTP answer is reachable. A sidecar that is down while its own
  ``host-unreachable`` issue fires is Rule 6's, which restarts it: it is listed, and does not hold back
  the monitor's verdict (a monitor restart cannot bring a dead llama-server back, and waiting for one
  would end in the wrong escalation, "networking issue"). A sidecar not probed is not known: not proved.

Pure: the poll's values in, the verdict out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuheal.core.remedy import Proving, RemedyContext
from gpuheal.model import UNREACHABLE_STATES
from gpuheal.rules.host_unreachable import ID as SIDECAR_ISSUE


def verify(p: Proving, ctx: RemedyContext) -> Mapping[str, Any]:
    """``ok`` when the source is healthy and every sidecar reachable; what was seen either way."""
    down = sorted(a for a, state in p.endpoints.items() if state in UNREACHABLE_STATES)
    own = [a for a in down if (a, SIDECAR_ISSUE) in p.firing]
    unknown = sorted(a for a, state in p.endpoints.items() if state is None)
    out: dict[str, Any] = {
        "source": p.source,
        "source_healthy": p.source_ok is True,
        "sidecars_reachable": sum(1 for s in p.endpoints.values() if s is not None and s not in UNREACHABLE_STATES),
        "sidecars": len(p.endpoints),
    }
    if own:
        out["sidecars_down_under_rule_6"] = own
    blocking = [a for a in down if a not in own]
    if blocking:
        out["sidecars_unreachable"] = blocking
    if unknown:
        out["sidecars_not_known"] = unknown
    out["ok"] = p.source_ok is True and not blocking and not unknown
    if not out["ok"]:
        out["error"] = ("the data source is not healthy" if p.source_ok is not True
                        else "not every sidecar is reachable")  # fmt: skip
    return out
