"""What the rules remember between runs, kept by the engine (``core/memory`` and ``engine.remember``): a
damaged book or row — a state file edited by hand, written by another version, cut short — is replaced
and the poll folded in, never a crash; the same poll folded twice counts once; a GPU gone from the config
is dropped; missing data neither advances nor resets; a state directory written by the previous version
carries on as if nothing had changed."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuheal import benchdata
from gpuheal.config import load_config_dict
from gpuheal.core import engine
from gpuheal.core.memory import Memory
from gpuheal.core.view import FleetView
from gpuheal.model import Breaker, GpuSample, Observation
from gpuheal.rules import ALL
from gpuheal.rules.circuit_breaker_stuck.memory import BreakerRow, open_since
from gpuheal.rules.context_window.change import ContextRow
from gpuheal.rules.model_stuck.memory import DecodeRow, LitellmRow, LoadingRow, TaskloopRow, decode_state
from gpuheal.rules.workload_misrouted.memory import CountersRow, RequestsRow, counter_points
from gpuheal.state import files
from gpuheal.state.history import History
from gpuheal.state.store import StateDir
from gpuheal.steps import check

try:
    from tests.series import cron_clock, fleet_config, fleet_trace
except ImportError:
    from series import cron_clock, fleet_config, fleet_trace

AT = datetime(2026, 7, 18, 8, 0, 7, 400_000, tzinfo=UTC)  # cron's late start: not a whole second
SAMPLE = GpuSample(endpoint="ok", n_decode_total=120.0, requests_processing=1, requests_deferred=0,
                   is_sleeping=False, litellm_requests_total=40.0, litellm_failures_total=2.0, n_ctx=4096,
                   litellm_model_group="chat", requests_60s=12, breaker=Breaker(open=True))
DAMAGE = [None, 7, "text", [1, 2], {"gpu-a": "text"}, {"gpu-a": {"at_s": "soon", "n": "x"}},
          {"gpu-a": {"at_s": True}}, {"gpu-a": [["x"], [1.0]]}, {"gpu-a": {"at_s": float("nan")}}]
KEYS = ("decode", "taskloop", "litellm", "context", "routing", "requests", "breaker_open_since")
# declared since 080cd9d (Rule 8 tier 2's rise, issue 27 item 10; Rule 3's model loading, issue 29): start empty there
NEW_KEYS = ("rise", "loading")
CFG = load_config_dict({"monitor": {"url": "http://127.0.0.1:9/gpu-data"},
                        "gpus": [{"alias": "gpu-a", "host": "a", "endpoint": "http://127.0.0.1:9", "weight": 1.0,
                                  "baseline_tok_s": 50.0, "transport": "local"}]})
OLD_STATE = Path(__file__).resolve().parent / "data" / "state-080cd9d"  # issues.json written by main at 080cd9d


def fold_all(memory: Memory, obs: Observation | None = None, cfg=CFG) -> FleetView:
    """One poll folded into every rule's memory, as ``check`` does before the rules judge it."""
    obs = obs or Observation(AT, {"gpu-a": SAMPLE}, True)
    view = FleetView(cfg, obs.at.timestamp(), obs, History(), benchdata.empty(), memory)
    engine.remember(ALL, view, memory)
    return view


@pytest.mark.parametrize("damage", DAMAGE, ids=repr)
def test_a_damaged_book_or_row_is_replaced_and_the_poll_folded_in(damage):
    memory = Memory.from_json({key: copy.deepcopy(damage) for key in KEYS})
    fold_all(memory)
    now_s = AT.timestamp()
    stored = json.loads(json.dumps(memory.to_json(), allow_nan=False))  # what issues.json gets: plain JSON
    assert stored["decode"]["gpu-a"]["n"] == 120.0 and stored["decode"]["gpu-a"]["at_s"] == now_s
    assert stored["litellm"]["gpu-a"]["total"] == 40.0
    assert stored["context"]["gpu-a"]["n_ctx"] == 4096
    assert stored["requests"]["gpu-a"] == {"at_s": now_s, "buckets": [[now_s - now_s % 300, 12]]}
    assert stored["breaker_open_since"]["gpu-a"] == {"at_s": now_s, "open_since_s": now_s}
    assert counter_points(memory, "gpu-a", now_s - 60) == [(now_s, 40.0)]


def test_the_same_poll_twice_counts_once_and_a_gone_gpu_is_dropped():
    memory = Memory.from_json({"decode": {"gone": {"n": 1.0, "at_s": 1.0}}})
    fold_all(memory)
    first = memory.to_json()
    fold_all(memory)
    assert memory.to_json()["routing"]["gpu-a"] == [[AT.timestamp(), 40.0, "chat"]]  # not appended twice
    assert memory.to_json()["requests"]["gpu-a"]["buckets"][0][1] == 12  # not added twice
    assert memory.to_json() == first
    assert "gone" not in memory.to_json()["decode"]


@pytest.mark.parametrize("at_s", [None, "1", True, [1], float("inf")])
def test_a_row_without_a_time_is_not_trusted(at_s):
    assert DecodeRow.load({"n": 1.0, "at_s": at_s, "busy": 1, "in_flight": True}) is None
    assert TaskloopRow.load({"polls": 1, "at_s": at_s}) is None
    assert LitellmRow.load({"total": 1.0, "failures": 0.0, "at_s": at_s}) is None


def test_a_poll_at_or_before_the_row_is_never_folded_again():
    """The same poll again, or a clock stepped back: the rows stay as they were."""
    memory = Memory()
    fold_all(memory)
    before = memory.to_json()
    stepped_back = Observation(AT - timedelta(seconds=90), {"gpu-a": replace(SAMPLE, n_decode_total=999.0,
                                                                            breaker=Breaker(open=False))}, True)
    fold_all(memory, stepped_back)
    assert memory.to_json() == before


# --------------------------------------------------------------------------- bad input, each field


@pytest.mark.parametrize(("load", "good", "field", "bad"), [
    (DecodeRow.load, {"n": 5, "at_s": 1.0, "busy": 1, "in_flight": True, "polls": 2}, "polls", "2"),
    (DecodeRow.load, {"n": 5, "at_s": 1.0, "busy": 1, "in_flight": True, "polls": 2}, "in_flight", "yes"),
    (DecodeRow.load, {"n": 5, "at_s": 1.0, "busy": 1, "in_flight": True, "polls": 2}, "busy", 1.5),
    (DecodeRow.load, {"n": 5, "at_s": 1.0, "busy": 1, "in_flight": True, "polls": 2}, "deferred", [3]),
    (DecodeRow.load, {"n": 5, "at_s": 1.0, "busy": 1, "in_flight": True, "polls": 2}, "first_s", "08:00"),
    (TaskloopRow.load, {"polls": 1, "at_s": 1.0, "silent": ["/metrics"]}, "silent", "/metrics"),
    (TaskloopRow.load, {"polls": 1, "at_s": 1.0, "silent": ["/metrics"]}, "answered", [1]),
    (LitellmRow.load, {"total": 9, "failures": 1, "at_s": 1.0}, "total", -1),
    (LitellmRow.load, {"total": 9, "failures": 1, "at_s": 1.0, "requests": 3, "failed": 1}, "failed", None),
    (RequestsRow.load, {"at_s": 1.0, "buckets": [[0.0, 3]]}, "buckets", [[0.0, 3.5]]),
    (RequestsRow.load, {"at_s": 1.0, "buckets": [[0.0, 3]]}, "at_s", "now"),
    (BreakerRow.load, {"at_s": 1.0, "open_since_s": 0.5}, "open_since_s", "then"),
    (LoadingRow.load, {"at_s": 1.0, "first_s": 0.5}, "first_s", "then"),
    (LoadingRow.load, {"at_s": 1.0, "first_s": None}, "at_s", None),
])
def test_a_field_of_the_wrong_type_makes_the_row_damaged(load, good, field, bad):
    assert load(good) is not None
    assert load({**good, field: bad}) is None


def test_wrong_types_inside_rules_own_rows_read_as_not_known():
    """Rule 9 reads its row part by part (a damaged ``n_ctx`` is no context to change from); Rule 10's
    counters drop a damaged point and keep the rest."""
    row = ContextRow.load({"n_ctx": "4096", "at_s": 5.0, "change": {"from_n_ctx": 1, "to_n_ctx": "2"}})
    assert row == ContextRow(n_ctx=None, at_s=5.0, change=None)
    assert CountersRow.load([[1.0, 5.0, None], ["t", 6.0, None], [2.0, True, None], [3.0, 7.0]]) == CountersRow(
        ((1.0, 5.0, None),))
    assert CountersRow.load([["t", 6.0, None]]) is None


def test_a_huge_memory_is_bounded_at_the_next_poll():
    """A memory grown by hand or by another version — keys no rule declares, a million counter points,
    thousands of GPUs long gone — costs one load: the next poll keeps the declared memories of the
    configured GPUs, over the rule's window."""
    now_s = AT.timestamp()
    points = [[now_s - 10 * 86400 + i * 0.5, float(i), None] for i in range(1_000_000)]
    memory = Memory.from_json({
        **{f"junk{i}": {"gpu-a": "x" * 100} for i in range(1000)},
        "routing": {"gpu-a": points, **{f"gone{i}": points[:2] for i in range(5000)}},
        "decode": {f"gone{i}": {"n": 1, "at_s": 1.0, "busy": 0} for i in range(5000)},
    })
    fold_all(memory)
    stored = memory.to_json()
    assert set(stored) == {*KEYS, *NEW_KEYS}
    assert all(set(rows) <= {"gpu-a"} for rows in stored.values())  # type: ignore[union-attr]
    window_s = 3600 + 300  # Rule 10's window and one bucket
    assert len(stored["routing"]["gpu-a"]) == sum(1 for p in points if p[0] >= now_s - window_s) + 1
    assert len(json.dumps(stored)) < 1_000_000


def test_a_memory_that_is_not_a_mapping_is_an_empty_one():
    for junk in (None, 5, "x", [1, 2], {"decode": "x"}, {"decode": {"gpu-a": None}}):
        memory = Memory.from_json(junk)
        assert decode_state(memory, "gpu-a", 0.0) is None
        fold_all(memory)
        assert decode_state(memory, "gpu-a", AT.timestamp()) is not None


# --------------------------------------------------------------------------- an older version's state


def _old_trace(cfg):
    """The trace whose first polls ran under main at 080cd9d and wrote OLD_STATE (every memory
    mid-run: a decode stall, a hung task loop, LiteLLM counters, a pending context change, Rule 10's
    counters and request buckets, a breaker open since poll 3 without ``opened_at``)."""
    series = {
        "gpu-dense": {"metrics": "ok*12", "n_decode_total": "100 200 300 400 400 400 400 400 500 600 600 600",
                      "requests_processing": "1x11", "requests_deferred": "0 0 0 0 1 2 3 4 0 0 0 0",
                      "n_ctx": "4096 4096 4096 4096 4096 2048 2048 2048 2048 2048 2048 2048",
                      "litellm_requests_total": "0+100x11",
                      "litellm_failures_total": "0 0 0 0 60 150 240 330 330 330 330 330"},
        "gpu-light": {"breaker": "0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 0", "requests_60s": "1x18",
                      "litellm_requests_total": "0+10x18", "litellm_model_group": None},
        "strix-moe": {"metrics": "ok ok ok ok timeout timeout timeout timeout ok ok ok ok",
                      "slots": "ok ok ok ok timeout timeout timeout timeout ok ok ok ok", "requests_60s": "9x18",
                      "litellm_requests_total": "0+5x18"},
    }
    return [replace(o, litellm_ok=True) for o in fleet_trace(cfg, series)]


def _cron(cfg, state: Path, observations) -> list[dict]:
    out = []
    for obs in observations:
        with StateDir(state, 1.0) as store:
            result = check.run(cfg, store, obs.at, obs=obs)
        out.append({"issues": result.issues, "transitions": result.evaluation.transitions,
                    "gpus": {a: (g["polls_without_decode"], g["deferred_growing_polls"])
                             for a, g in result.health["gpus"].items()}})
    return out


def test_a_state_directory_written_by_the_previous_version_carries_on(tmp_path):
    """Every memory of main at 080cd9d (its issues.json, written by that code on the first 6 polls) loads:
    the next polls give the same issues, evidence and transitions as a run that never changed version —
    a stall counted from its first poll, the breaker from when it was first seen open, the context change
    still pending, the counters' increase over the window."""
    cfg = fleet_config()
    trace = _old_trace(cfg)
    split = 6
    with StateDir(tmp_path / "old", 1.0) as store:
        store.write(files.ISSUES, json.loads((OLD_STATE / "issues.json").read_text())["data"])
    carried = _cron(cfg, tmp_path / "old", trace[split:])
    fresh = _cron(cfg, tmp_path / "new", trace)[split:]
    assert carried == fresh
    fired = {(t["gpu"], t["issue"]) for poll in carried for t in poll["transitions"] if t["event"] == "firing"}
    assert {("gpu-dense", "model-stuck"), ("gpu-light", "circuit-breaker-stuck")} <= fired


def test_every_row_the_previous_version_wrote_is_read_not_replaced():
    """Each of the seven memories main wrote at 080cd9d loads row for row (none taken for damage), and
    the rows that earlier versions stored bare — Rule 10's request buckets, Rule 5's first-seen time —
    keep their values."""
    stored = json.loads((OLD_STATE / "issues.json").read_text())["data"]["memory"]
    declared = {m.key: m for rule in ALL for m in rule.remember or ()}
    assert set(stored) == set(KEYS) and set(declared) == {*KEYS, *NEW_KEYS}
    memory = Memory.from_json(stored)
    for key, rows in stored.items():
        assert set(memory.of(declared[key])) == set(rows), key
    requests = memory.of(declared["requests"])["gpu-dense"]
    assert requests == RequestsRow(None, ((1784361600.0, 110), (1784361900.0, 22)))
    assert memory.of(declared["breaker_open_since"])["gpu-light"] == BreakerRow(None, 1784361780.0)


# --------------------------------------------------------------------------- a jittered clock


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_breaker_first_seen_open_counts_the_same_under_a_cron_like_clock(tmp_path, seed):
    """Rule 5 without ``opened_at`` counts from the first poll that saw the breaker open, remembered
    across one-shot runs: under cron's late starts (0-2 s after each minute) it fires at the same poll
    as with whole seconds, a poll that does not know the breakers (gpu-monitor down) does not restart
    the count, and the open time is that first poll's own time."""
    cfg = fleet_config()
    trace = fleet_trace(cfg, {"gpu-light": {"breaker": "0 1 1 1 1 1 1 1 1 1 1 1 1 1 1"}},
                        monitor="1 1 1 1 0 1 1 1 1 1 1 1 1 1 1")

    def fired_at(observations, state: Path) -> tuple[list[int], float | None]:
        polls = []
        for i, obs in enumerate(observations):
            with StateDir(state, 1.0) as store:
                ev = check.run(cfg, store, obs.at, obs=obs).evaluation
            polls += [i for t in ev.transitions if t["issue"] == "circuit-breaker-stuck" and t["event"] == "firing"]
        return polls, open_since(ev.memory, "gpu-light")

    jittered = cron_clock(trace, seed)
    whole, _ = fired_at(trace, tmp_path / "whole")
    late, since = fired_at(jittered, tmp_path / "late")
    assert whole == late == [12]  # open from poll 1; more than 10 minutes at poll 12 (not reset at poll 4)
    assert since == jittered[1].at.timestamp()


# --------------------------------------------------------------------------- what the book costs per GPU


def _issues_bytes(tmp_path: Path, n_gpus: int, loading: int = 0) -> int:
    """``issues.json`` after three cron polls of a quiet fleet of ``n_gpus`` as Prometheus sees it (a
    temperature, VRAM, ``/health``; no counters), the first ``loading`` of them loading their model."""
    gpus = [{"alias": f"gpu-{i:05d}", "host": f"h{i}", "endpoint": "http://127.0.0.1:9", "transport": "local"}
            for i in range(n_gpus)]
    cfg = load_config_dict({"prometheus": {"url": "http://127.0.0.1:9"}, "gpus": gpus})
    state = tmp_path / f"state-{n_gpus}-{loading}"
    for minute in range(3):
        at = AT + timedelta(minutes=minute)
        obs = Observation(at, {g["alias"]: GpuSample(temp_c=55.0 + i % 3, vram_used_mb=1000.0, vram_total_mb=2000.0,
                                                     endpoint="loading" if i < loading else "ok")
                               for i, g in enumerate(gpus)}, True, source="prometheus")
        with StateDir(state, 1.0) as store:
            check.run(cfg, store, at, obs=obs)
    return (state / "issues.json").stat().st_size


def test_a_quiet_fleet_costs_the_issue_book_no_row_per_gpu(tmp_path):
    """Issue 13's 5 MB state directory at 10,000 GPUs leaves the issue book ~50 bytes a GPU beside the
    contract's files: a row that says nothing a later run reads (a server not loading, a rise not yet
    known) is not written — one such row per GPU in ``loading`` and ``rise`` took the 10,000-GPU state
    directory from 4.50 to 5.69 MB. A server that is loading keeps its row (its load's start)."""
    small, large = _issues_bytes(tmp_path, 10), _issues_bytes(tmp_path, 210)
    assert (large - small) / 200 <= 8
    stored = json.loads((tmp_path / "state-210-0" / "issues.json").read_text())["data"]["memory"]
    assert stored["loading"] == {} and stored["rise"] == {}
    assert _issues_bytes(tmp_path, 10, loading=2) > small  # the loading servers' rows are kept


def test_an_old_book_with_empty_rows_is_read_and_written_without_them():
    """The rows written before (a server not loading, a rise not known) still load, and read as no row."""
    memory = Memory.from_json({"loading": {"gpu-a": {"first_s": None, "at_s": 1.0}},
                               "rise": {"gpu-a": {"at_s": 1.0, "temp_c": 55.0, "rise_c_per_min": None}}})
    declared = {m.key: m for rule in ALL for m in rule.remember or ()}
    assert memory.get(declared["loading"], "gpu-a") == LoadingRow(first_s=None, at_s=1.0)
    assert memory.get(declared["rise"], "gpu-a") is not None
    assert memory.to_json()["loading"] == {} and memory.to_json()["rise"] == {}
