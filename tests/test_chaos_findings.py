"""What the chaos week (benchmarks/chaos.py, issue 29) found gpuheal doing wrong, each reduced to a
minimal reproduction on the simulated fleet, through ``heal --apply`` as cron runs it.

Each is ``xfail(strict=True)``: it fails today, and turns into a failure (XPASS) the moment the fix
lands, so the mark is removed with the fix. The fixes belong to heal/evaluate/rules (issue 26's
owners), not to the benchmark."""

from __future__ import annotations

import pytest

from tests.lab import Lab, scenario

TWO = [{"alias": "gpu-a", "host": "ct1"}, {"alias": "gpu-b", "host": "ct2"}]


@pytest.fixture
def lab(tmp_path):
    lab = Lab(tmp_path, scenario(TWO))
    yield lab
    lab.close()


@pytest.mark.xfail(strict=True, reason=(
    "chaos finding (seed 1, 10 GPUs, deploy of gpu-0007 at t=99 s): a llama-server still loading its model "
    "after a planned restart answers /health 503 'Loading model' while LiteLLM's requests to it fail, so "
    "gpu-monitor's failures_60s = requests_60s; Rule 3 (model-stuck, from the failure ratio) fires at the "
    "2nd such poll and heal restarts it (audit: detected.endpoint 'loading'). A loading server is not stuck: "
    "the restart only starts its load over. Expected: no action while /health says loading."))
def test_a_server_loading_its_model_after_a_deploy_is_not_restarted(lab):
    lab.fleet.apply({"gpu": "gpu-a", "fault": "loading"})  # a deploy: the new process loads for 3 minutes
    for _ in range(3):
        lab.heal()
    assert lab.restarts("gpu-a") == 0
    assert not [r for r in lab.audit() if r["gpu"] == "gpu-a" and r["action"].startswith("restart")]


def test_control_a_server_that_fails_requests_while_healthy_is_restarted(lab):
    """The same failure ratio with /health ok (completions failing) is Rule 3 and is healed: the
    finding above is about the loading state alone."""
    lab.fleet.apply({"gpu": "gpu-a", "fault": "failing"})
    for _ in range(3):
        lab.heal()
    assert lab.restarts("gpu-a") == 1


def test_a_monitor_that_lists_no_gpu_is_restarted_like_a_refused_one(lab):
    """Found by the chaos week (seed 1, monitor-empty for 5 h: never restarted); fixed with issue 27 item 1."""
    lab.fleet.apply({"gpu": "fleet", "monitor": "empty"})
    fired = []
    for _ in range(4):
        health = lab.heal()
        fired += [i["issue"] for i in health["issues"] if i["gpu"] == "fleet" and i["state"] in ("firing", "verifying")]
    assert "data-source-unreachable" in fired
    assert lab.fleet.restart_count("monitor") == 1


def test_control_a_refused_monitor_is_restarted_at_the_third_poll(lab):
    lab.fleet.apply({"gpu": "fleet", "monitor": "down"})
    for _ in range(4):
        lab.heal()
    assert lab.fleet.restart_count("monitor") == 1
