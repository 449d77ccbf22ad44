"""The judgement's fast paths (issue 29: a 100-GPU week's CPU) answer exactly what the paths they stand in for
answered: the readers of stored rows and transitions, Rule 10's window sum, and the engine's parameters bound
once a pass. Each reference below is the code as it was before, kept here to compare against on any input."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal import benchdata
from gpuheal.config import load_config_dict
from gpuheal.core import engine, memory, timing
from gpuheal.core.memory import Memory
from gpuheal.core.view import FleetView
from gpuheal.model import GpuSample, Observation
from gpuheal.rules.workload_misrouted import memory as rule10
from gpuheal.rules.workload_misrouted.memory import REQUEST_BUCKET_S, REQUESTS, RequestsRow
from gpuheal.state.history import History

# --------------------------------------------------------------------------- references (the code before)


def number_before(value: object) -> float | None:
    if isinstance(value, float):
        return value if value - value == 0.0 else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def whole_before(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def requests_load_before(data: object) -> RequestsRow | None:
    at_s: object = None
    if isinstance(data, dict):
        at_s, data = data.get("at_s"), data.get("buckets")
    if not isinstance(data, list) or (at_s is not None and number_before(at_s) is None):
        return None
    buckets = []
    for b in data:
        if not isinstance(b, list) or len(b) != 2:
            return None
        start, count = number_before(b[0]), whole_before(b[1])
        if start is None or count is None:
            return None
        buckets.append((start, count))
    return RequestsRow(number_before(at_s), tuple(buckets))


def in_window_before(buckets: tuple[tuple[float, int], ...], now_s: float, window: float, tol: float) -> int | None:
    cut = now_s - window
    total = 0
    seen = False
    for start, count in buckets:
        if timing.more_than(start + REQUEST_BUCKET_S - cut, 0.0, tol):
            total += count
            seen = True
    return total if seen else None


def transition_before(data: Any) -> engine.Transition | None:
    if not isinstance(data, dict) or data.get("event") not in tuple(engine.Event):
        return None
    text = ("at", "gpu", "issue", "severity", "since", "summary")
    if not all(isinstance(data.get(k), str) for k in text):
        return None
    detected = data.get("detected")
    return engine.Transition(**{k: data[k] for k in text}, event=engine.Event(data["event"]),
                             detected=detected if isinstance(detected, dict) else {})


def typed(value: object) -> object:
    """``value`` with the type of every number in it (``1``, ``1.0`` and ``True`` are equal, not the same)."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [typed(v) for v in value])
    if isinstance(value, dict):
        return ("dict", [(k, typed(v)) for k, v in value.items()])
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, value)


# --------------------------------------------------------------------------- what is stored

SCALARS = st.one_of(st.integers(-(10**20), 10**20), st.integers(-(2**1100), 2**1100), st.floats(), st.booleans(),
                    st.none(), st.text(max_size=3), st.just(1e308))
PAIRS = st.lists(st.one_of(st.lists(SCALARS, min_size=2, max_size=2), st.lists(SCALARS, max_size=3), SCALARS,
                           st.tuples(SCALARS, SCALARS)), max_size=8)
GOOD_PAIRS = st.lists(st.tuples(st.one_of(st.integers(0, 2 * 10**9), st.floats(0, 2e9)),
                                st.integers(0, 10**6)).map(list), max_size=12)


@settings(max_examples=400, deadline=None)
@given(SCALARS)
def test_number_and_whole_answer_as_before(value):
    assert typed(memory.number(value)) == typed(number_before(value))
    assert typed(memory.whole(value)) == typed(whole_before(value))


@settings(max_examples=500, deadline=None)
@given(st.one_of(PAIRS, GOOD_PAIRS), st.one_of(st.none(), SCALARS), st.booleans())
def test_a_requests_row_is_read_as_before(buckets, at_s, bare):
    """Every stored row — plain, damaged, a NaN or an infinity among the starts, a bool count, an int too large
    for a float — reads as the pair-by-pair reader read it: the same numbers of the same types, or no row."""
    data: object = buckets if bare else {"at_s": at_s, "buckets": buckets}
    got, want = RequestsRow.load(data), requests_load_before(data)
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        assert typed(got.at_s) == typed(want.at_s) and typed(got.buckets) == typed(want.buckets)
        assert got.to_json() == want.to_json() and typed(got.to_json()) == typed(want.to_json())


def test_plain_rows_take_the_fast_path_and_an_odd_one_the_checked_path():
    assert rule10._plain_buckets([[300.0, 2], [600, 3]]) == ((300.0, 2), (600, 3))
    for odd in ([[1.0, True]], [[float("nan"), 1]], [[1e308, 1], [1e308, 1]], [[2**1100, 1], [1.0, 1]], [(1.0, 1)]):
        assert rule10._plain_buckets(odd) is None  # the checked reader says what it is
    assert RequestsRow.load([[1e308, 1], [1e308, 1]]) == RequestsRow(None, ((1e308, 1), (1e308, 1)))
    assert RequestsRow.load([[2**1100, 1], [1.0, 1]]) == RequestsRow(None, ((2**1100, 1), (1.0, 1)))


CFG = load_config_dict({"monitor": {"url": "http://127.0.0.1:9/gpu-data"},
                        "gpus": [{"alias": "gpu-a", "host": "a", "endpoint": "http://127.0.0.1:9", "weight": 1.0,
                                  "transport": "local"}]})


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e6, 1e6).map(lambda x: round(x, 1)), st.integers(0, 100)), max_size=10),
       st.floats(0, 1e6), st.floats(0, 1e5),
       st.one_of(st.floats(-20, 20), st.just(0.0), st.just(float("inf")), st.just(float("nan"))))
def test_requests_in_the_window_are_counted_as_before(buckets, now_s, window, tol):
    """Rule 10's window sum: a bucket counts when it ends more than the tolerance after the cut — the
    comparison worked out once, for any tolerance (negative, infinite and NaN ones too)."""
    mem = Memory()
    mem.of(REQUESTS)["gpu-a"] = RequestsRow(now_s, tuple(buckets))
    view = FleetView(CFG, now_s, None, History(), benchdata.empty(), mem, tolerance_s=tol)
    assert rule10.requests_in_window(view, "gpu-a", window) == in_window_before(tuple(buckets), now_s, window, tol)


TEXT = st.one_of(st.text(max_size=4), st.integers(), st.none(), st.lists(st.integers(), max_size=1))
EVENTS = st.one_of(st.sampled_from([str(e) for e in engine.Event]), st.sampled_from(list(engine.Event)), TEXT)
TRANSITIONS = st.one_of(
    st.fixed_dictionaries({k: TEXT for k in ("at", "gpu", "issue", "severity", "since", "summary")},
                          optional={"event": EVENTS, "detected": st.one_of(st.dictionaries(st.text(max_size=2),
                                                                                             st.integers()), TEXT)}),
    st.fixed_dictionaries({k: st.text(max_size=3) for k in ("at", "gpu", "issue", "severity", "since", "summary")}
                          | {"event": EVENTS}, optional={"detected": st.dictionaries(st.text(max_size=2),
                                                                                     st.integers()), "extra": TEXT}),
    TEXT)


@settings(max_examples=400, deadline=None)
@given(TRANSITIONS)
def test_a_stored_transition_is_read_as_before(data):
    got, want = engine.Transition.from_json(data), transition_before(data)
    assert got == want
    if got is not None and want is not None:
        assert type(got.event) is engine.Event and got.to_json() == want.to_json()


# --------------------------------------------------------------------------- parameters bound once a pass


def test_each_gpu_is_judged_with_its_own_parameters():
    """GPUs that override a rule's parameters and GPUs that do not: the engine hands each GPU's ``detect`` the
    record ``view.rule_params`` gives for that GPU, bound once a pass."""
    gpus = [{"alias": f"gpu-{i}", "host": f"h{i}", "endpoint": f"http://127.0.0.1:{9000 + i}", "transport": "local"}
            for i in range(4)]
    gpus[1]["rules"] = {"thermal-critical": {"temp_c": 75.0, "clear_below_c": 70.0}}
    gpus[3]["rules"] = {"thermal-critical": {"temp_c": 99.0}}
    cfg = load_config_dict({"monitor": {"url": "http://127.0.0.1:9/gpu-data"}, "gpus": gpus})
    seen: dict[str, Any] = {}
    from gpuheal.rules import thermal_critical

    class Spy:
        def __getattr__(self, name: str) -> Any:
            return getattr(thermal_critical, name)

        @staticmethod
        def detect(view: FleetView, alias: str, p: Any) -> Any:
            seen[alias] = p
            return thermal_critical.detect(view, alias, p)

    obs = Observation(__import__("datetime").datetime(2026, 7, 18, 8, tzinfo=__import__("datetime").UTC),
                      {g["alias"]: GpuSample(temp_c=80.0, endpoint="ok") for g in gpus}, True)
    view = FleetView(cfg, obs.at.timestamp(), obs, History(), benchdata.empty(), Memory())
    ev = engine.evaluate([Spy()], view, engine.new_book())  # type: ignore[list-item]
    assert seen == {a: view.rule_params("thermal-critical", thermal_critical.Params, a) for a in view.aliases}
    assert seen["gpu-1"].temp_c == 75.0 and seen["gpu-3"].temp_c == 99.0 and seen["gpu-0"] is seen["gpu-2"]
    assert [(t["gpu"], t["event"]) for t in ev.transitions] == [("gpu-1", "pending")]


LINES = st.lists(st.one_of(TRANSITIONS, st.builds(lambda d: engine.Transition.from_json(d), TRANSITIONS)
                           .filter(lambda t: t is not None).map(lambda t: t.to_json())), max_size=6)


@settings(max_examples=300, deadline=None)
@given(LINES, st.integers(1, 4), st.integers(0, 3))
def test_the_log_is_written_back_as_before(lines, log_max, added):
    """The book's log, kept as read where a line is already what would be written: the same JSON as
    decoding every line and encoding it again — the damaged ones dropped, the last LOG_MAX kept, lines
    appended and the log trimmed across what was read and what was added."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "LOG_MAX", log_max)
        decoded = [t for t in (transition_before(x) for x in lines) if t is not None][-log_max:]
        book = engine.load_book({"log": lines})
        assert book.to_json()["log"] == [t.to_json() for t in decoded]
        assert list(book.log) == decoded and len(book.log) == len(decoded)
        extra = [engine.Transition("t", "g", "i", "info", engine.Event.PENDING, "s", f"x{n}", {}) for n in range(added)]
        for t in extra:
            book.log.append(t)
        book.log.trim(log_max)
        want = (decoded + extra)[-log_max:]
        assert book.to_json()["log"] == [t.to_json() for t in want] and list(book.log) == want


# --------------------------------------------------------------------------- Rule 9's last few results

RESULTS = st.lists(st.fixed_dictionaries(
    {"at": st.one_of(st.integers(0, 100), st.floats(0, 100))},
    optional={"ok": st.one_of(st.booleans(), st.none(), st.integers(0, 1)),
              "gen_tok_s": st.one_of(st.floats(), st.integers(-5, 50), st.booleans(), st.none(), st.text(max_size=1))}),
    max_size=12)


@settings(max_examples=400, deadline=None)
@given(RESULTS, st.floats(-10, 110), st.integers(1, 5), st.booleans(), st.floats(0, 20))
def test_the_last_few_results_are_the_tail_of_every_result(results, since_s, count, asked_before, tol):
    """Read from the newest back, the last ``count`` successful results are ``bench_ok``'s last ``count`` —
    in any order of the results' times, whatever their fields say; and so is the tail of an answer already
    worked out this poll."""
    bench = {"results": {"gpu-a": results}, "baselines": {}, "monitor_baselines": {}}
    view = FleetView(CFG, 100.0, None, History(), bench, Memory(), tolerance_s=tol)
    every = FleetView(CFG, 100.0, None, History(), bench, Memory(), tolerance_s=tol).bench_ok("gpu-a", since_s)
    if asked_before:
        view.bench_ok("gpu-a", since_s)
    assert view.bench_ok_last("gpu-a", since_s, count) == every[-count:]
    with pytest.raises(ValueError):
        view.bench_ok_last("gpu-a", since_s, 0)
