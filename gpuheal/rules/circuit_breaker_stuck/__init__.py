"""Rule 5: circuit breaker stuck open — LiteLLM's breaker for a GPU open more than 10 minutes while
the GPU's own ``/health`` answers 200.

Counted from the monitor's ``opened_at`` when given, else from the first poll that saw it open
(the rule's memory, ``memory.py``, so a poll with ``/health`` not 200 does not restart the count); the
engine's ``hold_s`` is ``open_for_s`` ("more than"). Only while ``/health`` is 200: a breaker open on
a sick GPU is doing its job. Breakers the monitor does not list are closed.

The fix alerts on detection ("alert but do NOT reset", catalog ``alert_now``) and restarts LiteLLM.
Verify, as the spec writes it: "LiteLLM returns healthy, circuit breaker clears within 60s" — it
recovers when the breaker is seen closed *and* LiteLLM's ``/health/liveliness`` did not fail this
poll (not probed, as with no ``litellm.url``, leaves the breaker alone to say); the window is the
rule's ``verify_within_s`` (60).
"""

from __future__ import annotations

from typing import Final

from gpuheal.config.model import RemedyParams
from gpuheal.core.engine import iso
from gpuheal.core.issue import Finding, IssueRecord
from gpuheal.core.remedy import Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.model import ENDPOINT_OK
from gpuheal.rules._util import num, show
from gpuheal.rules.circuit_breaker_stuck.memory import REMEMBER, open_since
from gpuheal.signals import Need, Signal, needs

ID: Final = "circuit-breaker-stuck"
SCOPE: Final = "gpu"
SEVERITY: Final = "warning"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.BREAKERS)
INHIBITS: Final = None
JUDGED_FROM_BENCH: Final = False


class Params(RemedyParams):
    open_for_s: float  # open more than this long while /health answers 200 is stuck


def hold(p: Params) -> tuple[int, float]:
    return 1, p.open_for_s


remember: Final = REMEMBER  # when the breaker was first seen open (memory.py)


def opened_at(view: FleetView, alias: str) -> float | None:
    """When the breaker opened, as well as known (epoch s); ``None`` if it is not open."""
    sample = view.sample(alias)
    if sample is None or sample.breaker is None or not sample.breaker.open:
        return None
    if sample.breaker.opened_at is not None:
        return sample.breaker.opened_at.timestamp()
    return open_since(view.memory, alias)


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    sample = view.sample(alias)
    if sample is None:
        return None
    if sample.breaker is None or not sample.breaker.open:
        return False
    if sample.endpoint is None:
        return None
    if sample.endpoint != ENDPOINT_OK:
        return False
    since = opened_at(view, alias)
    if since is None:
        since = view.now_s
    open_for = max(0.0, view.now_s - since)
    return Finding(
        {
            "open_for_s": num(open_for, 0),
            "opened_at": iso(since),
            "threshold_s": p.open_for_s,
            "endpoint": sample.endpoint,
        },
        f"LiteLLM circuit breaker for {alias} open {show(open_for / 60, 0)} min while its "
        "/health answers 200",
        started_at=since,
    )


def recovered(view: FleetView, alias: str, p: Params, record: IssueRecord) -> bool | None:
    sample = view.sample(alias)
    if sample is None:
        return None
    if sample.breaker is not None and sample.breaker.open:
        return False
    return view.obs is None or view.obs.litellm_ok is not False  # closed, and LiteLLM answers


REMEDY: Final = Remedy(
    ("restart-litellm",),
    alert_now=True,  # Rule 5.2: "alert but do NOT reset" — the humans hear of it on detection
    why_escalate="LiteLLM restart did not clear the breaker — human investigation (Rule 5)",
)
