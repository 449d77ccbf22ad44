"""Evaluate the rules for one poll: the issue book in, issues and transitions out.

Two callers share :func:`evaluate_poll` (pure, in memory), so ``replay`` is exactly what cron runs:

- :func:`run_full` — ``check`` (and ``heal``) in the state directory: loads the issue
  book (``issues.json``), the bench results and ``heal``'s restarts, evaluates, saves the book, and
  writes the public ``vram-trend.json`` and ``circuit-breaker-status.json``::

      vram-trend.json             {"schema_version": 1,
                                   ALIAS: {"gpu", "current_mb", "rate_mb_per_hour",
                                           "projected_full_in_hours", "samples", "span_h"}}
      circuit-breaker-status.json {"schema_version": 1,
                                   ALIAS: {"gpu", "open", "auto_reset_attempted", "last_reset",
                                           "opened_at"}}

- :func:`evaluate_bench_full` — ``bench``, after recording results: only the rules judged from them
  (those declaring ``JUDGED_FROM_BENCH``), same book.
- ``steps/replay`` — a recorded trace, with the trace's own clock, no state directory.

Issue dicts (``gpu-health`` ``issues``): ``{"gpu", "issue", "severity", "state", "since",
"fired_at", "detected", "summary"}``; resolved ones add ``resolved_at`` (see
:class:`gpuheal.core.engine.Evaluation`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from gpuheal.config import Config
from gpuheal.core import engine
from gpuheal.core.engine import Evaluation, IssueBook, iso
from gpuheal.core.heal_state import HealState
from gpuheal.core.view import FleetView, Restarts
from gpuheal.model import Observation
from gpuheal.rules import ALL, circuit_breaker_stuck
from gpuheal.rules.benchmark_regression import monitor
from gpuheal.rules.vram_leak.trend import vram_trend
from gpuheal.state import bench_store, files
from gpuheal.state.history import History
from gpuheal.state.store import StateDir
from gpuheal.steps import book as book_file
from gpuheal.steps.rebench import file_raised

__all__ = [
    "Evaluation",
    "evaluate_bench_full",
    "evaluate_probe",
    "evaluate_poll",
    "Judged",
    "run_full",
]


# --------------------------------------------------------------------------- pure


class Judged(NamedTuple):
    """One poll's judgement: the engine's evaluation, the view it read, and whether the recorded bench
    results changed (``check`` then rewrites ``bench-results.json``)."""

    evaluation: Evaluation
    view: FleetView
    bench_changed: bool


def evaluate_poll(
    cfg: Config,
    obs: Observation | None,
    history: History,
    book: IssueBook,
    bench: dict[str, Any],
    restarts: Restarts,
    now_s: float,
    only: tuple[str, ...] | None = None,
) -> Judged:
    """One poll through every rule (or ``only`` these ids): gpu-monitor's benchmark readings recorded
    (Rule 4's, :func:`gpuheal.rules.benchmark_regression.monitor.ingest`) and the poll folded into what
    the rules remember, then every rule judged. ``history`` already holds ``obs``. Mutates ``book`` and
    ``bench`` (and nothing else)."""
    view = FleetView(cfg, now_s, obs, history, bench, book.memory, restarts)
    bench_changed = monitor.ingest(bench, view, book.issues.values())
    engine.remember(ALL, view, book.memory)
    return Judged(engine.evaluate(ALL, view, book, only=only), view, bench_changed)


def evaluate_probe(
    cfg: Config, obs: Observation, book: IssueBook, restarts: Restarts, only: tuple[str, ...], tolerance_s: float
) -> Evaluation:
    """An in-run re-probe (issue 28 item 1, :mod:`gpuheal.core.confirm`) through the rules ``only``
    names — those that count evidence in seconds (``min_probes``). ``obs`` holds only the re-probed
    GPUs' own answers: every other GPU, and every signal a probe does not give (failure ratios,
    temperatures), is "not known" (neither advances nor resets a hold). No history and no bench: a
    re-probe is not a poll of the fleet, so no trend, window or cadence ever sees it; time is counted
    at the probes' cadence (``tolerance_s``). Only ``only``'s memories are folded. Mutates ``book``."""
    view = FleetView(cfg, obs.at.timestamp(), obs, History(), {}, book.memory, restarts, tolerance_s=tolerance_s)
    engine.remember([r for r in ALL if r.ID in only], view, book.memory, prune=False)
    return engine.evaluate(ALL, view, book, only=only)


def breaker_status(view: FleetView, heal_state: HealState) -> dict[str, Any]:
    """The spec's ``circuit-breaker-status`` object per GPU. ``open`` is ``None`` when the breakers are
    not known this poll (the monitor not usable, or a source without them: Prometheus, smi). There
    is no per-GPU auto-reset (Design Decision 5): a reset is a LiteLLM restart by ``heal``, read from
    ``heal-state.json`` ``"litellm_restarts": [epoch_s, ...]``."""
    last_reset = max(heal_state.litellm_restarts, default=None)
    out: dict[str, Any] = {}
    breakers_known = view.obs is not None and view.obs.breakers_known
    for alias in view.aliases:
        sample = view.monitor_sample(alias) if breakers_known else None
        is_open = None if sample is None else bool(sample.breaker is not None and sample.breaker.open)
        opened = circuit_breaker_stuck.opened_at(view, alias) if is_open else None
        out[alias] = {
            "gpu": alias,
            "open": is_open,
            "auto_reset_attempted": bool(
                is_open and opened is not None and last_reset is not None and last_reset >= opened
            ),
            "last_reset": iso(last_reset) if last_reset is not None else None,
            "opened_at": iso(opened) if opened is not None else None,
        }
    return out


# --------------------------------------------------------------------------- state directory


def _load(store: StateDir) -> tuple[IssueBook, bench_store.Loaded]:
    """The issue book and the results as the rules read them: from their index (only the fields rules
    read) while it is the file's (:mod:`gpuheal.state.bench_store`)."""
    return book_file.load(store), bench_store.load_for_check(store)


def run_full(
    cfg: Config, store: StateDir, obs: Observation, history: History, now: datetime,
    heal_state: HealState, restarts: Restarts,
) -> Evaluation:
    """``check``'s evaluation: every rule, one poll, state carried in the directory. ``heal``'s record and
    its ``restarts`` are read by ``check`` before its poll (:class:`gpuheal.steps.check.CheckPlan`), as its
    source's trend windows start there too."""
    book, bench = _load(store)
    ev, view, bench_changed = evaluate_poll(cfg, obs, history, book, bench.data, restarts, now.timestamp())
    book_file.save(store, book)
    file_raised(store, book.memory, now)  # re-benchmarks the rules' memory asks for (Rule 9: a context change)
    if bench_changed:  # gpu-monitor's readings recorded (Rule 4)
        bench_store.save_recorded(store, bench)
    store.write_raw(files.VRAM_TREND, {"schema_version": 1, **{a: vram_trend(view, a) for a in cfg.aliases}})
    store.write_raw(files.CIRCUIT_BREAKER_STATUS, {"schema_version": 1, **breaker_status(view, heal_state)})
    return ev


def evaluate_bench_full(cfg: Config, store: StateDir, now: datetime) -> Evaluation:
    """Only the bench-driven rules, over the recorded results (``bench`` calls this after recording,
    and after answering the re-benchmarks asked for: :func:`gpuheal.steps.rebench.answer`).
    ``issues`` is every open issue of the book, as ``check`` would report it."""
    book, bench = _load(store)
    heal_state = HealState.from_json(store.read(files.HEAL, {}))  # damaged values coerced (issue 9)
    restarts = Restarts.from_heal_state(heal_state, cfg.heal.startup_grace_s)
    judged = tuple(r.ID for r in ALL if r.JUDGED_FROM_BENCH)
    ev = evaluate_poll(cfg, None, History(), book, bench.data, restarts, now.timestamp(), only=judged).evaluation
    book_file.save(store, book)
    return ev
