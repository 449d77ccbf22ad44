"""A model answering 401 is taken out of LiteLLM's routing, not only escalated (issue 27 item 15; Lessons
L1/L2: "do NOT fall back to it again"), and put back once it answers again — each way counted only when
LiteLLM's read-back shows it. End to end on the simulated fleet, one ``heal --apply`` per simulated minute:
a database-backed LiteLLM look-alike (whose answers ``tests/reallitellm/test_lookalike_matches.py`` checks
against the real proxy); a ``config.yaml`` LiteLLM says at once why it cannot be done (the same against the
real proxy: ``tests/reallitellm/test_heal_real.py``)."""

from __future__ import annotations

import json

import pytest
from lab import Lab, scenario

from gpuheal.core.remedy import Planning
from gpuheal.rules import api_key_mismatch as l1

WRONG_KEY = [{"at": 30, "gpu": "gpu-a", "fault": "wrong-key", "api_key": "sk-local-5678"}]


@pytest.fixture
def make_lab(tmp_path, monkeypatch):
    labs = []

    def make(store: str):
        gpus = [{"alias": "gpu-a", "host": "ct1", "litellm_group": "qwen", "litellm_weight": 0.55},
                {"alias": "gpu-b", "host": "ct2", "litellm_group": "qwen", "litellm_weight": 0.45}]
        where = tmp_path / f"lab{len(labs)}"
        where.mkdir()
        lab = Lab(where, scenario(gpus, WRONG_KEY, litellm_store=store), heal={"restore_after_s": 120})
        labs.append(lab)
        monkeypatch.setenv("LITELLM_MASTER_KEY", lab.fleet.litellm_admin_key)
        for g in lab.raw["gpus"]:
            g["litellm_model_id"] = g["alias"]
        lab.write_config()
        return lab

    yield make
    for lab in labs:
        lab.close()


def bench(lab, rc: int = 1) -> None:
    """gpuheal's own benchmark sees the 401, or the answer again (a /health probe asks no key)."""
    lab.fleet.advance(60)
    assert lab.cli("bench", "--gpu", "gpu-a").returncode == rc


def weight(lab) -> float:
    return lab.fleet.state()["gpus"]["gpu-a"]["litellm_weight"]


def escalations(lab) -> list[dict]:
    return [a for a in lab.read("alerts.json").get("queue", []) if a["kind"] == "escalated" and a["gpu"] == "gpu-a"]


def test_a_401_is_taken_out_of_routing_told_and_put_back_once_it_answers(make_lab):
    lab = make_lab("db")
    bench(lab)
    first = lab.heal(advance_s=0)  # the same minute as the benchmark that saw the 401
    assert ("gpu-a", "api-key-mismatch") in {(i["gpu"], i["issue"]) for i in first["issues"]}
    assert weight(lab) == 0.55 and escalations(lab) == []  # never on one poll
    lab.heal()
    assert weight(lab) == 0.0  # out of routing: LiteLLM sends it nothing (its group routes by weight)
    [out] = [r for r in lab.audit() if r["action"] == "redirect-traffic" and r["phase"] == "outcome"]
    assert out["result"] == "escalated" and out["steps"][0]["ok"] and "read back" in out["steps"][0]["output"]
    [told] = escalations(lab)
    assert told["issue"] == "api-key-mismatch" and "taken out of LiteLLM routing" in told["summary"]
    assert lab.restarts("gpu-a") == 0  # never a restart for a key
    for _ in range(3):
        lab.heal()
    assert weight(lab) == 0.0 and len(escalations(lab)) == 1  # stays out; told once
    lab.fleet.apply({"gpu": "gpu-a", "fault": "none"})  # the operator aligned the key: it answers again
    bench(lab, rc=0)
    for _ in range(6):
        lab.heal()
        if weight(lab) == 0.55:
            break
    assert weight(lab) == 0.55  # put back exactly as it was, read back
    restore = [r for r in lab.audit() if r["action"] == "restore-load" and r["phase"] == "outcome"]
    assert [r["result"] for r in restore] == ["resolved"]
    audit = (lab.state_dir / "gpu-self-heal-log.jsonl").read_text()
    assert "sk-local-5678" not in audit and lab.fleet.litellm_admin_key not in audit


def test_a_config_file_litellm_cannot_take_it_out_and_says_so_at_once(make_lab):
    lab = make_lab("config-no-db")
    bench(lab)
    for _ in range(2):
        lab.heal()
    assert weight(lab) == 0.55
    [told] = escalations(lab)
    assert "config.yaml" in told["summary"] or "No DB" in told["summary"], told["summary"]
    assert told["summary"].startswith(l1.WHY) and "it stays in LiteLLM's routing" in told["summary"]


@pytest.mark.parametrize(("seen", "waits"), [(None, True), (0.0, True), ("60", True), (True, True), (29.0, False),
                                             (60.0, False), (float("nan"), True)])
def test_the_take_out_waits_for_a_second_poll(seen, waits):
    detected = {} if seen is None else {"duration_s": seen}
    p = Planning("gpu-a", "api-key-mismatch", "S", detected, frozenset(), {}, {}, 0.0, 2.0, None)  # type: ignore[arg-type]
    assert (l1.guard(p).wait is not None) is waits


def test_without_any_litellm_path_it_is_escalated_at_once_as_before(tmp_path):
    lab = Lab(tmp_path, scenario([{"alias": "gpu-a", "host": "ct1"}, {"alias": "gpu-b", "host": "ct2"}], WRONG_KEY))
    try:
        bench(lab)
        lab.heal()
        [told] = [a for a in lab.read("alerts.json")["queue"] if a["kind"] == "escalated"]
        assert told["issue"] == "api-key-mismatch" and "L1" in told["summary"]
        assert "sk-local-5678" not in json.dumps(told)
    finally:
        lab.close()
