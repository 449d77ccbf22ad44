"""One heal run's books: the heal state (``heal-state.json``) and what the run records about it — audit
lines, the ``actions`` list and queued alerts (:class:`~gpuheal.actions.record.Recorder`). The phases
of a run (:mod:`gpuheal.actions.attempts`, :mod:`gpuheal.actions.restore`, the heal step itself) work
on one :class:`Ledger`, so none reaches into another's private state.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from gpuheal.actions.record import Recorder, Subject, old_run_counter
from gpuheal.core.alerts import AlertQueue
from gpuheal.core.heal_state import Escalation, HealState
from gpuheal.core.remedy import Escalate, FollowUp, Note, Notice, Remedy
from gpuheal.state import files
from gpuheal.state.store import StateDir


class Ledger:
    def __init__(self, store: StateDir, now: datetime, secrets: tuple[str, ...], remedies: Mapping[str, Remedy]):
        self.store, self.now, self.now_s, self.remedies = store, now, now.timestamp(), remedies
        self.state = HealState.from_json(store.read(files.HEAL, {}))
        self.rec = Recorder(store, now, secrets, AlertQueue.from_json(store.read(files.ALERTS, {})), remedies)

    def run_id(self) -> str:
        """The next ``gpu-self-heal-YYYYMMDD-NNN`` of this UTC day (the audit trail's id: each attempt
        and escalation has its own; the state directory numbers them, :meth:`StateDir.next_run_id`)."""
        return self.store.next_run_id(self.now, old_run_counter)

    def save(self) -> None:
        self.store.write(files.HEAL, self.state.to_json())

    def clear(self, target: str, example_alias: str) -> None:
        """``heal --clear ALIAS/ISSUE``: an operator lifts an escalation so healing may try again."""
        from gpuheal.core import verify
        from gpuheal.errors import GpuhealError

        gpu, _, issue = target.partition("/")
        if not gpu or not issue:
            example = f"{example_alias}/{next(iter(self.remedies))}"
            raise GpuhealError(f"--clear {target!r}: expected ALIAS/ISSUE, e.g. {example}")
        self.state, found = verify.clear(self.state, gpu, issue, self.now_s)
        if not found:
            raise GpuhealError(f"--clear {target!r}: nothing escalated for {gpu}/{issue}")
        self.save()

    def save_alerts(self) -> None:
        self.store.write(files.ALERTS, self.rec.alerts.to_json())

    def attempts(self, subject: Subject) -> int:
        return len(self.state.attempts_for(subject.gpu, subject.issue, subject.since))

    def tried(self, subject: Subject) -> list[str]:
        return self.state.tried(subject.gpu, subject.issue, subject.since)

    def queue(
        self, subject: Subject, kind: str, summary: str, run_id: str | None, tried: list[str] | None = None
    ) -> None:
        self.rec.queue(subject, kind, summary, run_id, tried or [], self.attempts(subject))

    def escalate(
        self, subject: Subject, reason: str, tried: list[str], run_id: str | None = None, hold: bool = True
    ) -> None:
        """Tell the humans. ``hold``: and stop acting on this (gpu, issue) until it resolves or is
        cleared (not for an issue that is already closed, like a failed restore-load)."""
        run_id = run_id or self.run_id()
        if hold:
            key = f"{subject.gpu}/{subject.issue}"
            self.state = self.state.with_escalation(key, Escalation(self.now_s, reason, subject.since))
        self.rec.escalated(run_id, subject, reason, tried, self.attempts(subject))

    def escalated_at(self, subject: Subject) -> float | None:
        """When this occurrence of (gpu, issue) was escalated; ``None``: not (yet)."""
        esc = self.state.escalated.get(f"{subject.gpu}/{subject.issue}")
        return esc.at if esc is not None and esc.since == subject.since else None

    def follow(self, subject: Subject, steps: tuple[FollowUp, ...]) -> None:
        """Do what a remedy's ``follow_up`` said (:mod:`gpuheal.core.remedy`)."""
        for step in steps:
            if isinstance(step, Escalate):
                self.escalate(subject, step.reason, self.tried(subject))
            elif isinstance(step, Note):
                self.rec.doc(subject, "alert", step.text, step.result)
            elif isinstance(step, Notice):
                run_id = self.run_id()
                if self.rec.queue(subject, "escalated", step.text, run_id, [], self.attempts(subject), key=step.key):
                    self.rec.audit(run_id, subject, "alert", "escalated", "outcome", escalated=True,
                                   extra={"reason": step.text})  # fmt: skip
                    self.rec.doc(subject, "alert", step.text, "escalated")
