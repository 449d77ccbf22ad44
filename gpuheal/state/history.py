"""Recorded per-poll samples, bounded: the memory the rules and trends read.

Per alias, columns (``t`` in epoch seconds, then one list per metric, ``None`` = not known).
Samples younger than ``raw_hours`` (≥ 6.5 h: Rule 2 fits a 6 h window) are kept per poll; older
ones are averaged, a whole bucket at a time, into ``coarse_bucket_s`` buckets kept
``coarse_days`` (the weekly report), then dropped — so the state directory stops growing
(issue 2). Pure: no IO here; :mod:`gpuheal.state.history_store` stores the two documents of
:meth:`History.to_files` (the raw tier every run, the coarse tier's open part in its own file when it changed) and
the coarse tier's closed parts (:class:`ClosedPart`: a day's buckets each, written once, issue 29).

On disk each numeric column is packed (little-endian float64, base64, NaN = not known) and the
endpoint column run-length encoded: a fleet of 1000 GPUs holds 2.3 million samples, and decoding
them as JSON numbers cost about a second per cron run where unpacking costs a few milliseconds
(issue 2's benchmark). In memory the columns are plain lists to every reader; the raw tier read from its file
keeps each metric's bytes until a reader asks for that column (:class:`RawColumns`, issue 29).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
import sys
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import groupby
from typing import Any, NamedTuple

from gpuheal.model import Observation

METRICS = ("temp_c", "vram_used_mb", "util_pct", "power_w")
COLUMNS = ("t", *METRICS, "endpoint")


def _empty() -> dict[str, list[Any]]:
    return {c: [] for c in COLUMNS}


class History:
    """``raw`` and ``coarse``: per alias, the columns (plain lists).

    The coarse tier is decoded only when something asks for it (:attr:`coarse`, :meth:`series` with
    ``coarse``, or :meth:`compact` when a bucket is folded in or ages out: once every
    ``coarse_bucket_s``). A coarse block read exactly as :func:`_pack_columns` writes it is held as
    read (:class:`_Packed`) and written back as it was; nothing a rule judges reads it. A cron run
    thus no longer unpacks and repacks the whole week's buckets of every GPU to append one poll to the
    raw tier (a 100-GPU week: ~7.5 MB, ~80 ms a run at the week's end, issue 29).

    Nor does it read the coarse tier's file at all when its owner knows each GPU's oldest bucket
    (:meth:`deferred`, ``history_store``'s index of the file): it is read when asked for — a bucket to fold
    in, one to age out, a GPU gone — as it would have been read at load, so no run decides anything else."""

    __slots__ = ("raw", "_coarse", "_times", "_coarse_read", "_deferred", "_first_t", "coarse_stamp", "listing",
                 "closed", "cut_s", "dropped", "_newest_fold_t")

    def __init__(
        self,
        raw: dict[str, dict[str, list[Any]]] | None = None,
        coarse: dict[str, dict[str, list[Any]]] | None = None,
    ) -> None:
        self.raw: dict[str, dict[str, list[Any]]] = {} if raw is None else raw
        # alias -> its columns, or its block as read (decoded in place, in order, when asked for)
        self._coarse: dict[str, dict[str, list[Any]] | _Packed] = {} if coarse is None else dict(coarse)
        self._times: dict[str, tuple[float, ...]] = {}  # the coarse t columns decoded so far, by their text
        # the coarse blocks as read from the coarse tier's own file (None: not read from it), see to_files
        self._coarse_read: dict[str, _Packed] | None = None
        self._deferred: Callable[[], Any] | None = None  # the coarse file's reader, while it is not read
        self._first_t: dict[str, float] | None = None  # meanwhile: each GPU's oldest bucket, as indexed
        self.coarse_stamp: tuple[int, ...] | None = None  # the coarse file's, as read (history_store's)
        self.listing: Any = None  # history.json's data as read or last written (history_store's; None: neither)
        # The coarse tier's closed parts, oldest first (ClosedPart: a day's buckets each, read when asked for);
        # the tier is theirs, then the open part's (_coarse), a GPU's buckets each newer than the last (issue 29)
        self.closed: list[ClosedPart] = []
        self.cut_s: float | None = None  # buckets of the closed parts before it are aged out (read as absent)
        self.dropped: list[str] = []  # the files of closed parts aged out whole (history_store removes them)
        self._newest_fold_t: float | None = None  # the newest bucket folded by this run (when the part closes)

    @classmethod
    def deferred(cls, data: Any, first_t: dict[str, float], read_coarse: Callable[[], Any]) -> History:
        """:meth:`from_files` of ``history.json``'s ``data`` (its own coarse tier empty: this layout) and the
        coarse file's data, which ``read_coarse`` returns when the tier is first asked for. ``first_t``: each
        GPU's oldest bucket in that file, as :meth:`coarse_index` gave it when the file was last written or
        read (GPUs of a damaged block may be in it: it may only ask for the file more often). Until then
        the tier is the file as it is: :meth:`to_files` leaves it, :meth:`coarse_index` gives it again."""
        hist = cls.from_dict({"raw": data.get("raw") if isinstance(data, dict) else None})
        hist._deferred, hist._first_t = read_coarse, dict(first_t)
        return hist

    def _read_coarse(self) -> None:
        """Read the coarse tier's file now if it was deferred (:meth:`deferred`), as :meth:`from_files` would."""
        reader = self._deferred
        if reader is None:
            return
        self._deferred = self._first_t = None
        tier = History.from_files({"coarse": {}}, reader())
        self._coarse, self._coarse_read = tier._coarse, tier._coarse_read

    @property
    def coarse(self) -> dict[str, dict[str, list[Any]]]:
        """Every GPU's coarse columns (decoded now, if not yet): the open part's own, or, with closed parts,
        a GPU's buckets of every part in one list (a copy: the parts stay as they are)."""
        self._read_coarse()
        for alias in list(self._coarse):
            self._coarse_of(alias)
        if not self.closed:
            return self._coarse  # type: ignore[return-value]  # all decoded above
        aliases = dict.fromkeys(a for part in self.closed for a in self._part_blocks(part))
        merged = {a: self._merged_of(a) for a in (*aliases, *self._coarse)}
        return {a: cols for a, cols in merged.items() if cols is not None}

    def _part_blocks(self, part: ClosedPart) -> dict[str, Any]:
        """A closed part's blocks (its file read now, if not yet; a file not in the shape: no block)."""
        if part.blocks is None:
            data = part.read() if part.read is not None else None
            part.blocks, part.read = History.from_files({"coarse": {}}, data)._coarse, None
            if part.span is None:
                part.span = _span(part.blocks, self._times)
        return part.blocks

    def _part_columns(self, part: ClosedPart, alias: str) -> dict[str, list[Any]] | None:
        """``alias``'s columns in a closed part, decoded (a damaged block dropped, as at load)."""
        blocks = self._part_blocks(part)
        block = blocks.get(alias)
        if isinstance(block, _Packed):
            cols = block.columns(self._times)
            if cols is None:
                del blocks[alias]
                return None
            block = blocks[alias] = cols
        return block

    def _merged_of(self, alias: str) -> dict[str, list[Any]] | None:
        """``alias``'s buckets of every part, oldest first: a closed part's from :attr:`cut_s` on, and each
        bucket after the one before (a part written again by a run stopped before ``history.json`` holds
        some twice: read once, as :meth:`_fold` would have kept them)."""
        out = _empty()
        blocks = [(self._part_columns(part, alias), self.cut_s) for part in self.closed]
        for cols, cut in [*blocks, (self._coarse_of(alias), None)]:
            if not cols:
                continue
            last = out["t"][-1] if out["t"] else -math.inf
            keep = [i for i, t in enumerate(cols["t"]) if t > last and (cut is None or t >= cut)]
            for c in COLUMNS:
                out[c].extend(cols[c][i] for i in keep)
        return out if out["t"] else None

    def _coarse_of(self, alias: str) -> dict[str, list[Any]] | None:
        """``alias``'s coarse columns, decoded now if held as read; ``None``: none (a damaged block is
        dropped, as :meth:`from_dict` drops it)."""
        self._read_coarse()
        block = self._coarse.get(alias)
        if isinstance(block, _Packed):
            cols = block.columns(self._times)
            if cols is None:
                del self._coarse[alias]
                return None
            block = self._coarse[alias] = cols
        return block

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, History):
            return NotImplemented
        return self.raw == other.raw and self.coarse == other.coarse

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it was

    def __repr__(self) -> str:
        return f"History(raw={self.raw!r}, coarse={self.coarse!r})"

    # ------------------------------------------------------------------ (de)serialise
    @classmethod
    def from_dict(cls, data: Any) -> History:
        """Tolerant: a malformed alias block is dropped, never raised (state must not crash a run)."""
        hist = cls()
        if not isinstance(data, dict):
            return hist
        for attr in ("raw", "coarse"):
            block = data.get(attr)
            if not isinstance(block, dict):
                continue
            target: dict[str, Any] = hist.raw if attr == "raw" else hist._coarse
            times: dict[str, list[float]] = {}  # GPUs polled by the same runs share one t column
            for alias, cols in block.items():
                if isinstance(cols, dict) and "n" in cols:
                    held = _Packed.of(cols) if attr == "coarse" else None
                    unpacked = held if held is not None else _unpack_columns(cols, times)
                    if unpacked is not None:
                        target[str(alias)] = unpacked
                elif _valid_columns(cols):  # plain lists (tests, hand-made states)
                    plain: dict[str, list[Any]] = {c: [_number_or_none(v) for v in cols[c]] for c in METRICS}
                    plain["t"] = list(cols["t"])
                    plain["endpoint"] = [v if isinstance(v, str) else None for v in cols["endpoint"]]
                    target[str(alias)] = {c: plain[c] for c in COLUMNS}
        return hist

    @classmethod
    def from_files(cls, data: Any, coarse: Any) -> History:
        """The history from ``history.json``'s data and the coarse tier's own file's (``coarse``, in the
        shape :meth:`to_files` writes; ``None``: no such file). A ``history.json`` with a coarse tier in it
        is the earlier layout (one file) and holds the tier: its coarse file, if any, is older and ignored."""
        old_coarse = data.get("coarse") if isinstance(data, dict) else None
        tier = coarse.get("coarse") if isinstance(coarse, dict) else None
        if (isinstance(old_coarse, dict) and old_coarse) or not isinstance(tier, dict):
            return cls.from_dict(data)  # no coarse file, or one not in its shape: written again by the next save
        hist = cls.from_dict({"raw": data.get("raw") if isinstance(data, dict) else None, "coarse": tier})
        hist._coarse_read = {a: b for a, b in hist._coarse.items() if isinstance(b, _Packed)}
        return hist

    def to_dict(self) -> dict[str, Any]:
        """Both tiers in one document (the earlier layout of ``history.json``; tests, benchmarks)."""
        if self.closed:
            return {"raw": self._raw_dict(), "coarse": {a: _pack_columns(c) for a, c in self.coarse.items()}}
        return {"raw": self._raw_dict(), "coarse": self._coarse_dict()}

    def to_files(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``history.json``'s data — the raw tier, its ``coarse`` left empty (an earlier version reads it
        as a history with no coarse tier yet) — and the coarse tier's own file's, ``{"coarse": {...}}``, or
        ``None`` when that file already holds it: nothing was folded in, dropped or decoded since it was
        read (every block is still the one read). The coarse tier changes once every ``coarse_bucket_s``
        while the raw tier changes every poll; a 100-GPU week holds ~5 MB of coarse buckets that a cron
        run no longer writes each minute (issue 29)."""
        raw = {"raw": self._raw_dict(), "coarse": {}}
        return raw, None if self._coarse_as_read() else {"coarse": self._coarse_dict()}

    def encoded_files(self) -> tuple[Iterator[bytes], Iterator[bytes] | None]:
        """:meth:`to_files`'s two documents as the UTF-8 of ``json.dumps(doc, separators=(",", ":"))``, in
        pieces (a GPU's block a piece), byte for byte: what ``history_store`` writes. Built from the packed
        bytes, as base64 needs no JSON escape: the C encoder scanned every packed string for characters to
        escape and the text was encoded to UTF-8 again: a 100-GPU save 12 -> 7 ms on a loaded VM (issue 29)."""
        if not all(type(a) is str for a in self.raw) or not all(type(a) is str for a in self._coarse):
            data, coarse = self.to_files()  # json turns a key that is not a string into text its own way
            return iter([_json(data)]), None if coarse is None else iter([_json(coarse)])
        raw = _encoded_doc("raw", self.raw, _encoded_columns, b',"coarse":{}}')
        if self._coarse_as_read():
            return raw, None
        return raw, _encoded_doc("coarse", self._coarse, _encoded_coarse_block, b"}")

    def coarse_gpus(self) -> int:
        """How many GPUs have coarse buckets (none decoded to count them)."""
        return len(self._first_t) if self._first_t is not None else len(self._coarse)

    def coarse_index(self) -> dict[str, float] | None:
        """Each GPU's oldest coarse bucket (none decoded): what :meth:`deferred` needs to leave the coarse
        file unread until a run changes it. ``None`` where a GPU has no bucket (a tier a compaction would
        change: read it)."""
        if self._first_t is not None:
            return dict(self._first_t)
        index: dict[str, float] = {}
        for alias, block in self._coarse.items():
            if isinstance(block, _Packed):
                index[alias] = block.first_t
            elif block["t"]:
                index[alias] = block["t"][0]
            else:
                return None
        return index

    def _coarse_as_read(self) -> bool:
        """Whether the coarse tier's own file holds the tier as it is: every block still the one read (or the
        file not read at all)."""
        if self._deferred is not None:
            return True
        read = self._coarse_read
        return read is not None and read.keys() == self._coarse.keys() and all(
            self._coarse[a] is block for a, block in read.items())

    def _raw_dict(self) -> dict[str, Any]:
        return {alias: _pack_columns(cols) for alias, cols in self.raw.items()}

    def _coarse_dict(self) -> dict[str, Any]:
        self._read_coarse()
        return {alias: cols.block if isinstance(cols, _Packed) else _pack_columns(cols)
                for alias, cols in self._coarse.items()}

    # ------------------------------------------------------------------ update
    def add(self, obs: Observation, aliases: tuple[str, ...] | None = None) -> None:
        """Append one poll; out-of-order or duplicate times (a clock step back) are ignored.

        ``t`` is stored exactly as the run's ``now`` (``obs.at``), never rounded: a time rounded up
        to the millisecond lay after ``now`` and dropped the current poll out of its own window
        (issue 9, point 1). Packed as float64, it costs nothing more on disk."""
        t = obs.at.timestamp()
        for alias, sample in obs.gpus.items():
            cols = self.raw.setdefault(alias, _empty())
            if cols["t"] and t <= cols["t"][-1]:
                continue
            if isinstance(cols, RawColumns):  # as read: its bytes too, its metrics left packed
                cols.append("t", t)
                for metric in METRICS:
                    cols.append(metric, getattr(sample, metric))
                cols.append("endpoint", sample.endpoint)
                continue
            cols["t"].append(t)
            for metric in METRICS:
                cols[metric].append(getattr(sample, metric))
            cols["endpoint"].append(sample.endpoint)
        if aliases is not None:  # a GPU removed from the config: forget it
            if self._first_t is not None and any(alias not in aliases for alias in self._first_t):
                self._read_coarse()
            if self.closed and any(alias not in aliases for alias in (*self.raw, *self._coarse)):
                self._forget_closed(aliases)
            for block in (self.raw, self._coarse):
                for alias in list(block):
                    if alias not in aliases:
                        del block[alias]

    def compact(self, now_s: float, raw_hours: float, bucket_s: int, coarse_days: float) -> None:
        """Move samples older than ``raw_hours`` into coarse buckets; drop what is too old."""
        # Fold only whole buckets: the cut is rounded down to a bucket boundary, so each bucket is
        # folded once with all its samples (folding poll by poll kept only a bucket's first one).
        raw_cut = now_s - raw_hours * 3600
        raw_cut -= raw_cut % bucket_s
        coarse_cut = now_s - coarse_days * 86400
        for alias, cols in self.raw.items():
            ts = cols["t"]
            n_old = 0
            while n_old < len(ts) and ts[n_old] < raw_cut:
                n_old += 1
            if n_old:
                if isinstance(cols, RawColumns):  # only the folded samples decoded
                    old = {c: cols.head(c, n_old) for c in COLUMNS}
                    cols.cut(n_old)
                else:
                    old = {c: cols[c][:n_old] for c in COLUMNS}
                    for c in COLUMNS:
                        del cols[c][:n_old]
                self._fold(alias, old, bucket_s)
        self._age_closed(coarse_cut, bucket_s)
        if self._first_t is not None and any(t < coarse_cut for t in self._first_t.values()):
            self._read_coarse()  # a bucket to age out (else none: the loops below find nothing in an unread tier)
        for alias, held in list(self._coarse.items()):
            if isinstance(held, _Packed) and held.first_t >= coarse_cut:
                continue  # nothing to drop: left as read
            kept = self._coarse_of(alias)
            if kept is None:
                continue
            ts = kept["t"]
            n_old = 0
            while n_old < len(ts) and ts[n_old] < coarse_cut:
                n_old += 1
            if n_old:
                for c in COLUMNS:
                    del kept[c][:n_old]
        for alias in [a for a, cols in self.raw.items() if not cols["t"]]:
            del self.raw[alias]
        for alias in [a for a, c in self._coarse.items() if (c.n if isinstance(c, _Packed) else len(c["t"])) == 0]:
            del self._coarse[alias]

    def _fold(self, alias: str, old: dict[str, list[Any]], bucket_s: int) -> None:
        """Append ``old``'s whole buckets to ``alias``'s coarse columns, a bucket once (never one at or before
        the newest kept). A block held as read takes them in its packed form (:meth:`_Packed.appended`): the
        same block as decoding, appending and packing it again, without a Python object per kept bucket — a
        week of 100 GPUs' buckets was decoded and packed again every ``coarse_bucket_s`` (issue 29)."""
        self._read_coarse()
        rows = _bucket_rows(old, bucket_s)
        if rows:
            self._newest_fold_t = max(rows[-1].start, self._newest_fold_t or rows[-1].start)
        if alias not in self._coarse and self.closed:  # its newest bucket is in a closed part, if any
            last = self._closed_last_t(alias)
            rows = [r for r in rows if last is None or r.start > last]
        held = self._coarse.get(alias)
        if isinstance(held, _Packed):
            grown = held.appended(rows)
            if grown is not None:
                self._coarse[alias] = grown
                return
        target = self._coarse_of(alias)
        if target is None:
            target = _empty()
            self._coarse[alias] = target
        for start, means, state in rows:
            if target["t"] and start <= target["t"][-1]:
                continue  # already folded (or clock skew): never duplicate a bucket
            target["t"].append(start)
            for metric, mean in zip(METRICS, means, strict=True):
                target[metric].append(mean)
            target["endpoint"].append(state)

    # ------------------------------------------------------------------ the closed parts (issue 29)
    def _closed_last_t(self, alias: str) -> float | None:
        """``alias``'s newest bucket in the closed parts (not aged out), read from the newest part that has it."""
        for part in reversed(self.closed):
            block = self._part_blocks(part).get(alias)  # decoded, not kept: a day of every GPU is read here
            cols = block.columns(self._times) if isinstance(block, _Packed) else block
            if cols and cols["t"]:
                last: float = cols["t"][-1]
                return None if self.cut_s is not None and last < self.cut_s else last
        return None

    def _forget_closed(self, aliases: tuple[str, ...]) -> None:
        """A GPU removed from the config leaves the closed parts too: each part that had it is written again."""
        for part in self.closed:
            blocks = self._part_blocks(part)
            for alias in [a for a in blocks if a not in aliases]:
                del blocks[alias]
                part.changed = True

    def _age_closed(self, coarse_cut: float, bucket_s: int) -> None:
        """Buckets before ``coarse_cut`` leave the closed parts: a part all older goes (its file removed), the
        buckets of one partly older are read as absent from then on (:attr:`cut_s`), its file left as it is —
        not a day's file written again every ``coarse_bucket_s``. The cut kept is the next bucket's start (a
        bucket starts at a multiple of ``bucket_s``: the same buckets are before it), so that ``history.json``,
        which holds it, changes once a bucket, not every run."""
        coarse_cut = float(math.ceil(coarse_cut / bucket_s) * bucket_s) if bucket_s > 0 else coarse_cut
        kept: list[ClosedPart] = []
        for part in self.closed:
            if part.span is None:
                self._part_blocks(part)  # a part not indexed: its span from its buckets
            span = part.span
            if span is None or span[1] < coarse_cut:  # no bucket left in it
                if part.name is not None:
                    self.dropped.append(part.name)
                continue
            if span[0] < coarse_cut and (self.cut_s is None or self.cut_s < coarse_cut):
                self.cut_s = coarse_cut
            kept.append(part)
        self.closed = kept

    def open_spans_days(self) -> bool:
        """Whether this run folded a bucket of a later UTC day than the open part's oldest: the part is then
        closed (:meth:`close_open`), so that a closed day's file is written once and the open part holds a day."""
        if self._newest_fold_t is None or self._deferred is not None:
            return False
        index = self.coarse_index()
        return bool(index) and index is not None and _day(min(index.values())) < _day(self._newest_fold_t)

    def close_open(self) -> ClosedPart:
        """The open part becomes the newest closed one (to be written: ``name`` None) and the open part empty."""
        self._read_coarse()
        part = ClosedPart(name=None, blocks=self._coarse, span=_span(self._coarse, self._times), changed=True)
        self.closed.append(part)
        self._coarse, self._coarse_read = {}, None
        return part

    def attach_closed(self, parts: list[ClosedPart], cut_s: float | None) -> None:
        """The closed parts of the state directory, oldest first, and the age cut their index gave."""
        self.closed, self.cut_s = parts, cut_s

    def trim_open(self) -> None:
        """Drop the open part's buckets at or before a GPU's newest in the closed parts: a run stopped between
        writing a part it closed and removing the open file leaves them in both (read at load, not indexed)."""
        self._read_coarse()
        for alias in list(self._coarse):
            last = self._closed_last_t(alias)
            block = self._coarse[alias]
            first = block.first_t if isinstance(block, _Packed) else (block["t"] or [math.inf])[0]
            if last is None or first > last:
                continue
            cols = self._coarse_of(alias)
            if cols is None:
                continue
            n_old = sum(1 for t in cols["t"] if t <= last)
            for c in COLUMNS:
                del cols[c][:n_old]
            if not cols["t"]:
                del self._coarse[alias]

    # ------------------------------------------------------------------ queries
    def series(
        self, alias: str, metric: str, since_s: float | None = None, coarse: bool = False
    ) -> list[tuple[float, float]]:
        """(t, value) pairs with known values, oldest first; ``coarse`` prepends the old buckets."""
        out: list[tuple[float, float]] = []
        tier = (self._merged_of(alias) if self.closed else self._coarse_of(alias)) if coarse else None
        blocks = [tier, self.raw.get(alias)]
        for cols in blocks:
            if not cols:
                continue
            for t, v in zip(cols["t"], cols[metric], strict=False):
                if v is not None and (since_s is None or t >= since_s):
                    out.append((t, v))
        return out

    def sample_count(self) -> int:
        self._read_coarse()
        if self.closed:
            return sum(len(c["t"]) for c in self.raw.values()) + sum(len(c["t"]) for c in self.coarse.values())
        return sum(len(c["t"]) for c in self.raw.values()) + sum(
            c.n if isinstance(c, _Packed) else len(c["t"]) for c in self._coarse.values())


def _valid_columns(cols: Any) -> bool:
    if not isinstance(cols, dict) or not all(isinstance(cols.get(c), list) for c in COLUMNS):
        return False
    n = len(cols["t"])
    return all(len(cols[c]) == n for c in COLUMNS) and all(_number_or_none(t) is not None for t in cols["t"])


class _Bucket(NamedTuple):
    """One coarse bucket folded from raw samples: its start, each metric's mean (``None``: none known), its
    endpoint state."""

    start: float
    means: tuple[float | None, ...]  # in METRICS' order
    endpoint: Any


def _bucket_rows(old: dict[str, list[Any]], bucket_s: int) -> list[_Bucket]:
    """``old``'s samples averaged by bucket, oldest first: a metric's known values rounded to 2 places; the
    endpoint the bucket's last failed probe, else its last state (a bucket with a failed probe in it is never
    summarised as ok)."""
    buckets: dict[float, list[int]] = {}
    for i, t in enumerate(old["t"]):
        buckets.setdefault(t - t % bucket_s, []).append(i)
    rows: list[_Bucket] = []
    for start in sorted(buckets):
        idx = buckets[start]
        means: list[float | None] = []
        for metric in METRICS:
            vals = [old[metric][i] for i in idx if old[metric][i] is not None]
            means.append(round(sum(vals) / len(vals), 2) if vals else None)
        states = [old["endpoint"][i] for i in idx]
        bad = [s for s in states if s not in ("ok", None)]
        rows.append(_Bucket(start, tuple(means), bad[-1] if bad else states[-1]))
    return rows


# --------------------------------------------------------------------------- packed columns

_BIG_ENDIAN = sys.byteorder == "big"


def _number_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return value if math.isfinite(value) else None
    except OverflowError:  # an int beyond float range
        return None


def _pack(values: list[Any]) -> str:
    """float64 little-endian, base64; ``None`` (or anything not a number) → NaN (:func:`_packed`)."""
    return _packed(values).decode("ascii")


def _packed(values: list[Any]) -> bytes:
    """:func:`_pack`'s text as ASCII bytes: :func:`_float64`, base64."""
    return binascii.b2a_base64(_float64(values), newline=False)


def _float64(values: list[Any]) -> bytes:
    """The column as float64 little-endian; ``None`` (or anything not a number) → NaN.

    A column of numbers only (the usual one) is packed by ``struct`` in one call, the same bytes as
    ``array("d")`` in little-endian order: no scan for ``None`` and no array built first (a 100-GPU
    fleet packs 500 columns of ~390 values every cron run; issue 29). Anything else raises there and
    takes the path below, as does a column whose newest value is not known (it would fail only at its end)."""
    if not values or values[-1] is not None:
        try:
            return struct.pack(f"<{len(values)}d", *values)
        except (struct.error, TypeError, OverflowError):
            pass
    if None in values:
        values = [math.nan if v is None else v for v in values]
    try:
        packed = array("d", values)
    except (TypeError, OverflowError):  # never let a bad value stop the state being saved
        packed = array("d", [math.nan if _number_or_none(v) is None else v for v in values])
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def _unpack(text: Any, n: int) -> list[Any] | None:
    """Inverse of :func:`_pack`; ``None`` when ``text`` is not ``n`` packed numbers."""
    if not isinstance(text, str):
        return None
    raw = _packed_bytes(text, n)
    return None if raw is None else _floats(raw)


def _packed_bytes(text: str, n: int) -> bytes | None:
    """The bytes of ``n`` packed numbers written as ``text`` (strict base64), or ``None``."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == 8 * n else None


def _floats(raw: bytes) -> list[Any]:
    """Inverse of :func:`_float64` (``len(raw)`` a multiple of 8): NaN and ±inf read as ``None``."""
    packed = array("d")
    packed.frombytes(raw)
    if _BIG_ENDIAN:
        packed.byteswap()
    values: list[Any] = packed.tolist()
    # A float64 is NaN/inf only if its top byte is 0x7f/0xff (exponent bits all set); finite
    # values with that byte are beyond 2**1008. Checking the bytes keeps the common case in C.
    top = raw[7::8]
    if b"\x7f" in top or b"\xff" in top:
        values = [v if math.isfinite(v) else None for v in values]
    return values


def _runs(states: list[Any]) -> list[list[Any]]:
    """The endpoint column run-length encoded: ``[[state, count], ...]``."""
    if states and states.count(states[0]) == len(states):  # the usual case: one state all along, counted in C
        return [[states[0], len(states)]]
    return [[state, len(list(group))] for state, group in groupby(states)]


def _pack_columns(cols: dict[str, list[Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(cols["t"])}
    for c in ("t", *METRICS):
        out[c] = _pack(cols[c])
    out["endpoint"] = _runs(cols["endpoint"])
    return out


# --------------------------------------------------------------------------- the files' text, encoded

_B64_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_COLUMN_KEYS = tuple(f',"{c}":"'.encode() for c in ("t", *METRICS))  # what precedes a packed column's text


def _json(value: Any) -> bytes:
    """``json.dumps(value, separators=(",", ":"), allow_nan=False)``, ASCII (``ensure_ascii``) bytes."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("ascii")


def _encoded_columns(cols: dict[str, list[Any]]) -> bytes:
    """``_json(_pack_columns(cols))``, from the packed bytes: base64 text is its own JSON string."""
    parts = [b'{"n":', str(len(cols["t"])).encode()]
    for key, c in zip(_COLUMN_KEYS, ("t", *METRICS), strict=True):
        parts += (key, _packed(cols[c]), b'"')
    parts += (b',"endpoint":', _json(_runs(cols["endpoint"])), b"}")
    return b"".join(parts)


def _encoded_coarse_block(block: dict[str, list[Any]] | _Packed) -> bytes:
    """A coarse block's JSON: decoded columns packed, a block held as read written back as it was read —
    its strings as they are where they are base64 (no character to escape), else through ``json``."""
    if not isinstance(block, _Packed):
        return _encoded_columns(block)
    held = block.block
    parts = [b'{"n":', str(held["n"]).encode()]  # _Packed.of: the keys in _BLOCK_KEYS' order, n an int
    for key, c in zip(_COLUMN_KEYS, ("t", *METRICS), strict=True):
        text: str = held[c]
        if block.canonical:
            parts += (key, text.encode("ascii"), b'"')
        elif text.isascii() and not (ascii_text := text.encode("ascii")).translate(None, _B64_CHARS):
            parts += (key, ascii_text, b'"')
        else:  # damaged past its first time (found when decoded): escaped where needed, as json.dumps did
            parts += (key[:-1], _json(text))
    parts += (b',"endpoint":', _json(held["endpoint"]), b"}")
    return b"".join(parts)


def _encoded_doc(tier: str, blocks: dict[str, Any], encode: Callable[[Any], bytes], tail: bytes) -> Iterator[bytes]:
    """``{"<tier>":{ALIAS:BLOCK,...}`` then ``tail``, a GPU's block a piece (every alias a string)."""
    sep = b'{"' + tier.encode() + b'":{'
    for alias, block in blocks.items():
        yield sep + _json(alias) + b":" + encode(block)
        sep = b","
    yield (b'{"' + tier.encode() + b'":{}' if sep != b"," else b"}") + tail


_BLOCK_KEYS = ("n", "t", *METRICS, "endpoint")  # what _pack_columns writes, in its order


@dataclass(slots=True, eq=False)
class ClosedPart:
    """A closed part of the coarse tier: the buckets folded while it was open (a UTC day's, about), in its own
    file (``name``; ``None`` until written), never written again unless a GPU is forgotten (``changed``), read
    only when a query, a fold's check for a bucket kept already or a forgotten GPU needs it (``read``, while
    ``blocks`` is ``None``). ``span``: its oldest and newest bucket (from ``history.json``'s index, or the
    blocks), what ageing needs (issue 29: a week's coarse file was read and written whole every 10 minutes)."""

    name: str | None
    blocks: dict[str, Any] | None = None
    read: Callable[[], Any] | None = None
    span: tuple[float, float] | None = None
    changed: bool = False
    stamp: tuple[int, ...] | None = None

    def encoded(self) -> Iterator[bytes]:
        """The part's file's data, ``{"coarse": {ALIAS: BLOCK}}``, as the coarse file's (every alias text)."""
        blocks = {_key_text(a): b for a, b in (self.blocks or {}).items()}
        return _encoded_doc("coarse", blocks, _encoded_coarse_block, b"}")


def _day(t: float) -> int:
    """The UTC day of epoch second ``t``."""
    return int(t // 86400)


def _span(blocks: dict[str, Any], times: dict[str, tuple[float, ...]]) -> tuple[float, float] | None:
    """The oldest and newest bucket of ``blocks`` (a packed block's newest from its t column), ``None``: none."""
    first, last = math.inf, -math.inf
    for block in blocks.values():
        if isinstance(block, _Packed):  # its t column only (a damaged block keeps none of its buckets when read)
            ts = _unpack(block.block["t"], block.n) or [block.first_t]
            if None in ts:  # not a time: the block is dropped when read
                ts = [block.first_t]
        else:
            ts = block["t"]
        if ts:
            first, last = min(first, ts[0]), max(last, ts[-1])
    return (first, last) if first <= last else None


@dataclass(frozen=True, slots=True, eq=False)
class _Packed:
    """A coarse block held as read, in the shape :func:`_pack_columns` writes (:meth:`of`), written back
    as it was while nothing decodes it."""

    block: dict[str, Any]
    n: int
    first_t: float  # the oldest bucket's start (what :meth:`History.compact` drops by)
    canonical: bool = False  # every packed text base64 as _packed writes it (:meth:`appended`'s): no escape

    @classmethod
    def of(cls, block: dict[str, Any]) -> _Packed | None:
        """``block`` held as read, or ``None``: decode it now, as before (another writer's shape, a
        length that does not match ``n``, an endpoint column :func:`_pack_columns` would not write, an
        oldest time that is not one). Reads no value but the first time: no base64 decoded, no Python
        object per value. A block whose base64 is damaged past its first time is found when it is
        decoded (:meth:`columns`), and dropped then, as a damaged block is at load."""
        if tuple(block) != _BLOCK_KEYS:
            return None
        n = block["n"]
        if type(n) is not int or n < 1:
            return None
        size = 4 * -(-8 * n // 3)
        if any(type(block[c]) is not str or len(block[c]) != size for c in _BLOCK_KEYS[1:-1]):
            return None
        try:
            head = base64.b64decode(block["t"][:12], validate=True)
        except (binascii.Error, ValueError):
            return None
        first_t: float = struct.unpack("<d", head[:8])[0]
        if not math.isfinite(first_t):
            return None
        runs = block["endpoint"]
        if type(runs) is not list:
            return None
        total, last = 0, None
        for i, run in enumerate(runs):
            if (type(run) is not list or len(run) != 2 or not (run[0] is None or type(run[0]) is str)
                    or type(run[1]) is not int or run[1] < 1 or (i and run[0] == last)):
                return None  # adjacent runs of one state are one run when packed
            total, last = total + run[1], run[0]
        return cls(block, n, first_t) if total == n else None

    def appended(self, rows: list[_Bucket]) -> _Packed | None:
        """This block with ``rows`` after its newest bucket (those at or before it skipped, as
        :meth:`History._fold` skips them), packed as :func:`_pack_columns` packs the decoded columns with them
        appended; ``None``: decode it instead — a column that is not ``n`` packed numbers, a time not known, a
        value that decoding would not give back as these bytes (an infinity, a NaN other than the one
        :func:`_float64` writes)."""
        packed: list[bytes] = []
        for c in ("t", *METRICS):
            raw = _exact_column(self.block[c], self.n, c != "t")
            if raw is None:
                return None
            packed.append(raw)
        last_t: float = struct.unpack("<d", packed[0][-8:])[0]
        rows = [r for r in rows if r.start > last_t]
        if not rows:
            return self
        added = [_float64([r.start for r in rows])]
        added += (_float64([r.means[i] for r in rows]) for i in range(len(METRICS)))
        runs = [list(run) for run in self.block["endpoint"]]
        for r in rows:
            if runs[-1][0] == r.endpoint:
                runs[-1][1] += 1
            else:
                runs.append([r.endpoint, 1])
        n = self.n + len(rows)
        block: dict[str, Any] = {"n": n}
        whole = 4 * (8 * self.n // 3)  # the text of the whole 3-byte groups, as it is: base64 is group by group
        for c, raw, more in zip(("t", *METRICS), packed, added, strict=True):
            tail = binascii.b2a_base64(raw[3 * (whole // 4) :] + more, newline=False).decode("ascii")
            block[c] = self.block[c][:whole] + tail
        block["endpoint"] = runs
        return _Packed(block, n, self.first_t, canonical=True)

    def columns(self, times: dict[str, tuple[float, ...]]) -> dict[str, list[Any]] | None:
        """The columns, or ``None`` for a damaged block (``times``: the t columns decoded before, by
        their text, shared as :func:`_unpack_columns` shares them; tuples, as a decoded column changes)."""
        text = self.block["t"]
        known = times.get(text)
        cols = _unpack_columns(self.block, {} if known is None else {text: known})  # type: ignore[dict-item]
        if cols is not None and known is None:
            times[text] = tuple(cols["t"])
        return cols


_NAN_BYTES = struct.pack("<d", math.nan)  # what _float64 writes for a value not known


def _exact_column(text: str, n: int, unknown_ok: bool) -> bytes | None:
    """A packed column's ``n`` float64 as they are, when decoding it and packing it again gives these bytes:
    every value finite, or (``unknown_ok``) the NaN :func:`_float64` writes; ``None`` otherwise (damaged base64,
    another length, an infinity, another NaN: decoded, they become ``None``, or the block is dropped)."""
    raw = _packed_bytes(text, n)
    if raw is None:
        return None
    top = raw[7::8]  # as in _floats: only a value with this top byte can be NaN or infinite
    if b"\x7f" in top or b"\xff" in top:
        values = _floats(raw)
        for i, value in enumerate(values):
            if value is None and not (unknown_ok and raw[8 * i : 8 * i + 8] == _NAN_BYTES):
                return None
    return raw


def _unpack_columns(block: dict[str, Any], times: dict[str, list[float]]) -> dict[str, list[Any]] | None:
    """``times``: the ``t`` columns unpacked so far, by their packed text. Every GPU of a fleet is
    sampled by the same cron runs, so most share one; a copy of the list shares its floats (1000
    GPUs x 390 samples: ~9 MB and ~0.03 s less a run, issue 12 benchmark)."""
    n = block.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        return None
    cols: dict[str, list[Any]] = {}
    packed_t = block.get("t")
    known_t = times.get(packed_t) if isinstance(packed_t, str) else None
    if known_t is not None and len(known_t) == n:
        cols["t"] = list(known_t)
    for c in ("t", *METRICS):
        values = cols.get(c) or _unpack(block.get(c), n)
        if values is None:
            return None
        cols[c] = values
    if None in cols["t"]:
        return None
    if known_t is None and isinstance(packed_t, str):
        times[packed_t] = cols["t"]
    endpoint = _endpoint(block.get("endpoint"), n)
    if endpoint is None:
        return None
    cols["endpoint"] = endpoint
    return {c: cols[c] for c in COLUMNS}


def _endpoint(runs: Any, n: int) -> list[Any] | None:
    """The endpoint column from its runs (:func:`_runs`), ``None`` unless they are ``n`` states in runs."""
    if not isinstance(runs, list):
        return None
    endpoint: list[Any] = []
    for run in runs:
        if (
            not isinstance(run, list)
            or len(run) != 2
            or not (run[0] is None or isinstance(run[0], str))
            or not isinstance(run[1], int)
            or run[1] < 1
            or len(endpoint) + run[1] > n
        ):
            return None
        endpoint.extend([run[0]] * run[1])
    return endpoint if len(endpoint) == n else None


# --------------------------------------------------------------------------- the raw tier's own file

RAW_MAGIC = b"gpuheal-history-raw 1\n"  # the first line of history_store's RAW file (the format's version)
_RAW_COLUMNS = ("t", *METRICS)  # a GPU's numeric columns in the file, in this order


def raw_file(raw: dict[str, dict[str, list[Any]]]) -> Iterator[bytes]:
    """The raw tier as one file, in pieces: :data:`RAW_MAGIC`, a line of JSON ``{"gpus": [[ALIAS, N, ENDPOINT
    RUNS], ...]}``, then each GPU's five numeric columns (:data:`_RAW_COLUMNS`), ``N`` float64 each,
    little-endian (NaN: not known), in the order of the line. The numbers as they are in memory, not base64 text
    inside JSON: a 100-GPU fleet's ~2 MB raw tier was decoded from base64 and scanned by the JSON parser every
    cron run (~19 ms of ~87 ms a run at a week's first day, issue 29), and encoded again to be written."""
    gpus = [[_key_text(alias), len(cols["t"]), _runs(cols["endpoint"])] for alias, cols in raw.items()]
    yield RAW_MAGIC + _json({"gpus": gpus}) + b"\n"
    last_t: list[Any] | None = None
    packed_t = b""
    for cols in raw.values():
        if isinstance(cols, RawColumns) and (packed := cols.packed()) is not None:
            yield packed  # as read, with this run's samples appended and the folded ones cut off
            continue
        if cols["t"] != last_t:  # GPUs polled by the same runs share their times: packed once
            last_t, packed_t = cols["t"], _float64(cols["t"])
        yield b"".join([packed_t, *(_float64(cols[c]) for c in METRICS)])


class RawColumns(dict[str, list[Any]]):
    """A GPU's raw columns as :func:`read_raw_file` read them: ``t`` and ``endpoint`` decoded, each metric's
    float64 bytes kept and decoded into its list only when it is read (``cols["util_pct"]``: Rule 2 fits
    VRAM and Rule 8 temperature every poll; nothing a poll judges reads utilisation or power). The bytes are
    kept up to date through :meth:`History.add` (:meth:`append`) and :meth:`History.compact` (:meth:`head`,
    :meth:`cut`), so the file is written from them: a 100-GPU fleet's 6.5 h of samples were turned into
    ~195,000 Python floats and packed again every cron run to append one poll (issue 29).

    A plain dict to every reader: asking for the whole mapping (its keys, items, length, equality, repr,
    a copy) decodes every column first. The lists are the history's: changed only through those methods (a
    list whose length no longer matches its bytes is packed from the list again, :meth:`packed`)."""

    __slots__ = ("_bytes",)

    def __init__(self, t: list[Any], spans: dict[str, bytes], endpoint: list[Any]) -> None:
        super().__init__(t=t, endpoint=endpoint)
        self._bytes = spans  # every numeric column's float64 bytes (t's too), as the file will hold them

    def __missing__(self, column: str) -> list[Any]:
        span = self._bytes.get(column) if column in METRICS else None
        if span is None:
            raise KeyError(column)
        values = self[column] = _floats(span)
        return values

    def whole(self) -> dict[str, list[Any]]:
        """Every column decoded, in :data:`COLUMNS`' order (a plain dict)."""
        return {c: self[c] for c in COLUMNS}

    def append(self, column: str, value: Any) -> None:
        """``value`` appended to ``column``: to its bytes as :func:`_float64` packs it, and to its list where
        decoded. A value that its bytes would not give back as it is (not a finite float nor ``None``: an
        infinity, an int, junk) decodes the column first, so that its list holds the value itself, as a
        plain column's would until the next run reads it back."""
        if column in self._bytes:
            if not (value is None or (type(value) is float and math.isfinite(value))):
                self[column]  # noqa: B018 - decoded now (a metric's; t and endpoint always are)
            self._bytes[column] += _float64([value])
        if dict.__contains__(self, column):
            dict.__getitem__(self, column).append(value)

    def head(self, column: str, n: int) -> list[Any]:
        """The first ``n`` values of ``column``, decoding only them when its list is not decoded."""
        if dict.__contains__(self, column) or column not in self._bytes:
            return self[column][:n]
        return _floats(self._bytes[column][: 8 * n])

    def cut(self, n: int) -> None:
        """The first ``n`` samples of every column dropped."""
        for column, span in self._bytes.items():
            self._bytes[column] = span[8 * n :]
        for values in dict.values(self):
            del values[:n]

    def packed(self) -> bytes | None:
        """The GPU's five numeric columns as :func:`raw_file` writes them; ``None`` when a decoded list's length
        no longer matches its bytes (changed by someone else: packed from the lists)."""
        n = len(dict.__getitem__(self, "t"))
        spans = [self._bytes[c] for c in _RAW_COLUMNS]
        if any(len(span) != 8 * n for span in spans) or any(len(v) != n for v in dict.values(self)):
            return None
        return b"".join(spans)

    # a plain dict to whoever asks for the whole: every column decoded first
    def __iter__(self) -> Iterator[str]:
        return iter(self.whole())

    def __len__(self) -> int:
        return len(COLUMNS)

    def __contains__(self, column: object) -> bool:
        return column in COLUMNS

    def get(self, column: str, default: Any = None) -> Any:
        return self[column] if column in COLUMNS else default

    def keys(self) -> Any:
        return self.whole().keys()

    def items(self) -> Any:
        return self.whole().items()

    def values(self) -> Any:
        return self.whole().values()

    def copy(self) -> dict[str, list[Any]]:
        return {c: list(v) for c, v in self.whole().items()}

    def __eq__(self, other: object) -> bool:
        return self.whole() == other

    def __ne__(self, other: object) -> bool:
        return self.whole() != other

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self.whole())

    def __reduce__(self) -> Any:
        return (dict, (self.whole(),))


def read_raw_file(blob: bytes) -> dict[str, dict[str, list[Any]]] | None:
    """Inverse of :func:`raw_file`; ``None`` when ``blob`` is not such a file (another version's, damaged,
    truncated: every GPU's place in it is known only from the whole header and length). A GPU whose entry is
    malformed — an alias that is not text, endpoint runs that are not its ``N`` states, a time not known — is
    dropped, as :meth:`History.from_dict` drops a malformed block."""
    if not blob.startswith(RAW_MAGIC):
        return None
    end = blob.find(b"\n", len(RAW_MAGIC))
    try:
        header = json.loads(blob[len(RAW_MAGIC) : end]) if end >= 0 else None
    except (ValueError, RecursionError):
        return None
    gpus = header.get("gpus") if isinstance(header, dict) else None
    if type(gpus) is not list or not all(type(g) is list and len(g) == 3 and type(g[1]) is int and g[1] >= 0
                                         for g in gpus):
        return None
    if len(blob) - end - 1 != sum(8 * len(_RAW_COLUMNS) * g[1] for g in gpus):
        return None
    raw: dict[str, dict[str, list[Any]]] = {}
    times: dict[bytes, list[Any]] = {}  # a t column shared by GPUs is decoded once (its floats shared)
    pos = end + 1
    for alias, n, runs in gpus:
        spans = [blob[pos + 8 * n * i : pos + 8 * n * (i + 1)] for i in range(len(_RAW_COLUMNS))]
        pos += 8 * n * len(_RAW_COLUMNS)
        endpoint = _endpoint(runs, n)
        if type(alias) is not str or endpoint is None:
            continue
        known = times.get(spans[0])
        t = list(known) if known is not None else _floats(spans[0])
        if known is None and None in t:
            continue
        times.setdefault(spans[0], t)
        raw[alias] = RawColumns(t, dict(zip(_RAW_COLUMNS, spans, strict=True)), endpoint)
    return raw


def _key_text(alias: Any) -> str:
    """``alias`` as the JSON of :meth:`History.to_dict` names it (a key that is not text becomes text there)."""
    return alias if type(alias) is str else next(iter(json.loads(json.dumps({alias: 0}))))
