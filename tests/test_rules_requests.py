"""Rules 3 (model stuck) and 10 (workload distribution), from gpu-monitor's request counts."""

from __future__ import annotations

try:
    from tests.series import fired, fleet_config, fleet_trace, polls, run
except ImportError:
    from series import fired, fleet_config, fleet_trace, polls, run

CFG = fleet_config()
STRIX = "strix-moe"


def stuck(requests: str, failures: str, **more):
    return run(CFG, fleet_trace(CFG, {STRIX: {"requests_60s": requests, "failures_60s": failures, **more}}))


# --------------------------------------------------------------------------- Rule 3


def test_rule3_fires_at_the_second_consecutive_bad_poll():
    r = stuck("9 9 9 9", "0 9 9 9")
    assert polls(r, STRIX, "model-stuck", "pending") == [1]
    assert polls(r, STRIX, "model-stuck") == [2]
    issue = next(i for i in r.open_at_end if i.issue == "model-stuck")
    assert issue.severity == "critical"
    assert issue.detected["failure_pct"] == 100 and issue.detected["requests_60s"] == 9


def test_rule3_one_failed_request_of_twenty_never_fires():
    r = stuck("20x6", "1x6")
    assert polls(r, STRIX, "model-stuck", "pending") == []


def test_rule3_exactly_half_is_not_more_than_half():
    assert polls(stuck("10x4", "5x4"), STRIX, "model-stuck", "pending") == []


def test_rule3_a_single_stuck_request_is_not_enough_traffic():
    assert polls(stuck("1x4", "1x4"), STRIX, "model-stuck", "pending") == []


def test_rule3_alternating_bad_and_good_polls_never_fire():
    assert polls(stuck("10x6", "9 0 9 0 9 0 9"), STRIX, "model-stuck") == []


def test_rule3_unknown_counts_neither_advance_nor_reset():
    r = stuck("10 _ 10", "9 _ 9")
    assert polls(r, STRIX, "model-stuck") == [2]
    r = stuck("10 10 10 10", "9 9 _ _")
    assert polls(r, STRIX, "model-stuck") == [1]
    assert polls(r, STRIX, "model-stuck", "resolved") == []


def test_rule3_grace_seconds_at_a_faster_cadence():
    # polls every 20 s: the 2nd bad poll is only 20 s after the first; 30 s grace → the 3rd
    trace = fleet_trace(CFG, {STRIX: {"requests_60s": "10x4", "failures_60s": "9x4"}}, step_s=20)
    assert polls(run(CFG, trace), STRIX, "model-stuck") == [2]


def test_rule3_clears_only_when_failures_drop_to_zero():
    r = stuck("10x6", "9 9 3 1 0 0 0")
    assert polls(r, STRIX, "model-stuck") == [1]
    assert polls(r, STRIX, "model-stuck", "resolved") == [4]


def test_rule3_needs_a_reachable_llama_server():
    # a refused host is Rule 6's: model-stuck must not race host-unreachable
    r = stuck("10x4", "10x4", endpoint="refused*4")
    assert polls(r, STRIX, "model-stuck", "pending") == []
    assert polls(r, STRIX, "host-unreachable") == [2]


def test_rule3_monitor_down_is_not_known():
    trace = fleet_trace(CFG, {STRIX: {"requests_60s": "10x3", "failures_60s": "9x3"}}, monitor="1 0 0 1")
    assert polls(run(CFG, trace), STRIX, "model-stuck") == [3]


# --------------------------------------------------------------------------- Rule 10


def traffic(dense: str, light: str, strix: str, cfg=CFG, **kw):
    return run(cfg, fleet_trace(cfg, {
        "gpu-dense": {"requests_60s": dense},
        "gpu-light": {"requests_60s": light},
        "strix-moe": {"requests_60s": strix},
    }, **kw))


def test_rule10_share_matching_weights_is_quiet():
    r = traffic("11x90", "3x90", "6x90")
    assert not [t for t in r.timeline if t["issue"] == "workload-misrouted"]


def test_rule10_overloaded_light_gpu_is_misrouted_after_the_hold():
    # gpu-light gets half the traffic against a weight of 0.15 (tolerance ±50 % of 15 %)
    r = traffic("5x70", "10x70", "5x70")
    assert polls(r, "gpu-light", "workload-misrouted", "pending") == [0]
    assert polls(r, "gpu-light", "workload-misrouted") == [61]  # hold_s 3600, "more than"
    issue = next(i for i in r.open_at_end if i.gpu == "gpu-light")
    assert issue.severity == "info" and issue.detected["direction"] == "over"
    assert issue.detected["role"] == "vision, light tasks"
    # the under-used GPUs are reported too
    assert ("gpu-dense", "workload-misrouted") in fired(r)


def test_rule10_recommendations_never_change_the_status():
    from gpuheal.core.health import derive_status

    trace = fleet_trace(CFG, {"gpu-light": {"requests_60s": "30x70"}})
    r = run(CFG, trace)
    assert r.open_at_end and all(i.severity == "info" for i in r.open_at_end)
    assert derive_status(trace[-1], r.open_at_end) == "healthy"


def test_rule10_too_little_traffic_is_not_known():
    r = traffic("0x70", "1x70", "0x70", cfg=fleet_config(rules={"workload-misrouted": {"min_requests": 500}}))
    assert not [t for t in r.timeline if t["issue"] == "workload-misrouted"]


def test_rule10_unknown_counts_are_not_known():
    r = traffic("5x70", "_x70", "5x70")
    assert not [t for t in r.timeline if t["issue"] == "workload-misrouted"]


def test_rule10_gpus_without_weight_are_not_judged():
    data = [{"alias": a, "host": h, "endpoint": f"http://127.0.0.1:{p}", "transport": "local"}
            for a, h, p in (("a", "ha", 1), ("b", "hb", 2))]
    cfg = fleet_config(gpus=data)
    r = run(cfg, fleet_trace(cfg, {"a": {"requests_60s": "50x70"}, "b": {"requests_60s": "0x70"}}))
    assert not [t for t in r.timeline if t["issue"] == "workload-misrouted"]
