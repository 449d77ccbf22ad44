"""Rules 5 (circuit breaker stuck), 6 (host unreachable), 7 (data source unreachable) and the
inhibition they carry."""

from __future__ import annotations

from datetime import timedelta

try:
    from tests.series import START, fired, fleet_config, fleet_trace, polls, run
except ImportError:
    from series import START, fired, fleet_config, fleet_trace, polls, run

CFG = fleet_config()
LIGHT, STRIX, DENSE = "gpu-light", "strix-moe", "gpu-dense"


def go(gpus=None, monitor=None, n=None):
    return run(CFG, fleet_trace(CFG, gpus or {}, monitor=monitor, n=n))


# --------------------------------------------------------------------------- Rule 5


def test_rule5_open_more_than_10_minutes_counted_from_first_seen():
    r = go({LIGHT: {"breaker": "0 1x12"}})  # first seen open at poll 1 (t=60)
    assert polls(r, LIGHT, "circuit-breaker-stuck", "pending") == [1]
    assert polls(r, LIGHT, "circuit-breaker-stuck") == [12]  # 660 s > 600 s; 600 s (poll 11) is not
    issue = next(i for i in r.open_at_end if i.issue == "circuit-breaker-stuck")
    assert issue.since == "2026-07-18T08:01:00Z" and issue.severity == "warning"


def test_rule5_open_9_minutes_never_fires():
    r = go({LIGHT: {"breaker": "1x9 0"}})
    assert polls(r, LIGHT, "circuit-breaker-stuck") == []
    assert polls(r, LIGHT, "circuit-breaker-stuck", "dropped") == [10]


def test_rule5_counted_from_the_monitors_opened_at():
    opened = START - timedelta(minutes=15)
    r = go({LIGHT: {"breaker": "1 1", "breaker_opened_at": opened}})
    assert polls(r, LIGHT, "circuit-breaker-stuck") == [0]
    issue = next(i for i in r.open_at_end if i.issue == "circuit-breaker-stuck")
    assert issue.since == "2026-07-18T07:45:00Z" and issue.detected["open_for_s"] == 960


def test_rule5_opened_at_9_minutes_ago_waits():
    opened = START - timedelta(minutes=9)
    r = go({LIGHT: {"breaker": "1 1 1", "breaker_opened_at": opened}})
    assert polls(r, LIGHT, "circuit-breaker-stuck") == [2]


def test_rule5_only_while_health_answers_200():
    opened = START - timedelta(minutes=30)
    r = go({LIGHT: {"breaker": "1x3", "endpoint": "loading*3", "breaker_opened_at": opened}})
    assert polls(r, LIGHT, "circuit-breaker-stuck", "pending") == []


def test_rule5_a_loading_poll_does_not_restart_the_count():
    r = go({LIGHT: {"breaker": "1x13", "endpoint": "ok*5 loading ok*7"}})
    assert polls(r, LIGHT, "circuit-breaker-stuck") == [11]  # since poll 0: 660 s at poll 11


def test_rule5_missing_breaker_data_does_not_reset():
    r = go({LIGHT: {"breaker": "1x5 _x3 1x5"}}, monitor="1x5 0x3 1x5")
    assert polls(r, LIGHT, "circuit-breaker-stuck") == [11]


def test_rule5_resolves_when_the_breaker_closes():
    opened = START - timedelta(minutes=20)
    r = go({LIGHT: {"breaker": "1 1 0", "breaker_opened_at": opened, "endpoint": "ok loading loading"}})
    assert polls(r, LIGHT, "circuit-breaker-stuck") == [0]
    # /health 503 at poll 1 does not resolve it while the breaker is still open
    assert polls(r, LIGHT, "circuit-breaker-stuck", "resolved") == [2]


def test_rule5_resolves_only_when_litellm_also_answers_its_liveliness():
    """The spec's verify: "LiteLLM returns healthy, circuit breaker clears" — a closed breaker
    reported while LiteLLM's /health/liveliness fails is not yet the fix proved."""
    from dataclasses import replace

    opened = START - timedelta(minutes=20)
    trace = fleet_trace(CFG, {LIGHT: {"breaker": "1 1 0 0 0", "breaker_opened_at": opened}})
    alive = [True, True, False, None, True]  # None: not probed this poll (no litellm.url)
    r = run(CFG, [replace(o, litellm_ok=ok) for o, ok in zip(trace, alive, strict=True)])
    assert polls(r, LIGHT, "circuit-breaker-stuck") == [0]
    assert polls(r, LIGHT, "circuit-breaker-stuck", "resolved") == [3]


def test_rule5_alerts_on_detection_and_is_verified_within_60_s():
    from gpuheal.rules import REMEDIES

    assert REMEDIES["circuit-breaker-stuck"].alert_now
    assert CFG.rule_params("circuit-breaker-stuck", None)["verify_within_s"] == 60


# --------------------------------------------------------------------------- Rule 6


def test_rule6_fires_on_the_third_refused_poll():
    r = go({STRIX: {"endpoint": "ok refused refused refused refused"}})
    assert polls(r, STRIX, "host-unreachable", "pending") == [1]
    assert polls(r, STRIX, "host-unreachable") == [3]
    issue = next(i for i in r.open_at_end if i.issue == "host-unreachable")
    assert issue.severity == "critical" and issue.detected["endpoint"] == "refused"
    assert issue.detected["host"] == "ct15"


def test_rule6_timeouts_count_too():
    assert polls(go({STRIX: {"endpoint": "timeout refused timeout"}}), STRIX, "host-unreachable") == [2]


def test_rule6_two_refused_polls_never_fire():
    r = go({STRIX: {"endpoint": "refused refused ok refused refused ok"}})
    assert polls(r, STRIX, "host-unreachable") == []


def test_rule6_not_probed_is_not_known():
    r = go({STRIX: {"endpoint": "refused _ refused _ refused"}})
    assert polls(r, STRIX, "host-unreachable") == [4]


def test_rule6_any_http_answer_is_reachable_and_200_resolves():
    r = go({STRIX: {"endpoint": "refused*3 loading http-500 ok"}})
    assert polls(r, STRIX, "host-unreachable") == [2]
    assert polls(r, STRIX, "host-unreachable", "resolved") == [5]  # loading / 500 hold it open


def test_rule6_inhibits_the_hosts_other_issues():
    r = go({STRIX: {"endpoint": "ok ok refused*4", "temp_c": "86x6",
                    "requests_60s": "10x6", "failures_60s": "10x6"}})
    assert polls(r, STRIX, "thermal-critical") == [1]
    assert polls(r, STRIX, "host-unreachable") == [4]
    assert [(i.gpu, i.issue) for i in r.open_at_end] == [(STRIX, "host-unreachable")]
    assert (STRIX, "model-stuck") in fired(r)  # fired while reachable, then frozen and hidden


# --------------------------------------------------------------------------- Rule 7


def test_rule7_fires_on_the_third_unusable_monitor_poll():
    r = go(monitor="1 0 0 0 0")
    assert polls(r, "fleet", "data-source-unreachable", "pending") == [1]
    assert polls(r, "fleet", "data-source-unreachable") == [3]
    issue = r.open_at_end[0]
    assert (issue.gpu, issue.severity, issue.detected["source"]) == ("fleet", "warning", "monitor")


def test_rule7_one_bad_poll_is_a_fault_not_an_issue():
    r = go(monitor="1 0 1 0 0 1 1")
    assert polls(r, "fleet", "data-source-unreachable") == []
    assert polls(r, "fleet", "data-source-unreachable", "dropped") == [2, 5]


def test_rule7_resolves_on_the_first_usable_poll():
    r = go(monitor="0 0 0 0 1")
    assert polls(r, "fleet", "data-source-unreachable", "resolved") == [4]


def test_rule7_hides_monitor_fed_issues_reports_unknown_not_healthy():
    r = go({DENSE: {"temp_c": "90 90 _ _ _"}}, monitor="1 1 0 0 0")
    assert polls(r, DENSE, "thermal-critical") == [1]
    # the hot GPU is not known any more: not reported as hot, not resolved either
    assert [i.issue for i in r.open_at_end] == ["data-source-unreachable"]
    assert polls(r, DENSE, "thermal-critical", "resolved") == []
    # the monitor back and the GPU still hot: the issue is visible again, never re-fired
    r = go({DENSE: {"temp_c": "90 90 _ _ _ 90"}}, monitor="1 1 0 0 0 1")
    assert [i.issue for i in r.open_at_end] == ["thermal-critical"]
    assert polls(r, DENSE, "thermal-critical") == [1]


def test_rule7_the_direct_probes_keep_rule6_going():
    r = go({STRIX: {"endpoint": "refused*3"}}, monitor="0 0 0")
    assert ("fleet", "data-source-unreachable") in fired(r)
    assert (STRIX, "host-unreachable") in fired(r)
