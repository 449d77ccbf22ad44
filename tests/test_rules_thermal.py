"""Rules 1 (thermal critical), 1.3 (cooling infrastructure) and 8 (predictive thermal, two tiers):
promtool-style — a series per GPU, the polls at which each issue fires."""

from __future__ import annotations

try:
    from tests.series import fired, fleet_config, fleet_trace, polls, run
except ImportError:
    from series import fired, fleet_config, fleet_trace, polls, run

CFG = fleet_config()
DENSE = "gpu-dense"


def go(temps: str, alias: str = DENSE, monitor: str | None = None, cfg=CFG, **more):
    gpus = {alias: {"temp_c": temps}}
    gpus.update(more)
    return run(cfg, fleet_trace(cfg, gpus, monitor=monitor))


# --------------------------------------------------------------------------- Rule 1


def test_rule1_fires_at_the_second_consecutive_hot_poll():
    r = go("84 86 87 88")
    assert polls(r, DENSE, "thermal-critical", "pending") == [1]
    assert polls(r, DENSE, "thermal-critical") == [2]
    issue = next(i for i in r.open_at_end if i.issue == "thermal-critical")
    assert issue.severity == "critical" and issue.since == "2026-07-18T08:01:00Z"
    assert issue.detected["temp_c"] == 88 and issue.detected["duration_s"] == 120


def test_rule1_one_hot_poll_never_fires():
    r = go("84 86 84 84")
    assert polls(r, DENSE, "thermal-critical") == []
    assert polls(r, DENSE, "thermal-critical", "dropped") == [2]


def test_rule1_alternating_values_never_fire():
    r = go("86 84 86 84 86 84 86")
    assert polls(r, DENSE, "thermal-critical") == []


def test_rule1_exactly_85_is_not_above_85():
    assert polls(go("85x5"), DENSE, "thermal-critical", "pending") == []


def test_rule1_missing_poll_neither_advances_nor_resets():
    r = go("86 _ 87")
    assert polls(r, DENSE, "thermal-critical") == [2]
    r = go("86 _ _ _")
    assert polls(r, DENSE, "thermal-critical") == [] and polls(r, DENSE, "thermal-critical", "dropped") == []


def test_rule1_gpu_missing_from_the_poll_is_no_data():
    r = run(CFG, fleet_trace(CFG, {DENSE: {"temp_c": "86 86 86", "present": "1 _ 1"}}))
    assert polls(r, DENSE, "thermal-critical") == [2]


def test_rule1_monitor_down_is_not_known_and_never_clears():
    r = go("86 86 86 86 86", monitor="1 1 0 0 1")
    assert polls(r, DENSE, "thermal-critical") == [1]
    assert polls(r, DENSE, "thermal-critical", "resolved") == []


def test_rule1_clears_only_below_80():
    r = go("86 87 83 82 81 80 79")
    assert polls(r, DENSE, "thermal-critical") == [1]
    assert polls(r, DENSE, "thermal-critical", "resolved") == [6]


def test_rule1_threshold_is_configuration():
    cfg = fleet_config(rules={"thermal-critical": {"temp_c": 75, "clear_below_c": 70}})
    assert polls(go("76 77", cfg=cfg), DENSE, "thermal-critical") == [1]


def test_rule1_per_gpu_override():
    gpus = fleet_config().gpus
    data = [
        {"alias": g.alias, "host": g.host, "endpoint": g.endpoint, "transport": "local",
         **({"rules": {"thermal-critical": {"temp_c": 90}}} if g.alias == DENSE else {})}
        for g in gpus
    ]
    cfg = fleet_config(gpus=data)
    assert polls(go("88 88 88", cfg=cfg), DENSE, "thermal-critical") == []
    assert polls(go("88 88 88", alias="strix-moe", cfg=cfg), "strix-moe", "thermal-critical") == [1]


# --------------------------------------------------------------------------- Rule 1.3


def all_hot(series: dict[str, str], monitor=None):
    return run(CFG, fleet_trace(CFG, {a: {"temp_c": s} for a, s in series.items()}, monitor=monitor))


def test_cooling_infrastructure_when_every_gpu_is_hot():
    r = all_hot({"gpu-dense": "86 87 88", "gpu-light": "86 86 86", "strix-moe": "84 86 87"})
    assert polls(r, "fleet", "cooling-infrastructure") == [2]
    issue = next(i for i in r.open_at_end if i.issue == "cooling-infrastructure")
    assert issue.gpu == "fleet" and issue.severity == "critical"
    assert issue.detected["gpus_hot"] == 3


def test_cooling_infrastructure_not_when_one_gpu_is_cool():
    r = all_hot({"gpu-dense": "86 87 88", "gpu-light": "86 86 86", "strix-moe": "60 60 60"})
    assert ("fleet", "cooling-infrastructure") not in fired(r)
    assert polls(r, "gpu-dense", "thermal-critical") == [1]


def test_cooling_infrastructure_unknown_temperature_is_not_known():
    r = all_hot({"gpu-dense": "86 87 88", "gpu-light": "86 86 86", "strix-moe": "86 _ 86"})
    assert polls(r, "fleet", "cooling-infrastructure") == [2]  # the missing poll froze the hold


def rack_fleet(n: int, rules: dict) -> object:
    """The spec's three (no rack label) plus ``n`` L40S in rack r7 (issue 21's 43-GPU fleet)."""
    gpus = [{"alias": a, "host": h, "endpoint": f"http://127.0.0.{i + 2}:8080"}
            for i, (a, h) in enumerate([("gpu-dense", "ct8"), ("gpu-light", "ct110"), ("strix-moe", "ct15")])]
    gpus += [{"alias": f"node{i:02d}", "host": f"node{i:02d}", "endpoint": f"http://127.0.1.{i + 1}:8080",
              "labels": {"rack": "r7"}} for i in range(n)]
    return fleet_config(rules=rules, gpus=gpus)


PER_RACK = {"cooling-infrastructure": {"cooling_fraction": 0.5, "group_by": "rack"}}


def rack_run(cfg, hot: int, temps: str = "88 89 90", cool: str = "60 60 60", rest: str = "60 60 60"):
    series = {f"node{i:02d}": {"temp_c": temps if i < hot else cool} for i in range(40)}
    series.update({a: {"temp_c": rest} for a in ("gpu-dense", "gpu-light", "strix-moe")})
    return run(cfg, fleet_trace(cfg, series))


def test_cooling_infrastructure_half_a_rack_hot_is_one_incident():
    """30 of the 43 GPUs hot, all in rack r7, with cooling_fraction 0.5 per rack: one fleet issue
    naming the rack and the 30 GPUs (30 of the rack's 40 is over half)."""
    r = rack_run(rack_fleet(40, PER_RACK), hot=30)
    assert polls(r, "fleet", "cooling-infrastructure") == [1]
    issue = next(i for i in r.open_at_end if i.issue == "cooling-infrastructure")
    assert issue.detected["groups"] == {"r7": [f"node{i:02d}" for i in range(30)]}
    assert issue.detected["gpus_hot"] == 30 and "in rack r7 above" in issue.summary


def test_cooling_infrastructure_default_needs_every_gpu_of_the_fleet():
    """The default (1.0, the whole fleet): the same 30 of 43 is no cooling incident, only Rule 1s."""
    r = rack_run(rack_fleet(40, {}), hot=30)
    assert ("fleet", "cooling-infrastructure") not in fired(r)
    assert polls(r, "node00", "thermal-critical") == [1]


def test_cooling_infrastructure_under_half_a_rack_is_not_an_incident():
    r = rack_run(rack_fleet(40, PER_RACK), hot=19)
    assert ("fleet", "cooling-infrastructure") not in fired(r)


def test_cooling_infrastructure_per_rack_unknown_and_recovery():
    """19 hot and one unknown could be half: not known (the hold freezes); the rack resolves when
    fewer than half its GPUs are still at or above 80 °C."""
    cfg = rack_fleet(40, PER_RACK)
    assert polls(rack_run(cfg, hot=20, temps="88 _ 88 88", cool="60 60 60 60", rest="60 60 60 60"),
                 "fleet", "cooling-infrastructure") == [2]
    r = rack_run(cfg, hot=25, temps="88 88 84 79", cool="60 60 60 60", rest="60 60 60 60")
    assert polls(r, "fleet", "cooling-infrastructure") == [1]
    assert polls(r, "fleet", "cooling-infrastructure", "resolved") == [3]


def test_cooling_fraction_is_checked():
    import pytest

    from gpuheal.errors import ConfigError

    for bad in (0, 1.5, "half"):
        with pytest.raises(ConfigError, match="cooling_fraction"):
            fleet_config(rules={"cooling-infrastructure": {"cooling_fraction": bad}})


def test_cooling_infrastructure_resolves_when_any_gpu_is_below_80():
    r = all_hot({"gpu-dense": "86 87 84 79", "gpu-light": "86 86 84 84", "strix-moe": "86 86 84 84"})
    assert polls(r, "fleet", "cooling-infrastructure") == [1]
    assert polls(r, "fleet", "cooling-infrastructure", "resolved") == [3]


# --------------------------------------------------------------------------- Rule 8


def test_rule8_demo_ramp_tier1_then_tier2_then_rule1():
    """examples/scenarios/demo.yaml: 64 °C + 3 °C/min → tier 1 at t=180, tier 2 at t=360, Rule 1 at t=540."""
    r = go("64+3x10")
    assert polls(r, DENSE, "thermal-warning") == [3]
    assert polls(r, DENSE, "thermal-rising") == [6]
    assert polls(r, DENSE, "thermal-critical") == [9]
    sev = {i.issue: i.severity for i in r.open_at_end}
    assert sev == {"thermal-warning": "warning", "thermal-rising": "critical", "thermal-critical": "critical"}


def test_rule8_tier1_needs_a_few_minutes_not_two_samples():
    # a jump of 4 °C between two samples is not "rising 2 °C/min over a few minutes"
    r = go("_ _ _ 68 72")
    assert polls(r, DENSE, "thermal-warning") == []
    r = go("_ _ 64 68 72")  # three samples over two minutes: now it is a trend
    assert polls(r, DENSE, "thermal-warning") == [4]


def test_rule8_tier1_slow_rise_does_not_fire():
    assert polls(go("71+1x8"), DENSE, "thermal-warning", "pending") == []


def test_rule8_tier1_hot_but_flat_does_not_fire():
    assert polls(go("75x8"), DENSE, "thermal-warning", "pending") == []


def test_rule8_tier1_alternating_values_do_not_fire():
    assert polls(go("72 76 72 76 72 76 72 76"), DENSE, "thermal-warning", "pending") == []


def test_rule8_tier1_clears_when_rise_drops_below_1_per_min():
    r = go("64+3x4 76 76 76 76 76")
    assert polls(r, DENSE, "thermal-warning") == [3]
    # rise over the last 5 min falls below 1 °C/min once the plateau dominates the fit
    resolved = polls(r, DENSE, "thermal-warning", "resolved")
    assert len(resolved) == 1 and 5 <= resolved[0] <= 8


def test_rule8_tier1_missing_temperature_is_not_known():
    r = go("64 67 70 _ 76")
    assert polls(r, DENSE, "thermal-warning") == [4]
    r = go("64+3x4 _ _ _")
    assert polls(r, DENSE, "thermal-warning", "resolved") == []


def test_rule8_tier2_needs_still_rising():
    assert polls(go("82x8"), DENSE, "thermal-rising", "pending") == []
    assert polls(go("82 82.5 82 82.5 82 82.5 82"), DENSE, "thermal-rising", "pending") == []


def test_rule8_tier2_clears_below_80_not_when_it_stops_rising():
    r = go("74+3x4 86 86 86 86 79")
    assert polls(r, DENSE, "thermal-rising") == [3]
    assert polls(r, DENSE, "thermal-rising", "resolved") == [9]
