"""The planner's guards (issue 4, item 5): pure values in, plan items out."""

from __future__ import annotations

from functools import partial

import pytest

from gpuheal.config import load_config_dict
from gpuheal.core import plan as planner
from gpuheal.core.actions import CapPower, LiteLLMUpdate
from gpuheal.core.heal_state import HealState
from gpuheal.core.issue import Issue
from gpuheal.core.plan import empty_state
from gpuheal.rules import REMEDIES

NOW = 1_800_000_000.0


def onsets(age_s: float = 3600.0, gpus=("gpu-0", "gpu-1", "gpu-2")) -> dict:
    """Rule 2's record (``vram-onset.json``) as heal keeps it: an onset snapshot of each GPU's leak."""
    snap = {"taken_s": NOW - age_s, "processes": [], "error": None}
    return {"vram-leak": {g: {"since": "2026-07-18T08:00:00Z", "snapshot": snap} for g in gpus}}


# the planner with every rule's remedy, and Rule 2's onset snapshots old enough to compare (as heal passes them)
plan = partial(planner.plan, remedies=REMEDIES, records=onsets())


def cfg(n_gpus: int = 3, monitor: bool = True, **heal):
    return load_config_dict(
        {
            "heal": heal,
            # Rule 7 restarts gpu-monitor (data-source-unreachable); without it the GPUs are read by smi
            **({"monitor": {"url": "http://127.0.0.1:9100/gpu-data"}} if monitor else {}),
            "litellm": {"restart_command": "docker restart litellm"},
            "gpus": [
                {
                    "alias": f"gpu-{i}",
                    "host": f"ct{i}",
                    "endpoint": f"http://127.0.0.1:{9000 + i}",
                    "restart_command": ["systemctl", "restart", "llama-server"],
                    "shed_load_command": "shed {alias}",
                }
                for i in range(n_gpus)
            ],
        }
    )


def issue(gpu="gpu-0", issue_id="model-stuck", state="firing", since="2026-07-18T08:00:00Z", severity="critical"):
    return Issue.from_json({"gpu": gpu, "issue": issue_id, "state": state, "since": since, "severity": severity, "detected": {"failure_ratio": 0.9}})


def only(items):
    assert len(items) == 1, items
    return items[0]


def test_firing_stuck_model_plans_a_restart_with_a_deterministic_key():
    item = only(plan([issue()], empty_state(), cfg(), NOW))
    assert item.decision == "act"
    assert [s.action for s in item.steps] == ["restart-llama-server"]
    assert item.steps[0].target == "ct0"  # ssh by default
    assert item.key == "gpu-0/model-stuck/2026-07-18T08:00:00Z/1"


def test_pending_issue_is_never_acted_on():
    assert plan([issue(state="pending")], empty_state(), cfg(), NOW) == []


def test_paused_gpu_and_paused_fleet_block():
    state = empty_state()
    state["paused"]["gpus"]["gpu-0"] = {"reason": "driver upgrade"}
    item = only(plan([issue()], state, cfg(), NOW))
    assert item.decision == "blocked" and "driver upgrade" in item.reason
    state = empty_state()
    state["paused"]["fleet"] = {"reason": "maintenance window"}
    assert only(plan([issue()], state, cfg(), NOW)).decision == "blocked"


def test_after_escalation_no_more_restarts_until_cleared():
    state = empty_state()
    state["escalated"]["gpu-0/model-stuck"] = {"at": NOW - 60, "reason": "x"}
    item = only(plan([issue()], state, cfg(), NOW))
    assert item.decision == "blocked" and "--clear gpu-0/model-stuck" in item.reason


def test_no_new_attempt_while_one_is_being_verified():
    state = empty_state()
    state["attempts"]["k"] = {"gpu": "gpu-0", "issue": "model-stuck", "since": "2026-07-18T08:00:00Z", "n": 1, "status": "pending", "verify_by": NOW + 60, "actions": ["restart-llama-server"]}
    item = only(plan([issue()], state, cfg(), NOW))
    assert item.decision == "blocked" and "being verified" in item.reason


def test_three_failed_verifications_escalate_instead_of_retrying():
    state = empty_state()
    for n in (1, 2, 3):
        state["attempts"][f"k{n}"] = {"gpu": "gpu-0", "issue": "model-stuck", "since": "2026-07-18T08:00:00Z", "n": n, "status": "failed"}
    item = only(plan([issue()], state, cfg(max_restarts_per_hour=10), NOW))
    assert item.decision == "escalate" and "3 failed" in item.reason


def test_two_failures_still_try_a_third_time():
    state = empty_state()
    for n in (1, 2):
        state["attempts"][f"k{n}"] = {"gpu": "gpu-0", "issue": "model-stuck", "since": "2026-07-18T08:00:00Z", "n": n, "status": "failed"}
    item = only(plan([issue()], state, cfg(max_restarts_per_hour=10), NOW))
    assert item.decision == "act" and item.attempt_no == 3


def test_restart_budget_is_a_sliding_hour():
    state = empty_state()
    state["restarts"]["gpu-0"] = [NOW - 3500, NOW - 2000, NOW - 1000]
    assert only(plan([issue()], state, cfg(), NOW)).decision == "escalate"
    state["restarts"]["gpu-0"] = [NOW - 3700, NOW - 2000, NOW - 1000]  # one fell out of the window
    assert only(plan([issue()], state, cfg(), NOW)).decision == "act"


def test_startup_grace_blocks_a_second_restart():
    state = empty_state()
    state["restarts"]["gpu-0"] = [NOW - 30]
    item = only(plan([issue()], state, cfg(startup_grace_s=120), NOW))
    assert item.decision == "blocked" and "startup grace" in item.reason


def test_fleet_guard_escalates_when_most_of_the_fleet_fails_at_once():
    issues = [issue(gpu=f"gpu-{i}", issue_id="host-unreachable") for i in range(2)]
    items = plan(issues, empty_state(), cfg(n_gpus=3), NOW)
    assert {i.decision for i in items} == {"escalate"}
    assert all("fleet guard" in i.reason for i in items)
    # one of three failing is within the guard
    items = plan(issues[:1], empty_state(), cfg(n_gpus=3), NOW)
    assert only(items).decision == "act"


def test_fleet_guard_does_not_block_load_shedding():
    issues = [issue(gpu=f"gpu-{i}", issue_id="host-unreachable") for i in range(3)]
    issues.append(issue(gpu="gpu-0", issue_id="thermal-critical"))
    items = {i.issue: i for i in plan(issues, empty_state(), cfg(n_gpus=3), NOW) if i.gpu == "gpu-0"}
    assert items["thermal-critical"].decision == "act"


def test_issues_without_a_safe_fix_escalate_at_once():
    item = only(plan([issue(issue_id="api-key-mismatch")], empty_state(), cfg(), NOW))
    assert item.decision == "escalate" and "L1" in item.reason


def test_recommendations_are_never_acted_on():
    item = only(plan([issue(issue_id="context-window", severity="info")], empty_state(), cfg(), NOW))
    assert item.decision == "recommend" and not item.steps


def test_filters_narrow_the_plan():
    issues = [issue(gpu="gpu-0"), issue(gpu="gpu-1", issue_id="thermal-critical")]
    assert [i.gpu for i in plan(issues, empty_state(), cfg(), NOW, gpu_filter="gpu-1")] == ["gpu-1"]
    assert [i.issue for i in plan(issues, empty_state(), cfg(), NOW, issue_filter="model-stuck")] == ["model-stuck"]


def test_thermal_without_any_load_command_caps_the_power_out_of_the_box_else_escalates():
    """Issue 27 item 7: no command, no LiteLLM deployment — the built-in shed is the GPU's power cap (over
    its own transport); with the cap turned off (``heal.shed_power_ratio: null``) there is nothing to do."""
    gpu = {"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:1", "transport": "ssh", "gpu_index": 1}
    item = only(plan([issue(gpu="a", issue_id="thermal-critical")], empty_state(), load_config_dict({"gpus": [gpu]}),
                     NOW))  # fmt: skip
    assert item.decision == "act" and [s.action for s in item.steps] == ["shed-load"]
    cap = item.steps[0]
    assert isinstance(cap, CapPower) and (cap.vendor, cap.gpu_index, cap.target, cap.ratio) == ("nvidia", 1, "h", 0.7)
    off = load_config_dict({"gpus": [gpu], "heal": {"shed_power_ratio": None}})
    item = only(plan([issue(gpu="a", issue_id="thermal-critical")], empty_state(), off, NOW))
    assert item.decision == "escalate" and "no command configured" in item.reason


def test_a_litellm_deployment_sheds_through_litellm_with_the_cap_instead():
    gpu = {"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:1", "litellm_model_id": "dep-a", "vendor": "amd"}
    c = load_config_dict({"gpus": [gpu], "litellm": {"url": "http://127.0.0.1:4000"}})
    [shed, redirect] = only(plan([issue(gpu="a", issue_id="thermal-critical")], empty_state(), c, NOW)).steps
    assert isinstance(shed, LiteLLMUpdate) and isinstance(shed.instead, CapPower) and shed.instead.vendor == "amd"
    assert isinstance(redirect, LiteLLMUpdate) and redirect.instead is None  # a cap redirects nothing


def test_fleet_data_source_restarts_gpu_monitor_locally():
    item = only(plan([issue(gpu="fleet", issue_id="data-source-unreachable")], empty_state(), cfg(), NOW))
    assert item.decision == "act"
    assert item.steps[0].action == "restart-gpu-monitor" and item.steps[0].target == "local"
    assert item.steps[0].argv == ("systemctl", "restart", "gpu-monitor.service")


@pytest.mark.parametrize("junk", [None, [], "x", {"attempts": [1, 2]}, {"restarts": {"a": ["x", 5]}}, {"paused": {"fleet": "yes"}}])
def test_damaged_heal_state_is_normalised_not_fatal(junk):
    state = HealState.from_json(junk)
    assert plan([issue()], state, cfg(), NOW)[0].decision in ("act", "blocked")


def test_one_run_never_restarts_the_same_gpu_twice():
    # a dead llama-server is stuck and leaking at once: the guards saw the state before this run's
    # first restart, so without a per-run check both items would restart gpu-0 back to back
    issues = [issue(), issue(issue_id="vram-leak", severity="warning")]
    items = plan(issues, empty_state(), cfg(), NOW)
    assert [(i.issue, i.decision) for i in items] == [("model-stuck", "act"), ("vram-leak", "blocked")]
    assert "gpu-0 is already being restarted" in items[1].reason


def test_one_litellm_restart_serves_every_stuck_breaker_of_the_run():
    issues = [issue(gpu=f"gpu-{i}", issue_id="circuit-breaker-stuck", severity="warning") for i in range(2)]
    items = plan(issues, empty_state(), cfg(), NOW)
    assert [i.decision for i in items] == ["act", "blocked"]
    assert items[0].steps[0].action == "restart-litellm"
    assert "litellm is already being restarted" in items[1].reason


def test_no_second_litellm_restart_while_one_is_being_verified():
    state = empty_state()
    state["attempts"]["k"] = {"gpu": "gpu-0", "issue": "circuit-breaker-stuck", "since": "2026-07-18T07:00:00Z", "n": 1, "status": "pending", "verify_by": NOW + 60, "actions": ["restart-litellm"]}
    item = only(plan([issue(gpu="gpu-1", issue_id="circuit-breaker-stuck", severity="warning")], state, cfg(), NOW))
    assert item.decision == "blocked" and "restart of litellm" in item.reason


def test_a_source_that_is_no_service_of_ours_is_not_restarted():
    # issue 19: whether Rule 7 may restart the source follows from its declaration (SourceSpec.restartable),
    # not from which config section exists; without gpu-monitor there is nothing of ours to restart
    item = only(plan([issue(gpu="fleet", issue_id="data-source-unreachable")], empty_state(), cfg(monitor=False), NOW))
    assert item.decision == "escalate"


@pytest.mark.parametrize(("issue_id", "gpu", "service"), [("circuit-breaker-stuck", "gpu-0", "litellm"), ("data-source-unreachable", "fleet", "gpu-monitor")])
def test_shared_services_have_a_restart_budget_too(issue_id, gpu, service):
    # a breaker (or gpu-monitor) that clears after each restart and comes back is a new occurrence
    # every time: only an hourly budget stops a restart loop of the service the whole fleet uses
    state = empty_state()
    state["service_restarts"][service] = [NOW - 3000, NOW - 2000, NOW - 1000]
    item = only(plan([issue(gpu=gpu, issue_id=issue_id, severity="warning")], state, cfg(), NOW))
    assert item.decision == "escalate" and f"3 restarts of {service}" in item.reason
    state["service_restarts"][service] = [NOW - 3700, NOW - 2000, NOW - 1000]
    assert only(plan([issue(gpu=gpu, issue_id=issue_id, severity="warning")], state, cfg(), NOW)).decision == "act"


def test_damaged_attempt_fields_are_coerced():
    state = HealState.from_json(
        {
            "attempts": {
                "k": {"gpu": "gpu-0", "issue": "model-stuck", "status": "running", "verify_by": "soon", "started_at": "x", "n": "2", "actions": "restart-llama-server"},
                "j": {"gpu": ["gpu-0"], "issue": "model-stuck"},
            },
            "escalated": {"gpu-0/model-stuck": "yes"},
            "run_seq": {"day": 20260718, "n": "x"},
            "active": {"gpu-0": ["shed-load"]},
            "restarts": {"gpu-0": [True, NOW - 10]},
        }
    ).to_json()
    assert list(state["attempts"]) == ["k"]
    a = state["attempts"]["k"]
    assert "verify_by" not in a and "started_at" not in a and a["n"] == 0 and a["actions"] == []
    assert state["escalated"] == {} and state["run_seq"] == {} and state["active"] == {}
    assert state["restarts"] == {"gpu-0": [NOW - 10]}


def test_a_litellm_attempt_past_its_window_does_not_hold_back_other_gpus():
    # gpu-0's attempt stays open while its issue is hidden (e.g. by api-key-mismatch): once its
    # verification window has passed it must not block gpu-1's breaker fix (nor its escalation)
    state = empty_state()
    # (a poll past it: one within the jitter tolerance of verify_by stands for the poll at it, core/timing)
    state["attempts"]["k"] = {"gpu": "gpu-0", "issue": "circuit-breaker-stuck", "since": "2026-07-18T07:00:00Z", "n": 1, "status": "pending", "verify_by": NOW - 60, "actions": ["restart-litellm"]}
    item = only(plan([issue(gpu="gpu-1", issue_id="circuit-breaker-stuck", severity="warning")], state, cfg(), NOW))
    assert item.decision == "act"


def test_fleet_guard_ignores_a_failure_already_escalated():
    """An old, escalated dead GPU plus one new failure is not "many GPUs at once"."""
    issues = [issue(gpu="gpu-0", issue_id="host-unreachable"), issue(gpu="gpu-1", issue_id="host-unreachable")]
    state = empty_state()
    assert {i.decision for i in plan(issues, state, cfg(n_gpus=3), NOW)} == {"escalate"}
    state["escalated"]["gpu-0/host-unreachable"] = {"at": NOW - 7200, "reason": "x"}
    items = {i.gpu: i for i in plan(issues, state, cfg(n_gpus=3), NOW)}
    assert items["gpu-0"].decision == "blocked"
    assert items["gpu-1"].decision == "act"


def test_a_remedy_held_back_by_a_wait_is_blocked_with_its_reason_and_no_attempt():
    """Rule 2's attribution waits for its second snapshot (its remedy's guard, reading its onset record):
    the plan holds that remedy back, shown with the reason, and counts no attempt; other issues are
    untouched."""
    leak = issue("gpu-1", "vram-leak", severity="warning")
    why = "waiting for attribution: the onset snapshot is 300 s old; the second is taken 600 s after it at the earliest"
    items = {i.issue: i for i in plan([issue(), leak], empty_state(), cfg(), NOW, records=onsets(300.0))}
    assert items["vram-leak"].decision == "blocked" and items["vram-leak"].reason == why
    assert items["vram-leak"].attempt_no == 0 and items["vram-leak"].steps == () and items["vram-leak"].key == ""
    assert items["model-stuck"].decision == "act"
    assert only(plan([leak], empty_state(), cfg(), NOW)).decision == "act"  # no wait: acts
    none = only(plan([leak], empty_state(), cfg(), NOW, records={}))  # no onset snapshot at all: waits for one
    assert none.decision == "blocked" and none.reason.startswith("waiting for attribution: no per-process")
