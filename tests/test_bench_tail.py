"""A ``check`` run's bench cost does not grow with the week (issue 29, wave 14): Rule 4's state is read from the
newest result back, only as far as a result that ends any slow run (:func:`gpuheal.benchdata.regression_state`),
and the index builds only the newest results of each GPU, the older ones when a rule reads them
(:class:`gpuheal.benchdata.IndexedResults`). Both give exactly what reading every result gave: the same state
for any results, thresholds and window, the same list for any way of reading it."""

from __future__ import annotations

import json
import math
import random
from bisect import insort
from typing import Any

import pytest

from gpuheal import benchdata

GPU = "gpu-a"


def _regression_state_before(data: dict[str, Any], alias: str, baseline_tok_s: float | None, *, since_s: float | None,
                             **ratios: Any) -> dict[str, Any]:  # fmt: skip
    """Rule 4's state as c8b3cf5 computed it: the scan over every successful result of the window, oldest first
    (the tail that :func:`benchdata.regression_state` reads now must give the same)."""
    return benchdata.scan_state(benchdata.ok_results(data, alias, since_s), baseline_tok_s, **ratios)


def _results(rnd: random.Random, n: int) -> list[dict[str, Any]]:
    """``n`` results around a baseline of 100 tok/s: slow, recovered, fast, at a threshold exactly, failed."""
    rates = [50.0, 79.99, 80.0, 85.0, 89.99, 90.0, 95.0, 100.0, 110.0, 110.01, 130.0, -5.0, 0.0, None]
    out = []
    for i in range(n):
        rate = rnd.choice(rates[:3] if rnd.random() < 0.3 else rates)
        out.append({"at": 1000.0 + 60 * i + rnd.choice([0, 0, 30]), "gen_tok_s": rate,
                    "ok": rate is not None and rnd.random() > 0.05, "source": "bench"})
    return out


@pytest.mark.parametrize("seed", range(300))
def test_rule4_state_from_the_newest_back_is_the_state_of_every_result(seed):
    """Random results, baselines (none, zero, negative, a NaN, an infinity), thresholds (the recovered one below
    the slow one too), counts (0: as 1) and windows: the state is the one of every result, value for value."""
    rnd = random.Random(seed)
    data = {"results": {GPU: _results(rnd, rnd.randrange(0, 60))}, "baselines": {}}
    baseline = rnd.choice([100.0, 100.0, 100.0, 100, 75.0, None, 0.0, -1.0, math.nan, math.inf])
    params = {"drop_ratio": rnd.choice([0.2, 0.1, 0.3, 0.05, 1.5]),
              "recovered_within_ratio": rnd.choice([0.1, 0.0, 0.25, -0.1]),
              "min_results": rnd.choice([0, 1, 2, 3, 5]),
              "since_s": rnd.choice([None, None, 1000.0 + 60 * rnd.randrange(0, 60)])}
    got = benchdata.regression_state(data, GPU, baseline, **params)
    want = _regression_state_before(data, GPU, baseline, **params)
    assert json.dumps(got) == json.dumps(want)  # NaN and -0.0 alike


def test_rule4_state_at_the_baseline_reads_only_the_newest_results():
    """A GPU at its baseline: the last ``min_results`` results decide (a result back within 10 % ends any
    run), not its week."""
    items = [{"at": float(i), "gen_tok_s": 100.0, "ok": True} for i in range(500)]
    read: list[dict[str, Any]] = []

    class Counted(list):
        def __reversed__(self):
            for r in super().__reversed__():
                read.append(r)
                yield r

        def __iter__(self):
            for r in super().__iter__():
                read.append(r)
                yield r

    st = benchdata.regression_state({"results": {GPU: Counted(items)}}, GPU, 100.0, min_results=3)
    assert st["trend"] == "stable" and st["current_tok_s"] == 100.0
    assert len(read) == 3
    read.clear()
    items[-2:] = [{"at": 498.0, "gen_tok_s": 50.0, "ok": True}, {"at": 499.0, "gen_tok_s": 50.0, "ok": True}]
    st = benchdata.regression_state({"results": {GPU: Counted(items)}}, GPU, 100.0, min_results=2)
    assert (st["trend"], st["regressing_since"], len(read)) == ("regressing", 498.0, 3)


# --------------------------------------------------------------------------- the index's results, built lazily


def _week(n: int, rnd: random.Random) -> dict[str, Any]:
    """GPUs with ``n`` results each or fewer, some of an earlier version's (fields absent), some failed."""
    data = benchdata.empty()
    for g in range(4):
        items = []
        for i in range(rnd.randrange(0, n + 1)):
            rate = None if rnd.random() < 0.1 else round(rnd.uniform(40, 120), 2)
            r = {"at": 1000.0 + 3600 * i, "gen_tok_s": rate, "ok": rate is not None, "source": "bench",
                 "error": None if rate else "timeout", "n_ctx": 32768, "slots": 2, "model": "m"}
            if rnd.random() < 0.1:
                del r["source"], r["slots"]
            items.append(r)
        data["results"][f"gpu-{g}"] = items
    return benchdata.normalise(json.loads(json.dumps(data)))


def _indexed(data: dict[str, Any]) -> dict[str, Any]:
    got = benchdata.from_index(json.loads(json.dumps(benchdata.to_index(data, (1, 2)))), (1, 2))
    assert got is not None
    return got


def _plain(data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """What the index gave before: every result, as a list of dicts of its CHECK_FIELDS."""
    return {a: [{f: r[f] for f in benchdata.CHECK_FIELDS if f in r} for r in items]
            for a, items in data["results"].items()}


def test_the_index_builds_only_the_newest_results_until_older_ones_are_read():
    data = _week(40, random.Random(1))
    data["results"]["gpu-0"] = [{"at": float(i), "gen_tok_s": 100.0, "ok": True, "source": "bench"}
                                for i in range(40)]
    indexed = _indexed(data)["results"]
    items = indexed["gpu-0"]
    assert isinstance(items, benchdata.IndexedResults) and len(items) == 40
    assert items.built == benchdata.IndexedResults.FIRST_BUILT
    assert benchdata.regression_state({"results": indexed}, "gpu-0", 100.0)["trend"] == "stable"
    assert [r["at"] for r in items[-3:]] == [37.0, 38.0, 39.0] and items.built == benchdata.IndexedResults.FIRST_BUILT
    assert items[0]["at"] == 0.0 and items.built == 40
    for items in [v for a, v in indexed.items() if a != "gpu-0"]:  # a GPU with few results: all built, a list
        few = len(items) <= benchdata.IndexedResults.ALL_BUILT
        assert type(items) is list if few else items.built == benchdata.IndexedResults.FIRST_BUILT
    few = {**data["results"], "gpu-1": data["results"]["gpu-0"][:8], "gpu-2": data["results"]["gpu-0"][:9]}
    indexed = _indexed({**data, "results": few})["results"]
    assert type(indexed["gpu-1"]) is list and indexed["gpu-2"].built == benchdata.IndexedResults.FIRST_BUILT
    assert indexed == _plain({"results": few})


@pytest.mark.parametrize("seed", range(60))
def test_the_index_results_read_in_any_order_are_the_plain_list(seed):
    """Reads from the newest back (stopped anywhere, resumed), by index, by slice, whole, and changes: each
    gives what the plain list of the same results gives, and the same objects every time."""
    rnd = random.Random(seed)
    data = _week(30, rnd)
    want = _plain(data)
    got = _indexed(data)["results"]
    assert got == want
    got = _indexed(data)["results"]
    for alias, items in got.items():
        plain = want[alias]
        seen: dict[int, int] = {}
        for _ in range(12):
            how = rnd.randrange(6)
            if how == 0 and plain:
                i = rnd.randrange(-len(plain), len(plain))
                assert items[i] == plain[i]
                seen.setdefault(i % len(plain), id(items[i]))
                assert id(items[i]) == seen[i % len(plain)]
            elif how == 1:
                stop = rnd.randrange(0, len(plain) + 1)
                back = reversed(items)
                assert [next(back) for _ in range(stop)] == plain[::-1][:stop]
                assert list(back) == plain[::-1][stop:]
            elif how == 2:
                a, b, step = rnd.randrange(-5, 35), rnd.randrange(-5, 35), rnd.choice([1, 2, -1, -3])
                assert items[a:b:step] == plain[a:b:step]
            elif how == 3:
                assert list(items) == plain and len(items) == len(plain)
            elif how == 4:
                assert list(reversed(items)) == plain[::-1]
            else:
                assert (plain[-1] in items if plain else True) and items.count(plain[0] if plain else {}) == \
                    plain.count(plain[0] if plain else {})
        assert items == plain and plain == items and not items != plain and repr(items) == repr(plain)


def test_a_change_to_the_index_results_is_a_change_to_the_list():
    """gpu-monitor's reading inserted in time order (monitor.ingest), a result replaced, one deleted: as in a
    list, whatever had been built."""
    data = _week(12, random.Random(5))
    data["results"]["gpu-0"] = [{"at": float(10 * i), "gen_tok_s": 100.0 + i, "ok": True} for i in range(12)]
    for prebuilt in (0, 3, 12):
        items = _indexed(data)["results"]["gpu-0"]
        plain = _plain(data)["gpu-0"]
        back = reversed(items)
        assert [next(back) for _ in range(prebuilt)] == plain[::-1][:prebuilt]
        reading = {"at": 55.0, "gen_tok_s": 1.0, "ok": True, "source": "monitor"}
        for seq in (items, plain):
            insort(seq, dict(reading), key=lambda r: r["at"])
            seq[0] = {"at": -1.0, "gen_tok_s": 2.0}
            del seq[3]
            seq.append({"at": 999.0})
        assert items == plain and len(items) == 13 and items.built == 13


def test_equality_with_what_is_not_a_list_of_results():
    week = {"results": {GPU: [{"at": float(i), "gen_tok_s": 1.0, "ok": True} for i in range(20)]}, "baselines": {}}
    items = _indexed(week)["results"][GPU]
    assert isinstance(items, benchdata.IndexedResults)
    assert items != (*items,) and items != "results" and items is not None
    with pytest.raises(TypeError):
        hash(items)
    with pytest.raises(IndexError):
        items[len(items)]


@pytest.mark.parametrize("seed", range(40))
def test_the_last_monitor_reading_is_the_greatest_and_read_from_the_newest_back(seed):
    """gpu-monitor's readings are checked against the newest one recorded at every poll (monitor.ingest): from
    the index, read from the newest back; the same time as the greatest of a plain list's."""
    rnd = random.Random(seed)
    data = _week(30, rnd)
    for items in data["results"].values():
        for r in items:
            if rnd.random() < 0.2:
                r["source"] = "monitor"
    got = _indexed(data)["results"]
    for alias, items in got.items():
        plain = _plain(data)[alias]
        assert benchdata.last_monitor_at(items) == benchdata.last_monitor_at(plain) == max(
            (r["at"] for r in plain if r.get("source") == "monitor"), default=None)
    week = {"results": {GPU: [{"at": float(i), "gen_tok_s": 1.0, "ok": True, "source": "monitor" if i == 37 else
                               "bench"} for i in range(40)]}, "baselines": {}}
    items = _indexed(week)["results"][GPU]
    assert benchdata.last_monitor_at(items) == 37.0 and items.built == benchdata.IndexedResults.FIRST_BUILT
    assert math.isnan(benchdata.last_monitor_at([{"at": math.nan, "source": "monitor"},
                                                 {"at": 3.0, "source": "monitor"}]))  # a file's NaN: as max() did
