"""Rule 3 and a llama-server loading its model (issue 29's chaos finding): while ``/health`` answers
503 ``Loading model`` (``endpoint: loading``; a real b11312 server answers so on every path until the
model is in memory: tests/realserver/test_bench_real.py::test_health_503_during_model_load_is_understood)
the requests LiteLLM sends it fail, so gpu-monitor's ``failures_60s`` equals its ``requests_60s`` and
LiteLLM's failure counter grows as fast as its request counter. That is a deploy or an ``n_ctx`` change
doing its work, not a stuck model: no ``model-stuck`` from the failure ratio, whichever source counts
the failures (gpu-monitor, LiteLLM's ``/metrics`` without gpu-monitor, LiteLLM during a gpu-monitor
outage — the Rule 7 fallback). A load that never ends is a fault of its own: past ``loading_max_s`` the
rule fires from ``/health`` alone, traffic or not. Every series also runs on cron-like jittered clocks
(``series.run``)."""

from __future__ import annotations

import pytest

try:
    from tests.series import fleet_config, fleet_trace, polls, run
except ImportError:
    from series import fleet_config, fleet_trace, polls, run

G = "gpu-dense"
CFG = fleet_config()
ALL_FAILING = {"requests_60s": "10", "failures_60s": "10"}
NO_MONITOR_COUNTS = {"requests_60s": "_", "failures_60s": "_"}


def short():
    """240 s of loading allowed (the default is 600 s)."""
    return fleet_config(rules={"model-stuck": {"loading_max_s": 240}})


def monitor_counts(endpoint: str, cfg=CFG, step_s: float = 60.0):
    return run(cfg, fleet_trace(cfg, {G: {"endpoint": endpoint, **ALL_FAILING}}, step_s=step_s))


@pytest.mark.parametrize("step_s", [58.7, 60.0, 61.9])
def test_a_loading_server_failing_every_request_is_not_stuck_from_gpu_monitor(step_s):
    r = monitor_counts("loading*6", step_s=step_s)
    assert polls(r, G, "model-stuck", "pending") == [] and polls(r, G, "model-stuck") == []


def test_a_loading_server_is_not_stuck_from_litellm_counters_without_gpu_monitor():
    fields = {"endpoint": "loading*6", "litellm_requests_total": "0+10x5", "litellm_failures_total": "0+10x5",
              **NO_MONITOR_COUNTS}
    r = run(CFG, fleet_trace(CFG, {G: fields}))
    assert polls(r, G, "model-stuck", "pending") == [] and polls(r, G, "model-stuck") == []


def test_a_loading_server_is_not_stuck_during_a_gpu_monitor_outage():
    """Rule 7's fallback: gpu-monitor refused, the GPU judged from the probe and LiteLLM's counters."""
    fields = {"endpoint": "loading*6", "litellm_requests_total": "0+10x5", "litellm_failures_total": "0+10x5"}
    r = run(CFG, fleet_trace(CFG, {G: fields}, monitor="0 0 0 0 0 0"))
    assert polls(r, G, "model-stuck", "pending") == [] and polls(r, G, "model-stuck") == []


def test_control_the_same_failures_with_health_ok_fire_at_the_second_poll():
    r = monitor_counts("ok*6")
    assert polls(r, G, "model-stuck", "pending") == [0] and polls(r, G, "model-stuck") == [1]
    fields = {"endpoint": "ok*6", "litellm_requests_total": "0+10x5", "litellm_failures_total": "0+10x5",
              **NO_MONITOR_COUNTS}
    assert polls(run(CFG, fleet_trace(CFG, {G: fields})), G, "model-stuck") == [2]


def test_a_pending_failure_ratio_is_dropped_when_the_server_starts_loading():
    """Failures seen once with /health ok, then a deploy: the new process loads — not a stuck one."""
    r = monitor_counts("ok loading*5")
    assert polls(r, G, "model-stuck", "pending") == [0] and polls(r, G, "model-stuck", "dropped") == [1]
    assert polls(r, G, "model-stuck") == []


def test_a_server_that_never_finishes_loading_is_stuck_once_past_loading_max_s():
    """240 s of loading is allowed here: past it the 2nd poll fires (the rule's hold), from /health
    alone — with no traffic at all — and the issue names the load, not a failure ratio."""
    fields = {"endpoint": "loading*9", "requests_60s": "0", "failures_60s": "0"}
    cfg = short()
    r = run(cfg, fleet_trace(cfg, {G: fields}))
    assert polls(r, G, "model-stuck", "pending") == [5] and polls(r, G, "model-stuck") == [6]
    issue = next(i for i in r.open_at_end if i.issue == "model-stuck")
    assert issue.detected["source"] == "llama-server /health" and issue.detected["endpoint"] == "loading"
    assert issue.detected["loading_s"] >= 360 and "still loading its model" in issue.summary


def test_the_default_allows_a_ten_minute_load():
    r = monitor_counts("loading*11")
    assert polls(r, G, "model-stuck", "pending") == [] and polls(r, G, "model-stuck") == []
    r = monitor_counts("loading*13")
    assert polls(r, G, "model-stuck", "pending") == [11] and polls(r, G, "model-stuck") == [12]


def test_a_load_that_finishes_starts_the_count_again():
    """Two deploys, each loading for 4 polls, with a served poll between: neither is past 240 s."""
    fields = {"endpoint": "loading*4 ok loading*4", "requests_60s": "0", "failures_60s": "0"}
    cfg = short()
    r = run(cfg, fleet_trace(cfg, {G: fields}))
    assert polls(r, G, "model-stuck", "pending") == []


def test_a_poll_that_cannot_see_the_server_keeps_the_load_s_start():
    """A poll with no probe answer (not known) keeps the load's start: 7 polls of loading around one
    unknown one is still one load, past 240 s."""
    fields = {"endpoint": "loading*3 _ loading*5", "requests_60s": "0", "failures_60s": "0"}
    cfg = short()
    r = run(cfg, fleet_trace(cfg, {G: fields}))
    assert polls(r, G, "model-stuck", "pending") == [5] and polls(r, G, "model-stuck") == [6]


def test_a_stuck_load_resolves_once_health_says_ok():
    fields = {"endpoint": "loading*8 ok*3", "requests_60s": "0", "failures_60s": "0"}
    cfg = short()
    r = run(cfg, fleet_trace(cfg, {G: fields}))
    assert polls(r, G, "model-stuck") == [6] and polls(r, G, "model-stuck", "resolved") == [8]


@pytest.mark.parametrize("bad", [-5, 0, "ten", True, 31 * 86400])
def test_a_bad_loading_max_s_is_one_config_error(bad):
    from gpuheal.errors import ConfigError

    with pytest.raises(ConfigError, match="model-stuck.loading_max_s: must be"):
        fleet_config(rules={"model-stuck": {"loading_max_s": bad}})
