"""Trend maths (core/trend): least squares, the reload cut, sparklines — with property tests."""

from __future__ import annotations

import bisect
import itertools
import math
import struct
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


# --------------------------------------------------------------------------- the spread shortcuts (issue 29)


def _fit_window_before(ts, vs, start_s, end_s, per_s, jump=None):
    """fit_window as it was before the spread shortcuts (wave 11): every sum over every window, and every
    consecutive step looked at for a jump. The shortcuts must give its numbers to the bit."""
    lo, hi = bisect.bisect_left(ts, start_s), bisect.bisect_right(ts, end_s)
    if hi - lo < 2:
        return None
    tv, vv = ts[lo:hi], vs[lo:hi]
    if None in vv:
        tv, vv = [t for t, v in zip(tv, vv, strict=True) if v is not None], [v for v in vv if v is not None]
        if len(vv) < 2:
            return None
    if jump is not None:
        diffs = [b - a for a, b in itertools.pairwise(vv)]
        if max(map(abs, diffs)) >= jump:
            cut = len(diffs) - 1
            while abs(diffs[cut]) < jump:
                cut -= 1
            tv, vv = tv[cut + 1 :], vv[cut + 1 :]
            if len(vv) < 2:
                return None
    xs = [t - tv[-1] for t in tv]
    ys = [v - vv[-1] for v in vv]
    n, sx, sy = len(xs), sum(xs), sum(ys)
    sxx, sxy = sum(x * x for x in xs), sum(x * y for x, y in zip(xs, ys, strict=True))
    den = n * sxx - sx * sx
    if n < 2 or den <= 0 or not math.isfinite(den):
        return None
    value = (n * sxy - sx * sy) / den
    if not math.isfinite(value):
        return None
    return (value * per_s, n, tv[0], tv[-1], vv[-1])


def _bits(fit):
    """A fit as exact bits (``0.0`` and ``-0.0`` differ, a NaN equals itself)."""
    if fit is None:
        return None
    return tuple(struct.pack("<d", v) if isinstance(v, float) else v for v in fit)


# A VRAM-like value: flat runs (the same number again), steps (a reload), a missing sample, now and then
# an int, a NaN or an infinity — every branch of the shortcuts.
values = st.one_of(
    st.sampled_from([10_000.0, 10_000.0, 10_000.0, 10_500.0, 4_000.0, 10_000, None]),
    st.floats(min_value=0, max_value=30_000),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0]),
)


@settings(max_examples=400, deadline=None)
@given(times, st.data(), st.sampled_from([None, 1024.0, 0.0, 500]), st.booleans())
def test_fit_window_gives_the_bits_of_the_whole_computation(ts, data, jump, whole_window):
    vs = data.draw(st.lists(values, min_size=len(ts), max_size=len(ts)))
    start, end = (ts[0], ts[-1]) if whole_window else (ts[len(ts) // 3], ts[-1])
    fit = fit_window(ts, vs, start, end, 3600.0, jump)
    got = None if fit is None else (fit.slope, fit.n, fit.first_t, fit.last_t, fit.last_v)
    assert _bits(got) == _bits(_fit_window_before(ts, vs, start, end, 3600.0, jump))


# Times a few ulps apart at epoch size (or at zero): the denominator's rounding at its worst.
close_times = st.tuples(st.sampled_from([T0, 0.0, 1e-90, 1e90, 1e300]), st.lists(st.integers(0, 3), min_size=2, max_size=40)).map(
    lambda base_steps: [base_steps[0] + sum(base_steps[1][: i + 1]) * math.ulp(base_steps[0] or 5e-324)
                        for i in range(len(base_steps[1]))])


@settings(max_examples=300, deadline=None)
@given(close_times, st.sampled_from([7.0, 0.0, -3.5, 10_000]), st.sampled_from([3600.0, 60.0, -1.0]))
def test_a_flat_window_over_times_ulps_apart_gives_the_bits_of_the_whole_computation(ts, value, per_s):
    fit = fit_window(ts, [value] * len(ts), ts[0], ts[-1], per_s)
    got = None if fit is None else (fit.slope, fit.n, fit.first_t, fit.last_t, fit.last_v)
    assert _bits(got) == _bits(_fit_window_before(ts, [value] * len(ts), ts[0], ts[-1], per_s))


def test_a_long_flat_window_gives_the_bits_of_the_whole_computation():
    ts = [T0 + 0.25 * i + (i % 7) * 1e-6 for i in range(200_000)]
    vs = [17_216.0] * len(ts)
    fit = fit_window(ts, vs, ts[0], ts[-1], 3600.0, jump=1024.0)
    assert _bits((fit.slope, fit.n, fit.first_t, fit.last_t, fit.last_v)) == _bits(
        _fit_window_before(ts, vs, ts[0], ts[-1], 3600.0, 1024.0))


def test_a_flat_window_has_a_slope_of_exactly_zero_and_a_hidden_nan_none():
    ts = [T0 + 60 * i for i in range(6)]
    fit = fit_window(ts, [7.0] * 6, ts[0], ts[-1], 3600.0, jump=1024.0)
    assert fit is not None and struct.pack("<d", fit.slope) == struct.pack("<d", 0.0) and fit.n == 6
    assert fit_window(ts, [7.0, 7.0, math.nan, 7.0, 7.0, 7.0], ts[0], ts[-1], 3600.0) is None  # max/min skip it
    assert fit_window([T0] * 3, [7.0] * 3, T0, T0, 3600.0) is None  # one instant: no slope, flat or not
