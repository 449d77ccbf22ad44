"""The coarse tier in parts (issue 29): closed days' files written once and read only when needed, the open
part (``history-coarse.json``) a day at most; read back, the tier is the one a long-lived process keeps."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta

import pytest

from gpuheal.model import GpuSample, Observation
from gpuheal.state.files import HISTORY, HISTORY_COARSE
from gpuheal.state.history import History
from gpuheal.state.history_store import load_history, save_history
from gpuheal.state.store import StateDir

T0 = datetime(2026, 7, 18, 0, 0, tzinfo=UTC)
ALIASES = ("gpu-dense", "gpu-light", "strix-moe")
RAW_H, BUCKET_S = 6.5, 600
STEP_MIN = 5  # a poll every 5 minutes: days of runs in a test's time


def obs_at(minute: int, aliases: tuple[str, ...] = ALIASES) -> Observation:
    return Observation(
        at=T0 + timedelta(minutes=minute),
        gpus={a: GpuSample(temp_c=50 + minute % 30, vram_used_mb=10_000 + minute, util_pct=40,
                           power_w=None if minute % 7 == 0 else 200.0 + i, endpoint="ok" if minute % 97 else "timeout")
              for i, a in enumerate(aliases)},
        monitor_ok=True,
    )


def run(history: History, minute: int, coarse_days: float, aliases: tuple[str, ...] = ALIASES) -> None:
    history.add(obs_at(minute, aliases), aliases)
    history.compact((T0 + timedelta(minutes=minute)).timestamp(), RAW_H, BUCKET_S, coarse_days)


def fed(minutes: range | list[int], coarse_days: float) -> History:
    """The history one long-lived process keeps (no state directory)."""
    history = History()
    for m in minutes:
        run(history, m, coarse_days)
    return history


def cron(state, minutes: range, coarse_days: float, aliases: tuple[str, ...] = ALIASES) -> None:
    """Cron's runs: load, append the poll, compact, save (as ``check`` does)."""
    for m in minutes:
        with StateDir(state) as store:
            history = load_history(store)
            run(history, m, coarse_days, aliases)
            save_history(store, history)


def loaded(state) -> History:
    with StateDir(state) as store:
        history = load_history(store)
        assert store.warnings == []
    return history


def parts(state) -> list[str]:
    return sorted(p.name for p in state.glob("history-coarse-*.json"))


def days(end: float, start: float = 0.0) -> range:
    """The runs' minutes from day ``start`` to day ``end``, on the poll grid."""
    def grid(d: float) -> int:
        return -(-int(d * 24 * 60) // STEP_MIN) * STEP_MIN
    return range(grid(start), grid(end), STEP_MIN)


def test_days_of_runs_keep_closed_days_apart_and_read_back_the_same_tier(tmp_path):
    """Three and a half days: a closed part a day, the open part younger than a day, and the tier read back
    (whole, and a GPU's series over it) the same as one process's."""
    minutes = days(3.5)
    cron(tmp_path, minutes, 8.0)
    back, want = loaded(tmp_path), fed(minutes, 8.0)
    assert parts(tmp_path) == ["history-coarse-20260718.json", "history-coarse-20260719.json",
                               "history-coarse-20260720.json"]
    assert back == want and back.coarse and back.raw == want.raw
    assert back.series("gpu-dense", "temp_c", coarse=True) == want.series("gpu-dense", "temp_c", coarse=True)
    assert back.sample_count() == want.sample_count()
    open_t = json.loads((tmp_path / HISTORY_COARSE).read_text())["data"]["coarse"]
    assert set(open_t) == set(ALIASES)
    assert all(p.stat().st_size > (tmp_path / HISTORY_COARSE).stat().st_size for p in tmp_path.glob("*-2026*"))


def test_a_closed_day_is_written_once_and_a_run_that_folds_reads_none(tmp_path, monkeypatch):
    cron(tmp_path, days(2.5), 8.0)
    stamps = {name: (tmp_path / name).stat().st_mtime_ns for name in parts(tmp_path)}
    reads: list[str] = []
    real = StateDir.read

    def spy(self, name, default=None):
        reads.append(name)
        return real(self, name, default)

    monkeypatch.setattr(StateDir, "read", spy)
    more = days(2.5 + 1 / 24, 2.5)  # an hour: folds, no day closed
    cron(tmp_path, more, 8.0)
    assert {name: (tmp_path / name).stat().st_mtime_ns for name in parts(tmp_path)} == stamps
    assert not [name for name in reads if name.startswith("history-coarse-")]
    assert HISTORY_COARSE in reads  # the open part, read to fold a bucket in
    monkeypatch.undo()
    assert loaded(tmp_path) == fed(range(0, more.stop, STEP_MIN), 8.0)


def test_buckets_age_out_of_the_closed_parts_as_they_do_in_one_process(tmp_path):
    """``coarse_days`` 1.2 over 4 days: parts all older go (their files removed), one partly older is read
    from the cut on; the tier is the same at every day's end."""
    for start, end in ((0.0, 1.5), (1.5, 2.3), (2.3, 3.1), (3.1, 4.0)):
        cron(tmp_path, days(end, start), 1.2)
        assert loaded(tmp_path) == fed(days(end), 1.2), end
    assert len(parts(tmp_path)) <= 2
    assert "history-coarse-20260718.json" not in parts(tmp_path)


def test_a_state_directory_of_the_earlier_layout_loads_and_moves_to_parts(tmp_path):
    """c8b3cf5's layout: the whole tier in ``history-coarse.json`` (indexed by ``history.json``); its first save
    that folds a bucket closes it into a part, nothing lost or doubled."""
    earlier = fed(days(3), 8.0)
    with StateDir(tmp_path) as store:
        data, coarse = earlier.to_files()
        store.write(HISTORY_COARSE, coarse)
        store.write(HISTORY, data)
    assert loaded(tmp_path) == earlier
    more = days(3 + 1 / 48, 3)
    cron(tmp_path, more, 8.0)
    assert parts(tmp_path) == ["history-coarse-20260718.json"]
    assert loaded(tmp_path) == fed(range(0, more.stop, STEP_MIN), 8.0)


def test_a_run_stopped_at_any_write_of_a_closing_save_loses_nothing(tmp_path, monkeypatch):
    """The save that closes a day writes the part, removes the open file, writes the raw tier and the index:
    stopped after any of them, the next run's state is the one the whole save leads to."""
    closing = 24 * 60 + 6 * 60 + 40  # the run that folds the first bucket of the second day
    base = tmp_path / "base"
    cron(base, range(0, closing, STEP_MIN), 8.0)
    assert parts(base) == []
    want = fed(range(0, closing + 2 * STEP_MIN, STEP_MIN), 8.0)
    unsaved = fed([m for m in range(0, closing + 2 * STEP_MIN, STEP_MIN) if m != closing], 8.0)  # its poll lost
    assert unsaved.coarse == want.coarse
    for stop_at in range(1, 5):  # the part, the open file removed, the raw tier, the index
        state = tmp_path / f"stop{stop_at}"
        shutil.copytree(base, state)
        calls = []

        def crash(*args, real, calls=calls, stop_at=stop_at, **kwargs):
            calls.append(args)
            if len(calls) == stop_at:
                raise KeyboardInterrupt  # the run killed here
            return real(*args, **kwargs)

        for method in ("write_encoded", "write_bytes", "write", "remove"):
            monkeypatch.setattr(StateDir, method, lambda *a, m=getattr(StateDir, method), **k: crash(*a, real=m, **k))
        with pytest.raises(KeyboardInterrupt):
            cron(state, range(closing, closing + 1), 8.0)
        monkeypatch.undo()
        cron(state, range(closing + STEP_MIN, closing + 2 * STEP_MIN, STEP_MIN), 8.0)
        assert parts(state) == ["history-coarse-20260718.json"]
        back = loaded(state)
        assert back == (unsaved if stop_at <= 3 else want), stop_at
        assert back.coarse == want.coarse


def test_a_part_not_indexed_is_read_at_load_and_the_open_part_holds_its_buckets_once(tmp_path):
    """A part written by a run stopped before the open file went: read at load, its buckets once."""
    minutes = days(1.5)
    cron(tmp_path, minutes, 8.0)
    (tmp_path / "history-coarse-20260719.json").write_bytes((tmp_path / HISTORY_COARSE).read_bytes())
    back = loaded(tmp_path)
    assert back == fed(minutes, 8.0)
    assert back._coarse == {}  # the open part's buckets are all in the part: none kept twice


@pytest.mark.parametrize("junk", [None, "x", [["history-coarse-20260718.json", "x", 1.0, 2.0]], [[1, [], 0.0, 1.0]],
                                  [["history-coarse-20260718.json", [1, 2, 3, 4], "NaN", 2.0]]])
def test_a_damaged_index_of_the_parts_reads_them_at_load(tmp_path, junk):
    minutes = days(2.3)
    cron(tmp_path, minutes, 8.0)
    doc = json.loads((tmp_path / HISTORY).read_text())
    doc["data"]["coarse_parts"] = junk
    (tmp_path / HISTORY).write_text(json.dumps(doc))
    assert loaded(tmp_path) == fed(minutes, 8.0)


@pytest.mark.parametrize("damage", ["{not json", '{"schema_version":1,"data":{"coarse":[]}}', ""])
def test_a_damaged_part_loses_its_own_buckets_only(tmp_path, damage):
    minutes = days(2.5)
    cron(tmp_path, minutes, 8.0)
    (tmp_path / "history-coarse-20260718.json").write_text(damage)
    with StateDir(tmp_path) as store:
        history = load_history(store)
        coarse = history.coarse
    want = fed(minutes, 8.0).coarse
    first_day_end = (T0 + timedelta(days=1)).timestamp()  # the first part holds the first bucket of the next day
    for alias, cols in want.items():
        assert coarse[alias]["t"] == [t for t in cols["t"] if t > first_day_end]
    if damage.startswith("{not"):
        assert any("history-coarse-20260718.json" in w for w in store.warnings)
    cron(tmp_path, range(minutes.stop, minutes.stop + 30, STEP_MIN), 8.0)  # no traceback, and runs on


def test_a_gpu_removed_from_the_config_leaves_the_closed_parts(tmp_path):
    minutes = days(2.5)
    cron(tmp_path, minutes, 8.0)
    kept = ALIASES[:2]
    cron(tmp_path, range(minutes.stop, minutes.stop + 10, STEP_MIN), 8.0, aliases=kept)
    back = loaded(tmp_path)
    assert set(back.coarse) == set(kept)
    for name in parts(tmp_path):
        assert set(json.loads((tmp_path / name).read_text())["data"]["coarse"]) == set(kept)
