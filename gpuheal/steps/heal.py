"""``gpuheal heal``: check, then plan; with ``--apply`` act, verify, audit, queue alerts.

Dry-run by default: without ``--apply`` the plan is printed (what, where, why, the exact command)
and the heal state, the audit trail and the alert queue are not touched. With ``--apply`` each
run, in order (:meth:`Heal.run`, and the methods below it in the same order):

1. judges the open attempts of earlier runs from this run's fresh data (:mod:`gpuheal.core.verify`:
   resolved when the issue cleared, failed when its window passed, superseded by a new occurrence);
2. plans the firing issues with every guard (:mod:`gpuheal.core.plan`);
3. executes each ``act`` item (:mod:`gpuheal.actions.execute`), escalates the rest;
4. undoes load-side mitigations of GPUs that stayed cool (``restore-load``);
5. (Rule 7.3's direct smi probes while gpu-monitor is down are part of the poll: sources/sense);
6. counts the clean cycle (the All Clear on every Nth) and saves.

The decisions are the pure core's; this module loads, calls the core, performs what it returns,
records it (:mod:`gpuheal.actions.record`) and saves.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from gpuheal.actions import leak
from gpuheal.actions.effects import Effects
from gpuheal.actions.findings import with_findings
from gpuheal.actions.record import Recorder, Subject, health_doc
from gpuheal.actions.rule4 import rebench_verdict
from gpuheal.clock import format_iso
from gpuheal.core import alerts, timing, verify
from gpuheal.core.actions import LiteLLMUpdate
from gpuheal.core.catalog import REMEDIES, THERMAL, primary_action
from gpuheal.core.heal_state import Escalation, HealState
from gpuheal.core.plan import NoRestore, PlanItem, plan, restore_action
from gpuheal.state import files
from gpuheal.steps.heal_routing import follow_up

FAILED_VERIFICATION = {
    verify.WINDOW_PASSED: "verification window passed, issue still open",
    verify.STILL_BROKEN: "still broken at the first poll that could judge it (past the startup grace)",
}
ACTIONABLE = ("warning", "critical")  # contract "Alerts": what resets the All Clear count


class Heal:
    """One heal run. Holds the state documents while the run works on them."""

    def __init__(self, cfg, store, now: datetime, apply: bool, runner=None, verify=None) -> None:
        from gpuheal.credentials import secrets_for

        self.cfg, self.store, self.now, self.now_s, self.apply = cfg, store, now, now.timestamp(), apply
        self.state = HealState.from_json(store.read(files.HEAL, {}))
        self.secrets = secrets_for(cfg)
        self.rec = Recorder(store, now, self.secrets, alerts.AlertQueue.from_json(store.read(files.ALERTS, {})))
        self.effects = Effects(cfg, runner, verify)
        self.warnings: list[str] = []
        self.tol = timing.TOLERANCE_S  # until this run's evaluation says the history's own
        self.onsets: dict = {}  # Rule 2: each open vram-leak's per-process VRAM snapshot at its onset

    def run(self, gpu_filter: str | None, issue_filter: str | None) -> dict[str, Any]:
        from gpuheal.steps import check

        result = self._check(gpu_filter)
        open_now = {(i["gpu"], i["issue"]): i for i in result.issues}
        # An inhibited issue (model-stuck while gpu-monitor is down) is still open, only hidden:
        # never judged resolved on the absence of data, and a hidden thermal issue keeps the load shed.
        hidden = {(i["gpu"], i["issue"]): i for i in result.evaluation.inhibited}
        still_open = {**hidden, **open_now}
        health, acted = dict(result.health), False
        self.tol = result.evaluation.tolerance_s  # count time as the rules did (core/timing, issue 9)
        try:
            self.onsets = leak.onsets(self.store)  # Rule 2: the per-process snapshots at each leak's onset
            if self.apply:  # 1. judge earlier attempts from this run's data
                self.onsets = leak.track(self.store, still_open, self.cfg, self.effects.run, self.now_s, self.secrets)
                self._judge_attempts(still_open, set(hidden), health.get("gpus") or {})
                self._settle_escalations(set(still_open))
            waits = leak.waits(self.onsets, result.issues, self.cfg, self.now_s, self.tol)
            for item in plan(result.issues, self.state, self.cfg, self.now_s, gpu_filter, issue_filter, tol=self.tol,
                             waits=waits):
                acted |= self._handle(item)  # 2-3. plan, then show (dry-run) or act
            if self.apply:  # 4. give cooled GPUs their load back
                acted |= self._undo_mitigations(set(still_open), gpu_filter)
        finally:
            self.effects.close()
        if self.apply:  # 6. count the clean cycle, save
            actionable = [i for i in result.issues if i.get("severity") in ACTIONABLE]  # never an info advice
            self.rec.count_clean_cycle(not actionable and not acted, self.cfg.alerts.all_clear_every)
            self.state = self.state.pruned(self.now_s, verify.OPEN)
            self._save()
            self.store.write(files.ALERTS, self.rec.alerts.to_json())
            # what this run fixed and proved reads "verifying" in this run's document already
            health = verify.present_verifying(health, result.obs, self.state, self.cfg, self.now_s)
        check.save_health(self.store, health_doc(health, self.state, self.rec, self.cfg, self.now_s, self.apply))
        self.warnings = list(result.obs.warnings)
        return health

    def _check(self, gpu_filter: str | None):
        """This run's fresh data: ``check``'s poll (smi sensing over SSH shares the run's logins)."""
        from gpuheal.errors import GpuhealError
        from gpuheal.steps import check

        if gpu_filter and gpu_filter not in self.cfg.aliases and gpu_filter != "fleet":
            raise GpuhealError(f"--gpu {gpu_filter!r}: no such alias (known: {', '.join(self.cfg.aliases)})")
        try:  # the pool opens a connection only if smi sensing (or its Rule 7.3 fallback) asks for one
            return check.run(self.cfg, self.store, self.now, transports=self.effects.sensing())
        except BaseException:
            self.effects.close()
            raise

    # ------------------------------------------------------------------ 1. judge earlier attempts
    def _judge_attempts(self, still_open: dict, hidden: set, readings: dict) -> None:
        for attempt in list(self.state.attempts.values()):
            issue = still_open.get((attempt.gpu, attempt.issue))
            event = verify.judge(attempt, issue, (attempt.gpu, attempt.issue) in hidden, self.now_s, self.tol)
            event = event or rebench_verdict(self.store, attempt)  # Rule 4: a re-benchmark disproved the fix
            if event is None:
                continue
            found = verify.resolution(attempt, self.now_s) if event == verify.ISSUE_CLEARED else None
            if found is not None and attempt.gpu in self.cfg.aliases:
                completion = self.effects.prove(attempt.gpu)  # resolved only after a real completion
                if not completion.get("ok"):
                    continue  # still pending: judged again next poll, until its window passes
                found = {**found, "completion_s": completion["completion_s"], "proof_tok_s": completion["gen_tok_s"]}
            attempt = verify.transition(attempt, event, self.now_s, found)
            subject = Subject(attempt.gpu, attempt.issue, attempt.since, (issue or {}).get("detected") or {})
            if event == verify.ISSUE_CLEARED:
                # the resolved record carries the reading that proved the fix and the MTTR (issue 20)
                proved = verify.proof(readings.get(attempt.gpu), found, format_iso(self.now))
                subject = Subject(attempt.gpu, attempt.issue, attempt.since, proved)
                timing_s = verify.mttr(self.state, attempt, self.now_s)
                self.rec.verified(attempt.run_id or self._run_id(), subject, attempt, self._attempts(subject), timing_s)
            elif event in FAILED_VERIFICATION:  # (superseded: the new occurrence gets attempts of its own)
                why = {"still_open_after_s": verify.open_for_s(attempt, self.now_s), "detected": issue.get("detected")}
                text = FAILED_VERIFICATION[event]
                self.rec.not_verified(attempt.run_id or self._run_id(), subject, attempt, why, text)
            self.state = self.state.with_attempt(attempt)

    def _settle_escalations(self, still_open: set) -> None:
        for gpu, issue, since, notify in verify.settled_escalations(self.state, still_open):
            self.state = self.state.with_escalation(f"{gpu}/{issue}", None)
            if notify:  # else the attempt's own resolution already queued the notice
                subject = Subject(gpu, issue, since)
                self.rec.audit(self._run_id(), subject, "alert", "resolved", "verification")
                self._queue(subject, "resolved", "resolved after escalation", None, [])

    # ------------------------------------------------------------------ 2-3. plan items
    def _handle(self, item: PlanItem) -> bool:
        """Show or perform one plan item; True if anything was acted on."""
        subject = Subject(item.gpu, item.issue, item.since, item.detected)
        if item.decision == "recommend":  # Rule 10's follow-through (issue 22): steps/heal_routing.py
            return follow_up(self, item, subject)
        if item.decision == "blocked":
            remedy = REMEDIES.get(item.issue)
            self.rec.blocked(subject, primary_action(item.actions or list(remedy.steps if remedy else ())), item.reason)
            return False
        if item.decision == "escalate" and self.apply:
            self._escalate(subject, item.reason, self._tried(subject))
            return True
        if not self.apply:
            self._show(item, subject)
            return False
        self._act(item, subject)
        return True

    def _show(self, item: PlanItem, subject: Subject) -> None:
        from gpuheal.actions.execute import describe

        if item.decision == "escalate":
            self.rec.doc(subject, "alert", item.reason, "planned")
            return
        for step in item.steps:  # an "auto" LiteLLM change shows what LiteLLM would do (a GET), or why not
            auto = isinstance(step, LiteLLMUpdate) and step.field == "auto"
            note, shown = self.effects.preview(step) if auto else step.note, describe(step, item.gpu, self.cfg)
            self.rec.doc(subject, step.action, item.reason, "planned", shown, step.target, note)
        if item.alert_now:
            self.rec.doc(subject, "alert", "alert on detection", "planned")

    def _act(self, item: PlanItem, subject: Subject) -> None:
        from gpuheal.actions.execute import describe, run_item

        if item.key in self.state.attempts:  # never repeat a reserved attempt
            self.rec.blocked(subject, primary_action(item.actions), f"attempt {item.key} already reserved")
            return
        run_id = self._run_id()
        params = self.cfg.rule_params(item.issue, item.gpu if item.gpu in self.cfg.aliases else None)
        within_s = float(params["verify_within_s"])
        attempt = verify.reserve(item, now_s=self.now_s, verify_within_s=within_s, run_id=run_id)
        # Reserved and saved before anything runs: a kill after this line never repeats it.
        self.state = verify.book(self.state, attempt, item.restarts, self.now_s)
        self._save()
        extra = {"attempt": item.attempt_no, "actions": item.actions}
        self.rec.intent(run_id, subject, item.actions, extra, [describe(s, item.gpu, self.cfg) for s in item.steps])
        if item.alert_now:
            self._queue(subject, "escalated", f"{item.issue}: {item.reason}; acting now", run_id)
        ex = run_item(item, self.cfg, self.effects.run, self.effects.verify, self.secrets, self.effects.litellm,
                      self.effects.model_health, self.onsets.get(item.gpu), self.now_s)  # fmt: skip
        subject = with_findings(self.store, subject, ex, run_id, self.now_s)  # Rules 2, 4, 6.1: what the fix found
        self.rec.step_docs(subject, item.reason, ex)
        if any(s.ok and s.action == "restart-litellm" for s in ex.steps):  # circuit-breaker-status "last_reset"
            self.state = self.state.with_litellm_restart(self.now_s)
        self.state = verify.note_restore(self.state, item.gpu, [s.effect for s in ex.steps if s.ok and s.effect])
        attempt = verify.transition(attempt, verify.EXECUTION_EVENT[ex.result], self.now_s, ex.verification)
        self.state = self.state.with_attempt(attempt)
        self.rec.outcome(run_id, subject, ex, extra)
        if ex.result == "escalated":
            self._escalate(subject, ex.escalate_reason or "remediation escalated", self._tried(subject), run_id)

    def _escalate(
        self, subject: Subject, reason: str, tried: list[str], run_id: str | None = None, hold: bool = True
    ) -> None:
        """Tell the humans. ``hold``: and stop acting on this (gpu, issue) until it resolves or is
        cleared (not for an issue that is already closed, like a failed restore-load)."""
        run_id = run_id or self._run_id()
        if hold:
            key = f"{subject.gpu}/{subject.issue}"
            self.state = self.state.with_escalation(key, Escalation(self.now_s, reason, subject.since))
        self.rec.escalated(run_id, subject, reason, tried, self._attempts(subject))

    # ------------------------------------------------------------------ 4. undo mitigations
    def _undo_mitigations(self, still_open: set, gpu_filter: str | None) -> bool:
        hot = {alias for alias, issue in still_open if issue in THERMAL}
        after_s = self.cfg.heal.restore_after_s
        self.state, due = verify.cooldown(
            self.state, hot, set(self.cfg.aliases), self.now_s, after_s, gpu_filter, self.tol
        )
        acted = False
        for r in due:
            subject, m = Subject(r.alias, r.mitigation.issue), r.mitigation
            step = restore_action(r.alias, m, self.cfg)
            if isinstance(step, NoRestore):
                self.rec.doc(subject, "restore-load", step.why, step.result)
                continue
            why, run_id, acted = f"GPU cooled down: undo {', '.join(m.actions)}", self._run_id(), True
            self.rec.audit(run_id, subject, "restore-load", "pending", "intent")
            res = self.effects.perform(step, r.alias, self.secrets)
            self.rec.restored(run_id, subject, why, step.target, res)
            if not res.ok:
                self._restore_failed(subject, m, res.error, run_id)
        return acted

    def _restore_failed(self, subject: Subject, m, error: str | None, run_id: str) -> None:
        """A GPU left at reduced load quietly costs capacity: retry next run, and after
        ``max_failed_verifications`` failures tell the humans instead."""
        failures = m.restore_failures + 1
        if failures < self.cfg.heal.max_failed_verifications:
            self.state = self.state.with_mitigation(subject.gpu, replace(m, restore_failures=failures))
            return
        reason = f"could not restore the load on {subject.gpu} after {failures} tries ({error}); it still runs shed"
        self._escalate(subject, reason, [f"restore-load × {failures}"], run_id, hold=False)

    # ------------------------------------------------------------------ helpers
    def _queue(
        self, subject: Subject, kind: str, summary: str, run_id: str | None, tried: list[str] | None = None
    ) -> None:
        self.rec.queue(subject, kind, summary, run_id, tried or [], self._attempts(subject))

    def _attempts(self, subject: Subject) -> int:
        return len(self.state.attempts_for(subject.gpu, subject.issue, subject.since))

    def _tried(self, subject: Subject) -> list[str]:
        return self.state.tried(subject.gpu, subject.issue, subject.since)

    def _run_id(self) -> str:
        self.state, run_id = self.state.next_run_id(self.now.astimezone(UTC).strftime("%Y%m%d"))
        return run_id

    def _save(self) -> None:
        self.store.write(files.HEAL, self.state.to_json())


def command(rt, store, apply: bool = False, gpu: str | None = None, issue: str | None = None, clear: str | None = None):
    from gpuheal import exit_codes
    from gpuheal.render.human import render_heal
    from gpuheal.runtime import CommandResult
    from gpuheal.steps.check import config_rows

    heal = Heal(rt.cfg, store, rt.now, apply)
    if clear:
        _clear(heal, clear)
    health = heal.run(gpu, issue)

    def render() -> None:
        render_heal(health, config_rows(rt.cfg), apply)

    return CommandResult(health, exit_codes.BY_STATUS[health["status"]], render, warnings=heal.warnings)


def _clear(heal: Heal, target: str) -> None:
    """``--clear ALIAS/ISSUE``: an operator lifts an escalation so healing may try again."""
    from gpuheal.errors import GpuhealError

    gpu, _, issue = target.partition("/")
    if not gpu or not issue:
        raise GpuhealError(f"--clear {target!r}: expected ALIAS/ISSUE, e.g. gpu-dense/model-stuck")
    heal.state, found = verify.clear(heal.state, gpu, issue, heal.now_s)
    if not found:
        raise GpuhealError(f"--clear {target!r}: nothing escalated for {gpu}/{issue}")
    heal._save()
