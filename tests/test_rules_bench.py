"""Rules judged from benchmark results: 4 (regression), 9 (context window), L1 (api-key mismatch),
through replay (monitor measurements) and through ``evaluate_bench_full`` on a real state directory."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gpuheal import benchdata
from gpuheal.core.heal_state import HealState
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import evaluate
from gpuheal.steps.check import plan_check

try:
    from tests.series import START, fleet_config, fleet_trace, polls, run
except ImportError:
    from series import START, fleet_config, fleet_trace, polls, run

CFG = fleet_config()
DENSE, LIGHT, STRIX = "gpu-dense", "gpu-light", "strix-moe"


def plan_heal(store: StateDir) -> tuple[HealState, Any]:
    """heal's record and its restarts, as ``check`` reads them before its poll."""
    heal_state = HealState.from_json(store.read(files.HEAL, {}))
    return heal_state, plan_check(CFG, heal_state).restarts


def result(at_min: float, tok_s: float | None, ok: bool = True, error: str | None = None,
           source: str = "bench", n_ctx: int | None = None, excluded: bool = False) -> dict:
    return {"at": (START + timedelta(minutes=at_min)).timestamp(), "gen_tok_s": tok_s, "prompt_tok_s": None,
            "tokens": 64, "ok": ok, "error": error, "source": source, "model": None, "n_ctx": n_ctx,
            "excluded": excluded, "excluded_reason": "open incident" if excluded else None}


@pytest.fixture
def store(tmp_path):
    with StateDir(tmp_path / "state", 1.0) as s:
        yield s


def bench_eval(store, results_by_alias: dict, at_min: float = 60, cfg=CFG):
    data = benchdata.empty()
    for alias, items in results_by_alias.items():
        data["results"][alias] = items
    store.write(files.BENCH, data)
    return evaluate.evaluate_bench_full(cfg, store, START + timedelta(minutes=at_min))


def rule4(ev) -> list[dict]:
    return [i for i in ev.issues if i.issue == "benchmark-regression"]


# --------------------------------------------------------------------------- Rule 4


def test_rule4_three_slow_monitor_benchmarks_fire():
    r = run(CFG, fleet_trace(CFG, {DENSE: {"bench_tok_s": "74 58 57 56 _ _"}}))
    assert polls(r, DENSE, "benchmark-regression") == [3]
    issue = next(i for i in r.open_at_end if i.issue == "benchmark-regression")
    assert issue.severity == "warning" and issue.since == "2026-07-18T08:01:00Z"
    d = issue.detected
    assert d["baseline_tok_s"] == 74.8 and d["current_tok_s"] == 56 and d["threshold_tok_s"] == 59.84
    assert d["recent_tok_s"] == [58, 57, 56] and d["util_pct"] == 50


def test_rule4_one_slow_run_never_fires():
    r = run(CFG, fleet_trace(CFG, {DENSE: {"bench_tok_s": "74 50 74 50 74 50 50"}}))
    assert polls(r, DENSE, "benchmark-regression") == []


def test_rule4_a_stale_monitor_measurement_counts_once():
    # the monitor repeats the same measured_at: one result, not three
    trace = fleet_trace(CFG, {DENSE: {"bench_tok_s": "55 55 55"}})
    first = trace[0].gpus[DENSE]
    from dataclasses import replace

    trace = [trace[0]] + [replace(o, gpus={**o.gpus, DENSE: replace(o.gpus[DENSE], bench_measured_at=first.bench_measured_at)})
                          for o in trace[1:]]
    assert polls(run(CFG, trace), DENSE, "benchmark-regression", "pending") == []


def test_rule4_from_recorded_bench_results(store):
    ev = bench_eval(store, {DENSE: [result(1, 74.9), result(10, 58.0), result(20, 57.5), result(30, 55.0)]})
    assert [(i.gpu, i.issue, i.state) for i in rule4(ev)] == [(DENSE, "benchmark-regression", "firing")]
    assert rule4(ev)[0].since == "2026-07-18T08:10:00Z"
    # slow enough for Rule 9 too: a recommendation, info
    assert [(i.issue, i.detected["recommendation"]) for i in ev.issues if i.issue == "context-window"] == [
        ("context-window", "reduce")]


def test_rule4_failed_benchmarks_are_not_samples(store):
    ev = bench_eval(store, {DENSE: [result(10, 58.0), result(15, None, ok=False, error="timeout"),
                                    result(20, 57.5), result(30, 55.0)]})
    assert [i.issue for i in rule4(ev)] == ["benchmark-regression"]


def test_rule4_excluded_results_still_count(store):
    ev = bench_eval(store, {DENSE: [result(10, 58.0, excluded=True), result(20, 57.5), result(30, 55.0)]})
    assert [i.issue for i in rule4(ev)] == ["benchmark-regression"]


def test_rule4_two_slow_results_are_not_enough(store):
    ev = bench_eval(store, {DENSE: [result(20, 57.5), result(30, 55.0)]})
    assert rule4(ev) == []


def test_rule4_hysteresis_and_recovery_within_10_percent(store):
    slow = [result(10, 58.0), result(20, 57.5), result(30, 55.0)]
    assert rule4(bench_eval(store, {DENSE: slow}))
    ev = bench_eval(store, {DENSE: [*slow, result(40, 65.0)]}, at_min=41)  # 87 %: still regressing
    assert [i.state for i in rule4(ev)] == ["firing"] and ev.resolved == []
    ev = bench_eval(store, {DENSE: [*slow, result(40, 65.0), result(50, 70.0)]}, at_min=51)  # 93.6 %
    assert rule4(ev) == [] and [(x.gpu, x.issue) for x in ev.resolved] == [(DENSE, "benchmark-regression")]
    assert ev.resolved[0].resolved_at == "2026-07-18T08:51:00Z"


def test_rule4_uses_the_rolling_baseline_once_computed(store):
    data = benchdata.empty()
    data["results"][DENSE] = [result(10, 58.0), result(20, 57.5), result(30, 55.0)]
    data["baselines"][DENSE] = {"baseline_tok_s": 60.0, "source": "rolling-30d", "computed_at": 0, "n": 50}
    store.write(files.BENCH, data)
    issues = evaluate.evaluate_bench_full(CFG, store, START + timedelta(minutes=40)).issues
    assert [i for i in issues if i["issue"] == "benchmark-regression"] == []


def test_rule4_results_older_than_max_age_say_nothing(store):
    ev = bench_eval(store, {DENSE: [result(10, 58.0), result(20, 57.5), result(30, 55.0)]}, at_min=60 * 24 * 8)
    assert ev.issues == []


def test_rule4_no_recent_results_never_clears(store):
    assert rule4(bench_eval(store, {DENSE: [result(10, 58.0), result(20, 57.5), result(30, 55.0)]}))
    ev = bench_eval(store, {DENSE: [result(10, 58.0), result(20, 57.5), result(30, 55.0)]}, at_min=60 * 24 * 8)
    assert [i.state for i in rule4(ev)] == ["firing"] and ev.resolved == []  # not known, not recovered


# --------------------------------------------------------------------------- Rule 9


def test_rule9_the_spec_fleet_today(store):
    """Spec Rule 9: 3090 at 100 % optimal; 5070 at 103 % optimal (within 10 %); Strix at 89 %:
    monitor, do not reduce yet (the example fleet's ``settling: true``)."""
    ev = bench_eval(store, {DENSE: [result(5, 74.9)], LIGHT: [result(5, 169.6)], STRIX: [result(5, 62.9)]})
    assert [(i.gpu, i.issue, i.severity) for i in ev.issues] == [(STRIX, "context-window", "info")]
    d = ev.issues[0].detected
    assert d["recommendation"] == "monitor" and d["ratio_pct"] == 89.2 and d["suggested_n_ctx"] is None


def test_rule9_reduce_by_25_percent_when_not_settling(store):
    ev = bench_eval(store, {DENSE: [result(5, 60.0, n_ctx=65536)]})
    d = ev.issues[0].detected
    assert (d["recommendation"], d["n_ctx"], d["suggested_n_ctx"]) == ("reduce", 65536, 49152)
    assert d["ctx_size_arg"] == 49152 and "--ctx-size 49152" in ev.issues[0].summary


def test_rule9_the_exact_ctx_size_counts_the_slots(store):
    ev = bench_eval(store, {DENSE: [{**result(5, 60.0, n_ctx=1000), "slots": 4}]})
    d = ev.issues[0].detected
    assert (d["suggested_n_ctx"], d["ctx_size_arg"]) == (750, 2048)  # 750 -> 512 a slot (256 steps) x 4
    assert "--ctx-size 2048 (512 per slot x 4 slots)" in ev.issues[0].summary


def test_rule9_headroom_above_the_optimal_band(store):
    ev = bench_eval(store, {LIGHT: [result(5, 190.0)]})
    assert ev.issues[0].detected["recommendation"] == "increase"


def test_rule9_recommendations_never_change_the_status(store):
    from gpuheal.core.health import derive_status

    trace = fleet_trace(CFG, n=1)
    ev = bench_eval(store, {DENSE: [result(5, 60.0)]})
    assert derive_status(trace[0], ev.issues) == "healthy"


def test_rule9_without_results_is_not_known(store):
    assert bench_eval(store, {}).issues == []


# --------------------------------------------------------------------------- L1


def test_l1_401_on_the_probe_fires_at_once():
    r = run(CFG, fleet_trace(CFG, {LIGHT: {"endpoint": "ok unauthorized unauthorized ok"}}))
    assert polls(r, LIGHT, "api-key-mismatch") == [1]
    assert polls(r, LIGHT, "api-key-mismatch", "resolved") == [3]


def test_l1_probe_not_known_never_clears():
    r = run(CFG, fleet_trace(CFG, {LIGHT: {"endpoint": "unauthorized _ _ ok"}}))
    assert polls(r, LIGHT, "api-key-mismatch") == [0]
    assert polls(r, LIGHT, "api-key-mismatch", "resolved") == [3]


def test_l1_bench_401_fires_and_stays_until_a_benchmark_succeeds(store):
    ev = bench_eval(store, {LIGHT: [result(5, 169.0), result(10, None, ok=False, error="unauthorized")]})
    issue = ev.issues[0]
    assert (issue.gpu, issue.issue, issue.severity, issue.state) == (LIGHT, "api-key-mismatch", "critical", "firing")
    assert "not-needed" not in str(issue) and issue.detected["via"] == ["bench"]
    # a later check (probe ok: /health is public) does not clear it
    from gpuheal.state.history import History

    obs = fleet_trace(CFG, n=1, start=START + timedelta(minutes=61))[0]
    hist = History()
    hist.add(obs, CFG.aliases)
    issues = evaluate.run_full(CFG, store, obs, hist, obs.at, *plan_heal(store)).issues
    assert [(i.gpu, i.issue) for i in issues] == [(LIGHT, "api-key-mismatch")]
    # a successful benchmark clears it
    ev = bench_eval(store, {LIGHT: [result(10, None, ok=False, error="unauthorized"), result(70, 168.0)]}, at_min=71)
    assert ev.issues == [] and [x.issue for x in ev.resolved] == ["api-key-mismatch"]


def test_l1_other_bench_errors_say_nothing_about_the_key(store):
    assert bench_eval(store, {LIGHT: [result(10, None, ok=False, error="timeout")]}).issues == []


# --------------------------------------------------------------------------- evaluate_bench_full and the book


def test_evaluate_bench_leaves_other_rules_alone(store):
    from gpuheal.state.history import History

    trace = fleet_trace(CFG, {DENSE: {"temp_c": "90 90"}})
    hist = History()
    for obs in trace:
        hist.add(obs, CFG.aliases)
        evaluate.run_full(CFG, store, obs, hist, obs.at, *plan_heal(store))
    ev = bench_eval(store, {DENSE: [result(10, 58.0), result(20, 57.5), result(30, 55.0)]})
    assert {(i.issue, i.state) for i in ev.issues} == {
        ("thermal-critical", "firing"), ("benchmark-regression", "firing"), ("context-window", "firing")}
    assert [t["issue"] for t in ev.transitions] == ["benchmark-regression", "context-window"]
