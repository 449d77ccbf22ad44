"""``gpuheal heal``: check, then plan; with ``--apply`` act, verify, audit, queue alerts.

Dry-run by default: without ``--apply`` the plan is printed (what, where, why, the exact command)
and the heal state, the audit trail and the alert queue are not touched. With ``--apply`` each
run, in order (:meth:`Heal.run`):

0. takes a GPU with a hard fault out of LiteLLM's routing, if ``heal.drain_first`` (:mod:`~gpuheal.actions.drain`),
   and confirms the hard fault within the run instead of at cron's 3rd poll (:mod:`gpuheal.steps.confirm`),
   steps 2-3 following each round that confirmed one (a confirmed GPU never waits for another's hold);
1. lets each remedy keep what its fix will need from its open issues (its ``track`` hook), then
   judges the open attempts of earlier runs from this run's fresh data (:mod:`gpuheal.actions.attempts`:
   resolved when the issue cleared and its remedy's proof holds, failed when its window passed or a
   re-benchmark disproved it, superseded by a new occurrence — one audit line for each outcome);
2. plans the firing issues with every guard (:mod:`gpuheal.core.plan`, each remedy's ``guard`` included);
3. executes each ``act`` item (:mod:`gpuheal.actions.execute`), escalates the rest, and follows up the
   advice it never acts on (a remedy's ``follow_up``);
4. undoes load-side mitigations of GPUs that stayed cool (:mod:`gpuheal.actions.restore`);
5. counts the clean cycle (the All Clear on every Nth) and saves.

Which rule an issue belongs to never matters here: its remedy (``gpuheal.rules.REMEDIES``) says what to
do. The decisions are the pure core's; the books are :class:`~gpuheal.actions.ledger.Ledger`'s.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuheal.actions import attempts, drain, restore
from gpuheal.actions.context import Context, Records
from gpuheal.actions.effects import Effects, Runner, Verifier
from gpuheal.actions.ledger import Ledger
from gpuheal.actions.record import Subject, health_doc
from gpuheal.clock import Clock
from gpuheal.config.model import Config
from gpuheal.core import timing, verify
from gpuheal.core.actions import LiteLLMUpdate
from gpuheal.core.alerts import clean_cycle
from gpuheal.core.catalog import primary_action
from gpuheal.core.issue import Issue
from gpuheal.core.plan import plan
from gpuheal.core.remedy import Followed, OpenIssue, PlanItem
from gpuheal.rules import REMEDIES
from gpuheal.state.store import StateDir
from gpuheal.steps import confirm

if TYPE_CHECKING:
    from gpuheal.steps.check import CheckResult

class Heal:
    """One heal run. Holds the run's books (:class:`Ledger`) while it works on them."""

    def __init__(self, cfg: Config, store: StateDir, now: datetime, apply: bool, runner: Runner | None = None,
                 verify: Verifier | None = None, clock: Clock | None = None,
                 probe: confirm.Prober | None = None, wait_clock: Clock | None = None) -> None:  # fmt: skip
        from gpuheal.credentials import secrets_for

        self.cfg, self.store, self.now, self.now_s, self.apply = cfg, store, now, now.timestamp(), apply
        self.ledger = Ledger(store, now, secrets_for(cfg), REMEDIES)
        self.effects = Effects(cfg, runner, verify, clock=wait_clock)  # a restart's readiness wait (None: real)
        self.records = Records(store, {i: r.state_file for i, r in REMEDIES.items() if r.state_file})
        self.warnings: list[str] = []
        self.tol = timing.TOLERANCE_S  # until this run's evaluation says the history's own
        self.clock, self.probe = clock, probe  # the in-run confirmation's clock, sleep, re-probe (tests' own)

    def run(self, gpu_filter: str | None, issue_filter: str | None) -> dict[str, Any]:
        from gpuheal.steps import check

        clock = self.clock or confirm.default_clock()  # one clock for the poll's start and the re-probes
        polled_s = clock.now()  # the poll begins: in-run evidence counts from here
        result = self._check(gpu_filter)
        drain.first(self.ledger, self.effects, self.cfg, result, self.apply, gpu_filter)  # out of routing first
        health, acted = dict(result.health), False
        # --apply: a hard fault is re-probed and acted on in this run as each GPU's hold is met (issue 28)
        rounds = confirm.rounds(self.cfg, self.store, result, clock, self.probe, self._keep, polled_s,
                                heal_state=self.ledger.state) if self.apply else iter((result,))  # fmt: skip
        try:
            for n, result in enumerate(rounds):
                health = dict(result.health)
                acted |= self._act(result, health, gpu_filter, issue_filter, first=n == 0)
        except confirm.Overtaken as exc:  # another run held the state meanwhile: it acts, this one not
            self.warnings = [*result.obs.warnings, str(exc)]
            return health
        finally:
            self.effects.close()
        if self.apply:  # 5. count the clean cycle, save (an info advice never resets the All Clear count)
            self.ledger.rec.count_clean_cycle(clean_cycle(result.issues, acted), self.cfg.alerts.all_clear_every)
            self.ledger.state = self.ledger.state.pruned(self.now_s, verify.OPEN)
            self.ledger.save()
            self.ledger.save_alerts()  # what this run fixed and proved reads "verifying" in its document already
            health = verify.present_verifying(health, result.issues, result.obs, self.ledger.state, self.cfg,
                                              self.now_s)  # fmt: skip
        doc = health_doc(health, self.ledger.state, self.ledger.rec, self.cfg, self.now_s, self.apply)
        check.save_health(self.store, doc)
        self.warnings = list(result.obs.warnings)
        return health

    def _act(self, result: CheckResult, health: dict[str, Any], gpu_filter: str | None, issue_filter: str | None,
             first: bool) -> bool:  # fmt: skip
        """Steps 1-4 on one round's result; True if anything was acted on. A later round only plans and acts."""
        open_now = {i.key: i for i in result.issues}
        # an inhibited issue is open, only hidden: never resolved on no data; a hidden thermal one keeps load shed
        hidden = {i.key: i for i in result.evaluation.inhibited}
        still_open, acted = {**hidden, **open_now}, False
        self.tol = result.evaluation.tolerance_s  # count time as the rules did (core/timing, issue 9)
        if self.apply and first:  # 1. keep what the fixes need, judge earlier attempts from this run's data
            self._track(still_open)
            attempts.judge(self.ledger, self.effects, self.cfg, still_open, set(hidden), result.obs,
                           health.get("gpus") or {}, self.tol, self.records, result.evaluation.memory)  # fmt: skip
            attempts.settle_escalations(self.ledger, set(still_open))
        for item in plan(result.issues, self.ledger.state, self.cfg, self.now_s, gpu_filter, issue_filter,
                         remedies=REMEDIES, tol=self.tol, records=self.records.all()):  # fmt: skip
            acted |= self._handle(item)  # 2-3. plan, then show (dry-run) or act
        if self.apply and first:  # 4. give cooled GPUs their load back
            acted |= restore.undo_mitigations(self.ledger, self.cfg, self.effects, set(still_open), gpu_filter,
                                              self.tol)  # fmt: skip
        return acted

    def _keep(self) -> None:
        """What this run must keep before it lets another take the lock: its books (the drain just done)."""
        self.ledger.save()
        self.ledger.save_alerts()

    def _check(self, gpu_filter: str | None) -> CheckResult:
        """This run's fresh data: ``check``'s poll (smi sensing over SSH shares the run's logins)."""
        from gpuheal.errors import GpuhealError
        from gpuheal.steps import check

        if gpu_filter and gpu_filter not in self.cfg.aliases and gpu_filter != "fleet":
            raise GpuhealError(f"--gpu {gpu_filter!r}: no such alias (known: {', '.join(self.cfg.aliases)})")
        try:  # the pool opens a connection only if smi sensing asks for one; the heal state is the books' (read once)
            return check.run(self.cfg, self.store, self.now, None, None, self.effects.sensing(), self.ledger.state)
        except BaseException:
            self.effects.close()
            raise

    def _track(self, still_open: dict[tuple[str, str], Issue]) -> None:
        """Each remedy's ``track`` hook over its open issues (pending, firing or hidden)."""
        for issue_id, remedy in REMEDIES.items():
            if remedy.track is None:
                continue
            remedy.track(OpenIssue.of(issue_id, still_open), self._context(issue_id, "fleet"))

    def _context(self, issue: str, gpu: str) -> Context:
        e = self.effects
        return Context(self.cfg, gpu, issue, self.now_s, e.run, self.ledger.rec.secrets, e.litellm, e.model_health,
                       e.prove, self.records)  # fmt: skip

    # ------------------------------------------------------------------ 2-3. plan items
    def _handle(self, item: PlanItem) -> bool:
        """Show or perform one plan item; True if anything was acted on."""
        subject = Subject(item.gpu, item.issue, item.since, item.detected)
        if item.decision == "recommend":  # advice: never an action on the fleet (README "Alerts")
            if item.remedy.follow_up is not None:
                followed = Followed(item.gpu, item.issue, item.since, item.reason, self.ledger.escalated_at(subject),
                                    self.now_s, self.tol, self.apply, self.cfg)  # fmt: skip
                self.ledger.follow(subject, item.remedy.follow_up(followed))
            return False
        if item.decision == "blocked":
            self.ledger.rec.blocked(subject, primary_action(item.actions or item.remedy.steps), item.reason)
            return False
        if item.decision == "escalate" and self.apply:
            self.ledger.escalate(subject, item.reason, self.ledger.tried(subject))
            return True
        if not self.apply:
            self._show(item, subject)
            return False
        attempts.act(self.ledger, item, subject, self.cfg, self.effects, self.records)
        return True

    def _show(self, item: PlanItem, subject: Subject) -> None:
        from gpuheal.actions.perform import describe

        rec = self.ledger.rec
        if item.decision == "escalate":
            rec.doc(subject, "alert", item.reason, "planned")
            return
        for step in item.steps:  # an "auto" LiteLLM change shows what LiteLLM would do (a GET), or why not
            auto = isinstance(step, LiteLLMUpdate) and step.field == "auto"
            note = self.effects.preview(step) if isinstance(step, LiteLLMUpdate) and auto else step.note
            rec.doc(subject, step.action, item.reason, "planned", describe(step, item.gpu, self.cfg), step.target, note)
        if item.alert_now:
            rec.doc(subject, "alert", "alert on detection", "planned")


def command(rt: Any, store: StateDir, apply: bool = False, gpu: str | None = None, issue: str | None = None,
            clear: str | None = None, clock: Clock | None = None) -> Any:  # fmt: skip
    from gpuheal import exit_codes
    from gpuheal.render.human import render_heal
    from gpuheal.runtime import CommandResult
    from gpuheal.steps.check import config_rows

    # clock: the run's, for the in-run confirmation and a restart's readiness wait (a simulated week's moves its
    # fleet on; tests of the confirmation alone give Heal a clock that moves only itself)
    heal = Heal(rt.cfg, store, rt.now, apply, clock=clock, wait_clock=clock)
    if clear:
        heal.ledger.clear(clear, rt.cfg.aliases[0] if rt.cfg.aliases else "gpu-dense")
    health = heal.run(gpu, issue)

    def render() -> None:
        render_heal(health, config_rows(rt.cfg), apply)

    return CommandResult(health, exit_codes.BY_STATUS[health["status"]], render, warnings=heal.warnings)
