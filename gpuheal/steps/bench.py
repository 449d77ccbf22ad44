"""``gpuheal bench``: the benchmark inference test on each GPU, one at a time (issue 5).

For each configured GPU (or ``--gpu ALIAS``), strictly in turn so one benchmark never disturbs
another: :func:`gpuheal.sources.llama_server.benchmark_inference` (``/props`` for the running model
and context, a warm-up, the measured completion, each under a hard deadline). Every result is
recorded in ``bench-results.json`` (:mod:`gpuheal.benchdata`), marked ``excluded`` from the baseline
when it was taken during an open incident of that GPU or inside the startup grace after a restart.
Then: history pruned to ``bench.keep_days`` and thinned as it ages, baselines recomputed (Design
Decision 6: rolling 30-day average, weekly, seeded from the config), ``benchmark-regression.json``
written (Rule 4 state per GPU), and the bench rules evaluated
(:func:`gpuheal.steps.evaluate.evaluate_bench_full`: Rules 4 and 9 and the L1 api-key mismatch), after
the re-benchmarks asked for are answered (:func:`gpuheal.steps.rebench.answer`: a fix's, Rule 4; a
context change's, Rule 9).

Lessons L1/L2: a 401 is recorded as ``unauthorized``, reported as the ``api-key-mismatch`` issue of
that GPU with the key that was sent described, never in full (``describe_key``), not retried, and
the bench moves on to the next GPU.

Exit: 0 done; 1 a regression or a rejected key among the GPUs benchmarked; 3 could not run.

The decisions and documents are pure, in :mod:`gpuheal.core.bench`; the terminal progress bar is
:func:`gpuheal.render.bench.progress_bar` (issue 10, item 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuheal import benchdata
from gpuheal.clock import format_iso
from gpuheal.config import Config, GpuConfig
from gpuheal.core.bench import exclusion_reason, public_result, result_record
from gpuheal.core.heal_state import HealState
from gpuheal.core.issue import FIRING, Issue, Reported
from gpuheal.errors import GpuhealError
from gpuheal.model import ERR_UNAUTHORIZED
from gpuheal.sources.llama_server import benchmark_inference
from gpuheal.state import bench_store, files
from gpuheal.state.store import StateDir
from gpuheal.steps import rebench

if TYPE_CHECKING:  # the renderer loads in command(), for a run that draws
    from gpuheal.core.rule import Rule
    from gpuheal.render.bench import Progress
    from gpuheal.runtime import CommandResult, Runtime


@dataclass
class BenchRun:
    results: list[dict[str, Any]]
    regressions: dict[str, dict[str, Any]]
    issues: list[dict[str, Any]]  # the document's (Rule 8's 401 may be one the engine has not seen yet)
    skipped: list[dict[str, str]] = field(default_factory=list)
    generated_at: str = ""
    rebenched: dict[str, Any] = field(default_factory=dict)  # the re-benchmarks' verdicts, by section (steps/rebench)

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "generated_at": self.generated_at,
            "results": self.results,
            "issues": self.issues,
            "regressions": self.regressions,
        }
        if self.skipped:
            doc["skipped"] = self.skipped
        doc.update(self.rebenched)  # Rule 9's ``context_changes``, a fix's ``rebench`` proofs, ...
        return doc

    def needs_attention(self) -> bool:
        """A rejected key or a regression among the GPUs benchmarked in this run."""
        benched = {r["gpu"] for r in self.results}
        if any(r["error"] == ERR_UNAUTHORIZED for r in self.results):
            return True
        if any(self.regressions.get(a, {}).get("trend") == "regressing" for a in benched):
            return True
        from gpuheal.rules import ALL

        judged = {r.ID for r in ALL if r.JUDGED_FROM_BENCH and r.SEVERITY != "info"}  # not Rule 9's advice
        return any(i.gpu in benched and i.issue in judged and i.state == FIRING for i in Reported.all_of(self.issues))


# --------------------------------------------------------------------------- the step


def select_gpus(cfg: Config, alias: str | None) -> tuple[list[GpuConfig], list[dict[str, str]]]:
    """The GPUs to benchmark, in config order; an unknown alias is a usage error (exit 3)."""
    if alias is not None:
        if alias not in cfg.aliases:
            known = ", ".join(cfg.aliases) or "(none configured)"
            raise GpuhealError(f"unknown GPU alias {alias!r} (known: {known})")
        return [cfg.gpu(alias)], []  # named explicitly: benchmarked even when paused
    chosen = [g for g in cfg.gpus if not g.paused]
    skipped = [{"gpu": g.alias, "reason": "paused"} for g in cfg.gpus if g.paused]
    return chosen, skipped


def run(
    cfg: Config,
    store: StateDir,
    now: datetime,
    gpu: str | None = None,
    progress: Progress | None = None,
) -> BenchRun:
    from gpuheal.rules import ALL, api_key_mismatch
    from gpuheal.rules.benchmark_regression.report import regression_document

    gpus, skipped = select_gpus(cfg, gpu)
    now_s = now.timestamp()
    fleet_incidents = slowing_every_gpu(ALL)
    bench_cfg = cfg.bench
    incidents = open_incidents(store)
    restarts = recent_restarts(store)
    grace_s = cfg.heal.startup_grace_s
    data = bench_store.load(store)

    results: list[dict[str, Any]] = []
    for index, g in enumerate(gpus):
        if progress:
            progress(g.alias, index, len(gpus), None)
        outcome = benchmark_inference(
            g.endpoint,
            cfg.litellm.api_key,
            bench_cfg.n_predict,
            bench_cfg.timeout_s,
            bench_cfg.warmup,
            prompt=bench_cfg.prompt,
        )
        reason = exclusion_reason(g.alias, now_s, incidents, restarts.get(g.alias, []), grace_s,
                                  fleet_incidents=fleet_incidents)
        record = result_record(outcome, now_s, reason)
        benchdata.add_result(data, g.alias, record)
        results.append(public_result(g.alias, record, outcome))
        if progress:
            progress(g.alias, index, len(gpus), outcome)

    benchdata.prune(data, now_s, bench_cfg.keep_days, cfg.aliases)
    benchdata.downsample(data, now_s)
    for g in cfg.gpus:
        benchdata.recompute_baseline(data, g.alias, now_s, g.baseline_tok_s)
    bench_store.save(store, data)  # and its index, which check reads

    regressions = regression_document(cfg, data, now_s)
    store.write_raw(files.BENCHMARK_REGRESSION, {"schema_version": 1, **regressions})
    baselines = {g: regressions.get(g, {}).get("baseline_tok_sec") for g in cfg.aliases}
    answered = rebench.answer(cfg, store, now, results, baselines)  # the re-benchmarks asked for (Rules 4, 9)

    from gpuheal.steps.evaluate import evaluate_bench_full

    issues = api_key_mismatch.complete_issues(evaluate_bench_full(cfg, store, now).issues, results, now)
    return BenchRun(
        results=results,
        regressions=regressions,
        issues=issues,
        skipped=skipped,
        generated_at=format_iso(now),
        rebenched=answered.sections,
    )


def command(rt: Runtime, store: StateDir, gpu: str | None = None) -> CommandResult:
    """CLI adapter: progress on a terminal (stderr, never stdout), then the document or a table."""
    from gpuheal import exit_codes
    from gpuheal.render.bench import ProgressBar
    from gpuheal.runtime import CommandResult

    with ProgressBar() as progress:
        result = run(rt.cfg, store, rt.now, gpu=gpu, progress=progress)
    document = result.document()

    def render() -> None:
        from gpuheal.render.bench import render_bench

        render_bench(document)

    return CommandResult(
        document=document,
        exit_code=exit_codes.ATTENTION if result.needs_attention() else exit_codes.OK,
        render=render,
    )


# --------------------------------------------------------------------------- state readers


def slowing_every_gpu(rules: Sequence[Rule[Any]]) -> frozenset[str]:
    """The fleet-wide issues that slow every GPU, so that a result taken during one stays out of the
    baseline: a fleet rule's issue that inhibits nothing is the fleet's own condition (cooling), where
    an inhibitor's (the data source down) says only that gpuheal cannot see."""
    return frozenset(r.ID for r in rules if r.SCOPE == "fleet" and r.INHIBITS is None)


def open_incidents(store: StateDir) -> list[Issue]:
    """Firing warning/critical issues in the engine's issue book — the same book ``check``,
    ``heal`` and ``bench`` itself update, so a regression found by the previous bench run
    already excludes the next result (a regression must never become the new baseline)."""
    from gpuheal.core.engine import load_book

    book = load_book(store.read(files.ISSUES, {}))
    return [
        rec.as_issue()
        for rec in book.issues.values()
        if rec.state == FIRING and rec.severity in ("warning", "critical")
    ]


def recent_restarts(store: StateDir) -> dict[str, list[float]]:
    """``heal-state.json`` ``restarts``: {alias: [epoch_s, ...]}, read as heal reads it
    (:class:`~gpuheal.core.heal_state.HealState`: a damaged value loses that value only)."""
    state = HealState.from_json(store.read(files.HEAL, {}))
    return {str(alias): list(times) for alias, times in state.restarts.items()}
