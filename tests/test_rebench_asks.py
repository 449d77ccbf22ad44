"""Issue 26 item 2: one re-bench mechanism for Rules 4 and 9 — one typed ask (core/rebench.RebenchAsk) in
one store (``rebench.json``), raised by a fix (Rule 4) or a rule's memory (Rule 9), answered once by
``bench`` (steps/rebench.answer), each verdict handed to its rule. Here: a state directory of an older
release migrated, garbage and hostile ask files, one ask answered once, an ask whose GPU is gone."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpuheal import benchdata
from gpuheal.config import load_config_dict
from gpuheal.core import rebench
from gpuheal.core.engine import load_book
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import rebench as answerer

NOW = datetime(2026, 7, 18, 9, 0, 3, tzinfo=UTC)
CHANGED_S = NOW.timestamp() - 3600.0
FIX_RUN = "gpu-self-heal-20260718-004"
GPUS = ("gpu-dense", "gpu-light")


def config():
    gpus = [{"alias": a, "host": a, "endpoint": f"http://127.0.0.1:{9 + i}", "transport": "local",
             "baseline_tok_s": 74.8} for i, a in enumerate(GPUS)]
    return load_config_dict({"monitor": {"url": "http://127.0.0.1:9/gpu-data"}, "gpus": gpus})


OLD_MARKS = {"due": {"gpu-light": {"issue": "benchmark-regression", "reason": "power limit restored",
                                   "requested_at": CHANGED_S, "attempt": FIX_RUN, "action": "restore-power-limit"}},
             "failed": {"gpu-dense": {"issue": "benchmark-regression", "attempt": "gpu-self-heal-20260717-001",
                                      "at": CHANGED_S - 86400}}}
OLD_CHANGE = {"n_ctx": 98304, "at_s": CHANGED_S, "change": {  # an older release kept it pending in Rule 9's memory
    "from_n_ctx": 131072, "to_n_ctx": 98304, "at_s": CHANGED_S, "target_tok_s": 74.8, "state": "pending",
    "gen_tok_s": None, "ratio_pct": None, "checked_at_s": None}}


def state(tmp_path, marks=None, change=OLD_CHANGE, results=((CHANGED_S + 600, 60.0, 98304),)):
    """A state directory as an older release left it: its ``rebench.json`` marks, a context change pending
    in Rule 9's memory, and benchmark results of gpu-dense."""
    data = benchdata.empty()
    for at, tok_s, n_ctx in results:
        benchdata.add_result(data, "gpu-dense", {"at": at, "gen_tok_s": tok_s, "ok": True, "n_ctx": n_ctx})
    with StateDir(tmp_path) as store:
        store.write(files.BENCH, data)
        if change is not None:
            store.write(files.ISSUES, {"issues": {}, "memory": {"context": {"gpu-dense": change}}})
        if marks is not None:
            store.write(files.REBENCH, marks)


def answer(tmp_path, benched=(), now=NOW, cfg=None):
    with StateDir(tmp_path) as store:
        got = answerer.answer(cfg or config(), store, now, [dict(b) for b in benched], {"gpu-light": 74.8})
        return got, list(store.warnings)


def audit(tmp_path) -> list[dict]:
    path = tmp_path / files.AUDIT_LOG
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def stored(tmp_path) -> rebench.Asks:
    with StateDir(tmp_path) as store:
        return rebench.Asks.load(store.read(files.REBENCH, {}))


LIGHT_OK = {"gpu": "gpu-light", "ok": True, "gen_tok_s": 72.0, "error": None}


def test_an_older_state_directory_migrates_and_both_asks_are_answered_by_the_one_answerer(tmp_path):
    state(tmp_path, marks=OLD_MARKS)
    got, warnings = answer(tmp_path, benched=[LIGHT_OK])
    assert not warnings
    assert got.sections["rebench"]["gpu-light"]["within_threshold"] is True  # Rule 4's fix, proved
    [verdict] = got.sections["context_changes"]  # Rule 9's change, stored before asks had a store
    assert (verdict["gpu"], verdict["state"], verdict["ratio_pct"]) == ("gpu-dense", "perf-loss", 80.2)
    lines = audit(tmp_path)
    assert [(x["gpu"], x["issue"], x["action"], x["result"]) for x in lines] == [
        ("gpu-light", "benchmark-regression", "restore-power-limit", "resolved"),
        ("gpu-dense", "context-window", "re-benchmark", "escalated")]
    assert lines[0]["run_id"] == FIX_RUN and lines[0]["phase"] == "rebench"
    asks = stored(tmp_path)  # rewritten in this release's shape: the perf loss stays asked, the fix is done
    assert [(a.gpu, a.issue, a.answered_by, a.checked_at_s) for a in asks.asks] == [
        ("gpu-dense", "context-window", "new-result", CHANGED_S + 600)]
    assert asks.disproved("gpu-dense", "benchmark-regression", "gpu-self-heal-20260717-001")  # kept
    with StateDir(tmp_path) as store:
        row = load_book(store.read(files.ISSUES, None)).memory.to_json()["context"]["gpu-dense"]
        assert row["change"]["state"] == "perf-loss"  # Rule 9's detect reads it
        [alert] = store.read(files.ALERTS, {})["queue"]
    assert alert["issue"] == "context-window" and "--ctx-size 131072" in alert["summary"]


def test_check_files_an_older_pending_change_as_an_ask_without_a_second_detected_line(tmp_path):
    state(tmp_path)
    with StateDir(tmp_path) as store:
        answerer.file_raised(store, load_book(store.read(files.ISSUES, None)).memory, NOW)
    [ask] = stored(tmp_path).asks
    assert (ask.gpu, ask.issue, ask.asked_at_s, ask.at_n_ctx, ask.target_tok_s) == (
        "gpu-dense", "context-window", CHANGED_S, 98304, 74.8)
    assert audit(tmp_path) == []  # its "context-change" line was written when it was seen


def test_one_ask_is_answered_once(tmp_path):
    ask = rebench.RebenchAsk("gpu-light", "benchmark-regression", "power limit restored", CHANGED_S,
                             attempt=FIX_RUN, action="restore-power-limit")
    state(tmp_path, marks=rebench.Asks().with_ask(ask).to_json(), change=None)
    first, _ = answer(tmp_path, benched=[{**LIGHT_OK, "gen_tok_s": 50.0}])
    assert first.sections["rebench"]["gpu-light"]["within_threshold"] is False
    again, _ = answer(tmp_path, benched=[LIGHT_OK])
    assert again.sections == {} and len(audit(tmp_path)) == 1
    assert stored(tmp_path).disproved("gpu-light", "benchmark-regression", FIX_RUN)  # the next heal fails it


def test_a_verified_context_change_is_answered_once_and_its_ask_closed(tmp_path):
    state(tmp_path, results=((CHANGED_S + 600, 72.0, 98304),))
    first, _ = answer(tmp_path)
    assert [v["state"] for v in first.sections["context_changes"]] == ["verified"]
    again, _ = answer(tmp_path)
    assert again.sections == {} and stored(tmp_path).asks == ()
    assert [x["result"] for x in audit(tmp_path)] == ["resolved"]


def test_an_ask_for_a_gpu_no_longer_configured_is_dropped_with_nothing_said(tmp_path):
    gone = rebench.RebenchAsk("gpu-gone", "benchmark-regression", "why", CHANGED_S, attempt=FIX_RUN)
    light = rebench.RebenchAsk("gpu-light", "benchmark-regression", "why", CHANGED_S, attempt=FIX_RUN)
    state(tmp_path, marks=rebench.Asks().with_ask(gone).with_ask(light).to_json(), change=None)
    got, warnings = answer(tmp_path, benched=[{**LIGHT_OK, "gpu": "gpu-gone"}])  # even a result named so
    assert got.sections == {} and not warnings and audit(tmp_path) == []
    assert [a.gpu for a in stored(tmp_path).asks] == ["gpu-light"]  # the configured GPU's still waits


@pytest.mark.parametrize("raw", [b"{not json", b"\x00\xff" * 50, b'{"schema_version": 99, "data": {}}',
                                 b'{"schema_version": 1, "data": [1, 2]}'])
def test_an_unreadable_ask_file_is_set_aside_with_one_line_and_bench_goes_on(tmp_path, raw):
    state(tmp_path)
    (tmp_path / files.REBENCH).write_bytes(raw)
    got, warnings = answer(tmp_path)
    assert [v["state"] for v in got.sections["context_changes"]] == ["perf-loss"]  # Rule 9's ask, from memory
    assert len(warnings) == 1 and files.REBENCH in warnings[0] and "set aside" in warnings[0]
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith(f"{files.REBENCH}.corrupt-")]
    assert aside.read_bytes() == raw  # nothing lost


HOSTILE = [
    {"gpu": "gpu-light", "issue": "benchmark-regression", "why": "ok", "asked_at_s": CHANGED_S, "attempt": FIX_RUN},
    {"gpu": ["gpu-light"], "issue": "benchmark-regression"},
    {"gpu": "", "issue": "x"},
    {"gpu": "gpu-light\u202e[red]", "issue": None},
    "junk", 7, None,
    {"gpu": "gpu-dense", "issue": "benchmark-regression", "asked_at_s": "NaN", "answered_by": "rm -rf /",
     "against": {"x": 1}, "target_tok_s": -5.0, "at_n_ctx": 10**30, "checked_at_s": True, "why": 5},
]


def test_hostile_ask_entries_are_dropped_with_one_line_the_file_kept_and_the_good_ones_answered(tmp_path):
    state(tmp_path, marks={"asks": HOSTILE, "failed": {"gpu-light": "junk", "gpu-dense": {"issue": 3}}}, change=None)
    original = (tmp_path / files.REBENCH).read_bytes()
    got, warnings = answer(tmp_path, benched=[LIGHT_OK, {"gpu": "gpu-dense", "ok": False, "gen_tok_s": None,
                                                         "error": "timeout"}])
    assert got.sections["rebench"]["gpu-light"]["within_threshold"] is True
    dense = got.sections["rebench"]["gpu-dense"]  # damaged values read as not known, never trusted
    assert (dense["within_threshold"], dense["fix"], dense["error"]) == (None, "", "timeout")
    assert len(warnings) == 1 and "8 damaged" in warnings[0]
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith(f"{files.REBENCH}.corrupt-")]
    assert aside.read_bytes() == original  # nothing lost
    assert stored(tmp_path).asks == ()
    assert {x["result"] for x in audit(tmp_path)} == {"resolved", "pending"}


def test_the_store_reads_its_own_shape_back_and_a_newer_ask_replaces_the_older():
    first = rebench.RebenchAsk("gpu-a", "context-window", "n_ctx 1 -> 2", 5.0, rebench.NEW_RESULT, "asked", 70.0, 2)
    newer = rebench.RebenchAsk("gpu-a", "context-window", "n_ctx 2 -> 3", 9.0, rebench.NEW_RESULT, "asked", 70.0, 3)
    asks = rebench.Asks().with_ask(first)
    assert rebench.Asks.load(json.loads(json.dumps(asks.to_json()))) == asks
    merged, new = asks.merged([newer, newer])
    assert merged.asks == (newer,) and new == (newer,)
    assert asks.merged([first]) == (asks, ())  # the same ask again: kept as stored


@pytest.mark.parametrize("doc", [{"asks": {"gpu": "gpu-a"}}, {"due": [1]}, {"failed": "x"}, [1, 2], "junk"])
def test_a_damaged_store_shape_is_counted_so_it_is_set_aside_before_it_is_rewritten(doc):
    assert rebench.Asks.load(doc).dropped >= 1 and rebench.Asks.load(doc).asks == ()
    assert rebench.Asks.load({}).dropped == 0 and rebench.Asks.load(None).dropped == 0


@pytest.mark.parametrize("huge", [10**400, -(10**400), float("nan"), float("inf"), True, "5"])
def test_an_ask_with_a_huge_or_junk_number_reads_as_not_known_and_never_raises(huge):
    """A hand-edited rebench.json: an int too large for a float raised OverflowError in the ask's reader."""
    doc = {"asks": [{"gpu": "gpu-a", "issue": "context-window", "asked_at_s": huge, "checked_at_s": huge,
                     "target_tok_s": huge}]}
    (ask,) = rebench.Asks.load(doc).asks
    assert (ask.asked_at_s, ask.checked_at_s, ask.target_tok_s) == (0.0, None, None)
