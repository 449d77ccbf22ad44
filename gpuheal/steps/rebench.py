"""The one re-benchmark mechanism, in the state directory (issue 26 item 2; the records and the measure
are pure, in :mod:`gpuheal.core.rebench`). Three moments, for every rule alike:

- :func:`file_raised` — ``check`` (and ``heal``'s poll), after the poll folded into the rules' memory:
  each rule's ``Remedy.asks`` hook says the re-benchmarks its memory holds (Rule 9: a change of a GPU's
  running context); a new one is filed, with its audit line when this poll saw it. A fix's ask is filed
  by ``heal`` as the attempt ends (:mod:`gpuheal.actions.attempts`, Rule 4: a restored power limit).
- :func:`answer` — ``bench``, after recording its results: each ask whose answer exists
  (:func:`gpuheal.core.rebench.answering`) is judged (:func:`gpuheal.core.rebench.measured`, against
  ``floor_ratio`` from the rule's parameters: :func:`rebench_floor_ratio`) and its verdict handed to the
  rule's ``Remedy.rebenched`` hook (default :func:`gpuheal.core.rebench.prove_fix`), whose
  :class:`~gpuheal.core.rebench.Told` is carried out here: audit lines, messages for the humans, a fix
  disproved for the next ``heal``, what ``bench --json`` shows. An ask is answered once, unless its rule
  keeps it open (a perf loss is judged again by the next result); an ask of a GPU no longer configured
  is dropped (nothing can answer it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuheal import benchdata
from gpuheal.actions import asks as ask_store
from gpuheal.actions.record import old_run_counter
from gpuheal.clock import format_iso
from gpuheal.config import Config
from gpuheal.core import rebench
from gpuheal.core.engine import load_book
from gpuheal.core.memory import Memory
from gpuheal.core.rebench import Asks
from gpuheal.state import bench_store, files
from gpuheal.state.store import StateDir, is_run_id
from gpuheal.steps import book as book_file

if TYPE_CHECKING:
    from gpuheal.core.alert import Alert


def raised(memory: Memory, now_s: float) -> list[rebench.Raised]:
    """The asks every rule's memory holds now (``Remedy.asks``), in registry order."""
    from gpuheal.rules import ALL

    return [r for rule in ALL if rule.REMEDY.asks is not None for r in rule.REMEDY.asks(memory, now_s)]


def file_raised(store: StateDir, memory: Memory, now: datetime) -> None:
    """File the asks the rules' memory holds after this poll; audit those this poll saw first."""
    found = raised(memory, now.timestamp())
    if not found:
        return
    read = ask_store.load(store)
    asks, new = read.merged(r.ask for r in found)
    if not new:
        return
    ask_store.save(store, asks, read)
    lines = [r.line for r in found if r.line is not None and r.ask in new]
    if lines:
        run_id = store.run_id(now, old_run_counter)
        store.append_lines(files.AUDIT_LOG, [{"run_id": run_id, **line} for line in lines])


@dataclass
class Answered:
    """What ``bench`` shows of the verdicts given this run: each rule's ``section`` of ``bench --json``."""

    sections: dict[str, Any] = field(default_factory=dict)

    def show(self, told: rebench.Told, gpu: str) -> None:
        if told.shown is None or not told.section:
            return
        if told.by_gpu:
            self.sections.setdefault(told.section, {})[gpu] = told.shown
        else:
            self.sections.setdefault(told.section, []).append(told.shown)


def answer(
    cfg: Config, store: StateDir, now: datetime, benched: list[dict[str, Any]], baselines: Mapping[str, Any]
) -> Answered:
    """Answer every ask this bench run can (module docstring). ``benched``: this run's results (public
    form); ``baselines``: each GPU's baseline now (tok/s). The rules' memory is read from and written
    back to the issue book, before the bench rules are evaluated (they read what a verdict kept)."""
    from gpuheal.rules import BY_ID

    book = load_book(store.read(files.ISSUES, None))
    read = ask_store.load(store)
    asks, _ = read.merged(r.ask for r in raised(book.memory, now.timestamp()))  # asks stored before the store
    data = bench_store.load(store)
    this_run = {r["gpu"]: r for r in benched}
    out, answered, failed = Answered(), False, asks
    lines: list[dict[str, Any]] = []
    alerts: list[Alert] = []
    kept: list[rebench.RebenchAsk] = []
    for ask in asks.asks:
        if ask.gpu not in cfg.aliases:
            continue  # its GPU is gone from the config: nothing will answer it
        recorded = tuple(benchdata.results(data, ask.gpu))
        result = rebench.answering(ask, recorded, this_run.get(ask.gpu))
        if result is None:
            kept.append(ask)
            continue
        measure = rebench.measured(ask, result, baselines.get(ask.gpu), rebench_floor_ratio(cfg, ask.issue, ask.gpu))
        rule = BY_ID.get(ask.issue)
        hook = rule.REMEDY.rebenched if rule is not None and rule.REMEDY.rebenched is not None else rebench.prove_fix
        answered = True
        told = hook(rebench.Rebenched(ask, result, measure, recorded, book.memory, now.timestamp(), format_iso(now)))
        lines += [{"run_id": ask.attempt if is_run_id(ask.attempt) else store.run_id(now, old_run_counter), **line}
                  for line in told.audit]  # the fix's heal run; this run's when it has none in the contract's form
        alerts += told.alerts
        out.show(told, ask.gpu)
        if told.keep:
            kept.append(replace(ask, checked_at_s=rebench.measured_at(result, ask.checked_at_s)))
        if told.disproves:  # the next heal fails the attempt this was verifying
            failed = failed.with_failure(ask, now.timestamp())
    after = Asks(tuple(kept), failed.failed)
    if after != Asks(read.asks, read.failed):
        ask_store.save(store, after, read)
    if answered:
        book_file.save(store, book)  # what the verdicts kept in the rules' memory
    if lines:
        store.append_lines(files.AUDIT_LOG, lines)
    if alerts:
        from gpuheal.core.alerts import AlertQueue

        queue = AlertQueue.from_json(store.read(files.ALERTS, {}))
        for alert in alerts:
            queue.enqueue(alert)
        store.write(files.ALERTS, queue.to_json())
    return out


def rebench_floor_ratio(cfg: Config, issue: str, gpu: str) -> float | None:
    """The share of the target a re-benchmark for ``issue`` must reach, from the rule's typed parameters
    (:class:`~gpuheal.core.rebench.FloorRatio`); ``None`` when the issue is no rule's or its rule has no
    such parameter."""
    from gpuheal.rules import BY_ID

    rule = BY_ID.get(issue)
    params = None if rule is None else cfg.params_as(rule.Params, issue, gpu)
    return params.rebench_floor_ratio if isinstance(params, rebench.FloorRatio) else None


