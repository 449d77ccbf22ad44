"""Rule 6 (generalised from the spec's Strix rule to every GPU): host / llama-server unreachable —
the direct ``/health`` probe refused or timed out for more than 2 consecutive polls (fires on the
3rd).

Also covers Rule 7's "sidecar port (:8080) unreachable" clause: a GPU's sidecar *is* its
llama-server, so one issue per GPU, not two. While firing it inhibits the GPU's other issues (they
are frozen and hidden: a dead host is not also "stuck" and "rejecting the key"). Any HTTP answer
means reachable (a pending issue is dropped); it resolves on a 200 (the spec's verify).
"""

from __future__ import annotations

from typing import Final

from gpuheal.config.model import RemedyParams
from gpuheal.core.issue import Finding, IssueRecord
from gpuheal.core.remedy import Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.model import ENDPOINT_OK, UNREACHABLE_STATES
from gpuheal.rules.host_unreachable import reach, remedy
from gpuheal.signals import Need

ID: Final = "host-unreachable"
SCOPE: Final = "gpu"
SEVERITY: Final = "critical"
NEEDS: Final[tuple[Need, ...]] = ()
INHIBITS: Final = "host"
JUDGED_FROM_BENCH: Final = False
hold: Final = None  # the engine's: hold_polls (fires on the 3rd consecutive failed probe)
remember: Final = None


class Params(RemedyParams):
    """Only the engine's and heal's parameters (hold_polls, verify_within_s, ...)."""


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    state = view.endpoint(alias)
    if state is None:
        return None
    if state in UNREACHABLE_STATES:
        gpu = view.gpu(alias)
        faults = view.obs.faults_for(alias) if view.obs is not None else []
        detail = faults[0].detail[:200] if faults else ""
        return Finding(
            {"endpoint": state, "host": gpu.host, "detail": detail},
            f"{alias} ({gpu.host}) llama-server {state} on its direct /health probe",
        )
    return False


def recovered(view: FleetView, alias: str, p: Params, record: IssueRecord) -> bool | None:
    state = view.endpoint(alias)
    if state is None:
        return None
    if state == ENDPOINT_OK:
        return True
    if state in UNREACHABLE_STATES:
        return False
    return None  # answering, not healthy yet (loading, http-5xx): neither down nor recovered


REMEDY: Final = Remedy(
    ("restart-llama-server",),
    why_escalate="llama-server does not come back — infrastructure alert (Rule 6)",
    cannot_serve=True,
    before_step=remedy.before_step,
    conclude=remedy.conclude,
    verify=remedy.verify,
    drain=remedy.hard_fault,
    state_file=reach.STATE_FILE,
)
