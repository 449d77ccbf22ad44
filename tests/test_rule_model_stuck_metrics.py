"""Rule 3 from llama-server's own counters (issue 12; contract "Rule 3 from llama-server"): requests
in flight and ``n_decode_total`` unchanged since the first of 3 consecutive polls → model-stuck at
the 3rd. Never from ``tokens_predicted_total``; a counter that goes down is a restart."""

from __future__ import annotations

from datetime import timedelta

import pytest

try:
    from tests.series import START, fleet_config, fleet_trace, polls, run
except ImportError:
    from series import START, fleet_config, fleet_trace, polls, run

CFG = fleet_config()
G = "gpu-dense"
NO_MONITOR_COUNTS = {"requests_60s": "_", "failures_60s": "_"}


def trace(decode: str, busy: str, step_s: float = 60.0, monitor: str | None = None, **more):
    fields = {"n_decode_total": decode, "requests_processing": busy, **NO_MONITOR_COUNTS, **more}
    return run(CFG, fleet_trace(CFG, {G: fields}, step_s=step_s, monitor=monitor))


def test_fires_at_the_third_poll_with_requests_in_flight_and_no_decode():
    r = trace("100 200 200 200 200", "1x4")
    assert polls(r, G, "model-stuck", "pending") == [2]
    assert polls(r, G, "model-stuck") == [3]
    issue = next(i for i in r.open_at_end if i.issue == "model-stuck")
    assert issue.severity == "critical"
    assert issue.detected["source"] == "llama-server /metrics"
    assert issue.detected["n_decode_total"] == 200 and issue.detected["requests_processing"] == 1
    assert "/health says ok" in issue.summary


@pytest.mark.parametrize("step_s", [47.3, 58.9, 61.7, 73.1])
def test_jittered_cadence_still_fires_at_the_third_poll(step_s):
    assert polls(trace("100 200 200 200 200", "1x4", step_s=step_s), G, "model-stuck") == [3]


def test_a_long_generation_never_fires_though_tokens_predicted_stays_flat():
    # measured on b11312: tokens_predicted_total stays 0 through a 2,300-token answer
    r = trace("158 700 1300 1900 2301", "1x4", tokens_predicted_total="0x4")
    assert polls(r, G, "model-stuck", "pending") == []


def test_two_stalled_polls_are_not_enough():
    # pairs of equal readings: a decode between every pair, never 3 polls without one
    assert polls(trace("100 100 150 150 200 200", "1x5"), G, "model-stuck") == []


def test_nothing_in_flight_is_never_stuck():
    assert polls(trace("100x5", "0x5"), G, "model-stuck", "pending") == []


def test_a_restart_between_two_polls_resets_without_firing():
    r = trace("500 500 3 40 90", "1x4")
    assert polls(r, G, "model-stuck", "pending") == [1]
    assert polls(r, G, "model-stuck") == []
    assert polls(r, G, "model-stuck", "dropped") == [2]


def test_a_counter_that_went_down_is_never_progress():
    # the restarted server wedges at once: the run restarts at the reset, 3 more polls to fire
    r = trace("500 500 3 3 3", "1x4")
    assert polls(r, G, "model-stuck") == [4]


def test_unknown_counters_neither_advance_nor_reset():
    r = trace("100 100 _ 100", "1 1 _ 1")
    assert polls(r, G, "model-stuck") == [3]


@pytest.mark.parametrize("bad", ["_", "-1"])
def test_unknown_in_flight_is_not_known(bad):
    r = trace("100x4", f"{bad}*5")
    assert polls(r, G, "model-stuck", "pending") == []


def test_a_sleeping_server_is_not_stuck():
    r = trace("100x4", "1x4", is_sleeping="1x4")
    assert polls(r, G, "model-stuck", "pending") == []


def test_fires_without_gpu_monitor_and_is_not_hidden_by_rule_7():
    r = trace("100 200 200 200 200 200", "1x5", monitor="0x5")
    assert polls(r, G, "model-stuck") == [3]
    assert ("fleet", "data-source-unreachable") in {(i.gpu, i.issue) for i in r.open_at_end}
    assert G in {i.gpu for i in r.open_at_end if i.issue == "model-stuck"}


def test_deferred_requests_growing_are_reported():
    r = trace("100 200 200 200", "1x3", requests_deferred="0 1 2 3")
    issue = next(i for i in r.open_at_end if i.issue == "model-stuck")
    assert issue.detected["requests_deferred"] == 3
    assert issue.detected["deferred_growing_polls"] == 3


def test_resolves_when_decoding_resumes():
    r = trace("100 200 200 200 200 260 300", "1x6")
    assert polls(r, G, "model-stuck") == [3]
    assert polls(r, G, "model-stuck", "resolved") == [5]


def test_a_monitor_found_issue_is_not_cleared_by_an_idle_metrics_reading():
    # LiteLLM stops routing to a failing server: nothing in flight is no proof it works again
    fields = {"requests_60s": "10 10 10 _ _", "failures_60s": "9 9 9 _ _",
              "n_decode_total": "100x4", "requests_processing": "0x4"}
    r = run(CFG, fleet_trace(CFG, {G: fields}))
    assert polls(r, G, "model-stuck") == [1]
    assert polls(r, G, "model-stuck", "resolved") == []


def test_the_same_poll_twice_is_counted_once():
    from gpuheal import benchdata
    from gpuheal.core import engine
    from gpuheal.core.memory import Memory
    from gpuheal.core.view import FleetView
    from gpuheal.rules import ALL
    from gpuheal.rules.model_stuck.memory import decode_state
    from gpuheal.state.history import History

    obs = fleet_trace(CFG, {G: {"n_decode_total": "7x2", "requests_processing": "1x2"}})
    memory = Memory()
    for o in (obs[0], obs[0], obs[1], obs[1]):
        view = FleetView(CFG, o.at.timestamp(), o, History(), benchdata.empty(), memory)
        engine.remember(ALL, view, memory)
    assert decode_state(memory, G, (START + timedelta(seconds=60)).timestamp()).polls == 2


def test_a_recorded_trace_replays_rule_3_and_rejects_garbage_telemetry(tmp_path):
    """``check --record`` keeps the server's counters; ``replay`` fires the same model-stuck, and a
    hand-edited trace with a string counter is one clear error, never a crash."""
    import json

    from gpuheal.trace import parse_observation

    obs = fleet_trace(CFG, {G: {"n_decode_total": "100 200 200 200", "requests_processing": "1x3",
                                **NO_MONITOR_COUNTS}})
    lines = [json.dumps(o.to_dict()) for o in obs]
    assert polls(run(CFG, [parse_observation(line) for line in lines]), G, "model-stuck") == [3]
    bad = json.loads(lines[0])
    bad["gpus"][G]["requests_processing"] = "1"
    with pytest.raises(ValueError, match="requests_processing"):
        parse_observation(json.dumps(bad))
    bad["gpus"][G]["requests_processing"] = 1
    bad["gpus"][G]["is_sleeping"] = "no"
    with pytest.raises(ValueError, match="is_sleeping"):
        parse_observation(json.dumps(bad))
