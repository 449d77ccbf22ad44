"""Confirm within the run (issue 28 item 1): the re-probe loop of ``heal --apply``, with its sleeps.

When this run's poll saw a hard fault on a GPU's own llama-server (:func:`gpuheal.core.confirm.signature`:
refused, ``/health`` timing out, the task loop silent), the run does not wait for cron's 3rd poll: it
re-probes that GPU every ``heal.confirm_interval_s`` for at most ``heal.confirm_budget_s`` and hands
each probe to the rules that count evidence in seconds (``min_probes``;
:func:`gpuheal.steps.evaluate.evaluate_probe`). Each watch ends when its GPU's issue fired, answered
(the confirmation is reset: the rule's own finding drops the pending issue, so a flapping server is
never restarted on mixed evidence), or the budget is spent (cron's next polls go on counting). As soon
as one GPU's issue fired, the loop hands the run back (:func:`rounds`) and ``heal`` plans and acts on it
in this same run, then the loop goes on confirming the others on the same schedule within what is left
of the same budget: a confirmed GPU never waits for a slower one's hold. A run whose poll saw nothing
suspicious returns at once: no wait, no re-probe.

Time: the probes are stamped on the run's clock (the poll's ``at``) plus the seconds measured since
the poll began (``polled_s``, a reading of ``Clock.now`` — monotonic; injectable with ``Clock.sleep``
so tests run in no time — taken just before the check, whose direct probes go out first thing), and
the re-probes are due every ``confirm_interval_s`` from then: the poll's own answer is evidence from
when it was asked, not from when the check finished with the slowest server (a ``/health`` that timed
out took the probe deadline, 5 s, of the check). One probe already due when the loop starts runs at
once, never a burst. The budget counts from the loop's start (a slow check of a large fleet does not
eat it). The evidence is never longer than it was: the poll's probe went out after ``polled_s``.
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
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpuheal.clock import Clock
from gpuheal.config.model import Config
from gpuheal.core import confirm as core
from gpuheal.core.confirm import GpuWatch, Probe, Seen, Watch
from gpuheal.core.engine import IssueBook, load_book
from gpuheal.model import GpuSample, Observation
from gpuheal.rules.host_unreachable.reach import STATE_FILE, Reacher, SilentLooks, ask_hosts
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import book as book_file

if TYPE_CHECKING:
    from gpuheal.core.heal_state import HealState

Prober = Callable[[Config, Collection[str], Collection[str]], dict[str, GpuSample]]


class Overtaken(Exception):
    """Another run held the state lock while this one confirmed without it: this run acts on nothing."""


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


def real_reach(cfg: Config, aliases: Collection[str]) -> set[str]:
    from gpuheal.actions.reach import silent_hosts

    return silent_hosts(cfg, aliases)


def confirmable(cfg: Config) -> tuple[str, ...]:
    """The rules whose hold may be met by seconds of evidence (``min_probes`` > 0 for some GPU)."""
    from gpuheal.rules import ALL

    return tuple(r.ID for r in ALL if any(p.min_probes > 0 for p in cfg.rule_records(r.Params, r.ID)))


def run(cfg: Config, store: StateDir, result: Any, clock: Clock | None = None, probe: Prober | None = None,
        keep: Callable[[], None] | None = None, reach: Reacher | None = None) -> Any:  # fmt: skip
    """``result`` (``check``'s) after confirming all its hard faults within the run: the last of
    :func:`rounds`, acting on nothing between them (what a caller that does not act sees)."""
    return list(rounds(cfg, store, result, clock, probe, keep, reach=reach))[-1]


def rounds(cfg: Config, store: StateDir, result: Any, clock: Clock | None = None, probe: Prober | None = None,
           keep: Callable[[], None] | None = None, polled_s: float | None = None,
           reach: Reacher | None = None, heal_state: HealState | None = None) -> Iterator[Any]:  # fmt: skip
    """``result`` (``check``'s) after confirming its hard faults within the run, one round at a time: each
    round yields the result whose issues fired on the probes' evidence so far (firing in it and in
    ``issues.json``, each with ``detected["probes"]``), with the state lock held, so the caller acts on
    them before the next round goes on confirming the GPUs still watched. A GPU whose hold is met is never
    kept waiting for a slower one's (issue 28: "acts as soon as the rule's confirmation holds") — a
    SIGKILLed server's 20 s of evidence no longer waits for a frozen task loop's 30 s. The probes keep
    their schedule and the one budget across rounds. The waits run without the lock (``keep`` first
    writes what the caller must keep, before every release); raises :class:`Overtaken` when another run
    held the lock meanwhile (what earlier rounds acted on was kept before the release: nothing is lost
    and nothing done twice). ``polled_s``: ``clock.now()`` when the poll began (default: the loop's start).

    First the hosts of the GPUs whose ``/health`` refused or timed out are asked over SSH (``reach``, by
    default :func:`real_reach` with the real probes, none with a caller's ``probe``): a silent host's GPU is
    not confirmed in-run (:func:`gpuheal.rules.host_unreachable.reach.ask_hosts`). ``heal_state``: the heal
    state as the caller's books read it under this lock (``heal``'s: one parse a run, issue 29); ``None``:
    read here."""
    from gpuheal.sources.gpu_source import gpu_source

    budget_s, interval_s = cfg.heal.confirm_budget_s, cfg.heal.confirm_interval_s
    only = confirmable(cfg) if budget_s > 0 else ()
    watches = core.suspects(result, only) if only else {}
    if not watches or not gpu_source(cfg).probes_endpoints:
        yield result  # nothing suspicious (or no direct probe to repeat): no wait, no re-probe
        return
    reach = reach or (real_reach if probe is None else None)
    looks = SilentLooks.from_json(store.read(STATE_FILE, {}))
    watches, looked = ask_hosts(cfg, result, watches, reach, looks)
    if looked != looks:  # Rule 6's memory of its hosts' silence (its look before a restart reads it)
        store.write(STATE_FILE, looked.to_json())
    if not any(w.state == Watch.WATCHING for w in watches.values()):
        yield result  # every suspect's host is silent too: nothing to confirm in-run
        return
    from gpuheal.core.view import Restarts

    clock = clock or default_clock()
    book = load_book(store.read(files.ISSUES, None))
    if heal_state is None:
        from gpuheal.core.heal_state import HealState

        heal_state = HealState.from_json(store.read(files.HEAL, {}))
    restarts = Restarts.from_heal_state(heal_state, cfg.heal.startup_grace_s)
    loop = _Loop(cfg, result, book, restarts, only, clock, probe or real_probe, polled_s=polled_s)
    while True:
        if keep is not None:
            keep()
        store.release(loop.left_s(budget_s) + cfg.state.lock_wait_s)  # waiting and probing need no lock
        watches = loop.watch(watches, budget_s, interval_s)
        if not store.resume(cfg.state.lock_wait_s):
            raise Overtaken(f"another gpuheal run held the state while this one confirmed "
                            f"{', '.join(sorted(watches))} between probes: it saw the fault and acts on it; "
                            "this run acts on nothing more")  # fmt: skip
        if not loop.evaluations:
            yield result
            return
        core.annotate(book, watches, only)
        book_file.save(store, book)
        yield loop.result(watches, only)
        if not any(w.state == Watch.WATCHING for w in watches.values()):
            return


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
    polled_s: float | None = None  # clock.now() when the poll began: the evidence's and the schedule's start
    start_s: float | None = None  # clock.now() at the first call of watch: the budget's start
    n: int = 0  # re-probes started so far

    def left_s(self, budget_s: float) -> float:
        """Seconds of the budget not yet spent (all of it before the first probe)."""
        return budget_s if self.start_s is None else max(0.0, budget_s - (self.clock.now() - self.start_s))

    def watch(self, watches: dict[str, GpuWatch], budget_s: float, interval_s: float) -> dict[str, GpuWatch]:
        """Probe every watched GPU on the schedule until some GPU's issue fired (the caller acts on it,
        then calls again for the rest), each is settled, or the budget is spent. The schedule and the
        budget count from the first call: a later call goes on where the last one stopped."""
        first_s = self.first.obs.at.timestamp()
        if self.start_s is None:
            self.start_s = self.clock.now()
        start = self.start_s
        polled = start if self.polled_s is None else min(self.polled_s, start)
        while any(w.state == Watch.WATCHING for w in watches.values()):
            self.n = max(self.n + 1, int((self.clock.now() - polled) // interval_s))  # one overdue probe at once
            due = core.due_s(polled, self.n, interval_s)
            if not core.within_budget(due, start, budget_s):
                break
            wait_s = due - self.clock.now()
            if wait_s > 0:
                self.clock.sleep(wait_s)
            at_s = first_s + max(0.0, self.clock.now() - polled)
            before = watches
            watches = self.once(watches, at_s, lambda: first_s + max(0.0, self.clock.now() - polled),
                                core.probe_tolerance_s(interval_s))  # fmt: skip
            if any(w.state == Watch.CONFIRMED and before[a].state == Watch.WATCHING for a, w in watches.items()):
                return watches  # confirmed: acted on now, never kept waiting for a slower GPU's hold
        return {a: w.after(Seen.BUDGET_SPENT) if w.state == Watch.WATCHING else w for a, w in watches.items()}

    def once(self, watches: dict[str, GpuWatch], at_s: float, now_s: Callable[[], float],
             tol: float) -> dict[str, GpuWatch]:  # fmt: skip
        """One re-probe of the watched GPUs, asked at ``at_s``; each answer is judged at the time it was known
        (:func:`gpuheal.core.confirm.answered_at_s`: a silence at the probe's deadline, ``now_s()`` on its
        return), the GPUs known at the same time in one evaluation, earliest first."""
        from gpuheal.steps.evaluate import evaluate_probe

        aliases = [a for a, w in watches.items() if w.state == Watch.WATCHING]
        canary = [a for a in aliases if getattr(self.first.obs.gpus.get(a), "canary", None) is not None]
        samples = self.probe(self.cfg, aliases, canary)
        returned_s = now_s()
        got = {a: samples[a] for a in aliases if a in samples}
        answers = {a: core.answer(got.get(a)) for a in aliases}
        known_s = {a: core.answered_at_s(answers[a], at_s, returned_s) for a in aliases}
        fired: set[str] = set()
        for when_s in sorted({known_s[a] for a in got}) or [at_s]:
            obs = Observation(at=datetime.fromtimestamp(when_s, tz=UTC),
                              gpus={a: s for a, s in got.items() if known_s[a] == when_s}, monitor_ok=False,
                              source=self.first.obs.source)  # fmt: skip
            ev = evaluate_probe(self.cfg, obs, self.book, self.restarts, self.only, tol)
            self.evaluations.append(ev)
            fired |= {i.gpu for i in ev.fired}
        out = dict(watches)
        for alias in aliases:
            probe = Probe(known_s[alias], answers[alias])
            event = Seen.FIRED if alias in fired else Seen.BAD_PROBE if probe.bad else Seen.ANSWERED
            out[alias] = watches[alias].after(event, probe)
        return out

    def result(self, watches: dict[str, GpuWatch], only: tuple[str, ...]) -> Any:
        """check's result with the last probe's issues (the fired ones carrying their probes)."""
        from gpuheal.core.health import derive_status

        last, first = self.evaluations[-1], self.first
        issues = [core.with_probes(i, watches, only) for i in last.issues]
        inhibited = [core.with_probes(i, watches, only) for i in last.inhibited]
        ev = replace(
            first.evaluation,
            issues=issues,
            inhibited=inhibited,
            fired=[*first.evaluation.fired, *(f for e in self.evaluations for f in e.fired)],
            transitions=[*first.evaluation.transitions, *(t for e in self.evaluations for t in e.transitions)],
        )
        health = {**first.health, "issues": [i.to_json() for i in issues], "status": derive_status(first.obs, issues)}
        return replace(first, issues=issues, health=health, evaluation=ev)

