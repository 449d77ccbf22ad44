"""An attempt's life inside the heal run: performed (:func:`act`: reserved and saved before anything
runs, audited before and after), then judged by later runs from fresh data (:func:`judge`), and
escalations settled once their issue is gone (:func:`settle_escalations`). The transitions are
:mod:`gpuheal.core.verify`'s; this module performs what it returns on the :class:`Ledger`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuheal.actions.context import Records
from gpuheal.actions.effects import Effects
from gpuheal.actions.ledger import Ledger
from gpuheal.actions.perform import describe
from gpuheal.actions.record import Subject
from gpuheal.clock import format_iso
from gpuheal.config.model import Config
from gpuheal.core import litellm_config, power, rebench, verify
from gpuheal.core.catalog import primary_action
from gpuheal.core.heal_state import Attempt
from gpuheal.core.memory import Memory
from gpuheal.core.plan import PlanItem
from gpuheal.core.remedy import Execution, Rechecking
from gpuheal.state import files

FAILED_VERIFICATION = {
    verify.WINDOW_PASSED: "verification window passed, issue still open",
    verify.STILL_BROKEN: "still broken at the first poll that could judge it (past the startup grace)",
}
OpenIssues = Mapping[tuple[str, str], dict[str, Any]]


def act(ledger: Ledger, item: PlanItem, subject: Subject, cfg: Config, effects: Effects, records: Records) -> None:
    """Reserve, audit the intent, run (:func:`gpuheal.actions.execute.run_item`), audit the outcome."""
    from gpuheal.actions.execute import run_item

    if item.key in ledger.state.attempts:  # never repeat a reserved attempt
        ledger.rec.blocked(subject, primary_action(item.actions), f"attempt {item.key} already reserved")
        return
    run_id = ledger.run_id()
    params = cfg.rule_params(item.issue, item.gpu if item.gpu in cfg.aliases else None)
    attempt = verify.reserve(item, now_s=ledger.now_s, verify_within_s=float(params["verify_within_s"]), run_id=run_id)
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
    ledger.state = ledger.state.with_attempt(attempt)
    ledger.rec.outcome(run_id, subject, ex, extra)
    if ex.result == "escalated":
        ledger.escalate(subject, ex.escalate_reason or "remediation escalated", ledger.tried(subject), run_id)


def _ask_rebench(ledger: Ledger, subject: Subject, ex: Execution, run_id: str) -> None:
    """A fix only a benchmark can prove: the GPU is marked for its verifying re-benchmark (core/rebench)."""
    if ex.rebench is None:
        return
    doc = rebench.marked(ledger.store.read(files.REBENCH, {}), subject.gpu, subject.issue, ex.rebench.reason,
                         ledger.now_s, run_id, ex.rebench.action)  # fmt: skip
    ledger.store.write(files.REBENCH, doc)


def judge(
    ledger: Ledger, effects: Effects, cfg: Config, still_open: OpenIssues, hidden: set[tuple[str, str]],
    readings: dict[str, Any], tol: float, memory: Memory | None = None,
) -> None:
    """Judge the open attempts of earlier runs from this run's fresh data: resolved (only after a real
    completion), failed (its window passed, still broken, or a re-benchmark disproved it), superseded —
    or, when its window passed and its remedy's ``recheck`` says the fix is still working, judged again
    one window later (``memory``: the rules' memory after this run's poll, which the hook reads)."""
    book = ledger.store.read(files.REBENCH, {})
    for attempt in list(ledger.state.attempts.values()):
        issue = still_open.get((attempt.gpu, attempt.issue))
        event = verify.judge(attempt, issue, (attempt.gpu, attempt.issue) in hidden, ledger.now_s, tol)
        if event is None and attempt.status == verify.VERIFYING:  # a re-benchmark disproved the fix (core/rebench)
            event = verify.STILL_BROKEN if rebench.disproved(book, attempt.gpu, attempt.issue, attempt.run_id) else None
        if event is None:
            continue
        if event in FAILED_VERIFICATION and _rechecked(ledger, cfg, attempt, issue, memory or Memory(), tol):
            continue
        found = verify.resolution(attempt, ledger.now_s) if event == verify.ISSUE_CLEARED else None
        if found is not None and attempt.gpu in cfg.aliases:
            completion = effects.prove(attempt.gpu)  # resolved only after a real completion
            if not completion.get("ok"):
                continue  # still pending: judged again next poll, until its window passes
            found = {**found, "completion_s": completion["completion_s"], "proof_tok_s": completion["gen_tok_s"]}
        _judged(ledger, verify.transition(attempt, event, ledger.now_s, found), event, issue, readings)


def _rechecked(
    ledger: Ledger, cfg: Config, attempt: Attempt, issue: dict[str, Any] | None, memory: Memory, tol: float
) -> bool:
    """Whether the remedy's ``recheck`` keeps a verifying attempt whose window passed: then it is judged
    again one window later (its ``verify_by`` moved on; audited ``pending`` with the reason), not failed."""
    remedy = ledger.remedies.get(attempt.issue)
    if remedy is None or remedy.recheck is None or attempt.status != verify.VERIFYING or issue is None:
        return False
    found = issue.get("detected")
    detected: dict[str, Any] = found if isinstance(found, dict) else {}
    seen = Rechecking(attempt.gpu, attempt.issue, attempt.since, attempt.actions, attempt.started_at, detected,
                      memory, ledger.now_s, tol, cfg)  # fmt: skip
    why = remedy.recheck(seen)
    if why is None:
        return False
    params = cfg.rule_params(attempt.issue, attempt.gpu if attempt.gpu in cfg.aliases else None)
    again_s = ledger.now_s + float(params["verify_within_s"])
    ledger.state = ledger.state.with_attempt(replace(attempt, verify_by=again_s))
    subject = Subject(attempt.gpu, attempt.issue, attempt.since, detected)
    primary = primary_action(attempt.actions)
    ledger.rec.audit(attempt.run_id or ledger.run_id(), subject, primary, "pending", "verification",
                     {"still_open_after_s": verify.open_for_s(attempt, ledger.now_s), "recheck": why},
                     extra={"attempt": attempt.n, "actions": list(attempt.actions)})  # fmt: skip
    ledger.rec.doc(subject, primary, why, "pending")
    return True


def _judged(
    ledger: Ledger, attempt: Attempt, event: str, issue: dict[str, Any] | None, readings: dict[str, Any]
) -> None:
    """Record one judged attempt: resolved with the reading that proved it and its MTTR, or failed."""
    subject = Subject(attempt.gpu, attempt.issue, attempt.since, (issue or {}).get("detected") or {})
    if event == verify.ISSUE_CLEARED:
        # the resolved record carries the reading that proved the fix and the MTTR (issue 20)
        proved = verify.proof(readings.get(attempt.gpu), attempt.verification, format_iso(ledger.now))
        subject = Subject(attempt.gpu, attempt.issue, attempt.since, proved)
        timing_s = verify.mttr(ledger.state, attempt, ledger.now_s)
        run_id = attempt.run_id or ledger.run_id()
        ledger.rec.verified(run_id, subject, attempt, ledger.attempts(subject), timing_s)
    elif event in FAILED_VERIFICATION:  # (superseded: the new occurrence gets attempts of its own)
        why = {"still_open_after_s": verify.open_for_s(attempt, ledger.now_s),
               "detected": (issue or {}).get("detected")}  # fmt: skip
        ledger.rec.not_verified(attempt.run_id or ledger.run_id(), subject, attempt, why, FAILED_VERIFICATION[event])
    ledger.state = ledger.state.with_attempt(attempt)


def settle_escalations(ledger: Ledger, still_open: set[tuple[str, str]]) -> None:
    """Escalations whose issue is gone: lifted, and announced as resolved unless an attempt already was."""
    for gpu, issue, since, notify in verify.settled_escalations(ledger.state, still_open):
        ledger.state = ledger.state.with_escalation(f"{gpu}/{issue}", None)
        if notify:  # else the attempt's own resolution already queued the notice
            subject = Subject(gpu, issue, since)
            ledger.rec.audit(ledger.run_id(), subject, "alert", "resolved", "verification")
            ledger.queue(subject, "resolved", "resolved after escalation", None, [])
