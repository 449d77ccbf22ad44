"""``gpuheal bench``: the benchmark inference test on each GPU, one at a time (issue 5).

For each configured GPU (or ``--gpu ALIAS``), strictly in turn so one benchmark never disturbs
another: :func:`gpuheal.sources.llama_server.benchmark_inference` (``/props`` for the running model
and context, a warm-up, the measured completion, each under a hard deadline). Every result is
recorded in ``bench-results.json`` (:mod:`gpuheal.benchdata`), marked ``excluded`` from the baseline
when it was taken during an open incident of that GPU or inside the startup grace after a restart.
Then: history pruned to ``bench.keep_days`` and thinned as it ages, baselines recomputed (Design
Decision 6: rolling 30-day average, weekly, seeded from the config), ``benchmark-regression.json``
written (Rule 4 state per GPU), and the bench rules evaluated
(:func:`gpuheal.steps.evaluate.evaluate_bench`: Rules 4 and 9 and the L1 api-key mismatch).

Lessons L1/L2: a 401 is recorded as ``unauthorized``, reported as the ``api-key-mismatch`` issue of
that GPU with the key that was sent described, never in full (``describe_key``), not retried, and
the bench moves on to the next GPU.

Exit: 0 done; 1 a regression or a rejected key among the GPUs benchmarked; 3 could not run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuheal import benchdata
from gpuheal.clock import format_epoch, format_iso
from gpuheal.config import Config, GpuConfig
from gpuheal.core import timing
from gpuheal.core.heal_state import normalise_state
from gpuheal.errors import GpuhealError
from gpuheal.sources.llama_server import ERR_UNAUTHORIZED, BenchOutcome, benchmark_inference
from gpuheal.state import files
from gpuheal.state.store import StateDir

REGRESSION_ISSUE = "benchmark-regression"
KEY_ISSUE = "api-key-mismatch"
RESULT_KEYS = ("gen_tok_s", "prompt_tok_s", "tokens", "model", "n_ctx")
# Fleet-wide issues that slow every GPU (and so keep this GPU's results out of its baseline).
FLEET_INCIDENTS = frozenset({"cooling-infrastructure"})

# progress callback: (alias, index, total, outcome or None when starting)
Progress = Callable[[str, int, int, BenchOutcome | None], None]


@dataclass
class BenchRun:
    results: list[dict[str, Any]]
    regressions: dict[str, dict[str, Any]]
    issues: list[dict[str, Any]]
    skipped: list[dict[str, str]] = field(default_factory=list)
    generated_at: str = ""

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "generated_at": self.generated_at,
            "results": self.results,
            "issues": self.issues,
            "regressions": self.regressions,
        }
        if self.skipped:
            doc["skipped"] = self.skipped
        return doc

    def needs_attention(self) -> bool:
        """A rejected key or a regression among the GPUs benchmarked in this run."""
        benched = {r["gpu"] for r in self.results}
        if any(r["error"] == ERR_UNAUTHORIZED for r in self.results):
            return True
        if any(self.regressions.get(a, {}).get("trend") == "regressing" for a in benched):
            return True
        return any(
            i.get("gpu") in benched
            and i.get("issue") in (REGRESSION_ISSUE, KEY_ISSUE)
            and i.get("state", "firing") == "firing"
            for i in self.issues
        )


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
    gpus, skipped = select_gpus(cfg, gpu)
    now_s = now.timestamp()
    bench_cfg = cfg.bench
    incidents = open_incidents(store)
    restarts = recent_restarts(store)
    grace_s = float(cfg.heal["startup_grace_s"])
    data = benchdata.normalise(store.read(files.BENCH, benchdata.empty()))

    results: list[dict[str, Any]] = []
    for index, g in enumerate(gpus):
        if progress:
            progress(g.alias, index, len(gpus), None)
        outcome = benchmark_inference(
            g.endpoint,
            cfg.litellm.api_key,
            int(bench_cfg["n_predict"]),
            float(bench_cfg["timeout_s"]),
            bool(bench_cfg.get("warmup", True)),
            prompt=bench_cfg.get("prompt"),
        )
        reason = exclusion_reason(g.alias, now_s, incidents, restarts.get(g.alias, []), grace_s)
        record = result_record(outcome, now_s, reason)
        benchdata.add_result(data, g.alias, record)
        results.append(public_result(g.alias, record, outcome))
        if progress:
            progress(g.alias, index, len(gpus), outcome)

    benchdata.prune(data, now_s, float(bench_cfg["keep_days"]), cfg.aliases)
    benchdata.downsample(data, now_s)
    for g in cfg.gpus:
        benchdata.recompute_baseline(data, g.alias, now_s, g.baseline_tok_s)
    store.write(files.BENCH, data)

    regressions = regression_document(cfg, data, now_s)
    store.write_raw(files.BENCHMARK_REGRESSION, {"schema_version": 1, **regressions})

    from gpuheal.steps.evaluate import evaluate_bench

    issues = [dict(i) for i in evaluate_bench(cfg, store, now)]
    issues = complete_issues(issues, results, now)
    return BenchRun(
        results=results,
        regressions=regressions,
        issues=issues,
        skipped=skipped,
        generated_at=format_iso(now),
    )


def command(rt, store: StateDir, gpu: str | None = None):
    """CLI adapter: progress on a terminal (stderr, never stdout), then the document or a table."""
    from gpuheal import exit_codes
    from gpuheal.runtime import CommandResult

    with _progress_bar() as progress:
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


# --------------------------------------------------------------------------- pieces (pure)


def open_incidents(store: StateDir) -> list[dict[str, Any]]:
    """Firing warning/critical issues in the engine's issue book — the same book ``check``,
    ``heal`` and ``bench`` itself update, so a regression found by the previous bench run
    already excludes the next result (a regression must never become the new baseline)."""
    from gpuheal.core.engine import load_book

    book = load_book(store.read(files.ISSUES, {}))
    return [
        rec
        for rec in book["issues"].values()
        if rec.get("state") == "firing" and rec.get("severity") in ("warning", "critical")
    ]


def recent_restarts(store: StateDir) -> dict[str, list[float]]:
    """``heal-state.json`` ``restarts``: {alias: [epoch_s, ...]} — tolerant of a damaged file."""
    restarts = normalise_state(store.read(files.HEAL, {}))["restarts"]
    if not isinstance(restarts, dict):
        return {}
    out: dict[str, list[float]] = {}
    for alias, times in restarts.items():
        if isinstance(times, list):
            out[str(alias)] = [
                float(t) for t in times if isinstance(t, int | float) and not isinstance(t, bool)
            ]
    return out


def exclusion_reason(
    alias: str,
    now_s: float,
    incidents: list[dict[str, Any]],
    restarts: list[float],
    grace_s: float,
) -> str | None:
    """Why a result taken now stays out of the baseline, or None (issue 5, item 3)."""
    for issue in incidents:
        gpu = issue.get("gpu")
        if gpu == alias or (gpu == "fleet" and issue["issue"] in FLEET_INCIDENTS):
            return f"incident: {issue['issue']}"
    recent = [t for t in restarts if timing.within_last(now_s, t, grace_s)]  # counted in polls (issue 9)
    if recent:
        return f"startup-grace: restarted {now_s - max(recent):.0f} s ago"
    return None


def result_record(outcome: BenchOutcome, now_s: float, excluded_reason: str | None) -> dict[str, Any]:
    """The stored RESULT (benchdata's shape)."""
    return {
        "at": now_s,
        "gen_tok_s": outcome.gen_tok_s if outcome.ok else None,
        "prompt_tok_s": outcome.prompt_tok_s if outcome.ok else None,
        "tokens": outcome.tokens,
        "ok": outcome.ok,
        "error": outcome.error,
        "source": "bench",
        "model": outcome.model,
        "n_ctx": outcome.n_ctx,
        "excluded": excluded_reason is not None,
        "excluded_reason": excluded_reason,
        "slots": outcome.slots,
        "api": outcome.api,
        "rate_source": outcome.rate_source,
        "elapsed_s": outcome.elapsed_s,
        "key_sent": outcome.key_sent,
    }


def public_result(alias: str, record: dict[str, Any], outcome: BenchOutcome) -> dict[str, Any]:
    """One entry of the ``--json`` ``results`` list."""
    out: dict[str, Any] = {"gpu": alias, **{k: record[k] for k in RESULT_KEYS}}
    out.update(
        ok=record["ok"],
        error=record["error"],
        excluded=record["excluded"],
        excluded_reason=record["excluded_reason"],
        detail=outcome.detail or None,
        elapsed_s=outcome.elapsed_s,
        api=outcome.api,
        requests=outcome.requests,
    )
    if outcome.key_sent is not None:
        out["key_sent"] = outcome.key_sent
    return out


def regression_document(cfg: Config, data: dict[str, Any], now_s: float) -> dict[str, dict[str, Any]]:
    """``benchmark-regression.json`` (without ``schema_version``): one entry per configured GPU."""

    def iso(epoch: float) -> str:
        return format_epoch(epoch)

    window_start = now_s - 30 * benchdata.DAY_S
    out: dict[str, dict[str, Any]] = {}
    for g in cfg.gpus:
        params = cfg.rule_params(REGRESSION_ISSUE, g.alias)
        base, source = benchdata.baseline(data, g.alias, g.baseline_tok_s)
        state = benchdata.regression_state(
            data,
            g.alias,
            base,
            drop_ratio=float(params["drop_ratio"]),
            min_results=int(params["min_results"]),
            recovered_within_ratio=float(params["recovered_within_ratio"]),
            since_s=now_s - float(params["max_age_h"]) * 3600 if params.get("max_age_h") else None,
        )
        alerts: list[dict[str, Any]] = []
        if state["trend"] == "regressing":
            drop = 100 * (1 - state["current_tok_s"] / base)
            alerts.append(
                {
                    "issue": REGRESSION_ISSUE,
                    "severity": "warning",
                    "since": iso(state["regressing_since"]),
                    "message": (
                        f"{state['current_tok_s']:.1f} tok/s, {drop:.0f}% below the baseline "
                        f"{base:.1f} (alert below {state['threshold_tok_s']:.1f}; "
                        f"recovered at {state['recovered_tok_s']:.1f})"
                    ),
                }
            )
        key_alert = _key_alert(data, g.alias, iso)
        if key_alert:
            alerts.append(key_alert)
        usable = [
            r for r in benchdata.ok_results(data, g.alias, window_start) if not r.get("excluded")
        ]
        out[g.alias] = {
            "gpu": g.alias,
            "baseline_tok_sec": base,
            "current_tok_sec": state["current_tok_s"],
            "trend": state["trend"],
            "alerts": alerts,
            "baseline_source": source,
            "samples": len(usable),
            "alert_below_tok_sec": state["threshold_tok_s"],
            "updated_at": iso(now_s),
        }
    return out


def _key_alert(data: dict[str, Any], alias: str, iso) -> dict[str, Any] | None:
    """The latest attempt was refused with 401: say so, with the key described (never shown)."""
    items = benchdata.results(data, alias)
    if not items or items[-1].get("error") != ERR_UNAUTHORIZED:
        return None
    since = items[-1]["at"]
    for r in reversed(items):
        if r.get("error") != ERR_UNAUTHORIZED:
            break
        since = r["at"]
    sent = items[-1].get("key_sent") or "?"
    return {
        "issue": KEY_ISSUE,
        "severity": "critical",
        "since": iso(since),
        "message": f"llama-server answers 401 to the configured litellm.api_key (sent {sent}); "
        "not retried (L1/L2)",
    }


def complete_issues(
    issues: list[dict[str, Any]], results: list[dict[str, Any]], now: datetime
) -> list[dict[str, Any]]:
    """Make sure a 401 seen by this run is in the list as the api-key-mismatch issue of that GPU,
    with the key that was sent (described, never shown). The rules engine's own issue wins where
    it has one (its ``detected`` gains ``key_sent``); Rule 4 is the engine's alone."""
    have = {(i.get("gpu"), i.get("issue")): i for i in issues}
    stamp = format_iso(now)
    for r in results:
        if r["error"] != ERR_UNAUTHORIZED:
            continue
        key = (r["gpu"], KEY_ISSUE)
        if key in have:
            detected = have[key].get("detected")
            detected = dict(detected) if isinstance(detected, dict) else {}
            detected.setdefault("key_sent", r.get("key_sent"))
            have[key]["detected"] = detected
            continue
        issue = {
            "gpu": r["gpu"],
            "issue": KEY_ISSUE,
            "severity": "critical",
            "state": "firing",
            "since": stamp,
            "detected": {"status": 401, "key_sent": r.get("key_sent"), "answer": r.get("detail")},
            "summary": f"llama-server rejects the configured litellm.api_key (sent {r.get('key_sent')}); "
            "start it with the LiteLLM key (L1). Not retried.",
        }
        issues.append(issue)
        have[key] = issue
    return issues


# --------------------------------------------------------------------------- progress


class _progress_bar:
    """A rich progress bar on stderr when stderr is a terminal; otherwise nothing at all.

    stdout stays the document's alone (``--json``) or the table's; the bar is transient.
    """

    def __init__(self) -> None:
        self._progress = None
        self._task = None

    def __enter__(self) -> Progress | None:
        if not sys.stderr.isatty():
            return None
        from rich import progress as rp

        from gpuheal.render.human import console

        self._progress = rp.Progress(
            rp.TextColumn("bench {task.description}", markup=False),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TimeElapsedColumn(),
            console=console(stderr=True),
            transient=True,
        )
        self._progress.start()
        return self._update

    def _update(self, alias: str, index: int, total: int, outcome: BenchOutcome | None) -> None:
        from gpuheal.render.human import clean

        if self._task is None:
            self._task = self._progress.add_task(clean(alias), total=total)
        if outcome is None:
            self._progress.update(self._task, description=clean(alias))
        else:
            self._progress.update(self._task, completed=index + 1)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
