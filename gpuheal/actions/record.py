"""What a heal run leaves behind besides the heal state: audit lines, the ``actions`` list of
``gpu-health.json`` and queued alerts — each redacted before it is kept.

Audit lines are appended and fsynced one call at a time (a kill between intent and outcome loses
nothing); the alert queue is the ``alerts.json`` document, saved by the heal step with its state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from gpuheal.clock import format_iso
from gpuheal.config.model import Config
from gpuheal.core import alerts
from gpuheal.core.actions import StepResult
from gpuheal.core.alerts import AlertQueue
from gpuheal.core.catalog import ACTIONS, primary_action
from gpuheal.core.heal_state import Attempt, HealState
from gpuheal.core.plan import paused_in
from gpuheal.core.remedy import Execution, Remedy
from gpuheal.redact import redact
from gpuheal.state import files
from gpuheal.state.store import StateDir, is_run_id


@dataclass(frozen=True)
class Subject:
    """What a record is about: one occurrence of one (gpu, issue)."""

    gpu: str
    issue: str
    since: str | None = None
    detected: dict[str, Any] = field(default_factory=dict)


class Recorder:
    def __init__(
        self, store: StateDir, now: datetime, secrets: tuple[str, ...], alerts: AlertQueue,
        remedies: Mapping[str, Remedy] | None = None,
    ) -> None:
        self.store = store
        self.now = now
        self.now_s = now.timestamp()
        self.secrets = secrets
        self.alerts = alerts
        self.remedies = remedies or {}
        self.actions: list[dict[str, Any]] = []

    def audit(
        self,
        run_id: str,
        subject: Subject,
        action: str,
        result: str,
        phase: str,
        verification: dict[str, Any] | None = None,
        escalated: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> None:
        record = {
            "run_id": run_id,
            "timestamp": format_iso(self.now),
            "gpu": subject.gpu,
            "issue": subject.issue,
            "detected": subject.detected,
            "action": action,
            "result": result,
            "verification": verification,
            "escalated": escalated,
            "phase": phase,
        }
        if extra:
            record.update({k: v for k, v in extra.items() if v is not None})
        self.store.append_lines(files.AUDIT_LOG, [redact(record, self.secrets)])

    def doc(
        self,
        subject: Subject,
        action: str,
        why: str,
        result: str,
        command: str | None = None,
        target: str | None = None,
        note: str = "",
        error: str | None = None,
    ) -> None:
        """One entry of the run's ``actions`` list (contract: gpu, issue, action, result)."""
        entry = {"gpu": subject.gpu, "issue": subject.issue, "action": action, "result": result, "why": why}
        for key, value in (("command", command), ("target", target), ("note", note), ("error", error)):
            if value:
                entry[key] = value
        self.actions.append(redact(entry, self.secrets))

    def intent(
        self, run_id: str, subject: Subject, actions: Sequence[str], extra: dict[str, Any], commands: list[str]
    ) -> None:
        """Audited before an attempt's commands run: a kill mid-command still leaves its trace."""
        self.audit(run_id, subject, primary_action(actions), "pending", "intent", None, False,
                   {**extra, "commands": commands})  # fmt: skip

    def escalated(self, run_id: str, subject: Subject, reason: str, tried: list[str], attempts: int) -> None:
        """The humans are told: audited, queued as an "escalated" alert, shown."""
        extra = {"reason": reason, "tried": tried}
        self.audit(run_id, subject, "alert", "escalated", "outcome", escalated=True, extra=extra)
        self.queue(subject, "escalated", reason, run_id, tried, attempts)
        self.doc(subject, "alert", reason, "escalated")

    def outcome(self, run_id: str, subject: Subject, ex: Execution, extra: dict[str, Any]) -> None:
        """The one outcome line of an attempt that ended in its own run (failed, escalated): every step,
        its own check and the evidence."""
        extra = {**extra, **carried(subject, ex)}
        extra.pop("detected")
        self.audit(run_id, subject, primary_action(extra["actions"]), ex.result, "outcome", ex.verification or None,
                   ex.result == "escalated", extra)  # fmt: skip

    def keep(self, subject: Subject, ex: Execution) -> dict[str, Any]:
        """:func:`carried`, redacted: what an attempt awaiting its verdict keeps in the heal state."""
        kept: dict[str, Any] = redact(carried(subject, ex), self.secrets)
        return kept

    def step_docs(self, subject: Subject, why: str, ex: Execution) -> None:
        """One ``actions`` entry per executed step: the last one carries the attempt's result."""
        last = len(ex.steps)
        for n, step in enumerate(ex.steps, 1):
            if not step.ok or (n == last and ex.result == "failed"):
                result = "failed"  # the command failed, or its verification did
            elif n == last and ex.result == "escalated":
                result = "escalated"  # it ran, and what it found needs the humans (L1, a kill)
            else:
                result = "resolved" if ACTIONS[step.action].evidence else "pending"
            error = step.error or (ex.verification.get("error") if result == "failed" and ex.verification else None)
            self.doc(subject, step.action, step.note or why, result, step.command, step.target, error=error)

    def verified(
        self, subject: Subject, attempt: Attempt, verification: dict[str, Any], attempts: int,
        mttr: dict[str, float] | None = None, shown: dict[str, Any] | None = None,
    ) -> None:
        """An attempt whose issue cleared and whose remedy's proof held: its one outcome line, in the
        spec's Audit Trail Format — ``detected`` as acted on, ``verification`` the reading that proved it
        (with ``time_to_detect_s`` / ``time_to_resolve_s``, issue 20) — announced (a "resolved" alert,
        which shows ``shown``: the proving reading), shown."""
        primary = primary_action(attempt.actions)
        extra = {"attempt": attempt.n, "actions": list(attempt.actions), **_kept(attempt), **(mttr or {})}
        self.audit(self._run_id(attempt), _acted(subject, attempt), primary, "resolved", "verification", verification,
                   extra=extra)  # fmt: skip
        summary = f"resolved after {'+'.join(attempt.actions)} (attempt {attempt.n})"
        remedy = self.remedies.get(subject.issue)
        if remedy is None or not remedy.silent:  # Rule 8 tier 1: "no alert", not when it resolves either
            told = Subject(subject.gpu, subject.issue, subject.since, shown if shown is not None else subject.detected)
            self.queue(told, "resolved", summary, attempt.run_id, [", ".join(attempt.actions)], attempts)
        self.doc(subject, primary, "verified: the issue cleared", "resolved")

    def not_verified(self, subject: Subject, attempt: Attempt, why: dict[str, Any], text: str) -> None:
        """An attempt judged failed from fresh data: its one outcome line, with what was still seen; shown."""
        primary = primary_action(attempt.actions)
        extra = {"attempt": attempt.n, "actions": list(attempt.actions), **_kept(attempt)}
        self.audit(self._run_id(attempt), _acted(subject, attempt), primary, "failed", "verification", why,
                   extra=extra)  # fmt: skip
        self.doc(subject, primary, text, "failed")

    def superseded(self, subject: Subject, attempt: Attempt, since: str | None) -> None:
        """An attempt whose issue cleared and came back before a poll could prove or disprove it: its one
        outcome line says so (the new occurrence gets attempts of its own)."""
        extra = {"attempt": attempt.n, "actions": list(attempt.actions), **_kept(attempt)}
        why = {"new_since": since, "note": "the issue cleared and came back before a poll judged this fix"}
        self.audit(self._run_id(attempt), _acted(subject, attempt), primary_action(attempt.actions), "superseded",
                   "verification", why, extra=extra)  # fmt: skip

    def _run_id(self, attempt: Attempt) -> str:
        """The attempt's run id: its outcome line joins its intent under the run that acted."""
        own = attempt.run_id
        return own if own is not None and is_run_id(own) else self.store.run_id(self.now, old_run_counter)

    def restored(
        self, run_id: str, subject: Subject, why: str, target: str, res: StepResult, action: str = "restore-load"
    ) -> None:
        """The outcome of one ``restore-load`` or ``restore-power-limit`` (the intent was audited before it ran)."""
        result = "resolved" if res.ok else "failed"
        extra = {"command": res.argv or res.command, "error": res.error, "check": res.check}
        self.audit(run_id, subject, action, result, "outcome", extra=extra)
        self.doc(subject, action, why, result, res.command, target, error=res.error)

    def blocked(self, subject: Subject, action: str, why: str) -> None:
        """A guard held the remedy back: shown as the action it would take, still ``pending``
        (the contract's action names and results), flagged ``blocked`` with the reason."""
        entry = {
            "gpu": subject.gpu,
            "issue": subject.issue,
            "action": action,
            "result": "pending",
            "blocked": True,
            "why": why,
        }
        self.actions.append(redact(entry, self.secrets))

    def queue(
        self, subject: Subject, kind: str, summary: str, run_id: str | None, tried: list[str], attempts: int,
        key: str | None = None,
    ) -> bool:
        """Queue one alert (``key``: a state of its own, e.g. Rule 10's audit); False when deduplicated."""
        alert = alerts.issue_alert(
            subject.gpu, subject.issue, kind, subject.since, self.now_s, summary,
            run_id=run_id, detected=subject.detected, tried=tried, attempts=attempts,
        )  # fmt: skip
        if key is not None:
            alert = replace(alert, state_key=key)
        return self.alerts.enqueue(alert.mapped(lambda doc: redact(doc, self.secrets)))

    def count_clean_cycle(self, clean: bool, every: int) -> None:
        alerts.count_clean_cycle(self.alerts, clean, every, self.now_s)


CARRIED_MAX_CHARS = 64_000  # an attempt's carried evidence beyond this is cut (heal-state.json stays small)


def carried(subject: Subject, ex: Execution) -> dict[str, Any]:
    """What an executed attempt's one outcome line will carry: ``detected`` as acted on (with what the
    fix found), every step (its command, answer and output tail) and the evidence. Written at once when
    the attempt ends in its run; else kept on the attempt (heal state) until fresh data judges it."""
    steps = [
        {"action": s.action, "command": s.argv or s.command, "target": s.target, "ok": s.ok, "rc": s.rc,
         "error": s.error, "output": s.output[-1500:], **({"note": s.note} if s.note else {})}
        for s in ex.steps
    ]  # fmt: skip
    out: dict[str, Any] = {"detected": subject.detected, "actions": [s.action for s in ex.steps] or ex.item.actions,
                           "steps": steps, "evidence": ex.evidence or None}  # fmt: skip
    if ex.result == "pending" and ex.verification:
        out["checked"] = ex.verification  # its own check in the run (a restart's completion)
    if len(json.dumps(out, default=str)) > CARRIED_MAX_CHARS:
        out["evidence"] = {"note": f"evidence over {CARRIED_MAX_CHARS} characters was not kept for the verdict"}
    return out


def _kept(attempt: Attempt) -> dict[str, Any]:
    """The outcome line's steps, evidence and in-run check, as the attempt kept them; an attempt whose run
    was cut short (or kept by an older release) kept none, and its line says so."""
    kept = attempt.outcome
    if kept is None:
        note = "what its steps did is not known here (its run was interrupted, or an older release ran it)"
        return {"note": note, **({"checked": attempt.verification} if attempt.verification else {})}
    return {k: v for k, v in kept.items() if k in ("steps", "evidence", "checked") and v is not None}


def _acted(subject: Subject, attempt: Attempt) -> Subject:
    """``subject`` with ``detected`` as the attempt acted on it (the spec's record), when it kept that."""
    kept = attempt.outcome or {}
    detected = kept.get("detected")
    shown = detected if isinstance(detected, dict) else subject.detected
    return Subject(subject.gpu, subject.issue, subject.since, shown)


def health_doc(
    health: dict[str, Any], state: HealState, rec: Recorder, cfg: Config, now_s: float, apply: bool
) -> dict[str, Any]:
    """``gpu-health.json`` as heal leaves it: check's document plus the run's actions, mode,
    pauses (``gpuheal pause``'s and the config's ``gpus[].paused``), restart budgets and queued alerts."""
    health["actions"] = rec.actions
    health["mode"] = "apply" if apply else "dry-run"
    health["paused"] = {  # the config's pauses as `gpuheal pause` shows its own (an operator's, with its reason, wins)
        "fleet": state.paused_fleet.to_json() if state.paused_fleet else None,
        "gpus": {**{a: {"reason": why, "at": None} for a, why in paused_in(cfg).items()},
                 **{a: p.to_json() for a, p in state.paused_gpus.items()}},
    }  # fmt: skip
    limit = cfg.heal.max_restarts_per_hour
    health["budgets"] = {
        g.alias: {"restarts_last_hour": state.restarts_in_window(g.alias, now_s), "max_restarts_per_hour": limit}
        for g in cfg.gpus
    }
    health["alerts_queued"] = len(rec.alerts.queue) if apply else None
    return health


def old_run_counter(store: StateDir) -> tuple[str, int] | None:
    """The run counter ``heal-state.json`` kept (``run_seq``) before the state directory numbered runs in
    ``run-ids.json``: where :meth:`StateDir.next_run_id` carries on from when that file holds none."""
    return HealState.from_json(store.read(files.HEAL, None)).run_counter
