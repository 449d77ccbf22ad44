"""Baselines (Design Decision 6), bounded history and the Rule 4 state machine (benchdata), plus
the rolling baseline taking over from the config seed through ``bench`` itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from test_bench_fakes import FakeLlama, Reply, completion_body, timings

from gpuheal import benchdata
from gpuheal.benchdata import DAY_S
from gpuheal.config import load_config_dict
from gpuheal.runtime import Runtime
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import bench as step

T0 = 1_784_361_600.0  # 2026-07-18T08:00:00Z
H = 3600.0


def result(at, gen=74.0, ok=True, excluded=False, error=None):
    return {
        "at": at,
        "gen_tok_s": gen if ok else None,
        "prompt_tok_s": None,
        "tokens": 64 if ok else None,
        "ok": ok,
        "error": error,
        "source": "bench",
        "model": None,
        "n_ctx": None,
        "excluded": excluded,
        "excluded_reason": "incident: thermal-critical" if excluded else None,
    }


def daily(data, alias, days, gen=70.0, start=T0):
    for d in range(days):
        benchdata.add_result(data, alias, result(start + d * DAY_S, gen))


# ----------------------------------------------------------------------------- baselines


def test_seeded_from_config_until_a_week_of_results_exists():
    data = benchdata.empty()
    daily(data, "g", 7, gen=60.0)  # days 0..6: six days of span
    benchdata.recompute_baseline(data, "g", T0 + 6 * DAY_S, 74.8)
    assert benchdata.baseline(data, "g", 74.8) == (74.8, "config")
    benchdata.add_result(data, "g", result(T0 + 7 * DAY_S, 60.0))
    benchdata.recompute_baseline(data, "g", T0 + 7 * DAY_S, 74.8)
    assert benchdata.baseline(data, "g", 74.8) == (60.0, "rolling-30d")
    assert data["baselines"]["g"]["n"] == 8


def test_rolling_average_ignores_excluded_failed_and_old_results():
    data = benchdata.empty()
    now = T0 + 40 * DAY_S
    benchdata.add_result(data, "g", result(T0, 10.0))  # 40 days old: outside the 30-day window
    for d in range(8):
        at = now - (8 - d) * DAY_S
        benchdata.add_result(data, "g", result(at, 70.0 if d % 2 else 80.0))
        benchdata.add_result(data, "g", result(at + H, 20.0, excluded=True))
        benchdata.add_result(data, "g", result(at + 2 * H, ok=False, error="timeout"))
    benchdata.recompute_baseline(data, "g", now, 74.8)
    base = data["baselines"]["g"]
    assert base["baseline_tok_s"] == pytest.approx(75.0)
    assert base["n"] == 8 and base["source"] == "rolling-30d" and base["seed_tok_s"] == 74.8


def test_recalculated_weekly_not_on_every_run():
    data = benchdata.empty()
    daily(data, "g", 8, gen=70.0)
    first = T0 + 7 * DAY_S
    benchdata.recompute_baseline(data, "g", first, 74.8)
    assert data["baselines"]["g"]["baseline_tok_s"] == 70.0
    for d in range(8, 13):
        benchdata.add_result(data, "g", result(T0 + d * DAY_S, 50.0))
    benchdata.recompute_baseline(data, "g", T0 + 12 * DAY_S, 74.8)
    assert data["baselines"]["g"]["baseline_tok_s"] == 70.0  # five days later: unchanged
    benchdata.add_result(data, "g", result(first + 7 * DAY_S, 50.0))
    benchdata.recompute_baseline(data, "g", first + 7 * DAY_S, 74.8)
    assert data["baselines"]["g"]["baseline_tok_s"] == pytest.approx((8 * 70 + 6 * 50) / 14, abs=0.01)
    assert data["baselines"]["g"]["computed_at"] == first + 7 * DAY_S


def test_only_excluded_results_keep_the_seed():
    data = benchdata.empty()
    for d in range(10):
        benchdata.add_result(data, "g", result(T0 + d * DAY_S, 30.0, excluded=True))
    benchdata.recompute_baseline(data, "g", T0 + 10 * DAY_S, 74.8)
    assert benchdata.baseline(data, "g", 74.8) == (74.8, "config")


# ----------------------------------------------------------------------------- bounded history


def test_prune_and_downsample_bound_the_history():
    data = benchdata.empty()
    now = T0 + 40 * DAY_S
    at = T0
    while at <= now:  # every 5 minutes for 40 days
        benchdata.add_result(data, "g", result(at, 70.0 + (at % 7)))
        at += 300
    benchdata.prune(data, now, 35)
    benchdata.downsample(data, now)
    items = data["results"]["g"]
    assert items[0]["at"] >= now - 35 * DAY_S
    recent = [r for r in items if r["at"] >= now - 7 * DAY_S]
    old = [r for r in items if r["at"] < now - 7 * DAY_S]
    assert len(recent) == 7 * 24 * 12 + 1  # the last week untouched
    assert len(old) <= 28 * 24 + 1  # at most one an hour before that
    assert [r["at"] for r in items] == sorted(r["at"] for r in items)
    benchdata.downsample(data, now, max_results=100)
    assert len(data["results"]["g"]) == 100 and data["results"]["g"][-1]["at"] == items[-1]["at"]


def test_downsample_keeps_a_usable_result_per_bucket():
    data = benchdata.empty()
    base = T0 - 10 * DAY_S
    benchdata.add_result(data, "g", result(base, ok=False, error="timeout"))
    benchdata.add_result(data, "g", result(base + 60, 50.0, excluded=True))
    benchdata.add_result(data, "g", result(base + 120, 71.0))
    benchdata.add_result(data, "g", result(base + 180, 73.0))
    benchdata.add_result(data, "g", result(base + 240, 72.0))
    benchdata.add_result(data, "g", result(base + 2 * H, ok=False, error="refused"))
    benchdata.downsample(data, T0)
    kept = data["results"]["g"]
    assert [r["gen_tok_s"] for r in kept] == [72.0, None]  # the median usable one; else the first


def test_prune_drops_unconfigured_aliases():
    data = benchdata.empty()
    daily(data, "gone", 2)
    daily(data, "g", 2)
    data["baselines"]["gone"] = {"baseline_tok_s": 1.0}
    benchdata.prune(data, T0 + 2 * DAY_S, 35, ("g",))
    assert list(data["results"]) == ["g"] and "gone" not in data["baselines"]


# ----------------------------------------------------------------------------- Rule 4 state


def states(values, baseline=100.0):
    data = benchdata.empty()
    out = []
    for i, v in enumerate(values):
        r = result(T0 + i * H, v) if v is not None else result(T0 + i * H, ok=False, error="loading")
        benchdata.add_result(data, "g", r)
        out.append(benchdata.regression_state(data, "g", baseline)["trend"])
    return out


def test_three_consecutive_slow_results_and_not_before():
    assert states([79, 79]) == ["stable", "stable"]
    assert states([79, 79, 79]) == ["stable", "stable", "regressing"]
    assert states([79, 79, 95, 79, 79]) == ["stable"] * 5


def test_failures_are_not_samples_and_do_not_break_a_run():
    assert states([79, None, 79, None, 79]) == ["stable", "stable", "stable", "stable", "regressing"]


def test_recovery_needs_within_ten_percent():
    trends = states([70, 70, 70, 85, 89, 91, 85])
    assert trends == ["stable", "stable", "regressing", "regressing", "regressing", "stable", "stable"]


def test_exactly_twenty_percent_is_not_a_regression():
    assert states([80, 80, 80])[-1] == "stable"


def test_unknown_without_baseline_or_samples():
    data = benchdata.empty()
    assert benchdata.regression_state(data, "g", 74.8)["trend"] == "unknown"
    benchdata.add_result(data, "g", result(T0, 70.0))
    assert benchdata.regression_state(data, "g", None)["trend"] == "unknown"
    state = benchdata.regression_state(data, "g", None)
    assert state["current_tok_s"] == 70.0


def test_regression_state_reports_since_and_thresholds():
    data = benchdata.empty()
    for i, v in enumerate([100, 50, 55, 52]):
        benchdata.add_result(data, "g", result(T0 + i * H, v))
    s = benchdata.regression_state(data, "g", 100.0)
    assert s["trend"] == "regressing" and s["regressing_since"] == T0 + H
    assert s["threshold_tok_s"] == 80.0 and s["recovered_tok_s"] == 90.0 and s["slow_run"] == 3
    assert s["current_tok_s"] == 52.0


# ----------------------------------------------------------------------------- through bench


@pytest.fixture
def evaluate():
    """The rules engine's bench evaluation, which ``bench`` calls after recording."""
    import gpuheal.steps.evaluate as ev

    return ev


def test_bench_over_eight_days_moves_from_config_seed_to_rolling_baseline(tmp_path, evaluate):
    srv = FakeLlama({"POST /completion": Reply(200, completion_body(16, timings(16, gen=70.0)))})
    try:
        cfg = load_config_dict(
            {
                "bench": {"n_predict": 16, "timeout_s": 2, "warmup": False},
                "gpus": [{"alias": "gpu-dense", "host": "ct8", "endpoint": srv.url, "baseline_tok_s": 74.8}],
            }
        )
        start = datetime.fromtimestamp(T0, UTC)
        sources = []
        for day in range(9):
            rt = Runtime(cfg=cfg, state_dir=tmp_path, now=start + timedelta(days=day), json_out=True)
            with StateDir(tmp_path) as store:
                doc = step.command(rt, store).document
            reg = doc["regressions"]["gpu-dense"]
            sources.append((reg["baseline_source"], reg["baseline_tok_sec"]))
        assert sources[:7] == [("config", 74.8)] * 7
        assert sources[7] == ("rolling-30d", 70.0)
        assert reg["samples"] == 9
        with StateDir(tmp_path) as store:
            data = store.read(files.BENCH)
        assert data["baselines"]["gpu-dense"]["computed_at"] == T0 + 7 * DAY_S
    finally:
        srv.stop()
