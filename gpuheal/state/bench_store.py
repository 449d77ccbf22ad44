"""The recorded benchmark results in the state directory: ``bench-results.json`` (:mod:`gpuheal.benchdata`'s
shape, unchanged) and its index for ``check``, ``bench-index.json``.

``check`` runs every minute and needs, of the results, only what its rules read
(:data:`gpuheal.benchdata.CHECK_FIELDS`); the file holds every field of every result for ``bench.keep_days``
(35 days: ~3,000 results a week on 100 GPUs). So each save writes the file, then the index of what was saved,
keyed by the file's stamp: its size and CRC-32 (~0.2 ms for a week's file, against ~10 ms to decode it). The
stamp is what the file holds, not ``os.stat``'s: two writes within one tick of the file system's clock, into
an inode used again, cannot pass for each other. ``check`` reads the index while it is the index of the file
as it is, and the file otherwise — the first run after an earlier version wrote it (which knows no index),
after an operator's edit, when the index is missing or damaged (set aside, as any state file) or cannot be
written (a hand-edited file holding a NaN) — and writes the index then, so that the next run reads it. A run
that records a gpu-monitor reading (:func:`gpuheal.rules.benchmark_regression.monitor.ingest`, whole results)
into the index's results reads the file then, and writes it back with those readings
(:func:`save_recorded`).
"""

from __future__ import annotations

import zlib
from bisect import insort
from typing import Any, NamedTuple

from gpuheal import benchdata
from gpuheal.state import files
from gpuheal.state.store import StateDir


class Loaded(NamedTuple):
    """The results as read: ``whole`` when every field of every result is there (the file was read), else
    only :data:`~gpuheal.benchdata.CHECK_FIELDS` (the index)."""

    data: dict[str, Any]
    whole: bool


def load(store: StateDir) -> dict[str, Any]:
    """Every recorded result (the file, normalised: damaged entries dropped; a corrupt file set aside)."""
    return benchdata.normalise(store.read(files.BENCH, None))


def load_for_check(store: StateDir) -> Loaded:
    """The results as ``check`` reads them: from the index while it indexes the file as it is now, else
    from the file (its index written again then, when it can be)."""
    stamp = _stamp(store)
    if stamp is None:
        return Loaded(benchdata.empty(), True)  # no results yet: nothing to read, nothing to index
    light = benchdata.from_index(store.read(files.BENCH_INDEX, None), stamp)
    if light is not None:
        return Loaded(light, False)
    data = load(store)
    _write_index(store, data)
    return Loaded(data, True)


def save(store: StateDir, data: dict[str, Any]) -> None:
    """Write every result (``data``: whole and normalised), then its index."""
    store.write(files.BENCH, data)
    _write_index(store, data)


def save_recorded(store: StateDir, bench: Loaded) -> None:
    """Write back results into which this run recorded gpu-monitor's readings. From the index's results: the
    file's, with the readings recorded into the index's (each a whole result, newer than the last reading of
    its GPU in the file: :func:`gpuheal.rules.benchmark_regression.monitor.ingest` records no other) and its
    gpu-monitor baselines: what recording them into the file would have given."""
    if bench.whole:
        save(store, bench.data)
        return
    whole = load(store)
    for alias, items in bench.data["results"].items():
        kept = whole["results"].setdefault(alias, [])
        last = max((r["at"] for r in kept if r.get("source") == "monitor"), default=None)
        for r in items:
            if r.get("source") == "monitor" and (last is None or r["at"] > last):
                insort(kept, r, key=lambda k: k["at"])
    whole["monitor_baselines"] = bench.data["monitor_baselines"]
    save(store, whole)


def _write_index(store: StateDir, data: dict[str, Any]) -> None:
    """The index of ``data`` as the results file holds it now; none when there is no file (one set aside) or
    when ``data`` cannot be written as JSON (a NaN or an infinity of a hand-edited file): the file is read
    then, as before there was an index."""
    stamp = _stamp(store)
    if stamp is None:
        return
    try:
        store.write(files.BENCH_INDEX, benchdata.to_index(data, stamp))
    except (ValueError, RecursionError):  # allow_nan=False; a value nested deeper than the encoder goes
        return


def _stamp(store: StateDir) -> tuple[int, int] | None:
    """The results file's (size, CRC-32); ``None`` when there is none."""
    try:
        raw = (store.path / files.BENCH).read_bytes()
    except FileNotFoundError:
        return None
    return len(raw), zlib.crc32(raw)
