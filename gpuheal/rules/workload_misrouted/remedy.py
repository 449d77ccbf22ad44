"""Rule 10's follow-through (issue 22, item 6): what ``heal`` says about a misrouted GPU, run after run.
The ``follow_up`` hook of ``REMEDY`` (:mod:`gpuheal.core.remedy`). Pure: what it sees in, steps out.

Spec Rule 10: "Alert if any GPU is handling workload outside its designated role … Verify: each GPU's
request pattern matches its designated role within 24h. Escalate: if role mismatch persists >48h →
agent alias audit needed." So, with ``--apply``:

- the first run that sees the incident firing alerts once (an escalation held until it resolves, so
  its resolution is announced; grouped with the same issue on other GPUs by ``core/alerts``);
- 24 h (``verify_within_s``) after that alert, still misrouted, the run's actions say "not verified";
- past 48 h (``escalate_after_s``) since the incident began, a message of its own (its own alert state,
  so it is not deduplicated against the first) asks for the agent alias audit, audited once.

A dry run shows the alert and the audit it would send. No reminders (``REMEDY.remind``): one alert per
incident, then the audit.
"""

from __future__ import annotations

from enum import StrEnum

from gpuheal.clock import parse_iso
from gpuheal.core.remedy import Escalate, Followed, FollowUp, Note, Notice

AUDIT_TEXT = ("role mismatch persists more than {hours:g} h: agent alias audit needed: check which model alias "
              "each agent uses against the GPU roles (stable aliases, Lesson L6)")


class Followup(StrEnum):
    """What ``heal --apply`` does about an open Rule 10 incident this run."""

    ALERT = "alert"  # first run that sees it firing: one alert per incident (grouped by core/alerts)
    WAITING = "waiting"  # alerted, inside the spec's 24 h to match its role again
    NOT_VERIFIED = "not-verified"  # 24 h after the alert and still misrouted
    AUDIT = "audit"  # open more than 48 h: "agent alias audit needed" (its own message, once)


def followup(since_s: float, alerted_s: float | None, now_s: float, *, verify_within_s: float,
             escalate_after_s: float, tolerance_s: float) -> Followup:
    """The step for an incident open since ``since_s`` (its first firing poll), alerted at ``alerted_s``
    (``None``: not yet). Durations compare with the clock's tolerance (cron starts a second or two late):
    "persists > 48 h" is more than 48 h less the tolerance."""
    if now_s - since_s > escalate_after_s - tolerance_s:
        return Followup.AUDIT
    if alerted_s is None:
        return Followup.ALERT
    if now_s - alerted_s > verify_within_s - tolerance_s:
        return Followup.NOT_VERIFIED
    return Followup.WAITING


def follow_up(f: Followed) -> tuple[FollowUp, ...]:
    """This run's steps for one misrouted GPU (never an action on the fleet: an ``info`` recommendation
    never resets the All Clear count, README "Alerts")."""
    from gpuheal.rules.workload_misrouted import Params  # the rule's own record (it imports this module)

    p = f.cfg.params_as(Params, f.issue, f.gpu)
    verify_within_s, escalate_after_s = p.verify_within_s, p.escalate_after_s
    since_s = parse_iso(f.since).timestamp() if isinstance(f.since, str) else f.now_s
    step = followup(since_s, f.escalated_at_s, f.now_s, tolerance_s=f.tol_s, verify_within_s=verify_within_s,
                    escalate_after_s=escalate_after_s)
    audit_text = AUDIT_TEXT.format(hours=escalate_after_s / 3600)
    if not f.apply:
        shown = {Followup.ALERT: f.reason, Followup.AUDIT: audit_text}.get(step)
        return (Note(shown, "planned"),) if shown is not None else ()
    out: list[FollowUp] = []
    if f.escalated_at_s is None:  # the first run that sees it firing (or one that starts past 48 h)
        out.append(Escalate(f.reason))
    if step is Followup.NOT_VERIFIED:
        hours = verify_within_s / 3600
        out.append(Note(f"not verified: still misrouted {hours:g} h after the alert", "not-verified"))
    if step is Followup.AUDIT:
        out.append(Notice(audit_text, f"audit:{f.since}"))
    return tuple(out)
