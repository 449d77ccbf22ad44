"""Drain first (issue 28 item 2), the heal run's side: right after this run's evaluation, take the GPUs with a
hard fault out of LiteLLM's routing, and put back the ones whose issue cleared. What may move is the pure
core's (:mod:`gpuheal.core.drain`); which findings are hard faults is each rule's (its remedy's ``drain``
hook); this module only reads, acts, reads back and keeps the books.

**How.** Through the path that works against a real LiteLLM 1.108.7 without a database — its
``config.yaml`` (``litellm.config_file``, ``litellm.restart_command``): the GPU's ``model_list`` entries
leave the file, LiteLLM is restarted and ``/v1/model/info`` read back
(:func:`gpuheal.actions.litellm_config.drain`); ``/model/update`` is refused there ("No DB Connected").
Off unless ``heal.drain_first: true``; without ``config_file`` and ``restart_command`` nothing is drained
and nothing is said either. Each move is audited as the contract's actions (``redirect-traffic`` out,
``restore-load`` back, ``drain`` naming which), an intent line before and an outcome line after, with the
run id and the issue's evidence; it counts only when LiteLLM's routing read back shows it.

**Back** when the issue that drained the GPU is no longer open — its verified restart cleared it, or it was
a blip — and a real completion on the GPU succeeds now; until then it stays out, said once per run.

Dry-run unless ``--apply``: the plan shows each move (``planned``), reading LiteLLM's routing only (a GET).
A LiteLLM that answers garbage, slowly, or 500 costs one line in the run's actions and the audit; the heal
goes on with its own steps.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuheal.actions.effects import Effects
from gpuheal.actions.ledger import Ledger
from gpuheal.actions.record import Subject
from gpuheal.config.model import Config
from gpuheal.core import drain as core
from gpuheal.core.actions import RewriteLiteLLM
from gpuheal.core.plan import paused_reason
from gpuheal.core.topology import Route
from gpuheal.parse.values import printable
from gpuheal.rules import REMEDIES
from gpuheal.state import files

OUT, BACK = "redirect-traffic", "restore-load"  # the contract's action names of the two moves


def first(ledger: Ledger, effects: Effects, cfg: Config, result: Any, apply: bool, gpu_filter: str | None) -> None:
    """Drain and undrain after this run's evaluation (``result``: :class:`gpuheal.steps.check.CheckResult`).
    Never raises: whatever goes wrong is one line, and the heal goes on."""
    try:
        _first(ledger, effects, cfg, result, apply, gpu_filter)
    except Exception as exc:  # noqa: BLE001 — drain first must never stop the heal that fixes the GPU
        ledger.rec.doc(Subject("fleet", "drain"), OUT, "drain first", "failed", error=printable(repr(exc), 200))


def _first(ledger: Ledger, effects: Effects, cfg: Config, result: Any, apply: bool, gpu_filter: str | None) -> None:
    issues = [*result.issues, *result.evaluation.inhibited]
    book = core.Book.from_json(ledger.store.read(files.DRAIN, {}))
    wanted = [h for h in core.hard_faults(issues, REMEDIES) if h.gpu not in book.drained]
    back = core.due_back(book, {i.key for i in issues})
    if gpu_filter:
        wanted, back = [h for h in wanted if h.gpu == gpu_filter], [d for d in back if d.gpu == gpu_filter]
    step = config_step(cfg)
    if step is None or not (wanted or back):  # nothing suspicious: no call, no wait (the check start-up figure)
        return
    mover = _Mover(ledger, effects, cfg, step, apply)
    for d in back:
        book = mover.back(d, book)
    if not wanted:
        return
    routes = mover.routes()
    failing = frozenset(i.gpu for i in issues if getattr(REMEDIES.get(i.issue), "cannot_serve", False))
    endpoints = {g.alias: g.endpoint for g in cfg.gpus}
    states = {a: s.endpoint for a, s in result.obs.gpus.items()}
    paused = [g.alias for g in cfg.gpus if paused_reason(ledger.state, cfg, g.alias)]
    for h in wanted:
        subject = Subject(h.gpu, h.issue, h.since, {**h.detected, "fault": h.fault})
        if isinstance(routes, str):
            ledger.rec.doc(subject, OUT, f"drain first ({h.fault})", "failed", error=routes)
            continue
        if h.gpu in paused:
            continue
        healthy = core.healthy_gpus(states, failing, book, paused)
        verdict = core.decide(h, routes, endpoints, healthy, failing, book, cfg.heal.fleet_guard_fraction)
        if isinstance(verdict, core.Refuse):
            ledger.rec.blocked(subject, OUT, f"drain first ({h.fault}): {verdict.why}")
            continue
        book = mover.out(h, subject, verdict, book)


def config_step(cfg: Config) -> RewriteLiteLLM | None:
    """The config-file move, when ``heal.drain_first`` asks for it and ``litellm.config_file``,
    ``restart_command`` and ``url`` say how. Opt-in: every move restarts the whole proxy, and through a
    real LiteLLM 1.108.7 that cost more failed requests than LiteLLM's own cooldown (benchmarks/README.md,
    the drill through LiteLLM: 67 of 101 failed per fault with drain first, 0–3 without)."""
    lite = cfg.litellm
    if not (cfg.heal.drain_first and lite.config_file and lite.restart_command and lite.url):
        return None
    where = lite.host if lite.transport == "ssh" and lite.host else "local"
    return RewriteLiteLLM(OUT, lite.config_file, where, tuple(lite.restart_command), "",
                          note="drain first: the GPU's deployments leave LiteLLM's config.yaml while a healthy "
                          "twin serves its groups; put back once it serves again")  # fmt: skip


class _Mover:
    """The two moves of one run, each audited (intent, outcome) and read back."""

    def __init__(self, ledger: Ledger, effects: Effects, cfg: Config, step: RewriteLiteLLM, apply: bool) -> None:
        self.ledger, self.effects, self.cfg, self.step, self.apply = ledger, effects, cfg, step, apply

    def routes(self) -> tuple[Route, ...] | str:
        """LiteLLM's deployments now (``/v1/model/info``), or the one line saying why not."""
        from gpuheal.core.topology import read_routes
        from gpuheal.credentials import env_or_dotenv
        from gpuheal.sources.litellm_admin import AdminProblem, read_model_info

        lite = self.cfg.litellm
        key = env_or_dotenv(lite.admin_key_env, self.cfg.path)
        payload = read_model_info(str(lite.url), key, float(lite.timeout_s))
        if isinstance(payload, AdminProblem):
            return f"LiteLLM's routing not read: {payload.line()}"
        return read_routes(payload)

    def out(self, h: core.Hard, subject: Subject, go: core.Go, book: core.Book) -> core.Book:
        twins = {g: list(t) for g, t in go.twins.items()}
        served = "; ".join(f"{g} stays served by {', '.join(t)}" for g, t in twins.items())
        why = f"drain first ({h.fault}): {served}"
        run_id = self.ledger.run_id() if self.apply else ""
        ok = self._move(subject, OUT, why, self.cfg.gpu(h.gpu).endpoint, False, run_id,
                        {"drain": "out", "fault": h.fault, "groups": list(go.groups), "twins": twins})  # fmt: skip
        if not ok:
            return book
        book = book.with_(core.Drained(h.gpu, h.issue, h.since, h.fault, go.groups, self.ledger.now_s, run_id,
                                       dict(h.detected)))  # fmt: skip
        self.ledger.store.write(files.DRAIN, book.to_json())
        return book

    def back(self, d: core.Drained, book: core.Book) -> core.Book:
        subject = Subject(d.gpu, d.issue, d.since, {**d.detected, "fault": d.fault})
        if d.gpu not in self.cfg.aliases:  # the GPU left the config: nothing to put back into routing
            self.ledger.store.write(files.DRAIN, book.without(d.gpu).to_json())
            return book.without(d.gpu)
        proof = self.effects.prove(d.gpu)
        if not proof.get("ok"):
            self.ledger.rec.blocked(subject, BACK, f"drain first: {d.issue} cleared; {d.gpu} stays out of routing "
                                    f"until a real completion on it succeeds ({proof.get('error')})")  # fmt: skip
            return book
        run_id = self.ledger.run_id() if self.apply else ""
        why = f"{d.issue} cleared and a real completion on {d.gpu} succeeded: back into {', '.join(d.groups)}"
        extra = {"drain": "in", "drained_by": d.run_id, "groups": list(d.groups),
                 "proof": {"completion_s": proof.get("completion_s")}}  # fmt: skip
        if not self._move(subject, BACK, why, self.cfg.gpu(d.gpu).endpoint, True, run_id, extra):
            return book
        book = book.without(d.gpu)
        self.ledger.store.write(files.DRAIN, book.to_json())
        return book

    def _move(self, subject: Subject, action: str, why: str, endpoint: str, restore: bool, run_id: str,
              extra: dict[str, Any]) -> bool:  # fmt: skip
        from gpuheal.actions.litellm_config import describe_drain, drain

        rec, step = self.ledger.rec, replace(self.step, action=action, hot_endpoint=endpoint, restore=restore)
        shown = describe_drain(step, subject.gpu)
        if not self.apply:
            rec.doc(subject, action, why, "planned", shown, step.target, step.note)
            return False
        rec.audit(run_id, subject, action, "pending", "intent", extra={**extra, "why": why, "commands": [shown]})
        res = drain(step, subject.gpu, self.effects.run, self.cfg.heal.command_timeout_s, rec.secrets, self.cfg)
        result = "resolved" if res.ok else "failed"
        rec.audit(run_id, subject, action, result, "outcome", {"read_back": res.note if res.ok else res.error},
                  extra={**extra, "why": why, "command": res.command, "error": res.error})  # fmt: skip
        rec.doc(subject, action, why, result, res.command, step.target, res.note if res.ok else "", res.error)
        return res.ok
