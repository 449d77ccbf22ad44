"""One cause, one message (issue 21): a rack's cooling failure on 30 of 43 GPUs — the spec's three plus
40 L40S on node00–node39 — reached Zulip as 90 messages (three per hot GPU). On the simulator, as cron
runs it (``heal --apply`` each simulated minute, then ``escalate``), to a loopback Zulip:

- at most 5 messages, every hot GPU named, each within Zulip's 10,000 characters;
- a second ``escalate`` in the same minute sends nothing new;
- 10 more GPUs heating up are one follow-up naming exactly those 10;
- the rack cooling down is one resolved message.
"""

from __future__ import annotations

import json
import re

import pytest
from lab import Lab, scenario

from gpuheal.sim.zulip import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike

SPEC = [{"alias": "gpu-dense", "host": "ct8"}, {"alias": "gpu-light", "host": "ct110", "vram_total_mb": 12288},
        {"alias": "strix-moe", "host": "ct15", "vendor": "amd", "vram_total_mb": 65536}]
NODES = [{"alias": f"node{i:02d}", "host": f"node{i:02d}", "vram_total_mb": 46068, "temp_c": 50} for i in range(40)]
ENV = {"ZULIP_EMAIL": DEFAULT_EMAIL, "ZULIP_API_KEY": DEFAULT_KEY}


@pytest.fixture
def storm(tmp_path):
    zulip = ZulipLookalike().start()
    lab = Lab(tmp_path, scenario(SPEC + NODES, ports={"gpus_from": 19200}), zulip={"site": zulip.url, "timeout_s": 3})
    for g in lab.raw["gpus"]:
        if g["alias"].startswith("node"):
            g["labels"] = {"rack": "r7"}
    lab.write_config()
    yield lab, zulip
    lab.close()
    zulip.stop()


def heat(lab, aliases, temp_base=88):
    for i, alias in enumerate(aliases):
        lab.fleet.set(alias, {"temp_c": temp_base + i % 5})  # 88-92 °C


def escalate(lab) -> dict:
    proc = lab.cli("escalate", "--json", env=ENV)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def named(messages) -> set[str]:
    return {m for msg in messages for m in re.findall(r"\bnode\d\d\b", msg["content"])}


def test_a_rack_cooling_failure_is_a_handful_of_messages(storm):
    lab, zulip = storm
    hot = [f"node{i:02d}" for i in range(30)]
    heat(lab, hot)
    for _ in range(3):
        lab.heal()
    first = escalate(lab)
    msgs = list(zulip.messages)
    assert 1 <= len(msgs) <= 5, [m["content"].splitlines()[0] for m in msgs]
    assert named(msgs) == set(hot)
    assert all(len(m["content"]) <= 10_000 for m in msgs)
    assert first["grouped"] >= 29 and first["queued"] == []

    again = escalate(lab)  # the same minute: nothing new
    assert again["sent"] == [] and len(zulip.messages) == len(msgs)

    more = [f"node{i:02d}" for i in range(30, 40)]
    heat(lab, more)
    for _ in range(3):
        lab.heal()
    escalate(lab)
    follow_up = zulip.messages[len(msgs):]
    assert len(follow_up) == 1, [m["content"].splitlines()[0] for m in follow_up]
    assert named(follow_up) == set(more)

    for alias in hot + more:
        lab.fleet.set(alias, {"temp_c": 60})
    before = len(zulip.messages)
    for _ in range(6):
        lab.heal()
    escalate(lab)
    resolved = zulip.messages[before:]
    assert len(resolved) == 1, [m["content"].splitlines()[0] for m in resolved]
    assert "resolved" in resolved[0]["content"].splitlines()[0]
    assert named(resolved) == set(hot + more)


def test_the_per_run_budget_folds_the_rest_into_one_summary(storm):
    """Four causes (three racks and an unlabelled GPU) under a budget of two: one message, then one
    summary naming the rest; nothing stays queued and the count is in --json."""
    lab, zulip = storm
    lab.raw["zulip"].update(max_messages_per_run=2, group_by="rack")
    for i, g in enumerate(g for g in lab.raw["gpus"] if g["alias"].startswith("node")):
        g["labels"] = {"rack": f"r{i // 2}"}
    lab.write_config()
    lab.fleet.set("gpu-dense", {"temp_c": 95})
    heat(lab, [f"node{i:02d}" for i in range(6)])
    for _ in range(3):
        lab.heal()
    doc = escalate(lab)
    assert len(zulip.messages) == 2, [m["content"].splitlines()[0] for m in zulip.messages]
    assert doc["over_budget"] >= 2 and doc["queued"] == []
    assert "more GPU" in zulip.messages[1]["content"].splitlines()[0]
    everyone = {m for msg in zulip.messages for m in re.findall(r"\b(?:node\d\d|gpu-dense)\b", msg["content"])}
    assert everyone == {"gpu-dense", *(f"node{i:02d}" for i in range(6))}


def test_group_by_a_rack_is_one_message_per_rack(storm):
    lab, zulip = storm
    lab.raw["zulip"]["group_by"] = "rack"
    for i, g in enumerate(g for g in lab.raw["gpus"] if g["alias"].startswith("node")):
        g["labels"] = {"rack": "r1" if i < 20 else "r2"}
    lab.write_config()
    heat(lab, ["node00", "node01", "node25", "node26"])
    for _ in range(3):
        lab.heal()
    escalate(lab)
    assert len(zulip.messages) == 2
    assert sorted(sorted(named([m])) for m in zulip.messages) == [["node00", "node01"], ["node25", "node26"]]


def test_half_a_labelled_rack_hot_is_one_cooling_incident(storm):
    """cooling_fraction 0.5 per rack (issue 21 point 2): 30 of the 43 GPUs hot, all in rack r7, is
    one cooling-infrastructure incident in Zulip, within the same handful of messages."""
    lab, zulip = storm
    lab.raw.setdefault("rules", {})["cooling-infrastructure"] = {"cooling_fraction": 0.5, "group_by": "rack"}
    lab.write_config()
    heat(lab, [f"node{i:02d}" for i in range(30)])
    for _ in range(3):
        lab.heal()
    escalate(lab)
    msgs = list(zulip.messages)
    assert 1 <= len(msgs) <= 5, [m["content"].splitlines()[0] for m in msgs]
    cooling = [m for m in msgs if "cooling-infrastructure" in m["content"]]
    assert len(cooling) == 1, [m["content"].splitlines()[0] for m in msgs]
    assert "where: rack r7" in cooling[0]["content"] and "gpus_hot: 30" in cooling[0]["content"]
    assert named(msgs) == {f"node{i:02d}" for i in range(30)}


@pytest.fixture
def spec3(tmp_path):
    """The spec's three GPUs and a loopback Zulip; ``events``: the scenario's timeline."""
    zulip = ZulipLookalike().start()
    labs = []

    def make(events, temp_c=66):
        gpus = [dict(g) for g in SPEC]
        gpus[0]["temp_c"] = temp_c
        lab = Lab(tmp_path, scenario(gpus, events, ports={"gpus_from": 19300}),
                  zulip={"site": zulip.url, "timeout_s": 3})
        labs.append(lab)
        return lab

    yield make, zulip
    for lab in labs:
        lab.close()
    zulip.stop()


def _cooling_commands(lab, shed_to_c):
    import sys

    ctl = [sys.executable, "-m", "gpuheal.sim.control", lab.fleet.control_url, "set", "{alias}"]
    gpu = next(g for g in lab.raw["gpus"] if g["alias"] == "gpu-dense")
    gpu["shed_load_command"] = [*ctl, f'{{{{"temp_c": {shed_to_c}}}}}']
    gpu["redirect_command"] = [*ctl, '{{"util_pct": 10}}']
    gpu["restore_load_command"] = [*ctl, '{{"util_pct": 50}}']
    lab.write_config()


def test_spec_fleet_tier_one_alone_sends_nothing(spec3):
    make, zulip = spec3
    lab = make([{"at": 30, "gpu": "gpu-dense", "ramp": {"temp_c": 3}, "max": {"temp_c": 78}}])
    _cooling_commands(lab, 72)
    seen = set()
    for _ in range(12):
        doc = lab.heal()
        seen |= {(i["gpu"], i["issue"]) for i in doc["issues"]}
        escalate(lab)
    assert ("gpu-dense", "thermal-warning") in seen
    assert ("gpu-dense", "thermal-rising") not in seen and ("gpu-dense", "thermal-critical") not in seen
    assert zulip.messages == [], [m["content"].splitlines()[0] for m in zulip.messages]


def test_spec_fleet_tier_two_sends_one_message(spec3):
    make, zulip = spec3
    lab = make([{"at": 30, "gpu": "gpu-dense", "ramp": {"temp_c": 1}, "max": {"temp_c": 84}}], temp_c=78)
    _cooling_commands(lab, 83)
    seen = set()
    for _ in range(10):
        doc = lab.heal()
        seen |= {(i["gpu"], i["issue"]) for i in doc["issues"]}
        escalate(lab)
    assert ("gpu-dense", "thermal-rising") in seen and ("gpu-dense", "thermal-critical") not in seen
    firsts = [m["content"].splitlines()[0] for m in zulip.messages]
    assert len(firsts) == 1, firsts
    assert "gpu-dense" in zulip.messages[0]["content"] and "thermal-rising" in zulip.messages[0]["content"]
