"""The recorded history in the state directory: several files, so that a cron run rewrites only what changed.

``history.json`` holds the raw tier (every poll appends to it); ``history-coarse.json`` the coarse tier
(:mod:`gpuheal.state.history`; now its open part, the closed days in their own files: below), which changes
once every ``coarse_bucket_s`` — a 100-GPU week holds ~5 MB of coarse buckets, which each cron run read and wrote
back unchanged while they shared one file (issue 29).
A state directory of the earlier layout (the coarse tier inside ``history.json``) is read as it is and
moved to this one by its first save.

``history.json``'s data also indexes the coarse file (``coarse_file``: ``{"stamp": [inode, size, mtime_ns,
ctime_ns], "first_t": {ALIAS: oldest bucket's start}}``): while the file is the one indexed (its stamp) a run
reads it only when it folds a bucket in, ages one out or forgets a GPU (:meth:`History.deferred`), not every
minute (a 100-GPU week's end: ~5 MB of JSON, ~10 ms a run, issue 29). An earlier version ignores the key and
writes ``history.json`` without it; a file that is not the one indexed (another writer's, an operator's, one
set aside) is read at load, as before. A coarse file damaged without its stamp changing is found at the next
run that reads it (within ``coarse_bucket_s``) instead of at the next load.

The coarse tier is in parts (issue 29: the whole week's file, ~5 MB at a 100-GPU week's end, was read, serialised
and fsynced every ``coarse_bucket_s``): ``history-coarse.json`` is the open part, which takes the buckets folded in
and holds a day at most; the save of a run that folds a bucket of a later UTC day than its oldest closes it into
``history-coarse-YYYYMMDD.json`` (``files.HISTORY_COARSE_PART``: the day of its oldest bucket, ``-N`` after it if
taken), written once and read only when asked for (a query of the tier, a GPU forgotten, a fold of a GPU without a
bucket in the open part, ageing a part the index does not span). ``history.json`` indexes them (``coarse_parts``:
``[[NAME, STAMP, OLDEST, NEWEST], ...]``) and holds the age cut (``coarse_cut_s``): a part partly older than
``coarse_days`` is read from the cut on, not written again; one all older is removed after the index that no longer
names it. The parts are found by their names in the directory, so that a part the index does not name (a run
stopped before ``history.json``) is read at load, and the open part's buckets at or before a GPU's newest in the
parts dropped (the closing save writes the part, then removes the open file: stopped between, both hold them).
A damaged part is set aside and only its buckets are lost. A state directory of an earlier layout is read as
before; its first save that folds a bucket closes its coarse file into a part.

The raw tier itself is in ``history-raw.bin`` (:func:`gpuheal.state.history.raw_file`: the numbers as float64,
no base64 inside JSON), and ``history.json``'s data names it (``raw_file``) with its own raw tier empty. A
``history.json`` with a raw tier in it is an earlier version's (or one written after a downgrade): that tier
wins and the ``.bin`` is ignored, as it is when ``history.json`` does not name it. A run stopped between the two
writes (the ``.bin`` first) leaves the newer ``.bin`` beside the older ``history.json``: read together, the same
raw tier the run saved. A damaged ``.bin`` is set aside with a warning and the raw tier starts empty, as a damaged
``history.json`` does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpuheal.state import files
from gpuheal.state.history import ClosedPart, History, raw_file, read_raw_file
from gpuheal.state.store import StateDir

INDEX = "coarse_file"  # history.json's data: the coarse file's stamp and each GPU's oldest bucket
RAW = "raw_file"  # history.json's data: the name of the raw tier's own file (files.HISTORY_RAW)
PARTS = "coarse_parts"  # history.json's data: the closed parts' files [[NAME, STAMP, OLDEST, NEWEST], ...]
CUT = "coarse_cut_s"  # history.json's data: the closed parts' buckets before it are aged out
PART_NAME = re.compile(files.HISTORY_COARSE_PARTS)


def load_history(store: StateDir) -> History:
    """The recorded history (any layout); a corrupt file is set aside and its tier starts empty."""
    data = store.read(files.HISTORY, {})
    raw = _read_raw(store, data)
    history = _with_coarse(store, data if raw is None else {**data, "raw": {}})
    if raw is not None:
        history.raw = raw
        history.listing = data  # this layout's: left as it is while it says the same
    _attach_closed(store, data, history)
    return history


def _attach_closed(store: StateDir, data: Any, history: History) -> None:
    """The closed parts on disk, oldest first: each as indexed in ``data`` (read when asked for) while its stamp
    is the one indexed, else read now. A part read now was written by a run stopped before ``history.json``:
    the open part may hold its buckets too (:meth:`History.trim_open`)."""
    index = _parts_index(data)
    parts: list[ClosedPart] = []
    for name in _part_names(store):
        stamp = store.stamp(name)
        indexed_stamp, span = index.get(name, (None, None))
        if stamp is None or indexed_stamp != list(stamp):
            span = None  # not the file indexed: read at load
        parts.append(ClosedPart(name, read=_reader(store, name), span=span, stamp=stamp))
    cut = data.get(CUT) if isinstance(data, dict) else None
    history.attach_closed(parts, cut if type(cut) is float and math.isfinite(cut) else None)
    if any(part.span is None for part in parts):
        history.trim_open()


def _reader(store: StateDir, name: str) -> Callable[[], Any]:
    """A closed part's file's data, read when the history first asks for it (damaged: set aside, ``None``)."""
    return lambda: store.read(name, None)


def _part_names(store: StateDir) -> list[str]:
    """The closed parts' files in the state directory, oldest first (by day, then number)."""
    try:
        names = [(m.group(1), int(m.group(2) or 0), m.group(0)) for p in store.path.iterdir()
                 if (m := PART_NAME.fullmatch(p.name))]
    except OSError:
        return []
    return [name for _day, _n, name in sorted(names)]


def _parts_index(data: Any) -> dict[str, tuple[list[int], tuple[float, float] | None]]:
    """``history.json``'s index of the closed parts: name -> (stamp, span); an entry not in its shape is left
    out (its part read at load)."""
    rows = data.get(PARTS) if isinstance(data, dict) else None
    out: dict[str, tuple[list[int], tuple[float, float] | None]] = {}
    for row in rows if type(rows) is list else []:
        if (type(row) is list and len(row) == 4 and type(row[0]) is str and type(row[1]) is list
                and all(type(x) is float and math.isfinite(x) for x in row[2:])):
            out[row[0]] = (row[1], (row[2], row[3]))
    return out


def _read_raw(store: StateDir, data: Any) -> dict[str, dict[str, list[Any]]] | None:
    """The raw tier from its own file when ``history.json``'s ``data`` names it and holds none itself; ``None``:
    the tier is ``data``'s (an earlier layout, or none). A file that is not one is set aside: no raw tier."""
    if not isinstance(data, dict) or data.get(RAW) != files.HISTORY_RAW:
        return None
    own = data.get("raw")
    if isinstance(own, dict) and own:
        return None
    blob = store.read_bytes(files.HISTORY_RAW)
    raw = read_raw_file(blob) if blob is not None else {}
    if raw is None:
        store.set_aside(files.HISTORY_RAW, "not a raw history file of this version")
        return {}
    return raw


def _with_coarse(store: StateDir, data: Any) -> History:
    """The history of ``history.json``'s ``data`` with its coarse tier (read now, or deferred by the index)."""
    stamp = store.stamp(files.HISTORY_COARSE)
    first_t = _indexed(data, stamp)
    if first_t is not None:
        history = History.deferred(data, first_t, lambda: store.read(files.HISTORY_COARSE, None))
    else:
        history = History.from_files(data, store.read(files.HISTORY_COARSE, None))
    history.coarse_stamp = stamp  # of the file as read (one set aside is written again: the tier changed)
    return history


def save_history(store: StateDir, history: History) -> None:
    """Both tiers: the coarse file first, only when it changed (removed when the tier is empty), the raw tier's
    file, then ``history.json`` with its index of the coarse file, when that changed (the same data: not
    written). A run stopped between the coarse file and ``history.json`` leaves buckets in both files, or the
    earlier layout's in ``history.json``: read back, the samples folded twice are folded once
    (``History.compact`` never folds a bucket again), an earlier layout's coarse tier wins over its coarse
    file, and the index names the file before: not this one, which is read."""
    if history.open_spans_days():
        history.close_open()
    _write_closed(store, history)  # before the open file that held their buckets
    coarse = history.encoded_files()[1]  # the coarse file's text, None when it holds the tier already
    stamp = history.coarse_stamp
    if coarse is not None:
        if history.coarse_gpus():
            store.write_encoded(files.HISTORY_COARSE, coarse)
            stamp = store.stamp(files.HISTORY_COARSE)
        else:
            store.remove(files.HISTORY_COARSE)
            stamp = None
        history.coarse_stamp = stamp
    first_t = history.coarse_index() if stamp is not None else None
    doc: dict[str, Any] = {"raw": {}, "coarse": {}, RAW: files.HISTORY_RAW}
    if first_t is not None:
        doc[INDEX] = {"stamp": list(stamp or ()), "first_t": first_t}
    if history.closed:
        doc[PARTS] = [[p.name, list(p.stamp or ()), *(p.span or ())] for p in history.closed]
        if history.cut_s is not None:
            doc[CUT] = history.cut_s
    store.write_bytes(files.HISTORY_RAW, raw_file(history.raw))  # before the file that names it
    if doc != history.listing:  # it changes with the coarse file only (once every coarse_bucket_s)
        store.write(files.HISTORY, doc)
        history.listing = doc
    for name in history.dropped:  # after the index that no longer names them
        store.remove(name)
    history.dropped.clear()


def _write_closed(store: StateDir, history: History) -> None:
    """Each closed part not written yet (just closed: named after its oldest bucket's UTC day) or changed."""
    taken: set[str | None] = {p.name for p in history.closed} | set(history.dropped)
    for part in history.closed:
        if part.name is not None and not part.changed:
            continue
        if part.name is None:
            part.name = _new_name(part.span[0] if part.span else 0.0, taken)
            taken.add(part.name)
        store.write_encoded(part.name, part.encoded())
        part.stamp, part.changed = store.stamp(part.name), False


def _new_name(oldest_s: float, taken: set[str | None]) -> str:
    """``history-coarse-YYYYMMDD.json`` (``-N`` after it when a part of that day is there already)."""
    day = datetime.fromtimestamp(oldest_s, UTC).strftime("%Y%m%d")
    n = 0
    while (name := files.HISTORY_COARSE_PART.format(day=day, n=f"-{n}" if n else "")) in taken:
        n += 1
    return name


def _indexed(data: Any, stamp: tuple[int, ...] | None) -> dict[str, float] | None:
    """The index's oldest bucket by GPU when it names the coarse file there (``stamp``) and ``data`` is this
    layout's (its own coarse tier empty); ``None``: read the coarse file now."""
    if stamp is None or not isinstance(data, dict):
        return None
    own, index = data.get("coarse"), data.get(INDEX)
    if (isinstance(own, dict) and own) or not isinstance(index, dict) or index.get("stamp") != list(stamp):
        return None
    first_t = index.get("first_t")
    if not isinstance(first_t, dict):
        return None
    out: dict[str, float] = {}
    for alias, t in first_t.items():
        if type(t) is not float or not math.isfinite(t):
            return None
        out[alias] = t
    return out
