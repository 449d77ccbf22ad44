"""The raw tier as read (``history.RawColumns``, issue 29): each metric's float64 bytes kept, decoded only when a
reader asks, and written back from them. The oracle is the plain path: the same file decoded into plain lists
(every column, as before), the same polls added and folded, packed from the lists."""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from gpuheal.model import GpuSample, Observation
from gpuheal.state.history import COLUMNS, METRICS, History, RawColumns, raw_file, read_raw_file

T0 = datetime(2026, 7, 18, 0, 0, tzinfo=UTC)
ALIASES = ("gpu-0", "gpu-1", "gpu-2")
RAW_H, BUCKET_S, COARSE_DAYS = 6.5, 600, 8.0
ODD = (None, math.nan, True, 10**400, "junk", 0.1, -0.0, 1e-300)  # what a sample may hold
INFINITE = (math.inf, -math.inf)  # unknown too, but kept as such in bytes not decoded (see below)


def _value(rng: random.Random, odd: tuple[object, ...]) -> object:
    return rng.choice(odd) if rng.random() < 0.1 else round(rng.uniform(0, 30000), rng.randint(0, 6))


def _obs(minute: float, rng: random.Random, odd: tuple[object, ...] = ODD) -> Observation:
    gpus = {a: GpuSample(**{m: _value(rng, odd) for m in METRICS}, endpoint=rng.choice(("ok", "ok", "timeout", None)))
            for a in ALIASES}
    return Observation(at=T0 + timedelta(minutes=minute), gpus=gpus, monitor_ok=True)


def _plain(blob: bytes) -> History:
    """The oracle's history: the file decoded into plain lists, every column."""
    raw = read_raw_file(blob)
    assert raw is not None
    return History(raw={alias: {c: list(cols[c]) for c in COLUMNS} for alias, cols in raw.items()})


def _lazy(blob: bytes) -> History:
    raw = read_raw_file(blob)
    assert raw is not None and all(isinstance(cols, RawColumns) for cols in raw.values())
    return History(raw=raw)


def _start(rng: random.Random, minutes: int, odd: tuple[object, ...] = ODD) -> bytes:
    history = History()
    for m in range(minutes):
        history.add(_obs(m + rng.uniform(0, 0.5), rng, odd), ALIASES)
    return b"".join(raw_file(history.raw))


def _run(history: History, minute: float, rng: random.Random, read: tuple[str, ...],
         odd: tuple[object, ...] = ODD) -> bytes:
    """One cron run: a poll added, the columns ``read`` read as the rules read them, folded, written."""
    history.add(_obs(minute, rng, odd), ALIASES)
    for cols in history.raw.values():
        for c in read:
            cols[c]  # noqa: B018 - a rule's reading
    history.compact((T0 + timedelta(minutes=minute)).timestamp(), RAW_H, BUCKET_S, COARSE_DAYS)
    return b"".join(raw_file(history.raw))


def _runs(seed: int, odd: tuple[object, ...]) -> Iterator[tuple[bytes, bytes, History, History]]:
    """Runs over 7 hours (samples folded into buckets from the 6.5th), each reading none, some or every metric:
    each run's file and history through the raw tier as read, and through the plain path, from the same file."""
    rng = random.Random(seed)
    blob = _start(rng, rng.randint(1, 420), odd)
    minute = 421.0
    for _ in range(rng.randint(1, 30)):
        minute += rng.uniform(0.5, 20)
        read = tuple(rng.sample(METRICS, rng.randint(0, len(METRICS))))
        lazy, plain = _lazy(blob), _plain(blob)
        state = rng.getstate()
        got = _run(lazy, minute, rng, read, odd)
        rng.setstate(state)
        yield got, _run(plain, minute, rng, read, odd), lazy, plain
        blob = got


@pytest.mark.parametrize("seed", range(12))
def test_the_raw_tier_as_read_writes_and_folds_what_decoding_it_whole_does(seed):
    """Junk values among the samples: each run's file is the plain path's to the byte, and so are the buckets."""
    for got, want, lazy, plain in _runs(seed, ODD):
        assert got == want
        assert lazy.to_dict() == plain.to_dict() and lazy == plain


@pytest.mark.parametrize("seed", range(6))
def test_an_infinity_read_back_is_unknown_either_way(seed):
    """An infinite sample is "not known" once read back. The plain path packs it as NaN at the run after (it was
    decoded to None); bytes not decoded keep it as it was written: the files then differ in those bytes only,
    and read back the same."""
    for got, want, lazy, plain in _runs(seed, ODD + INFINITE):
        assert len(got) == len(want) and read_raw_file(got) == read_raw_file(want)
        assert lazy.to_dict() == plain.to_dict()


def test_a_run_that_reads_no_metric_decodes_none_and_writes_the_bytes_it_read():
    rng = random.Random(7)
    blob = _start(rng, 60)
    history = _lazy(blob)
    history.add(_obs(61, rng, (None,)), ALIASES)
    history.compact((T0 + timedelta(minutes=61)).timestamp(), RAW_H, BUCKET_S, COARSE_DAYS)
    out = b"".join(raw_file(history.raw))
    assert all(not dict.__contains__(cols, m) for cols in history.raw.values() for m in METRICS)
    assert len(out) > len(blob) and out.startswith(blob[: blob.index(b"\n", 22)].split(b"\n")[0])
    assert read_raw_file(out) == _plain(out).raw


def test_a_fold_decodes_only_the_samples_it_folds():
    rng = random.Random(3)
    blob = _start(rng, 400)  # past 6.5 h: the first bucket folds at the next run
    history = _lazy(blob)
    history.add(_obs(401, rng, (None,)), ALIASES)
    history.compact((T0 + timedelta(minutes=401)).timestamp(), RAW_H, BUCKET_S, COARSE_DAYS)
    assert history.coarse and all(len(c["t"]) == 1 for c in history.coarse.values())
    assert all(not dict.__contains__(cols, m) for cols in history.raw.values() for m in METRICS)


def test_as_a_mapping_the_columns_are_every_column_decoded():
    rng = random.Random(5)
    blob = _start(rng, 20)
    cols = _lazy(blob).raw[ALIASES[0]]
    plain = _plain(blob).raw[ALIASES[0]]
    assert list(cols) == list(COLUMNS) and len(cols) == len(COLUMNS) and set(cols.keys()) == set(COLUMNS)
    assert dict(cols.items()) == plain and list(cols.values()) == [plain[c] for c in COLUMNS]
    assert cols == plain and not (cols != plain) and plain == cols and repr(cols) == repr(plain)
    assert "power_w" in cols and "nope" not in cols and cols.get("nope", 1) == 1 and cols.get("util_pct") == plain[
        "util_pct"]
    assert copy.deepcopy(cols) == plain and type(copy.deepcopy(cols)) is dict and cols.copy() == plain
    with pytest.raises(KeyError):
        cols["nope"]  # noqa: B018


def test_a_list_changed_from_outside_is_packed_from_the_list():
    """The lists are the history's; a caller that appends to one behind its back still gets a consistent file."""
    rng = random.Random(9)
    blob = _start(rng, 10)
    history, plain = _lazy(blob), _plain(blob)
    for h in (history, plain):
        h.raw[ALIASES[1]]["util_pct"].append(12.5)
        h.raw[ALIASES[1]]["t"].append(1e10)
        h.raw[ALIASES[1]]["endpoint"].append("ok")
        for m in ("temp_c", "vram_used_mb", "power_w"):
            h.raw[ALIASES[1]][m].append(None)
    assert b"".join(raw_file(history.raw)) == b"".join(raw_file(plain.raw))
