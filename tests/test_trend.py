"""Trend maths (core/trend): least squares, the reload cut, sparklines — with property tests."""

from __future__ import annotations

import math
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal import benchdata
from gpuheal.core.engine import Finding
from gpuheal.core.trend import SPARK, fit_window, slope, sparkline
from gpuheal.core.view import FleetView
from gpuheal.rules import vram_leak
from gpuheal.rules.vram_leak.trend import vram_trend
from gpuheal.state.history import History

try:
    from tests.series import START, fleet_config, fleet_trace
except ImportError:
    from series import START, fleet_config, fleet_trace

T0 = 1_784_361_600.0  # an epoch-sized time: precision must survive it
CFG = fleet_config()

times = st.lists(st.floats(min_value=1, max_value=600), min_size=2, max_size=200).map(
    lambda gaps: [T0 + sum(gaps[: i + 1]) for i in range(len(gaps))]
)


@given(times, st.floats(min_value=0, max_value=200_000))
def test_constant_series_has_slope_exactly_zero(ts, value):
    fit = fit_window(ts, [value] * len(ts), ts[0], ts[-1], 3600.0)
    assert fit is not None and fit.slope == 0 and fit.n == len(ts)


@given(times, st.floats(min_value=0, max_value=50_000), st.floats(min_value=-5000, max_value=5000))
def test_linear_series_has_its_own_slope(ts, start, per_hour):
    vs = [start + per_hour * (t - ts[0]) / 3600 for t in ts]
    fit = fit_window(ts, vs, ts[0], ts[-1], 3600.0)
    if fit is None:  # every sample at (numerically) the same instant
        return
    assert math.isclose(fit.slope, per_hour, rel_tol=1e-6, abs_tol=1e-3)


NOISE_MB = 150.0  # bounded jitter; the worst case least-squares slope over 6 h is 3·150/6 = 75 MB/h


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(min_value=-NOISE_MB, max_value=NOISE_MB), min_size=361, max_size=361),
    st.sampled_from(["gpu-dense", "gpu-light", "strix-moe"]),
)
def test_bounded_noise_on_a_flat_line_never_fires_a_leak(noise, alias):
    history = History()
    series = " ".join(f"{10_000 + e:.3f}" for e in noise)
    for obs in fleet_trace(CFG, {alias: {"vram_used_mb": series}}):
        history.add(obs, CFG.aliases)
    now_s = (START + timedelta(minutes=360)).timestamp()
    view = FleetView(CFG, now_s, None, history, benchdata.empty(), {})
    assert not isinstance(vram_leak.detect(view, alias, view.rule_params(vram_leak.ID, vram_leak.Params, alias)), Finding)
    assert abs(view.vram_fit(alias, 6 * 3600, 1024).slope) <= 3 * NOISE_MB / 6 + 1e-6


def test_slope_needs_two_distinct_points():
    assert slope([], []) is None
    assert slope([1.0], [2.0]) is None
    assert slope([1.0, 1.0], [2.0, 3.0]) is None
    assert slope([0.0, 1.0], [2.0, 3.0]) == 1.0


def test_fit_window_skips_unknown_values_and_bounds_the_window():
    ts = [T0 + 60 * i for i in range(10)]
    vs = [None, 1.0, None, 3.0, 4.0, None, 6.0, 7.0, 8.0, None]
    fit = fit_window(ts, vs, ts[2], ts[8], 60.0)
    assert (fit.n, fit.first_t, fit.last_t, fit.last_v) == (5, ts[3], ts[8], 8.0)
    assert math.isclose(fit.slope, 1.0)
    assert fit_window(ts, [None] * 10, ts[0], ts[-1], 60.0) is None
    assert fit_window(ts, vs, ts[0], ts[1], 60.0) is None


def test_fit_window_restarts_after_the_last_jump():
    ts = [T0 + 60 * i for i in range(8)]
    vs = [100.0, 101.0, 5000.0, 5001.0, 100.0, 102.0, 104.0, 106.0]
    fit = fit_window(ts, vs, ts[0], ts[-1], 60.0, jump=1000)
    assert (fit.n, fit.first_t) == (4, ts[4]) and math.isclose(fit.slope, 2.0)
    assert fit_window(ts, [1.0, 9000.0], ts[0], ts[1], 60.0, jump=1000) is None


def test_sparkline_scales_and_leaves_gaps_blank():
    ts = [T0 + 60 * i for i in range(8)]
    line = sparkline(ts, [0, 1, 2, 3, None, None, 6, 7], ts[0], ts[0] + 480, width=8)
    assert len(line) == 8 and line[0] == SPARK[0] and line[-1] == SPARK[-1] and line[4:6] == "  "
    assert sparkline(ts, [5] * 8, ts[0], ts[0] + 480, width=4) == SPARK[0] * 4
    assert sparkline(ts, [None] * 8, ts[0], ts[0] + 480, width=4) == "    "
    assert sparkline([], [], 0, 10, width=3) == "   "
    assert sparkline(ts, [1] * 8, ts[0], ts[0], width=3) == ""


def test_vram_trend_of_a_leaking_gpu_is_within_10_percent_of_the_truth():
    """Issue 3 "done when": the demo's gpu-light leaks 10 MB/min = 600 MB/h, with jitter."""
    jitter = [(-40, 25, 0, 35, -20, 10)[i % 6] for i in range(150)]
    series = " ".join(f"{10100 + 10 * i + jitter[i]}" for i in range(150))
    history = History()
    trace = fleet_trace(CFG, {"gpu-light": {"vram_used_mb": series}})
    for obs in trace:
        history.add(obs, CFG.aliases)
    view = FleetView(CFG, trace[-1].at.timestamp(), trace[-1], history, benchdata.empty(), {})
    trend = vram_trend(view, "gpu-light")
    assert abs(trend["rate_mb_per_hour"] - 600) / 600 < 0.10
    assert trend["samples"] == 150 and trend["span_h"] == round(149 / 60, 2)
    assert trend["current_mb"] == 10100 + 10 * 149 + jitter[149]
    assert math.isclose(trend["projected_full_in_hours"], (12288 - trend["current_mb"]) / trend["rate_mb_per_hour"], rel_tol=0.01)


def test_vram_trend_without_history_is_not_known():
    view = FleetView(CFG, T0, None, History(), benchdata.empty(), {})
    assert vram_trend(view, "gpu-dense") == {
        "gpu": "gpu-dense", "current_mb": None, "rate_mb_per_hour": None,
        "projected_full_in_hours": None, "samples": 0, "span_h": 0.0}
