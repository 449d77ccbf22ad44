"""Confirm within the run (issue 28 item 1): the re-probe loop of ``heal --apply``, with its sleeps.

When this run's poll saw a hard fault on a GPU's own llama-server (:func:`gpuheal.core.confirm.signature`:
refused, ``/health`` timing out, the task loop silent), the run does not wait for cron's 3rd poll: it
re-probes that GPU every ``heal.confirm_interval_s`` for at most ``heal.confirm_budget_s`` and hands
each probe to the rules that count evidence in seconds (``min_probes``;
:func:`gpuheal.steps.evaluate.evaluate_probe`). It stops as soon as every watched GPU's issue fired
(then ``heal`` plans and acts on it in this same run), answered (the confirmation is reset: the rule's
own finding drops the pending issue, so a flapping server is never restarted on mixed evidence), or
the budget is spent (cron's next polls go on counting). A run whose poll saw nothing suspicious
returns at once: no wait, no re-probe.

Time: the probes are stamped on the run's clock (the poll's ``at``) plus the seconds measured since
the loop began (``Clock.now``, monotonic; injectable with ``Clock.sleep`` so tests run in no time).
The check's own seconds before the loop are not counted: the evidence is never longer than it was.
A process started with ``GPUHEAL_CONFIRM_WAIT=simulated`` (the demo and the tests that run ``gpuheal`` as
cron does, one process per simulated minute under ``GPUHEAL_NOW``, against a simulated fleet whose state
changes only when its clock is advanced) gets that seam too: its waits are counted, not slept
(:func:`default_clock`).

The state lock is not held while the loop only waits and probes (up to ``confirm_budget_s``): it is
what a run must hold to read the state and act on it, and here there is nothing to write until the
loop ends. So before the loop the run writes what it must keep (``keep``: heal's books — the drain just
done, its alerts) and releases the lock; another run may take it meanwhile (cron's next minute behind a
slow drain, a wake, an operator's ``pause``). After the loop the run takes it back (waiting
``state.lock_wait_s``, else exit 3 acting on nothing) and goes on only if no other run held it
meanwhile (:meth:`gpuheal.state.store.StateDir.resume`: the lock file still bears this run's stamp), so
what it read — the issue book, the attempts, the drain — is still the state. If one did, that run saw
the fault and the state, and acted or will act on it; this run acts on nothing (:class:`Overtaken`):
nothing is done twice, and no run's writes are lost under another's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpuheal.config.model import Config
from gpuheal.core import confirm as core
from gpuheal.core.confirm import GpuWatch, Probe, Seen, Watch
from gpuheal.core.engine import IssueBook, iso, load_book
from gpuheal.model import GpuSample, Observation
from gpuheal.state import files
from gpuheal.state.store import StateDir

Prober = Callable[[Config, Collection[str], Collection[str]], dict[str, GpuSample]]


class Overtaken(Exception):
    """Another run held the state lock while this one confirmed without it: this run acts on nothing."""


@dataclass(frozen=True)
class Clock:
    """Seconds since an arbitrary start, and a way to wait (tests give both, jittered)."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def default_clock() -> Clock:
    """Real seconds; with ``GPUHEAL_CONFIRM_WAIT=simulated`` seconds counted on a counter that each wait
    advances (as the chaos week's clock does, without its world): the same probes at the same stamps,
    without sleeping them — for a simulated fleet on a pinned clock (``examples/demo.py``, the tests)."""
    if os.environ.get("GPUHEAL_CONFIRM_WAIT") != "simulated":
        return Clock()
    elapsed_s = [0.0]

    def sleep(seconds: float) -> None:
        elapsed_s[0] += max(0.0, seconds)

    return Clock(now=lambda: elapsed_s[0], sleep=sleep)


def real_probe(cfg: Config, aliases: Collection[str], canary: Collection[str]) -> dict[str, GpuSample]:
    from gpuheal.sources.sense import probe_servers

    return probe_servers(cfg, aliases, canary)


def confirmable(cfg: Config) -> tuple[str, ...]:
    """The rules whose hold may be met by seconds of evidence (``min_probes`` > 0 for some GPU)."""
    from gpuheal.rules import ALL

    subjects = [None, *cfg.gpus]
    return tuple(r.ID for r in ALL
                 if any(cfg.rule_record(r.Params, (cfg.rules if g is None else g.rules).get(r.ID, {})).min_probes > 0
                        for g in subjects))  # fmt: skip


def suspects(result: Any, only: tuple[str, ...]) -> dict[str, GpuWatch]:
    """The GPUs this run watches: a hard fault in this poll, not muted (a restart's grace), and no issue
    of a confirmable rule already firing on it (a GPU being verified or escalated needs no proof)."""
    faults = {a: f for a, f in ((a, core.signature(s)) for a, s in result.obs.gpus.items()) if f is not None}
    if not faults:
        return {}
    ev = result.evaluation
    opened = (*result.issues, *ev.inhibited)
    firing = {i["gpu"] for i in opened if i.get("issue") in only and i.get("state") != "pending"}
    at_s = result.obs.at.timestamp()
    return {alias: GpuWatch(alias, Watch.WATCHING, (Probe(at_s, found),)) for alias, found in faults.items()
            if alias not in firing and alias not in ev.muted}  # fmt: skip


def run(cfg: Config, store: StateDir, result: Any, clock: Clock | None = None, probe: Prober | None = None,
        keep: Callable[[], None] | None = None) -> Any:  # fmt: skip
    """``result`` (``check``'s) after confirming its hard faults within the run: the issues that fired
    on the probes' evidence are firing in it (and in ``issues.json``), each with ``detected["probes"]``.
    The loop runs without the state lock (``keep`` first writes what the caller must keep); raises
    :class:`Overtaken` when another run held the lock meanwhile."""
    from gpuheal.sources.gpu_source import gpu_source

    budget_s, interval_s = cfg.heal.confirm_budget_s, cfg.heal.confirm_interval_s
    only = confirmable(cfg) if budget_s > 0 else ()
    watches = suspects(result, only) if only else {}
    if not watches or not gpu_source(cfg).probes_endpoints:
        return result  # nothing suspicious (or no direct probe to repeat): no wait, no re-probe
    from gpuheal.core.heal_state import HealState
    from gpuheal.core.view import Restarts

    clock = clock or default_clock()
    book = load_book(store.read(files.ISSUES, None))
    restarts = Restarts.from_heal_state(HealState.from_json(store.read(files.HEAL, {})), cfg.heal.startup_grace_s)
    loop = _Loop(cfg, result, book, restarts, only, clock, probe or real_probe)
    if keep is not None:
        keep()
    store.release(budget_s + cfg.state.lock_wait_s)  # waiting and probing need no lock; another run may take it
    watches = loop.watch(watches, budget_s, interval_s)
    if not store.resume(cfg.state.lock_wait_s):
        raise Overtaken(f"another gpuheal run held the state while this one confirmed {', '.join(sorted(watches))} "
                        "between probes: it saw the fault and acts on it; this run acts on nothing")
    if not loop.evaluations:
        return result
    _annotate(book, watches, only)
    store.write(files.ISSUES, book.to_json())
    return loop.result(watches, only)


@dataclass
class _Loop:
    cfg: Config
    first: Any  # check's result
    book: IssueBook
    restarts: Any
    only: tuple[str, ...]
    clock: Clock
    probe: Prober
    evaluations: list[Any] = field(default_factory=list)  # each probe's evaluation, in order

    def watch(self, watches: dict[str, GpuWatch], budget_s: float, interval_s: float) -> dict[str, GpuWatch]:
        """Probe every watched GPU on the schedule until each is settled or the budget is spent."""
        first_s = self.first.obs.at.timestamp()
        start = self.clock.now()
        n = 0
        while any(w.state == Watch.WATCHING for w in watches.values()):
            n += 1
            if not core.within_budget(core.due_s(first_s, n, interval_s), first_s, budget_s):
                break
            wait_s = core.due_s(start, n, interval_s) - self.clock.now()
            if wait_s > 0:
                self.clock.sleep(wait_s)
            at_s = first_s + max(0.0, self.clock.now() - start)
            watches = self.once(watches, at_s, core.probe_tolerance_s(interval_s))
        return {a: w.after(Seen.BUDGET_SPENT) if w.state == Watch.WATCHING else w for a, w in watches.items()}

    def once(self, watches: dict[str, GpuWatch], at_s: float, tol: float) -> dict[str, GpuWatch]:
        from gpuheal.steps.evaluate import evaluate_probe

        aliases = [a for a, w in watches.items() if w.state == Watch.WATCHING]
        canary = [a for a in aliases if getattr(self.first.obs.gpus.get(a), "canary", None) is not None]
        samples = self.probe(self.cfg, aliases, canary)
        got = {a: samples[a] for a in aliases if a in samples}
        obs = Observation(at=datetime.fromtimestamp(at_s, tz=UTC), gpus=got, monitor_ok=False,
                          source=self.first.obs.source)  # fmt: skip
        ev = evaluate_probe(self.cfg, obs, self.book, self.restarts, self.only, tol)
        self.evaluations.append(ev)
        fired = {i["gpu"] for i in ev.fired}
        out = dict(watches)
        for alias in aliases:
            probe = Probe(at_s, core.answer(obs.gpus.get(alias)))
            event = Seen.FIRED if alias in fired else Seen.BAD_PROBE if probe.bad else Seen.ANSWERED
            out[alias] = watches[alias].after(event, probe)
        return out

    def result(self, watches: dict[str, GpuWatch], only: tuple[str, ...]) -> Any:
        """check's result with the last probe's issues (the fired ones carrying their probes)."""
        from gpuheal.core.health import derive_status

        last, first = self.evaluations[-1], self.first
        issues = [_with_probes(i, watches, only) for i in last.issues]
        inhibited = [_with_probes(i, watches, only) for i in last.inhibited]
        ev = replace(
            first.evaluation,
            issues=issues,
            inhibited=inhibited,
            fired=[*first.evaluation.fired, *(f for e in self.evaluations for f in e.fired)],
            transitions=[*first.evaluation.transitions, *(t for e in self.evaluations for t in e.transitions)],
        )
        health = {**first.health, "issues": issues, "status": derive_status(first.obs, issues)}
        return replace(first, issues=issues, health=health, evaluation=ev)


def _with_probes(issue: dict[str, Any], watches: dict[str, GpuWatch], only: tuple[str, ...]) -> dict[str, Any]:
    w = watches.get(issue.get("gpu", ""))
    if w is None or issue.get("issue") not in only or not isinstance(issue.get("detected"), dict):
        return issue
    return {**issue, "detected": {**issue["detected"], "probes": w.evidence(iso), "confirmation": str(w.state)}}


def _annotate(book: IssueBook, watches: dict[str, GpuWatch], only: tuple[str, ...]) -> None:
    """The open issues of the watched GPUs keep what the run saw: each probe, its time, its answer."""
    for rec in book.issues.values():
        w = watches.get(rec.gpu)
        if w is not None and rec.issue in only:
            rec.detected = {**rec.detected, "probes": w.evidence(iso), "confirmation": str(w.state)}
