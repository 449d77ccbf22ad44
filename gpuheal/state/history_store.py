"""The recorded history in the state directory: two files, so that a cron run rewrites only what changed.

``history.json`` holds the raw tier (every poll appends to it); ``history-coarse.json`` the coarse tier
(:mod:`gpuheal.state.history`), which changes once every ``coarse_bucket_s`` — a 100-GPU week holds ~5 MB
of coarse buckets, which each cron run read and wrote back unchanged while they shared one file (issue 29).
A state directory of the earlier layout (the coarse tier inside ``history.json``) is read as it is and
moved to this one by its first save.

``history.json``'s data also indexes the coarse file (``coarse_file``: ``{"stamp": [inode, size, mtime_ns,
ctime_ns], "first_t": {ALIAS: oldest bucket's start}}``): while the file is the one indexed (its stamp) a run
reads it only when it folds a bucket in, ages one out or forgets a GPU (:meth:`History.deferred`), not every
minute (a 100-GPU week's end: ~5 MB of JSON, ~10 ms a run, issue 29). An earlier version ignores the key and
writes ``history.json`` without it; a file that is not the one indexed (another writer's, an operator's, one
set aside) is read at load, as before. A coarse file damaged without its stamp changing is found at the next
run that reads it (within ``coarse_bucket_s``) instead of at the next load.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

from gpuheal.state import files
from gpuheal.state.history import History
from gpuheal.state.store import StateDir

INDEX = "coarse_file"  # history.json's data: the coarse file's stamp and each GPU's oldest bucket


def load_history(store: StateDir) -> History:
    """The recorded history (either layout); a corrupt file is set aside and its tier starts empty."""
    data = store.read(files.HISTORY, {})
    stamp = store.stamp(files.HISTORY_COARSE)
    first_t = _indexed(data, stamp)
    if first_t is not None:
        history = History.deferred(data, first_t, lambda: store.read(files.HISTORY_COARSE, None))
    else:
        history = History.from_files(data, store.read(files.HISTORY_COARSE, None))
    history.coarse_stamp = stamp  # of the file as read (one set aside is written again: the tier changed)
    return history


def save_history(store: StateDir, history: History) -> None:
    """Both tiers: the coarse file first, only when it changed (removed when the tier is empty), then
    ``history.json`` with its index of the coarse file. A run stopped between the two leaves buckets in
    both files, or the earlier layout's in ``history.json``: read back, the samples folded twice are folded
    once (``History.compact`` never folds a bucket again), an earlier layout's coarse tier wins over its
    coarse file, and the index names the file before: not this one, which is read."""
    data, coarse = history.encoded_files()  # the text of History.to_files' documents
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
    index = b"" if first_t is None else b',"%s":%s' % (INDEX.encode(), json.dumps(
        {"stamp": list(stamp or ()), "first_t": first_t}, separators=(",", ":"), allow_nan=False).encode("ascii"))
    store.write_encoded(files.HISTORY, _before_last_brace(data, index))  # a few large packed strings


def _before_last_brace(pieces: Iterable[bytes], extra: bytes) -> Iterator[bytes]:
    """The pieces of a JSON object with ``extra`` (``,"key":value``) inserted before its closing brace."""
    last = None
    for piece in pieces:
        if last is not None:
            yield last
        last = piece
    if last is not None:
        yield last[:-1] + extra + b"}"


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
