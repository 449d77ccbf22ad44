"""Rule 7's own verify (issue 27 item 5): "gpu-monitor returns healthy + all sidecars reachable" before a
gpu-monitor restart is resolved — a fleet fix has no GPU to prove it with a completion, and before this
it resolved on its issue clearing alone. Declared on the rule (``REMEDY.verify``), read by the generic
judge; the registry refuses a fleet rule with a fix and no verify."""

from __future__ import annotations

import types
from dataclasses import replace

import pytest

from gpuheal import rules
from gpuheal.core.remedy import Proving
from gpuheal.rules import data_source_unreachable as rule7
from gpuheal.rules.data_source_unreachable.remedy import verify
from tests.lab import Lab, scenario


def proving(endpoints, source_ok=True, firing=()):
    return Proving("fleet", rule7.ID, "monitor", source_ok, endpoints, frozenset(firing))


@pytest.mark.parametrize(
    ("endpoints", "source_ok", "firing", "ok", "key"),
    [({"a": "ok", "b": "ok"}, True, (), True, None),
     ({"a": "ok", "b": "http-503"}, True, (), True, None),  # any HTTP answer is reachable (loading, 5xx)
     ({"a": "ok", "b": "loading"}, True, (), True, None),
     ({"a": "ok", "b": "unauthorized"}, True, (), True, None),
     ({"a": "ok", "b": "ok"}, False, (), False, "error"),  # the monitor's poll was not usable
     ({"a": "ok", "b": "ok"}, None, (), False, "error"),  # no such source: not proved
     ({"a": "ok", "b": "refused"}, True, (), False, "sidecars_unreachable"),
     ({"a": "ok", "b": "timeout"}, True, (("b", "host-unreachable"),), True, "sidecars_down_under_rule_6"),
     ({"a": "ok", "b": None}, True, (), False, "sidecars_not_known"),
     ({}, True, (), True, None)],
)  # fmt: skip
def test_the_monitor_healthy_and_every_sidecar_reachable(endpoints, source_ok, firing, ok, key):
    got = verify(proving(endpoints, source_ok, firing), None)  # type: ignore[arg-type]  (pure: no capability)
    assert got["ok"] is ok and got["source_healthy"] is (source_ok is True)
    if key:
        assert key in got
    assert got["sidecars"] == len(endpoints)


def test_the_registry_refuses_a_fleet_fix_without_its_own_verify():
    fake = types.ModuleType("data_source_unreachable")
    fake.__dict__.update({k: getattr(rule7, k) for k in dir(rule7) if not k.startswith("__")})
    fake.REMEDY = replace(rule7.REMEDY, verify=None)
    with pytest.raises(rules.RuleRegistryError, match="verify"):
        rules.build_registry((fake,))  # type: ignore[arg-type]
    assert rules.build_registry((rule7,)) == (rule7,)


def test_a_gpu_monitor_restart_is_resolved_only_once_every_sidecar_answers(tmp_path):
    """gpu-monitor down from t=30 (a restart brings it back); gpu-b's llama-server dies at t=200 and is back
    at t=270. The monitor's restart (3rd unusable poll, t=180) is not resolved at t=240 — its issue cleared,
    but a sidecar does not answer and no Rule 6 issue of its own fires yet — and is at t=300."""
    events = [{"at": 30, "gpu": "fleet", "monitor": "down"},
              {"at": 200, "gpu": "gpu-b", "fault": "dead"}, {"at": 270, "gpu": "gpu-b", "fault": "none"}]
    lab = Lab(tmp_path, scenario([{"alias": "gpu-a", "host": "ct1"}, {"alias": "gpu-b", "host": "ct2"},
                                  {"alias": "gpu-c", "host": "ct3"}], events))  # fmt: skip
    try:
        for _ in range(3):
            lab.heal()
        assert lab.restarts("monitor") == 1
        at_240 = lab.heal()
        assert ("fleet", rule7.ID) not in {(i["gpu"], i["issue"]) for i in at_240["issues"]}  # the issue cleared
        assert not [r for r in lab.audit() if r["issue"] == rule7.ID and r["result"] == "resolved"]
        lab.heal()
        lines = [r for r in lab.audit() if r["issue"] == rule7.ID]
    finally:
        lab.close()
    assert [(r["phase"], r["result"]) for r in lines] == [("intent", "pending"), ("verification", "resolved")]
    v = lines[-1]["verification"]
    assert v["source_healthy"] is True and v["sidecars_reachable"] == v["sidecars"] == 3 and v["after_s"] == 120
    assert lines[-1]["detected"]["source"] == "monitor" and lines[-1]["steps"][0]["action"] == "restart-gpu-monitor"
