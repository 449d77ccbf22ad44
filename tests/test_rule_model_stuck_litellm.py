"""Rule 3 from LiteLLM's own counters (issue 20): its ``prometheus`` callback counts requests and
failures per deployment; the difference between two polls is what users saw — "> 50 % failures over
60 s" with no gpu-monitor. Same hold as gpu-monitor's path (the 2nd consecutive bad poll), on jittered
cron clocks; a proxy restart (counters down) is never a rate."""

from __future__ import annotations

import pytest

try:
    from tests.series import fleet_config, fleet_trace, polls, run
except ImportError:
    from series import fleet_config, fleet_trace, polls, run

from gpuheal.parse.litellm_metrics import InvalidLiteLLMMetrics, parse_litellm_metrics

CFG = fleet_config()
G = "gpu-dense"
NO_MONITOR_COUNTS = {"requests_60s": "_", "failures_60s": "_"}


def trace(total: str, failed: str, step_s: float = 60.0):
    fields = {"litellm_requests_total": total, "litellm_failures_total": failed, **NO_MONITOR_COUNTS}
    return run(CFG, fleet_trace(CFG, {G: fields}, step_s=step_s))


@pytest.mark.parametrize("step_s", [58.7, 60.0, 61.9, 73.1])
def test_fires_at_the_second_bad_poll_and_says_what_users_saw(step_s):
    r = trace("0 10 20 30 40", "0 0 8 16 24", step_s=step_s)
    assert polls(r, G, "model-stuck", "pending") == [2] and polls(r, G, "model-stuck") == [3]
    issue = next(i for i in r.open_at_end if i.issue == "model-stuck")
    d = issue.detected
    assert d["source"] == "LiteLLM /metrics" and d["failure_pct"] == 80 and d["requests"] == 10
    assert "LiteLLM saw 8 of 10 requests fail" in issue.summary


def test_half_or_less_failing_never_fires_and_few_requests_are_not_known():
    assert polls(trace("0 10 20 30 40", "0 5 10 15 20"), G, "model-stuck", "pending") == []
    assert polls(trace("0 1 2 3 4", "0 1 2 3 4"), G, "model-stuck", "pending") == []


def test_a_proxy_restart_is_never_a_rate():
    # the counters go down at poll 2 (the proxy restarted): not known there, then a clean window
    r = trace("0 10 2 12 22", "0 9 2 2 2")
    assert polls(r, G, "model-stuck", "pending") == [1] and polls(r, G, "model-stuck") == []


def test_recovers_once_requests_succeed_again():
    r = trace("0 10 20 30 40 50", "0 8 16 16 16 16")
    assert polls(r, G, "model-stuck") == [2]
    assert polls(r, G, "model-stuck", "resolved") == [3]


REAL_LINE = ('litellm_deployment_total_requests_total{api_base="http://127.0.0.1:46221/v1",api_key_alias="None",'
             'api_provider="openai",client_ip="127.0.0.1",hashed_api_key="litellm_proxy_master_key",'
             'litellm_model_name="gpu-a",model_group="qwen",model_id="gpu-a",requested_model="qwen",team="None",'
             'team_alias="None",user_agent="python-requests/2.34.2"} 3.0')


def test_parser_sums_series_and_skips_garbage():
    text = "\n".join([
        "# HELP litellm_deployment_total_requests_total x", REAL_LINE,
        REAL_LINE.replace('client_ip="127.0.0.1"', 'client_ip="127.0.0.2"').replace("} 3.0", "} 4.0"),
        'litellm_deployment_failure_responses_total{model_id="gpu-a",exception_status="500"} 2.0',
        'litellm_deployment_failure_responses_total{model_id="gpu-a" broken} 9',
        'litellm_deployment_total_requests_total{model_id="gpu-b"} NaN',
        'litellm_deployment_total_requests_total{model_id="gpu-c"} -1',
        'litellm_deployment_total_requests_total{model_id="q\\"uote"} 1',
    ])
    got = parse_litellm_metrics(text)
    a = got.deployments["gpu-a"]
    assert (a.total, a.failures, a.successes, a.model_group) == (7.0, 2.0, 5.0, "qwen")
    assert set(got.deployments) == {"gpu-a", 'q"uote'} and len(got.problems) == 3
    assert got.for_gpu("gpu-a", "http://x:1") is a
    assert got.for_gpu("other", "http://127.0.0.1:46221") is a  # matched by api_base
    assert got.for_gpu("other", "http://127.0.0.1:1") is None


@pytest.mark.parametrize("text", ["", "garbage\n\x00", "<html>404</html>"])
def test_no_litellm_counters_is_a_typed_fault(text):
    with pytest.raises(InvalidLiteLLMMetrics):
        parse_litellm_metrics(text)
