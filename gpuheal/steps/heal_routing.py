"""``heal``'s follow-through on Rule 10, workload misrouted (issue 22, item 6), kept beside
:mod:`gpuheal.steps.heal` (which calls :func:`follow_up` for a ``recommend`` plan item).

Spec Rule 10: "Alert if any GPU is handling workload outside its designated role … Verify: each GPU's
request pattern matches its designated role within 24h. Escalate: if role mismatch persists >48h →
agent alias audit needed." What to do this run is decided by the pure
:func:`gpuheal.core.routing.followup`; here it is done:

- the first run that sees the incident firing alerts once (an escalation held until it resolves, so
  its resolution is announced; grouped with the same issue on other GPUs by ``core/alerts``);
- 24 h (``verify_within_s``) after that alert, still misrouted, the run's actions say "not verified";
- past 48 h (``escalate_after_s``) since the incident began, a message of its own (its own alert state,
  so it is not deduplicated against the first) asks for the agent alias audit, audited once.

Other recommendations (Rule 9) are reported only, as before.
"""

from __future__ import annotations

from typing import Any

from gpuheal.clock import parse_iso
from gpuheal.core import routing

ISSUE = "workload-misrouted"


def follow_up(heal: Any, item: Any, subject: Any) -> bool:
    """Do this run's step for a Rule 10 ``recommend`` item. Always False: an alert is not an action on the
    fleet, and an ``info`` recommendation never resets the All Clear count (README "Alerts")."""
    if item.issue != ISSUE:
        return False
    p = heal.cfg.rule_params(item.issue, item.gpu)
    esc = heal.state.escalated.get(f"{item.gpu}/{item.issue}")
    alerted_s = esc.at if esc is not None and esc.since == item.since else None
    since_s = parse_iso(item.since).timestamp() if isinstance(item.since, str) else heal.now_s
    step = routing.followup(since_s, alerted_s, heal.now_s, tolerance_s=heal.tol,
                            verify_within_s=float(p["verify_within_s"]), escalate_after_s=float(p["escalate_after_s"]))
    audit_text = routing.AUDIT_TEXT.format(hours=float(p["escalate_after_s"]) / 3600)
    if not heal.apply:
        if step in (routing.Followup.ALERT, routing.Followup.AUDIT):
            heal.rec.doc(subject, "alert", audit_text if step is routing.Followup.AUDIT else item.reason, "planned")
        return False
    if alerted_s is None:  # the first run that sees it firing (or one that starts past 48 h)
        heal._escalate(subject, item.reason, [])
    if step is routing.Followup.NOT_VERIFIED:
        hours = float(p["verify_within_s"]) / 3600
        heal.rec.doc(subject, "alert", f"not verified: still misrouted {hours:g} h after the alert", "not-verified")
    if step is routing.Followup.AUDIT:
        run_id = heal._run_id()
        if heal.rec.queue(subject, "escalated", audit_text, run_id, [], 0, key=f"audit:{item.since}"):
            heal.rec.audit(run_id, subject, "alert", "escalated", "outcome", escalated=True,
                           extra={"reason": audit_text})
            heal.rec.doc(subject, "alert", audit_text, "escalated")
    return False
