"""``check`` reads the recorded bench results from their index (issue 29; :mod:`gpuheal.state.bench_store`):
the index gives what the file gives of CHECK_FIELDS, result by result (a field a result lacks stays absent);
any index that is not the one of the file as it is now is not used (another file, another version, damage,
hostile values), and the file is read instead; check's issues, book and files are the same with the index
as without it, over polls that record gpu-monitor readings."""

from __future__ import annotations

import json
import math
import zlib
from datetime import timedelta
from typing import Any

import pytest

from gpuheal import benchdata
from gpuheal.core.heal_state import HealState
from gpuheal.state import bench_store, files
from gpuheal.state.history import History
from gpuheal.state.store import StateDir
from gpuheal.steps import evaluate
from gpuheal.steps.check import plan_check

try:
    from tests.series import START, fleet_config, fleet_trace
except ImportError:
    from series import START, fleet_config, fleet_trace

CFG = fleet_config()
DENSE, LIGHT, STRIX = "gpu-dense", "gpu-light", "strix-moe"


def result(at_min: float, tok_s: float | None, **fields: Any) -> dict[str, Any]:
    r = {"at": (START + timedelta(minutes=at_min)).timestamp(), "gen_tok_s": tok_s, "prompt_tok_s": 900.5,
         "tokens": 64, "ok": tok_s is not None, "error": None if tok_s is not None else "timeout",
         "source": "bench", "model": "models/m.gguf", "n_ctx": 32768, "excluded": False, "excluded_reason": None,
         "slots": 2, "api": "completion", "rate_source": "timings", "elapsed_s": 1.5, "key_sent": None}
    r.update(fields)
    return r


def week() -> dict[str, Any]:
    """Results of every kind check's rules tell apart: slow runs, failures, a 401, monitor readings, an
    earlier version's record without ``source`` (read as ``bench``) or ``n_ctx``, odd values."""
    data = benchdata.empty()
    data["results"][DENSE] = [result(-600 + 60 * i, 74.0 - (20 if 3 <= i <= 6 else 0)) for i in range(9)]
    data["results"][DENSE].insert(4, result(-355, None))
    data["results"][LIGHT] = [result(-300, 169.0),
                              result(-240, None, ok=False, error="unauthorized", key_sent="sk-…9f"),
                              result(-200, 150.0, source="monitor", n_ctx=None, slots=None)]
    old = result(-100, 120.0, n_ctx="big")
    del old["source"], old["slots"]
    data["results"][STRIX] = [old, result(-50, 0.0), result(-40, -3.0), result(-30, True), result(-20, 10**30)]
    data["results"]["gone-gpu"] = []
    data["baselines"][DENSE] = {"baseline_tok_s": 74.0, "source": "rolling-30d", "computed_at": 0.0, "n": 40}
    data["monitor_baselines"][LIGHT] = {"baseline_tok_s": 168.0, "seen_at": 0.0}
    return benchdata.normalise(json.loads(json.dumps(data)))


def projection(data: dict[str, Any]) -> dict[str, Any]:
    """What check reads of ``data``: each result's CHECK_FIELDS that it has."""
    return {**data, "results": {a: [{f: r[f] for f in benchdata.CHECK_FIELDS if f in r} for r in items]
                                for a, items in data["results"].items()}}


def encoded(doc: Any) -> Any:
    """``doc`` as the file holds it (JSON and back)."""
    return json.loads(json.dumps(doc))


# --------------------------------------------------------------------------- the index, pure


def test_the_index_gives_each_results_check_fields_and_no_others():
    data = week()
    light = benchdata.from_index(encoded(benchdata.to_index(data, (7, 9))), (7, 9))
    assert light == projection(data)
    [old] = [r for r in light["results"][STRIX] if r["gen_tok_s"] == 120.0]
    assert "source" not in old and "slots" not in old and old["n_ctx"] == "big"  # absent, not None
    assert all(set(r) <= set(benchdata.CHECK_FIELDS) for items in light["results"].values() for r in items)
    assert list(light["results"]) == list(data["results"])  # the GPUs in the file's order


def test_results_out_of_order_across_gpus_are_an_index():
    """Each GPU's results are in time order; one GPU's may start before the last of the one before it."""
    data = benchdata.normalise({"results": {DENSE: [{"at": 10.0}, {"at": 20.0}], LIGHT: [{"at": 5.0}], STRIX: []}})
    assert benchdata.from_index(encoded(benchdata.to_index(data, (1,))), (1,)) == data


def test_every_check_field_goes_through_the_index():
    """The index's rows are built field by field (a dict display): each field lands in its own key."""
    row = {f: f"value of {f}" for f in benchdata.CHECK_FIELDS} | {"at": 5.0, "gen_tok_s": 12.5}
    data = benchdata.normalise({"results": {DENSE: [row]}})
    assert benchdata.from_index(encoded(benchdata.to_index(data, (1,))), (1,))["results"][DENSE] == [row]


def plain(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with every column a plain list (version 1's shape, which version 2 still reads)."""
    n = sum(doc["gpus"].values())
    return {**doc, "columns": benchdata._plain_columns(doc["columns"], n)}


def test_an_index_of_another_file_or_version_is_not_used():
    doc = encoded(benchdata.to_index(week(), (7, 9)))
    assert benchdata.from_index(doc, (7, 8)) is None and benchdata.from_index(doc, None) is None
    assert benchdata.from_index({**doc, "version": 3}, (7, 9)) is None
    assert benchdata.from_index({**doc, "fields": [*benchdata.CHECK_FIELDS, "model"]}, (7, 9)) is None


def _damaged() -> list[tuple[str, Any]]:
    good = plain(encoded(benchdata.to_index(week(), (7, 9))))
    at, rest = good["columns"][0], good["columns"][1:]
    n_dense = good["gpus"][DENSE]
    assert list(good["gpus"])[0] == DENSE and good["absent"]  # DENSE's rows come first; some fields absent

    def with_columns(columns: Any) -> dict[str, Any]:
        return {**good, "columns": columns}

    def with_at(i: int, value: Any) -> dict[str, Any]:
        return with_columns([[*at[:i], value, *at[i + 1:]], *rest])

    return [
        ("junk", "junk"), ("a list", [good]), ("null", None), ("a number", 7),
        ("gpus not a dict", {**good, "gpus": list(good["gpus"])}),
        ("a count not an integer", {**good, "gpus": {**good["gpus"], DENSE: float(n_dense)}}),
        ("a count a boolean", {**good, "gpus": {**good["gpus"], "nobody": True}}),
        ("a negative count", {**good, "gpus": {**good["gpus"], LIGHT: -1, STRIX: good["gpus"][STRIX] + 1}}),
        ("counts that miss rows", {**good, "gpus": {**good["gpus"], DENSE: n_dense - 1}}),
        ("counts past the rows", {**good, "gpus": {**good["gpus"], DENSE: n_dense + 1}}),
        ("columns not a list", with_columns({"at": at})),
        ("a column missing", with_columns(good["columns"][:-1])),
        ("a column not a list", with_columns([at, *rest[:-1], 7])),
        ("columns of different lengths", with_columns([at, *rest[:-1], rest[-1][:-1]])),
        ("a NaN at", with_at(0, math.nan)),
        ("an infinite at", with_at(1, -math.inf)),
        ("a huge integer at", with_at(0, 10**400)),
        ("a string at", with_at(0, "08:00")),
        ("a boolean at", with_at(0, True)),
        ("a null at", with_at(0, None)),
        ("at out of order within a GPU", with_at(1, at[0] - 1)),
        ("absent: at", {**good, "absent": {"at": [0]}}),
        ("absent: an unknown field", {**good, "absent": {"model": [0]}}),
        ("absent: a row out of range", {**good, "absent": {"slots": [len(at)]}}),
        ("absent: a negative row", {**good, "absent": {"slots": [-1]}}),
        ("absent: a row twice", {**good, "absent": {"slots": [0, 0]}}),
        ("absent: a float row", {**good, "absent": {"slots": [0.0]}}),
        ("absent: rows not a list", {**good, "absent": {"slots": 0}}),
        ("absent: not a dict", {**good, "absent": ["slots"]}),
        ("absent: missing", {k: v for k, v in good.items() if k != "absent"}),
    ]


def test_packed_columns_give_the_plain_ones_and_version_1_is_still_read():
    """Floats packed as float64 (a failed run's null rate as NaN), the other fields run-length encoded; an
    index of version 1 (plain lists: an earlier version's) gives the same results."""
    data = week()
    data["results"][LIGHT].append(result(-10, 151.0, source="monitor", n_ctx=None, slots=None))
    doc = encoded(benchdata.to_index(data, (7, 9)))
    assert [type(c).__name__ for c in doc["columns"]] == ["dict", "list", "dict", "dict", "dict", "dict", "dict"]
    assert list(doc["columns"][0]) == ["f64"] and any(n > 1 for _, n in doc["columns"][3]["runs"])
    light = benchdata.from_index(doc, (7, 9))
    assert light == projection(data) == benchdata.from_index({**plain(doc), "version": 1}, (7, 9))
    assert [type(r["gen_tok_s"]) for r in light["results"][STRIX]] == [float, float, float, int]  # as written
    ok = {"results": {DENSE: [result(60 * i, 74.5 if i % 3 else None, ok=i % 3 != 0) for i in range(6)]}}
    doc = encoded(benchdata.to_index(benchdata.normalise(ok), (1,)))
    assert list(doc["columns"][1]) == ["f64"]  # every rate a float or null: packed, null as NaN
    assert benchdata.from_index(doc, (1,))["results"][DENSE] == projection(benchdata.normalise(ok))["results"][DENSE]


def _damaged_packed() -> list[tuple[str, Any]]:
    good = encoded(benchdata.to_index(week(), (7, 9)))
    at, runs = good["columns"][0]["f64"], good["columns"][2]["runs"]
    n = sum(good["gpus"].values())

    def with_column(i: int, column: Any) -> dict[str, Any]:
        return {**good, "columns": [*good["columns"][:i], column, *good["columns"][i + 1:]]}

    return [
        ("f64 not base64", with_column(0, {"f64": "!" + at[1:]})),
        ("f64 one float short", with_column(0, {"f64": at[:-12]})),
        ("f64 not a string", with_column(0, {"f64": [1.0]})),
        ("f64 a NaN at", with_column(0, {"f64": "AAAAAAAA+H8=" + at[12:]})),
        ("f64 and another key", with_column(0, {"f64": at, "x": 1})),
        ("f64 for a field not a float", with_column(2, {"f64": at})),
        ("runs for at", with_column(0, {"runs": [[1.0, n]]})),
        ("runs short", with_column(2, {"runs": [*runs[:-1], [runs[-1][0], runs[-1][1] - 1]]} if runs[-1][1] > 1
                                   else {"runs": runs[:-1]})),
        ("runs a huge count", with_column(2, {"runs": [[True, 10**12]]})),
        ("runs a negative count", with_column(2, {"runs": [[True, -1], *runs]})),
        ("runs a boolean count", with_column(2, {"runs": [[True, True]] * n})),
        ("runs a list value", with_column(4, {"runs": [[[1], n]]})),
        ("runs not a list", with_column(4, {"runs": "ok"})),
        ("runs of three", with_column(4, {"runs": [[None, n, 0]]})),
        ("an object of neither", with_column(4, {"values": [None] * n})),
    ]


@pytest.mark.parametrize(("why", "doc"), _damaged() + _damaged_packed(),
                         ids=[w for w, _ in _damaged() + _damaged_packed()])
def test_a_damaged_or_hostile_index_is_not_used(why, doc):
    assert benchdata.from_index(doc, (7, 9)) is None


def test_hostile_baselines_in_an_index_are_dropped_as_the_files_are():
    doc = encoded(benchdata.to_index(week(), (7, 9)))
    doc["baselines"] = {DENSE: {"baseline_tok_s": "fast"}, LIGHT: 5, STRIX: {"baseline_tok_s": 60.0}}
    doc["monitor_baselines"] = {DENSE: {"baseline_tok_s": math.nan}, LIGHT: {"baseline_tok_s": 1e9}}
    light = benchdata.from_index(doc, (7, 9))
    assert light["baselines"] == {STRIX: {"baseline_tok_s": 60.0}} and light["monitor_baselines"] == {}


# --------------------------------------------------------------------------- the state directory


@pytest.fixture
def store(tmp_path):
    with StateDir(tmp_path / "state", 1.0) as s:
        yield s


def test_a_saved_file_is_read_from_its_index(store):
    data = week()
    bench_store.save(store, data)
    loaded = bench_store.load_for_check(store)
    assert loaded == (projection(data), False)
    raw = (store.path / files.BENCH).read_bytes()
    assert store.read(files.BENCH_INDEX)["stamp"] == [len(raw), zlib.crc32(raw)]
    assert bench_store.load(store) == data  # the file itself is unchanged in form


def test_a_file_written_by_another_writer_is_read_and_indexed_again(store):
    """An earlier version's file (it writes no index), then an operator's edit of the same size."""
    data = week()
    store.write(files.BENCH, data)
    assert bench_store.load_for_check(store) == (data, True)
    assert bench_store.load_for_check(store) == (projection(data), False)  # indexed by the run before
    text = (store.path / files.BENCH).read_text()
    edited = text.replace('"gen_tok_s":169.0', '"gen_tok_s":109.0')
    assert edited != text and len(edited) == len(text)
    (store.path / files.BENCH).write_text(edited)
    loaded = bench_store.load_for_check(store)
    assert loaded.whole and loaded.data["results"][LIGHT][0]["gen_tok_s"] == 109.0
    assert bench_store.load_for_check(store).data["results"][LIGHT][0]["gen_tok_s"] == 109.0


@pytest.mark.parametrize("damage", [b"", b"junk", b'{"schema_version": 1, "data": ', b"\xff\xfe", b"[" * 100_000])
def test_a_damaged_index_is_set_aside_and_the_file_read(store, damage):
    data = week()
    bench_store.save(store, data)
    (store.path / files.BENCH_INDEX).write_bytes(damage)
    assert bench_store.load_for_check(store) == (data, True)
    assert bench_store.load_for_check(store) == (projection(data), False)


def test_a_file_that_cannot_be_indexed_is_read_every_time(store):
    """A hand-edited NaN where a result's rate is not (a rate that is not a number drops the result): gpuheal
    never writes one (allow_nan=False), so no index of it either."""
    data = week()
    store.write(files.BENCH, data)
    text = (store.path / files.BENCH).read_text().replace('"n_ctx":32768', '"n_ctx":NaN', 1)
    (store.path / files.BENCH).write_text(text)
    for _ in range(2):
        loaded = bench_store.load_for_check(store)
        assert loaded.whole and any(isinstance(r.get("n_ctx"), float) and math.isnan(r["n_ctx"])
                                    for items in loaded.data["results"].values() for r in items)
    assert not (store.path / files.BENCH_INDEX).exists()


def test_no_file_is_no_results_and_no_index(store):
    assert bench_store.load_for_check(store) == (benchdata.empty(), True)
    (store.path / files.BENCH).write_text("junk")  # set aside: no results, as before
    assert bench_store.load_for_check(store) == (benchdata.empty(), True)
    assert not (store.path / files.BENCH_INDEX).exists() and store.warnings


# --------------------------------------------------------------------------- check, with and without the index


def _check_run(store: StateDir, obs: Any, hist: History) -> str:
    heal_state = HealState.from_json(store.read(files.HEAL, {}))
    ev = evaluate.run_full(CFG, store, obs, hist, obs.at, heal_state, plan_check(CFG, heal_state).restarts)
    return json.dumps([ev.issues, ev.transitions, ev.resolved], default=str, sort_keys=True)


def test_check_decides_and_writes_the_same_with_the_index_as_without(tmp_path):
    """Two state directories from the same results, the same polls (gpu-monitor readings at some, a
    regression and its recovery, a 401): one reads the index, the other is made to read the file every
    run. Every evaluation, the book and the results file are the same."""
    trace = fleet_trace(CFG, {DENSE: {"bench_tok_s": "_ 56 _ 55 _ 54 _ 74 _"},
                              LIGHT: {"bench_tok_s": "_ _ _ 100 _ _ _ _ _",
                                      "bench_baseline_tok_s": "_ 168 170 170 _ _ 150 _ _"}},
                        start=START + timedelta(minutes=1))
    dirs = [StateDir(tmp_path / name, 1.0) for name in ("indexed", "file")]
    hists = [History(), History()]
    for store in dirs:
        store.__enter__()
        bench_store.save(store, week())
    used, seen = [], []
    try:
        for obs in trace:
            out = []
            for store, hist in zip(dirs, hists, strict=True):
                if store is dirs[1]:
                    store.remove(files.BENCH_INDEX)
                else:
                    used.append(not bench_store.load_for_check(store).whole)
                hist.add(obs, CFG.aliases)
                out.append(_check_run(store, obs, hist))
            assert out[0] == out[1]
            seen.append(out[0])
        for name in (files.ISSUES, files.BENCH, files.VRAM_TREND, files.CIRCUIT_BREAKER_STATUS):
            assert (dirs[0].path / name).read_bytes() == (dirs[1].path / name).read_bytes(), name
    finally:
        for store in dirs:
            store.__exit__(None, None, None)
    assert all(used)  # the index was the one of the file at every run, readings recorded or not
    recorded = benchdata.normalise(json.loads((dirs[0].path / files.BENCH).read_text())["data"])
    assert len([r for r in recorded["results"][DENSE] if r["source"] == "monitor"]) == 4
    fired = ["'benchmark-regression', severity='warning', state='firing'" in e for e in seen]
    assert True in fired and not fired[-1]  # the regression, then its recovery (74 tok/s)


# --------------------------------------------------------------------------- Rule 4's scan, in one pass


def _regression_state_before(samples: list[dict[str, Any]], baseline: float, need: int) -> tuple[Any, ...]:
    """Rule 4's scan as it was written before (a list copied at every slow result), for comparison."""
    run: list[dict[str, Any]] = []
    since = None
    for r in samples:
        value = float(r["gen_tok_s"])
        run = run + [r] if value < baseline * 0.8 else []
        if since is None and len(run) >= need:
            since = float(run[0]["at"])
        elif since is not None and value >= baseline * 0.9:
            since = None
    return len(run), since


def _compare(seed: int) -> bool:
    """Rule 4's scan over random results against the scan before; whether they end regressing."""
    import random

    rnd = random.Random(seed)
    n = rnd.randrange(0, 40)
    slow = rnd.random()  # this seed's share of slow results: some end regressing, some recovered
    values = [[60.0, 66.0, 67.5, 70.0, 80.0, None], [50.0, 59.0, 59.99]]
    items = [{"at": 1000.0 + 60 * i, "gen_tok_s": rnd.choice(values[rnd.random() < slow]), "ok": rnd.random() > 0.1}
             for i in range(n)]
    data = {"results": {DENSE: items}, "baselines": {}}
    need = rnd.choice([1, 2, 3, 5])
    st = benchdata.regression_state(data, DENSE, 75.0, min_results=need)
    samples = benchdata.ok_results(data, DENSE)
    assert samples == [r for r in items if r["ok"] and r["gen_tok_s"]]
    if samples:
        assert (st["slow_run"], st["regressing_since"]) == _regression_state_before(samples, 75.0, need)
    return st["regressing_since"] is not None


def test_rule4_scan_is_the_same_as_before_and_sees_regressions_and_recoveries():
    ends = [_compare(seed) for seed in range(40)]
    assert 5 < ends.count(True) < 35


@pytest.mark.parametrize("rate", ["fast", "", True, False, [], {}, "NaN", float("nan"), float("inf"), -float("inf")])
def test_a_hand_edited_rate_that_is_not_a_number_is_dropped_and_check_goes_on(tmp_path, rate):
    """A result whose ``gen_tok_s`` is neither a finite number nor null is damage: ``normalise`` drops it (Rule
    4's scan sorted and summed it: ``"fast"`` raised at ``float()``); the rest of the file is read, and a
    ``check`` over it decides as over the file without it."""
    good = week()
    damaged = json.loads(json.dumps(good))
    damaged["results"][DENSE].insert(3, result(-500, 60.0) | {"gen_tok_s": rate})
    raw = json.dumps(damaged, allow_nan=True)  # a NaN or an infinity as an edited file holds it
    assert benchdata.normalise(json.loads(raw)) == good
    obs = fleet_trace(CFG, {DENSE: {"bench_tok_s": "_"}}, start=START + timedelta(minutes=1))[0]
    told = []
    for name, text in (("damaged", raw), ("clean", json.dumps(good))):
        with StateDir(tmp_path / name, 1.0) as store:
            (store.path / files.BENCH).write_text(text)
            told.append(_check_run(store, obs, History()))
    assert told[0] == told[1]
