"""Issue 26 item 6: a rule is the unit of extension. A toy rule with memory, a special fix and a follow-through
across cron runs (tests/toy_fault/: its detection, its ``REMEDY`` and hooks, nothing else) is registered
for this test only — one registry line, checked as the registry checks every rule — and runs end to end
on the simulated fleet: detected by the engine, waited on by its guard, tracked in its own record across
cron runs, acted on by ``heal --apply`` through the generic loops (its hooks get every capability from
the run's context), audited with what its fix found, and delivered by ``escalate`` to a loopback Zulip.
No product module names it."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from gpuheal import rules
from gpuheal.core.rule import rule
from gpuheal.runtime import Runtime
from gpuheal.sim.zulip import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike
from gpuheal.state.store import StateDir
from gpuheal.steps import escalate, evaluate
from tests import toy_fault
from tests.lab import Lab, scenario

PKG = Path(__file__).resolve().parent.parent / "gpuheal"
PARAMS = {"power_w": 400.0, "hold_polls": 1, "verify_within_s": 600.0, "escalate_after_failures": 2}


@pytest.fixture
def registered(monkeypatch):
    """The toy rule in the registry, for this test only (its id is no contract id, so the test lets it in)."""
    monkeypatch.setattr(rules, "KNOWN_IDS", (*rules.KNOWN_IDS, toy_fault.ID))
    registry = rules.build_registry((*rules.ALL, rule(toy_fault)))  # the one registry line
    monkeypatch.setattr(rules, "ALL", registry)
    monkeypatch.setattr(evaluate, "ALL", registry)  # where check evaluates the registry's rules
    monkeypatch.setitem(rules.BY_ID, toy_fault.ID, toy_fault)
    monkeypatch.setitem(rules.REMEDIES, toy_fault.ID, toy_fault.REMEDY)


def with_toy_params(cfg):
    """Its parameters, as ``rules.toy-fault`` in defaults.yaml would give them to every GPU."""
    gpus = tuple(dataclasses.replace(g, rules={**g.rules, toy_fault.ID: PARAMS}) for g in cfg.gpus)
    return dataclasses.replace(cfg, rules={**cfg.rules, toy_fault.ID: PARAMS}, gpus=gpus)


def test_a_toy_rule_runs_end_to_end_through_heal_and_escalate(tmp_path, registered, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZULIP_EMAIL", DEFAULT_EMAIL)
    monkeypatch.setenv("ZULIP_API_KEY", DEFAULT_KEY)
    events = [{"at": 90, "gpu": "gpu-a", "set": {"power_w": 450}}, {"at": 150, "gpu": "gpu-a", "set": {"power_w": 470}},
              {"at": 210, "gpu": "gpu-a", "set": {"power_w": 440}}]
    lab = Lab(tmp_path, scenario([{"alias": "gpu-a", "host": "ct1"}, {"alias": "gpu-b", "host": "ct2"}], events))
    rng = random.Random(26)
    try:
        with ZulipLookalike() as zulip:
            lab.raw["zulip"] = {"site": zulip.url, "timeout_s": 3}
            lab.write_config()
            lab.cfg = with_toy_params(lab.cfg)
            dry = lab.heal(apply=False, advance_s=0)  # before the fault: nothing
            assert not [a for a in dry["actions"] if a["issue"] == toy_fault.ID]
            docs = []
            for _ in range(6):  # cron starts a second or two late
                docs.append(lab.heal(advance_s=60 + rng.uniform(0.2, 2.0)))
                with StateDir(lab.state_dir, 10) as store:
                    escalate.command(Runtime(cfg=lab.cfg, state_dir=lab.state_dir, now=lab.fleet.now()), store)
            messages = list(zulip.messages)
        audit = lab.audit()
        record = lab.read("toy-fault.json")
    finally:
        lab.close()
    toy = [(n, a) for n, d in enumerate(docs) for a in d["actions"] if a["issue"] == toy_fault.ID]
    blocked = [(n, a) for n, a in toy if a.get("blocked")]
    assert blocked and blocked[0][1]["why"].startswith("toy: seen open in 1 heal run(s)")  # its guard waited
    outcome = next(r for r in audit if r["issue"] == toy_fault.ID and r["phase"] == "outcome" and r["action"] != "alert")
    assert outcome["result"] == "escalated" and outcome["steps"][0]["action"] == "snapshot-processes"
    look = outcome["detected"]["toy_look"]  # what its fix found joins what was detected
    assert look["completion_ok"] is True and outcome["detected"]["toy_runs"] >= 2  # a real completion on the sim
    assert outcome["detected"]["power_w"] in (450, 470, 440)
    # its memory, kept by the engine across cron runs: the peak of the hot run, not this poll's draw
    peaks = [i["detected"].get("peak_w") for d in docs for i in d["issues"] if i["issue"] == toy_fault.ID]
    seen = [(i["detected"].get("power_w"), i["detected"].get("peak_w")) for d in docs for i in d["issues"]
            if i["issue"] == toy_fault.ID]
    assert 470 in peaks and (440, 470) in seen  # at 440 W it still reports the run's 470 W peak
    with StateDir(lab.state_dir, 10) as store:
        assert store.read("issues.json", {})["memory"]["toy_peak"]["gpu-a"]["peak_w"] == 470
    assert record["gpu-a"]["runs"] >= 2  # its own record, kept across cron runs
    sent = [m for m in messages if "toy fault on gpu-a" in m["content"]]
    assert len(sent) == 1 and sent[0]["content"].startswith("⚠ GPU Self-Heal — gpu-a needs attention")
    assert not [a for n, a in toy if a["issue"] == toy_fault.ID and a.get("gpu") == "gpu-b"]


def test_no_product_module_names_the_toy():
    assert not [p for p in PKG.rglob("*.py") if "toy" in p.read_text()]


def toy_asks(memory, now_s):
    """The toy's ``Remedy.asks``: a GPU whose hot run peaked at 450 W or more asks for a re-benchmark."""
    from gpuheal.core.rebench import Raised, RebenchAsk
    from tests.toy_fault.memory import PEAK

    rows = memory.rows(PEAK.key, PEAK.load)
    return tuple(Raised(RebenchAsk(alias, toy_fault.ID, f"toy: peaked at {row.peak_w:g} W", row.at_s or now_s),
                        line=None)
                 for alias, row in rows.items() if row.peak_w is not None and row.peak_w >= 450)


def test_the_toy_rule_raises_a_re_benchmark_through_the_same_hook_and_bench_answers_it(tmp_path, registered,
                                                                                      monkeypatch):
    """Issue 26 item 2: a rule's memory asks for a re-benchmark through ``Remedy.asks`` (as Rule 9 does);
    ``check`` files it in the one store and ``bench`` answers it once — with no hook of its own for the
    verdict, the default proof of a fix (core/rebench.prove_fix)."""
    from datetime import UTC, datetime

    from gpuheal.config import load_config_dict
    from gpuheal.core import rebench
    from gpuheal.core.engine import load_book
    from gpuheal.state import files
    from gpuheal.steps import rebench as answerer

    monkeypatch.setattr(toy_fault, "REMEDY", dataclasses.replace(toy_fault.REMEDY, asks=toy_asks))
    registry = rules.build_registry((*[r for r in rules.ALL if r.ID != toy_fault.ID], rule(toy_fault)))
    monkeypatch.setattr(rules, "ALL", registry)
    monkeypatch.setitem(rules.BY_ID, toy_fault.ID, toy_fault)
    cfg = with_toy_params(load_config_dict({"monitor": {"url": "http://127.0.0.1:9/gpu-data"},
                                            "gpus": [{"alias": "gpu-a", "host": "ct1", "endpoint": "http://127.0.0.1:9"}]}))
    now = datetime(2026, 7, 18, 9, 0, 3, tzinfo=UTC)
    with StateDir(tmp_path) as store:
        store.write(files.ISSUES, {"memory": {"toy_peak": {"gpu-a": {"at_s": now.timestamp() - 60, "peak_w": 470}}}})
        answerer.file_raised(store, load_book(store.read(files.ISSUES, None)).memory, now)
        [ask] = rebench.Asks.load(store.read(files.REBENCH, {})).asks
        assert (ask.gpu, ask.issue, ask.why) == ("gpu-a", toy_fault.ID, "toy: peaked at 470 W")
        store.write(files.ISSUES, {"memory": {}})  # the hot run is over: the ask stays until answered
        bench = [{"gpu": "gpu-a", "ok": True, "gen_tok_s": 72.0, "error": None}]
        got = answerer.answer(cfg, store, now, bench, {"gpu-a": 74.8})
        assert got.sections["rebench"]["gpu-a"]["rebench_tok_s"] == 72.0
        assert answerer.answer(cfg, store, now, bench, {"gpu-a": 74.8}).sections == {}  # answered once
    [line] = [json.loads(x) for x in (tmp_path / files.AUDIT_LOG).read_text().splitlines()]
    assert (line["issue"], line["phase"], line["action"]) == (toy_fault.ID, "rebench", "re-benchmark")
