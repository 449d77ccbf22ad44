"""``gpus[].paused: true`` pauses healing of that GPU exactly as ``gpuheal pause --gpu`` does (issue 27,
a safety bug found in wave 5: the plan guard read only the state ``gpuheal pause`` writes)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from gpuheal.config import load_config_dict
from gpuheal.core import plan as planner
from gpuheal.core import verify
from gpuheal.core.heal_state import HealState, Mitigation
from gpuheal.core.issue import Issue
from gpuheal.core.plan import empty_state
from gpuheal.rules import REMEDIES
from tests.lab import Lab, scenario

NOW = 1_800_000_000.0
plan = partial(planner.plan, remedies=REMEDIES)


def cfg(paused_b: bool = True):
    return load_config_dict(
        {"gpus": [{"alias": a, "host": f"ct{i}", "endpoint": f"http://127.0.0.1:{9000 + i}",
                   "restart_command": ["systemctl", "restart", "llama-server"], "shed_load_command": "shed {alias}",
                   **({"paused": True} if a == "gpu-b" and paused_b else {})}
                  for i, a in enumerate(("gpu-a", "gpu-b", "gpu-c"))]}
    )  # fmt: skip


def stuck(gpu: str) -> dict:
    return Issue.from_json({"gpu": gpu, "issue": "model-stuck", "state": "firing", "since": "2026-07-18T08:00:00Z",
            "severity": "critical", "detected": {"failure_ratio": 0.9}})  # fmt: skip


def test_a_gpu_paused_in_the_config_is_blocked_like_a_paused_one():
    items = {i.gpu: i for g in ("gpu-a", "gpu-b") for i in plan([stuck(g)], empty_state(), cfg(), NOW)}
    assert items["gpu-a"].decision == "act"
    assert items["gpu-b"].decision == "blocked" and items["gpu-b"].reason == "gpu-b paused (gpus[].paused in the config)"
    # the same guard as `gpuheal pause --gpu gpu-b`: a paused GPU escalates nothing either
    state = empty_state()
    state["paused"]["gpus"]["gpu-b"] = {"reason": "driver upgrade"}
    by_pause = {i.gpu: i for i in plan([stuck("gpu-b")], state, cfg(paused_b=False), NOW)}
    assert by_pause["gpu-b"].decision == items["gpu-b"].decision == "blocked"


def test_a_paused_gpu_in_the_config_escalates_nothing():
    escalating = replace(stuck("gpu-b"), issue="api-key-mismatch")  # automatic=False: escalated at once when not paused
    assert [i.decision for i in plan([escalating], empty_state(), cfg(paused_b=False), NOW)] == ["escalate"]
    assert [i.decision for i in plan([escalating], empty_state(), cfg(), NOW)] == ["blocked"]


def test_a_paused_gpu_in_the_config_keeps_its_shed_load_until_it_is_unpaused():
    state = HealState.from_json(empty_state()).with_mitigation("gpu-b", Mitigation(("shed-load",), "thermal-warning"))
    _, due = verify.cooldown(state, set(), {"gpu-a", "gpu-b", "gpu-c"}, NOW, 0.0, paused=planner.paused_in(cfg()))
    assert due == []
    _, due = verify.cooldown(state, set(), {"gpu-a", "gpu-b", "gpu-c"}, NOW, 0.0,
                             paused=planner.paused_in(cfg(paused_b=False)))  # fmt: skip
    assert [r.alias for r in due] == ["gpu-b"]


def test_heal_apply_never_restarts_a_gpu_paused_in_the_config(tmp_path):
    lab = Lab(tmp_path, scenario([{"alias": "gpu-a", "host": "ct1"}, {"alias": "gpu-b", "host": "ct2"},
                                  {"alias": "gpu-c", "host": "ct3"}],
                                 [{"at": 30, "gpu": "gpu-a", "fault": "stuck", "heals_on_restart": True}]))  # fmt: skip
    try:
        lab.gpu_raw("gpu-a")["paused"] = True
        lab.write_config()
        for _ in range(6):
            health = lab.heal()
        assert lab.restarts("gpu-a") == 0
        blocked = [a for a in health["actions"] if a.get("blocked") and a["gpu"] == "gpu-a"]
        assert blocked and blocked[0]["why"] == "gpu-a paused (gpus[].paused in the config)"
        assert health["paused"]["gpus"]["gpu-a"]["reason"] == "gpus[].paused in the config"
        assert not [r for r in lab.audit() if r["gpu"] == "gpu-a" and r.get("action") != "heal-cycle"]
        lab.gpu_raw("gpu-a")["paused"] = False
        lab.write_config()
        lab.heal()
        assert lab.restarts("gpu-a") == 1
    finally:
        lab.close()
