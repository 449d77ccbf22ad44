"""Load-side cooling that works or says why at once (issue 11), end to end on the simulated fleet:
a database-backed LiteLLM round-trips shed -> verify -> restore with each step read back; a
LiteLLM that keeps its models in config.yaml makes the shed ``failed`` and the thermal issue
reaches the humans in that same run. (The same against the real proxy: tests/reallitellm.)"""

from __future__ import annotations

import pytest
from lab import Lab, scenario

HOT = [{"at": 0, "gpu": "gpu-a", "ramp": {"temp_c": 3}, "max": {"temp_c": 95}}]


@pytest.fixture
def make_lab(tmp_path, monkeypatch):
    labs = []

    def make(store: str, gpus=None, events=None, **overrides):
        gpus = gpus or [
            {"alias": "gpu-a", "host": "ct1", "temp_c": 78, "litellm_group": "qwen", "litellm_weight": 0.55},
            {"alias": "gpu-b", "host": "ct2", "litellm_group": "qwen", "litellm_weight": 0.45},
        ]
        where = tmp_path / f"lab{len(labs)}"
        where.mkdir()
        lab = Lab(where, scenario(gpus, HOT if events is None else events, litellm_store=store), **overrides)
        labs.append(lab)
        monkeypatch.setenv("LITELLM_MASTER_KEY", lab.fleet.litellm_admin_key)
        for g in lab.raw["gpus"]:
            g["litellm_model_id"] = g["alias"]
        lab.write_config()
        return lab

    yield make
    for lab in labs:
        lab.close()


def outcomes(lab, action):
    """The outcome lines of ``action``: at once when it ended in its run, else its verdict (issue 27 item 13)."""
    return [r for r in lab.audit() if r["action"] == action and r["phase"] in ("outcome", "verification")]


def test_a_database_backed_litellm_round_trips_shed_verify_restore(make_lab):
    lab = make_lab("db", heal={"restore_after_s": 300})
    weights, shed_seen = [], False
    for _ in range(40):
        lab.heal()
        gpu = lab.fleet.state()["gpus"]["gpu-a"]
        weights.append(gpu["litellm_weight"])
        shed_seen |= gpu["litellm_weight"] < 0.55
        if shed_seen and gpu["litellm_weight"] == 0.55:
            break
    assert shed_seen, "the deployment's weight was lowered (its group routes by weight)"
    assert min(weights) < 0.55 and weights[-1] == 0.55, weights  # lowered, then exactly what was there
    assert lab.fleet.state()["gpus"]["gpu-a"]["litellm_rpm"] == 60  # rpm never touched
    shed = outcomes(lab, "shed-load")
    assert shed and shed[0]["result"] != "failed"
    restore = outcomes(lab, "restore-load")
    assert [r["result"] for r in restore] == ["resolved"]
    assert not [a for a in lab.read("alerts.json").get("queue", []) if a["kind"] == "escalated"]
    assert lab.fleet.litellm_admin_key not in (lab.state_dir / "gpu-self-heal-log.jsonl").read_text()


@pytest.mark.parametrize(
    ("store", "words"),
    [
        ("config-no-db", "config.yaml (db_model false)"),  # seen in /v1/model/info: nothing is sent
        ("config-with-db", "config.yaml (db_model false)"),
        ("db-store-off", "200 null"),
    ],
)
def test_a_litellm_that_cannot_store_escalates_in_the_run_that_tried(make_lab, store, words):
    lab = make_lab(store, events=[{"at": 0, "gpu": "gpu-a", "set": {"temp_c": 90}}])
    tried_in = None
    for poll in range(6):
        health = lab.heal()
        shed = [a for a in health["actions"] if a["action"] == "shed-load" and not a.get("blocked")]
        if shed:
            tried_in = poll
            assert shed[0]["result"] == "failed", shed
            alerts = [a for a in health["actions"] if a["action"] == "alert"]
            assert alerts and alerts[0]["result"] == "escalated", health["actions"]
            break
    assert tried_in is not None, "a shed was planned and tried"
    queue = lab.read("alerts.json")["queue"]
    escalated = [a for a in queue if a["kind"] == "escalated" and a["issue"] == "thermal-critical"]
    assert len(escalated) == 1 and "load shedding through LiteLLM is impossible" in escalated[0]["summary"]
    assert not [r for r in outcomes(lab, "shed-load") if r["result"] == "resolved"]
    gpu = lab.fleet.state()["gpus"]["gpu-a"]
    assert (gpu["litellm_weight"], gpu["litellm_updates"]) == (0.55, 0)  # nothing was shed
    # no verification windows spent: the following runs do not try again
    for _ in range(3):
        health = lab.heal()
        assert not [a for a in health["actions"] if a["action"] == "shed-load" and not a.get("blocked")]
    assert words in escalated[0]["summary"]


@pytest.mark.parametrize(
    "raw",
    [None, "x", {"model_id": "a", "field": "tpm", "value": 1}, {"model_id": "", "field": "rpm", "value": 1},
     {"model_id": "a", "field": "weight", "value": -1}, {"model_id": "a", "field": "weight", "value": "0.5"},
     {"model_id": "a", "field": "weight", "value": float("nan")}],
)
def test_a_damaged_restore_note_is_dropped_never_guessed(raw):
    from gpuheal.core.heal_state import Mitigation

    m = Mitigation.from_json({"actions": ["shed-load"], "restore": raw})
    assert m is not None and m.restore is None
    good = Mitigation.from_json({"actions": ["shed-load"], "restore": {"model_id": "a", "field": "weight", "value": 0.55}})
    assert good.restore == ("a", "weight", 0.55) and Mitigation.from_json(good.to_json()) == good


def test_a_hung_litellm_fails_the_shed_within_its_deadline_and_the_audit_keeps_both_lines(make_lab):
    import time

    lab = make_lab("db", events=[{"at": 0, "gpu": "gpu-a", "set": {"temp_c": 90}},
                                 {"at": 0, "gpu": "fleet", "litellm": "hang"}])
    for _ in range(4):
        started = time.monotonic()
        health = lab.heal()
        took = time.monotonic() - started
        shed = [a for a in health["actions"] if a["action"] == "shed-load" and not a.get("blocked")]
        if shed:
            assert shed[0]["result"] == "failed" and "timeout" in (shed[0].get("error") or ""), shed
            assert took < 20, took  # litellm.timeout_s is 1 s in the lab: bounded, not hung
            break
    else:
        raise AssertionError("no shed was tried")
    lines = [(r["action"], r["phase"]) for r in lab.audit() if r["action"] == "shed-load"]
    assert ("shed-load", "intent") in lines and ("shed-load", "outcome") in lines
    assert lab.fleet.state()["gpus"]["gpu-a"]["litellm_updates"] == 0


@pytest.mark.parametrize(
    ("store", "words"),
    [("db", "would set weight 0.55 -> 0.275 (read now from LiteLLM)"),
     ("config-with-db", "would fail: LiteLLM keeps gpu-a in config.yaml (db_model false)")],
)
def test_the_dry_run_says_what_litellm_would_do_or_why_not(make_lab, store, words):
    lab = make_lab(store, events=[{"at": 0, "gpu": "gpu-a", "set": {"temp_c": 90}}])
    notes = []
    for _ in range(3):
        health = lab.heal(apply=False)
        notes += [a.get("note", "") for a in health["actions"] if a["action"] == "shed-load"]
    assert any(words in n for n in notes), notes
    assert lab.fleet.state()["gpus"]["gpu-a"]["litellm_updates"] == 0  # a dry run changes nothing
