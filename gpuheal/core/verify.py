"""The life of a remediation attempt, as a transition table (issue 10, item 1). Pure; ``now_s``
is an argument.

Design, "An attempt is reserved before it runs", and the spec's "verify, escalate after N
failures"::

    (reserve) ─► running ─executed─► acted ─issue-cleared─► resolved
                    │                  ├─new-occurrence─► superseded
                    │                  └─window-passed──► failed ─operator-clear─► cleared
                    ├─exec-failed─► failed
                    └─exec-escalated─► escalated ─operator-clear─► cleared

``running`` is the reserved state: the attempt is saved under its deterministic key *before* its
commands run, so a run killed mid-command leaves it ``running`` and the next run judges it from
fresh data (the same three judgements as ``acted``) instead of repeating it. ``acted`` (:data:`ACTED`): its
steps ran and passed their own checks, and fresh data will judge it — stored as ``"pending"``, the
word earlier releases wrote (``heal-state.json``), and the only meaning that word has here; its issue is
reported ``verifying`` meanwhile (``core/issue.VERIFYING``, the same fact from the issue's side). Written the way h11
writes its ``_SWITCH_*`` tables: every allowed move is one line of :data:`TRANSITIONS`; any other
is a :class:`BadTransition` (a programming error, never data).

The judgements that need fresh data (:func:`judge`) and the other across-run decisions of
``heal --apply`` — which escalations settled (:func:`settled_escalations`), which GPUs stayed
cool long enough to get their load back (:func:`cooldown`) — are here too, so that
:mod:`gpuheal.steps.heal` only performs what they return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpuheal.core import timing
from gpuheal.core.catalog import MITIGATIONS, SERVICE_OF
from gpuheal.core.heal_state import Attempt, HealState, Mitigation
from gpuheal.core.issue import FIRING, Issue
from gpuheal.core.remedy import PlanItem, Result

if TYPE_CHECKING:
    from gpuheal.config.model import Config
    from gpuheal.model import Observation

# states (the stored ``status`` strings)
RUNNING = "running"
ACTED = "pending"  # executed, judged by fresh data (the stored word; contract "Issue state after a remediation")
RESOLVED = "resolved"
FAILED = "failed"
SUPERSEDED = "superseded"
ESCALATED = "escalated"
OPERATOR_CLEARED = "cleared"  # an operator cleared a failed or escalated attempt (the stored word)
OPEN = frozenset({RUNNING, ACTED})
FAILURES = frozenset({FAILED, ESCALATED})  # count toward the rule's escalate_after_failures

# events
EXECUTED = "executed"  # its commands ran and their own checks passed: wait for fresh data
EXEC_FAILED = "exec-failed"  # a command failed, or the restart's own verification did
EXEC_ESCALATED = "exec-escalated"  # what it found needs the humans (L1, an unknown VRAM process)
ISSUE_CLEARED = "issue-cleared"
NEW_OCCURRENCE = "new-occurrence"  # the issue cleared and came back: a new ``since``
WINDOW_PASSED = "window-passed"  # still open after verify_by
STILL_BROKEN = "still-broken"  # a poll that may judge it (past the startup grace) saw it still broken
OPERATOR_CLEAR = "operator-clear"  # `gpuheal heal --clear ALIAS/ISSUE`

TRANSITIONS: dict[tuple[str, str], str] = {
    (RUNNING, EXECUTED): ACTED,
    (RUNNING, EXEC_FAILED): FAILED,
    (RUNNING, EXEC_ESCALATED): ESCALATED,
    (RUNNING, ISSUE_CLEARED): RESOLVED,
    (RUNNING, NEW_OCCURRENCE): SUPERSEDED,
    (RUNNING, WINDOW_PASSED): FAILED,
    (ACTED, ISSUE_CLEARED): RESOLVED,
    (ACTED, NEW_OCCURRENCE): SUPERSEDED,
    (ACTED, WINDOW_PASSED): FAILED,
    (ACTED, STILL_BROKEN): FAILED,
    (FAILED, OPERATOR_CLEAR): OPERATOR_CLEARED,
    (ESCALATED, OPERATOR_CLEAR): OPERATOR_CLEARED,
}

# The executor's result of one attempt (core/remedy.Result) -> its event.
EXECUTION_EVENT = {Result.ACTED: EXECUTED, Result.FAILED: EXEC_FAILED, Result.ESCALATED: EXEC_ESCALATED}


class BadTransition(ValueError):
    """An event the attempt's state does not allow."""


def reserve(item: PlanItem, *, now_s: float, verify_within_s: float, run_id: str) -> Attempt:
    """The attempt of an ``act`` plan item, ``running`` from the moment it is saved."""
    return Attempt(
        key=item.key,
        gpu=item.gpu,
        issue=item.issue,
        since=item.since,
        n=item.attempt_no,
        actions=tuple(item.actions),
        status=RUNNING,
        started_at=now_s,
        verify_by=now_s + verify_within_s,
        run_id=run_id,
    )


def book(state: HealState, attempt: Attempt, restarts_gpu: bool, now_s: float) -> HealState:
    """``state`` with ``attempt`` reserved and everything it will do counted before it runs: the
    GPU's restart budget, the shared services' budgets, and the load-side mitigations to undo
    later (a run killed mid-command must still leave the note that makes a later run restore)."""
    restarts = dict(state.restarts)
    if restarts_gpu and attempt.gpu != "fleet":
        restarts[attempt.gpu] = (*restarts.get(attempt.gpu, ()), now_s)
    services = dict(state.service_restarts)
    for service in sorted({SERVICE_OF[a] for a in attempt.actions if a in SERVICE_OF}):
        services[service] = (*services.get(service, ()), now_s)
    state = replace(state.with_attempt(attempt), restarts=restarts, service_restarts=services)
    shed = [a for a in attempt.actions if a in MITIGATIONS]
    if shed and attempt.gpu != "fleet":
        active = state.active.get(attempt.gpu) or Mitigation((), attempt.issue)
        actions = (*active.actions, *(a for a in shed if a not in active.actions))
        state = state.with_mitigation(attempt.gpu, replace(active, actions=actions))
    return state


def transition(attempt: Attempt, event: str, now_s: float, verification: dict[str, Any] | None = None) -> Attempt:
    """``attempt`` after ``event`` at ``now_s``; ``verification`` (when given) replaces its record."""
    new = TRANSITIONS.get((attempt.status, event))
    if new is None:
        raise BadTransition(f"attempt {attempt.key}: {event!r} is not allowed while {attempt.status!r}")
    changes: dict[str, Any] = {"status": new}
    if new not in OPEN:
        changes["outcome"] = None  # written with its one outcome line: not kept for the week the attempt is
    if verification is not None:
        changes["verification"] = verification
    if event in (EXEC_FAILED, EXEC_ESCALATED):
        changes["finished_at"] = now_s
    return replace(attempt, **changes)


def judge(
    attempt: Attempt, issue: Issue | None, hidden: bool, now_s: float, tol: float = timing.TOLERANCE_S
) -> str | None:
    """The event this run's fresh data gives an open attempt; ``None``: nothing new is known.

    ``issue`` is the attempt's (gpu, issue) as open now (``None`` when it cleared); ``hidden``: it
    is inhibited (its data source is down) — still open, only not visible, so it is judged when
    the data is back, never "resolved" on the absence of data. ``verify_by`` is passed in polls
    (core/timing, ``tol``): a poll a second early or late judges the attempt at the same poll.
    """
    if attempt.status not in OPEN or hidden:
        return None
    if issue is None:
        return ISSUE_CLEARED
    if issue.since != attempt.since:
        return NEW_OCCURRENCE
    if attempt.status == ACTED and issue.state == FIRING:
        # The engine reports the issue of a pending attempt ``verifying`` until a poll from the
        # attempt's judgement point (past the startup grace after a GPU restart, else verify_by)
        # saw it still broken; ``firing`` means that poll came (contract "Issue state after a
        # remediation": firing again, and the attempt failed).
        return STILL_BROKEN
    if timing.past(now_s, attempt.verify_by if attempt.verify_by is not None else 0.0, tol):
        return WINDOW_PASSED
    return None


# the readings of a GPU that say a fix worked (the spec's resolved record: ``temp_c: 76``, the completion)
PROOF_FIELDS = ("temp_c", "vram_used_mb", "util_pct", "power_w", "power_limit_w", "endpoint", "metrics", "slots",
                "n_decode_total", "requests_processing", "failures_60s", "requests_60s")


def mttr(state: HealState, attempt: Attempt, now_s: float) -> dict[str, float]:
    """Time to detect and to resolve one occurrence (issue 20), in seconds from its onset
    (``since``): detected = its first attempt (acted on as it fired), resolved = now. Empty when the
    onset is not known."""
    from gpuheal.clock import parse_iso

    try:
        since_s = parse_iso(attempt.since).timestamp() if attempt.since else None
    except ValueError:
        since_s = None
    if since_s is None or now_s < since_s:
        return {}
    starts = [a.started_at for a in state.attempts.values()
              if (a.gpu, a.issue, a.since) == (attempt.gpu, attempt.issue, attempt.since) and a.started_at is not None]
    out = {"time_to_resolve_s": round(now_s - since_s, 1)}
    if starts:
        out["time_to_detect_s"] = round(max(0.0, min(starts) - since_s), 1)
    return out


def proof(reading: dict[str, Any] | None, verdict: Mapping[str, Any] | None, at: str, after_s: int) -> dict[str, Any]:
    """The resolved record's ``verification`` (the spec's Audit Trail Format: ``{"temp_c": 76, "after_s":
    300}``): this poll's values of the GPU, the source and request each came from (issue 19: its
    ``provenance``, cut to the values shown), how long after the fix, and the remedy's own proof
    (``verdict``: the real completion, Rule 6's LiteLLM health, Rule 7's monitor and sidecars)."""
    out: dict[str, Any] = {"at": at, "after_s": after_s}
    if isinstance(reading, dict):
        out.update({k: reading[k] for k in PROOF_FIELDS if reading.get(k) is not None})
        origins = reading.get("provenance")
        if isinstance(origins, dict):
            shown = {r: [k for k in keys if k in out] for r, keys in origins.items() if isinstance(keys, list)}
            if any(shown.values()):
                out["provenance"] = {r: keys for r, keys in shown.items() if keys}
    out.update({k: v for k, v in (verdict or {}).items() if k != "ok" and v is not None})
    return out


def open_for_s(attempt: Attempt, now_s: float) -> int:
    return round(now_s - (attempt.started_at if attempt.started_at is not None else now_s))


def settled_escalations(state: HealState, still_open: set[tuple[str, str]]) -> list[tuple[str, str, str | None, bool]]:
    """Escalations whose issue is no longer open: ``(gpu, issue, since, notify)``. ``notify`` is
    False when a resolved attempt of that occurrence already queued the "resolved" notice."""
    out = []
    for key, esc in state.escalated.items():
        gpu, _, issue = key.partition("/")
        if (gpu, issue) in still_open:
            continue
        resolved = any(
            a.status == RESOLVED and a.gpu == gpu and a.issue == issue and a.since == esc.since
            for a in state.attempts.values()
        )
        out.append((gpu, issue, esc.since, not resolved))
    return out


def clear(state: HealState, gpu: str, issue: str, now_s: float) -> tuple[HealState, bool]:
    """``--clear ALIAS/ISSUE``: lift the escalation; its failed attempts no longer count."""
    found = f"{gpu}/{issue}" in state.escalated
    state = state.with_escalation(f"{gpu}/{issue}", None)
    for a in state.attempts.values():
        if a.gpu == gpu and a.issue == issue and a.status in FAILURES:
            state = state.with_attempt(transition(a, OPERATOR_CLEAR, now_s))
    return state, found


def note_restore(state: HealState, alias: str, effects: list[dict[str, Any]]) -> HealState:
    """Remember the value a built-in LiteLLM shed found before its first change, so restore-load
    puts back exactly that (issue 11); a later shed of the same mitigation never overwrites it."""
    m = state.active.get(alias)
    if m is None or m.restore is not None:
        return state
    for effect in effects:
        if effect.get("before") is not None and "model_id" in effect:  # a LiteLLM change (not a power cap)
            restore = (str(effect["model_id"]), str(effect["field"]), float(effect["before"]))
            return state.with_mitigation(alias, replace(m, restore=restore))
    return state


@dataclass(frozen=True)
class Restore:
    """A GPU whose load-side mitigation is due to be undone."""

    alias: str
    mitigation: Mitigation


def cooldown(
    state: HealState,
    hot: set[str],
    known: set[str],
    now_s: float,
    restore_after_s: float,
    gpu_filter: str | None = None,
    tol: float = timing.TOLERANCE_S,
    paused: Mapping[str, str] | None = None,
) -> tuple[HealState, list[Restore]]:
    """Hysteresis on the undo: a mitigated GPU gets its load back only after it stayed cool for
    ``restore_after_s`` (or the restored load heats it straight back and the issue flaps). A hot
    GPU starts its cool-down over; a paused (``gpuheal pause``, or ``paused``: the GPUs the config
    pauses) or unknown GPU waits. The due ones leave ``active``.
    "Cool for ``restore_after_s``" is counted in polls (core/timing, ``tol``), as the rules' holds are."""
    due: list[Restore] = []
    for alias, mitigation in state.active.items():
        if gpu_filter and alias != gpu_filter:
            continue
        if alias in hot:
            state = state.with_mitigation(alias, replace(mitigation, cool_since=None))
            continue
        if state.paused_reason(alias) or alias in (paused or {}) or alias not in known:
            continue
        cool_since = mitigation.cool_since
        if cool_since is None:
            cool_since = now_s
            mitigation = replace(mitigation, cool_since=cool_since)
            state = state.with_mitigation(alias, mitigation)
        if timing.less_than(now_s - cool_since, restore_after_s, tol):
            continue
        state = state.with_mitigation(alias, None)
        due.append(Restore(alias, mitigation))
    return state, due


def present_verifying(
    health: dict[str, Any], issues: Sequence[Issue], obs: Observation, state: HealState, cfg: Config, now_s: float
) -> dict[str, Any]:
    """``health`` (whose issues are ``issues``) with the issues whose remediation ran at ``now_s`` and
    passed its own checks as ``verifying``, and the status following (contract "Issue state after a
    remediation"; later runs get the same from the engine)."""
    from gpuheal.core.health import derive_status
    from gpuheal.core.issue import verifying_issue
    from gpuheal.core.view import Restarts

    marks = Restarts.from_heal_state(state, cfg.heal.startup_grace_s).verifying
    shown = []
    for issue in issues:
        v = marks.get(issue.key)
        fresh = v is not None and v.acted_s == now_s and v.since == issue.since
        shown.append(verifying_issue(issue, v) if v is not None and fresh and issue.state == FIRING else issue)
    return {**health, "issues": [i.to_json() for i in shown], "status": derive_status(obs, shown)}
