"""Step 4 of ``heal --apply``: give GPUs that stayed cool their load back (``restore-load``).

A GPU keeps its load-side mitigation while an issue whose fix sheds load (a remedy with ``shed-load`` or
``redirect-traffic`` among its steps: Rules 1 and 8) is open on it — hidden ones included; once it
stayed cool for ``heal.restore_after_s`` (:func:`gpuheal.core.verify.cooldown`) the configured
``restore_load_command`` runs, or the LiteLLM values the built-in shed changed are put back. A restore
that keeps failing is escalated after ``heal.max_failed_verifications`` tries: a GPU left at reduced
load quietly costs capacity.
"""

from __future__ import annotations

from dataclasses import replace

from gpuheal.actions.effects import Effects
from gpuheal.actions.ledger import Ledger
from gpuheal.actions.record import Subject
from gpuheal.config.model import Config
from gpuheal.core import verify
from gpuheal.core.catalog import MITIGATIONS
from gpuheal.core.heal_state import Mitigation
from gpuheal.core.plan import NoRestore, paused_in, restore_actions


def undo_mitigations(
    ledger: Ledger, cfg: Config, effects: Effects, still_open: set[tuple[str, str]], gpu_filter: str | None,
    tol: float,
) -> bool:
    """Restore the GPUs whose cool-down is over; True if anything was acted on."""
    sheds = [i for i, r in ledger.remedies.items() if set(r.steps) & set(MITIGATIONS)]
    hot = {alias for alias, issue in still_open if issue in sheds}
    ledger.state, due = verify.cooldown(
        ledger.state, hot, set(cfg.aliases), ledger.now_s, cfg.heal.restore_after_s, gpu_filter, tol, paused_in(cfg)
    )
    acted = False
    for r in due:
        # a mitigation an older release noted without its issue is the most severe rule's that sheds load
        m = r.mitigation
        subject = Subject(r.alias, m.issue or (sheds[0] if sheds else ""))
        steps = restore_actions(r.alias, m, cfg)
        if isinstance(steps, NoRestore):
            ledger.rec.doc(subject, "restore-load", steps.why, steps.result)
            continue
        why, run_id, acted = f"GPU cooled down: undo {', '.join(m.actions)}", ledger.run_id(), True
        failed: list[str] = []
        for step in steps:  # the power limit and LiteLLM's values are put back independently
            ledger.rec.audit(run_id, subject, step.action, "pending", "intent")
            res = effects.perform(step, r.alias, ledger.rec.secrets)
            ledger.rec.restored(run_id, subject, step.note or why, step.target, res, step.action)
            if not res.ok:
                failed.append(f"{step.action}: {res.error}")
        if failed:
            _restore_failed(ledger, cfg, subject, m, "; ".join(failed), run_id)
    return acted


def _restore_failed(
    ledger: Ledger, cfg: Config, subject: Subject, m: Mitigation, error: str | None, run_id: str
) -> None:
    """Retry next run; after ``max_failed_verifications`` failures tell the humans instead."""
    failures = m.restore_failures + 1
    if failures < cfg.heal.max_failed_verifications:
        ledger.state = ledger.state.with_mitigation(subject.gpu, replace(m, restore_failures=failures))
        return
    reason = f"could not restore the load on {subject.gpu} after {failures} tries ({error}); it still runs shed"
    ledger.escalate(subject, reason, [f"restore-load × {failures}"], run_id, hold=False)
