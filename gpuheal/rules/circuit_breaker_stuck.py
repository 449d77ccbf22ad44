"""Rule 5: circuit breaker stuck open — LiteLLM's breaker for a GPU open more than 10 minutes while
the GPU's own ``/health`` answers 200.

Counted from the monitor's ``opened_at`` when given, else from the first poll that saw it open
(kept in the engine's memory, so a poll with ``/health`` not 200 does not restart the count); the
engine's ``hold_s`` is ``open_for_s`` ("more than"). Only while ``/health`` is 200: a breaker open on
a sick GPU is doing its job. Breakers the monitor does not list are closed.

The fix alerts on detection ("alert but do NOT reset", catalog ``alert_now``) and restarts LiteLLM.
Verify, as the spec writes it: "LiteLLM returns healthy, circuit breaker clears within 60s" — it
recovers when the breaker is seen closed *and* LiteLLM's ``/health/liveliness`` did not fail this
poll (not probed, as with no ``litellm.url``, leaves the breaker alone to say); the window is the
rule's ``verify_within_s`` (60).
"""

from __future__ import annotations

from gpuheal.core.engine import Finding, iso
from gpuheal.model import ENDPOINT_OK
from gpuheal.rules._util import num, show
from gpuheal.signals import Need, Signal, needs

ID = "circuit-breaker-stuck"
SCOPE = "gpu"
SEVERITY = "warning"
NEEDS: tuple[Need, ...] = needs(Signal.BREAKERS)


def hold(p):
    return 1, float(p["open_for_s"])


def opened_at(view, alias):
    """When the breaker opened, as well as known (epoch s); ``None`` if it is not open."""
    sample = view.sample(alias)
    if sample is None or sample.breaker is None or not sample.breaker.open:
        return None
    if sample.breaker.opened_at is not None:
        return sample.breaker.opened_at.timestamp()
    return view.breaker_open_since(alias)


def detect(view, alias, p):
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
            "threshold_s": float(p["open_for_s"]),
            "endpoint": sample.endpoint,
        },
        f"LiteLLM circuit breaker for {alias} open {show(open_for / 60, 0)} min while its "
        "/health answers 200",
        started_at=since,
    )


def recovered(view, alias, p, record):
    sample = view.sample(alias)
    if sample is None:
        return None
    if sample.breaker is not None and sample.breaker.open:
        return False
    return view.obs is None or view.obs.litellm_ok is not False  # closed, and LiteLLM answers
