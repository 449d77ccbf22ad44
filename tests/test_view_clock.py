"""This poll's own sample is in every window that ends now, whatever the clock's sub-ms digits.

History stores times rounded to the millisecond, so a poll at ``...627.860981`` is stored as
``...627.861`` — after ``now``. Windows ending exactly at ``now`` dropped the newest sample about
half the time on a real clock: Rule 8 saw a GPU jump from 55 to 91 °C one poll late (found by the
gpu-monitor/Prometheus equivalence test, issue 13)."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal import benchdata
from gpuheal.config import load_config_dict
from gpuheal.core.engine import new_book
from gpuheal.core.view import NO_RESTARTS
from gpuheal.model import GpuSample, Observation
from gpuheal.state.history import History
from gpuheal.steps.evaluate import evaluate_poll

CFG = load_config_dict(
    {
        "monitor": {"url": "http://127.0.0.1:1"},
        "rules": {"thermal-warning": {"window_s": 10.5, "min_span_s": 4.5}, "thermal-rising": {"window_s": 10.5, "min_span_s": 4.5}},
        "gpus": [{"alias": "gpu-a", "host": "ct1", "endpoint": "http://127.0.0.1:9"}],
    }
)


@given(st.floats(min_value=0.0, max_value=0.999), st.lists(st.floats(-0.1, 0.1), min_size=5, max_size=5))
@settings(max_examples=60, deadline=None)
def test_newest_sample_counts_on_a_jittered_clock(frac, jitter):
    history, book = History(), new_book()
    base = 1784361615.0 + frac
    issues = []
    for i, (temp, j) in enumerate(zip([55, 55, 55, 55, 91], jitter, strict=True)):
        t = base + 3 * i + j
        obs = Observation(
            at=datetime.fromtimestamp(t, UTC),
            gpus={"gpu-a": GpuSample(temp_c=temp, vram_used_mb=1000, vram_total_mb=2000, endpoint="ok")},
            monitor_ok=True,
        )
        history.add(obs)
        ev, view, _ = evaluate_poll(CFG, obs, history, book, benchdata.normalise({}), NO_RESTARTS, obs.at.timestamp())
        issues = {(i.issue, i.state) for i in ev.issues}
    assert view.temp_rise("gpu-a", 10.5).last_v == 91
    assert ("thermal-rising", "firing") in issues and ("thermal-warning", "firing") in issues
