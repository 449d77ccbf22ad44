"""An attempt's life inside the heal run: performed (:func:`act`: reserved and saved before anything
runs, its intent audited before), then judged by later runs from fresh data (:func:`judge`), and
escalations settled once their issue is gone (:func:`settle_escalations`). The transitions are
:mod:`gpuheal.core.verify`'s; this module performs what it returns on the :class:`Ledger`.

The audit trail gets two lines per attempt (issue 27 item 13; the spec's Audit Trail Format): its intent,
before anything runs (a kill mid-command leaves its trace), and one line for its outcome — at once when it
ends in its own run (failed, escalated), else when fresh data judges it (resolved, failed, superseded),
carrying what it did (steps, evidence, ``detected`` as acted on) kept on the attempt meanwhile. A
resolved line's ``verification`` is the reading that proved it, after its remedy's own proof held
(``Remedy.verify``; by default a real completion on the GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuheal.actions import asks
from gpuheal.actions.context import Context, Records
from gpuheal.actions.effects import Effects
from gpuheal.actions.ledger import Ledger
from gpuheal.actions.perform import describe
from gpuheal.actions.record import Subject
from gpuheal.clock import format_iso
from gpuheal.config.model import Config, EngineParams
from gpuheal.core import litellm_config, power, rebench, verify
from gpuheal.core.catalog import primary_action
from gpuheal.core.heal_state import Attempt
from gpuheal.core.issue import FIRED_STATES, Issue
from gpuheal.core.memory import Memory
from gpuheal.core.remedy import Execution, PlanItem, Proving, Rechecking, Result, completion_proof
from gpuheal.model import Observation

FAILED_VERIFICATION = {
    verify.WINDOW_PASSED: "verification window passed, issue still open",
    verify.STILL_BROKEN: "still broken at the first poll that could judge it (past the startup grace)",
}
OpenIssues = Mapping[tuple[str, str], Issue]


def act(ledger: Ledger, item: PlanItem, subject: Subject, cfg: Config, effects: Effects, records: Records) -> None:
    """Reserve, audit the intent, run (:func:`gpuheal.actions.execute.run_item`), audit the outcome."""
    from gpuheal.actions.execute import run_item

    if item.key in ledger.state.attempts:  # never repeat a reserved attempt
        ledger.rec.blocked(subject, primary_action(item.actions), f"attempt {item.key} already reserved")
        return
    run_id = ledger.run_id()
    verify_within_s = cfg.params_as(EngineParams, item.issue, item.gpu).verify_within_s
    attempt = verify.reserve(item, now_s=ledger.now_s, verify_within_s=verify_within_s, run_id=run_id)
    # Reserved and saved before anything runs: a kill after this line never repeats it.
    ledger.state = verify.book(ledger.state, attempt, item.restarts, ledger.now_s)
    ledger.save()
    extra = {"attempt": item.attempt_no, "actions": item.actions}
    ledger.rec.intent(run_id, subject, item.actions, extra, [describe(s, item.gpu, cfg) for s in item.steps])
    if item.alert_now:  # a state of its own: a later escalation of this occurrence (the fix failed) is news
        ledger.rec.queue(subject, "escalated", f"{item.issue}: {item.reason}; acting now", run_id, [],
                         ledger.attempts(subject), key=f"acting:{item.since}")
    ex = run_item(item, cfg, effects.run, effects.verify, ledger.rec.secrets, effects.litellm, effects.model_health,
                  now_s=ledger.now_s, records=records, prove=effects.prove)  # fmt: skip
    subject = Subject(subject.gpu, subject.issue, subject.since, {**subject.detected, **ex.found})
    _ask_rebench(ledger, subject, ex, run_id)
    ledger.rec.step_docs(subject, item.reason, ex)
    if any(s.ok and s.action == "restart-litellm" for s in ex.steps):  # circuit-breaker-status "last_reset"
        ledger.state = ledger.state.with_litellm_restart(ledger.now_s)
    changed = [s.effect for s in ex.steps if s.ok and s.effect]
    ledger.state = power.note_restore(verify.note_restore(ledger.state, item.gpu, changed), item.gpu, changed)
    ledger.state = litellm_config.note_restore(ledger.state, item.gpu, changed)
    attempt = verify.transition(attempt, verify.EXECUTION_EVENT[ex.result], ledger.now_s, ex.verification)
    if ex.result is Result.ACTED:  # its one outcome line is written when fresh data judges it (issue 27 item 13)
        ledger.state = ledger.state.with_attempt(replace(attempt, outcome=ledger.rec.keep(subject, ex)))
        ledger.save()  # kept at once: a run killed now still leaves it for that line
        return
    ledger.state = ledger.state.with_attempt(attempt)
    ledger.rec.outcome(run_id, subject, ex, extra)
    if ex.result is Result.ESCALATED:
        ledger.escalate(subject, ex.escalate_reason or "remediation escalated", ledger.tried(subject), run_id)


def _ask_rebench(ledger: Ledger, subject: Subject, ex: Execution, run_id: str) -> None:
    """A fix only a benchmark can prove asks for its verifying re-benchmark (core/rebench): answered by the
    GPU's next ``gpuheal bench``, against the baseline then, under this heal run's id."""
    if ex.rebench is None:
        return
    read = asks.load(ledger.store)
    ask = rebench.RebenchAsk(subject.gpu, subject.issue, ex.rebench.reason, ledger.now_s, attempt=run_id,
                             action=ex.rebench.action)  # fmt: skip
    asks.save(ledger.store, read.with_ask(ask), read)


def judge(
    ledger: Ledger, effects: Effects, cfg: Config, still_open: OpenIssues, hidden: set[tuple[str, str]],
    obs: Observation, readings: dict[str, Any], tol: float, records: Records,
    memory: Memory | None = None,
) -> None:
    """Judge the open attempts of earlier runs from this run's fresh data: resolved (only once its
    remedy's proof holds: :func:`prove`), failed (its window passed, still broken, or a re-benchmark
    disproved it), superseded — or, when its window passed and its remedy's ``recheck`` says the fix is
    still working, judged again one window later. ``obs``: this run's poll; ``readings``: its per-GPU
    document; ``memory``: the rules' memory after this run's poll, which ``recheck`` reads."""
    book = asks.load(ledger.store)
    for attempt in list(ledger.state.attempts.values()):
        issue = still_open.get((attempt.gpu, attempt.issue))
        event = verify.judge(attempt, issue, (attempt.gpu, attempt.issue) in hidden, ledger.now_s, tol)
        if event is None and attempt.status == verify.ACTED:  # a re-benchmark disproved the fix (core/rebench)
            event = verify.STILL_BROKEN if book.disproved(attempt.gpu, attempt.issue, attempt.run_id) else None
        if event is None:
            continue
        if event in FAILED_VERIFICATION and _rechecked(ledger, cfg, attempt, issue, memory or Memory(), tol):
            continue
        if event == verify.ISSUE_CLEARED:
            verdict = prove(ledger, effects, cfg, attempt, _proving(attempt, cfg, obs, readings, still_open), records)
            if not verdict.get("ok"):
                continue  # still pending: judged again next poll, until its window passes
            _resolved(ledger, attempt, verdict, readings)
            continue
        _judged(ledger, verify.transition(attempt, event, ledger.now_s), attempt, event, issue)


def prove(ledger: Ledger, effects: Effects, cfg: Config, attempt: Attempt, proving: Proving,
          records: Records) -> Mapping[str, Any]:  # fmt: skip
    """The remedy's own proof that its fix worked (``Remedy.verify``): by default a real completion on
    the GPU (:func:`~gpuheal.core.remedy.completion_proof`). A fleet attempt whose rule declares none
    (the registry refuses such a rule) is never resolved on its issue clearing alone."""
    remedy = ledger.remedies.get(attempt.issue)
    ctx = Context(cfg, attempt.gpu, attempt.issue, ledger.now_s, effects.run, ledger.rec.secrets, effects.litellm,
                  effects.model_health, effects.prove, records)  # fmt: skip
    if remedy is not None and remedy.verify is not None:
        return remedy.verify(proving, ctx)
    if attempt.gpu in cfg.aliases:
        return completion_proof(ctx)
    return {"ok": False, "error": f"{attempt.issue} declares no verify for a fix that has no GPU to complete on"}


def _proving(attempt: Attempt, cfg: Config, obs: Observation, readings: dict[str, Any],
             still_open: OpenIssues) -> Proving:  # fmt: skip
    from gpuheal.source_kinds import home

    def endpoint(alias: str) -> str | None:
        got = readings.get(alias)
        state = got.get("endpoint") if isinstance(got, dict) else None
        return state if isinstance(state, str) else None

    firing = frozenset(k for k, i in still_open.items() if i.state in FIRED_STATES)
    return Proving(attempt.gpu, attempt.issue, home(obs.source), obs.monitor_ok, {a: endpoint(a) for a in cfg.aliases},
                   firing)  # fmt: skip


def _resolved(ledger: Ledger, attempt: Attempt, verdict: Mapping[str, Any], readings: dict[str, Any]) -> None:
    """The attempt resolved: its one outcome line carries the reading that proved it under ``verification``
    (the spec's ``{"temp_c": 76, "after_s": 300}``), its remedy's proof and the MTTR (issue 20)."""
    proved = verify.proof(readings.get(attempt.gpu), verdict, format_iso(ledger.now),
                          verify.open_for_s(attempt, ledger.now_s))  # fmt: skip
    done = verify.transition(attempt, verify.ISSUE_CLEARED, ledger.now_s, proved)
    timing_s = verify.mttr(ledger.state, attempt, ledger.now_s)
    subject = Subject(attempt.gpu, attempt.issue, attempt.since)
    ledger.state = ledger.state.with_attempt(done)
    ledger.rec.verified(subject, attempt, proved, ledger.attempts(subject), timing_s, shown=proved)


def _rechecked(
    ledger: Ledger, cfg: Config, attempt: Attempt, issue: Issue | None, memory: Memory, tol: float
) -> bool:
    """Whether the remedy's ``recheck`` keeps a verifying attempt whose window passed: then it is judged
    again one window later (its ``verify_by`` moved on; audited ``pending`` with the reason), not failed."""
    remedy = ledger.remedies.get(attempt.issue)
    if remedy is None or remedy.recheck is None or attempt.status != verify.ACTED or issue is None:
        return False
    detected = issue.detected
    seen = Rechecking(attempt.gpu, attempt.issue, attempt.since, attempt.actions, attempt.started_at, detected,
                      memory, ledger.now_s, tol, cfg)  # fmt: skip
    why = remedy.recheck(seen)
    if why is None:
        return False
    again_s = ledger.now_s + cfg.params_as(EngineParams, attempt.issue, attempt.gpu).verify_within_s
    ledger.state = ledger.state.with_attempt(replace(attempt, verify_by=again_s))
    subject = Subject(attempt.gpu, attempt.issue, attempt.since, detected)
    primary = primary_action(attempt.actions)
    ledger.rec.audit(attempt.run_id or ledger.run_id(), subject, primary, "pending", "verification",
                     {"still_open_after_s": verify.open_for_s(attempt, ledger.now_s), "recheck": why},
                     extra={"attempt": attempt.n, "actions": list(attempt.actions)})  # fmt: skip
    ledger.rec.doc(subject, primary, why, "pending")
    return True


def _judged(ledger: Ledger, done: Attempt, attempt: Attempt, event: str, issue: Issue | None) -> None:
    """Record one attempt judged failed (its one outcome line, with what was still seen) or superseded."""
    seen = None if issue is None else issue.detected
    subject = Subject(attempt.gpu, attempt.issue, attempt.since, seen or {})
    if event in FAILED_VERIFICATION:
        why = {"still_open_after_s": verify.open_for_s(attempt, ledger.now_s), "seen": seen}
        ledger.rec.not_verified(subject, attempt, why, FAILED_VERIFICATION[event])
    elif event == verify.NEW_OCCURRENCE:  # the new occurrence gets attempts of its own
        ledger.rec.superseded(subject, attempt, None if issue is None else issue.since)
    ledger.state = ledger.state.with_attempt(done)


def settle_escalations(ledger: Ledger, still_open: set[tuple[str, str]]) -> None:
    """Escalations whose issue is gone: lifted, and announced as resolved unless an attempt already was."""
    for gpu, issue, since, notify in verify.settled_escalations(ledger.state, still_open):
        ledger.state = ledger.state.with_escalation(f"{gpu}/{issue}", None)
        if notify:  # else the attempt's own resolution already queued the notice
            subject = Subject(gpu, issue, since)
            ledger.rec.audit(ledger.run_id(), subject, "alert", "resolved", "verification")
            ledger.queue(subject, "resolved", "resolved after escalation", None, [])
