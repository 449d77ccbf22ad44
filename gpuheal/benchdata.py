"""Recorded benchmark results and baselines, shared by ``bench`` (writer), Rules 4 and 9 (readers)
and the weekly report. Pure functions over a plain dict; ``StateDir`` stores it as
``bench-results.json``.

Shape (``data`` of the file)::

    {"results":   {ALIAS: [RESULT, ...]},            # oldest first, bounded by keep_days
     "baselines": {ALIAS: {"baseline_tok_s": float, "source": "config" | "rolling-30d",
                           "computed_at": epoch_s, "n": int}},
     "monitor_baselines": {ALIAS: {"baseline_tok_s": float, "seen_at": epoch_s}}}  # gpu-monitor's latest

    RESULT = {"at": epoch_s, "gen_tok_s": float | None, "prompt_tok_s": float | None,
              "tokens": int | None, "ok": bool, "error": str | None, "source": "bench" | "monitor",
              "model": str | None, "n_ctx": int | None,
              "excluded": bool, "excluded_reason": str | None,
              # written by ``bench`` since issue 5 (readers treat them as optional):
              "slots": int | None, "api": "completion" | "chat" | None,
              "rate_source": "timings" | "wall" | None, "elapsed_s": float | None,
              "key_sent": str | None}       # describe_key() of the key sent, on a 401 only

``error`` is None or ``unauthorized | loading | timeout | refused | http-NNN | invalid | empty``
(``gpuheal.sources.llama_server``); ``n_ctx`` is the running per-slot context from ``/props``.

A result is ``excluded`` from the baseline when it was taken during an open incident or inside the
startup grace after a restart (issue 5); it still counts for Rule 4's "3+ benchmarks".

The baseline in force (contract "Rule 4"; Design Decision 6) is the rolling 30-day average of the
recorded results once a week of them exists; until then a seed: the configured ``baseline_tok_s``,
else gpu-monitor's (its ``benchmarks`` entry's ``baseline_tok_s``: the spec's "current baselines
live in gpu-monitor"; issue 27 item 14). The configured one wins when both are there — ``doctor``
warns when they differ by more than 10 %. A baseline that is not a finite positive number within
:data:`MAX_TOK_S` is not known, never zero.
"""

from __future__ import annotations

import binascii
import math
import sys
from array import array
from collections.abc import Iterator, MutableSequence, Sequence
from itertools import chain, groupby, repeat
from operator import itemgetter
from typing import Any, overload

FILE = "bench-results.json"
DAY_S = 86400.0
MAX_TOK_S = 1e6  # parse.gpu_data's limits: a baseline past them is garbage, not a fast GPU ...
MIN_TOK_S = 0.01  # ... nor a slow one (1e-320 would make every ratio against it infinite)


def empty() -> dict[str, Any]:
    return {"results": {}, "baselines": {}, "monitor_baselines": {}}


def tok_s(value: Any) -> float | None:
    """A baseline figure, or ``None`` (not known): a bool, a string, NaN, infinity, zero, a
    negative or a number outside [:data:`MIN_TOK_S`, :data:`MAX_TOK_S`] is no baseline."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        v = float(value)
    except OverflowError:  # a 400-digit integer
        return None
    return v if MIN_TOK_S <= v <= MAX_TOK_S else None  # NaN compares false: not known


def normalise(data: Any) -> dict[str, Any]:
    """Tolerate a damaged file: keep only well-formed entries."""
    out = empty()
    if not isinstance(data, dict):
        return out
    results = data.get("results")
    if isinstance(results, dict):
        for alias, items in results.items():
            if isinstance(items, list):
                good = [r for r in items if _well_formed(r)]
                out["results"][str(alias)] = sorted(good, key=lambda r: r["at"])
    baselines = data.get("baselines")
    if isinstance(baselines, dict):
        for alias, b in baselines.items():
            if isinstance(b, dict) and isinstance(b.get("baseline_tok_s"), int | float):
                out["baselines"][str(alias)] = b
    monitor = data.get("monitor_baselines")
    if isinstance(monitor, dict):
        for alias, b in monitor.items():
            if isinstance(b, dict) and tok_s(b.get("baseline_tok_s")) is not None:
                out["monitor_baselines"][str(alias)] = b
    return out


def _well_formed(result: Any) -> bool:
    """A result with a numeric ``at`` and a rate that is a finite number or null (a failed run). A rate of
    another type (a hand-edited ``"fast"``, ``true``, NaN) is damage: Rules 4 and 9 and the baseline would sort
    and sum it."""
    if not isinstance(result, dict) or not isinstance(result.get("at"), int | float):
        return False
    rate = result.get("gen_tok_s")
    return rate is None or (type(rate) in (int, float) and math.isfinite(rate))


# --------------------------------------------------------------------------- check's index
# ``check`` runs every minute and reads, of each result, only what Rules 4, 9 and 8 (api-key-mismatch) and
# gpu-monitor's readings (rules/benchmark_regression/monitor) read: CHECK_FIELDS. A 100-GPU week holds ~3,000
# results of ~16 fields each (a 35-day file five times that); decoding and normalising them all was ~10 ms of
# every run late in the week (issue 29). So every writer of ``bench-results.json`` also writes its index
# (``bench-index.json``, :mod:`gpuheal.state.bench_store`): those fields of every result, in columns, with
# the baselines, keyed by the results file's stamp (its size and CRC-32: what it holds, not when it was
# written). A rule that reads another field of a result must add it here.
CHECK_FIELDS: tuple[str, ...] = ("at", "gen_tok_s", "ok", "source", "error", "n_ctx", "slots")
INDEX_VERSION = 2  # 2: a column may be packed (:func:`_packed_column`); 1's plain lists are still read
_INDEX_VERSIONS = (1, 2)
_FLOAT_FIELDS = ("at", "gen_tok_s")  # packed as float64 when every value is a float (gen_tok_s: or null)
_SCALARS = (type(None), bool, int, float, str)  # what a column's runs may repeat (one object, shared by rows)


def to_index(data: dict[str, Any], stamp: tuple[int, ...]) -> dict[str, Any]:
    """The index of normalised ``data`` (:func:`normalise`'s), as written under ``stamp``.

    ``{"version": 1, "stamp": [...], "fields": CHECK_FIELDS, "gpus": {ALIAS: number of results}, "columns":
    [column, ...] (one per field: every GPU's results in turn, oldest first), "absent": {FIELD: [row, ...]}
    (results without that field: an earlier version's, which readers tell from ``None``: ``source``
    defaults to ``bench``), "baselines": ..., "monitor_baselines": ...}``. One table for the fleet, not
    one per GPU: reading it back is a few passes in C over each column, whatever the number of GPUs."""
    rows = [r for items in data["results"].values() for r in items]
    absent = {f: [i for i, r in enumerate(rows) if f not in r] for f in CHECK_FIELDS[1:]}
    return {
        "version": INDEX_VERSION,
        "stamp": list(stamp),
        "fields": list(CHECK_FIELDS),
        "gpus": {alias: len(items) for alias, items in data["results"].items()},
        "columns": [_packed_column(f, [r.get(f) for r in rows]) for f in CHECK_FIELDS],
        "absent": {f: found for f, found in absent.items() if found},
        "baselines": data["baselines"],
        "monitor_baselines": data.get("monitor_baselines", {}),
    }


def from_index(doc: Any, stamp: tuple[int, ...] | None) -> dict[str, Any] | None:
    """The results as ``check`` reads them (each result holding CHECK_FIELDS only; :func:`normalise`'s
    shape, each GPU's results an :class:`IndexedResults`), when ``doc`` is the index of the results file as it
    is now (``stamp``); ``None`` (read the file) when it is not, or is not an index this version wrote: another
    version's, a damaged or edited one (columns of different lengths, an ``at`` that is not a finite number or
    out of order, a bad ``absent``). The whole index is checked here, before any rule reads it; of each GPU's
    results only the newest few are built until a rule reads further back (issue 29)."""
    if stamp is None or not isinstance(doc, dict) or doc.get("version") not in _INDEX_VERSIONS:
        return None
    if doc.get("stamp") != list(stamp) or doc.get("fields") != list(CHECK_FIELDS):
        return None
    gpus: Any = doc.get("gpus")
    if not isinstance(gpus, dict) or not all(type(n) is int and n >= 0 for n in gpus.values()):
        return None
    n = sum(gpus.values())
    columns = _plain_columns(doc.get("columns"), n)
    absent = _absent_rows(doc.get("absent"), n)
    if columns is None or absent is None or not _finite_ats(columns[0]):
        return None
    ats: list[Any] = columns[0]
    start = 0
    for count in gpus.values():
        mine = ats[start : start + count]
        if mine != sorted(mine):
            return None
        start += count
    out = normalise({"baselines": doc.get("baselines"), "monitor_baselines": doc.get("monitor_baselines")})
    out["results"] = IndexedResults.of_fleet(columns, gpus, absent)
    return out


_UNBUILT: dict[str, Any] = {}  # IndexedResults' place of a result not built yet (never handed out)


class IndexedResults(MutableSequence[dict[str, Any]]):
    """One GPU's results as ``check`` reads them from the index: a list of result dicts (CHECK_FIELDS, less
    the fields a result did not have), the older ones built from the index's columns when first read.

    Rules 4, 8 and 9 read the newest few results of each GPU, from the newest back (:func:`regression_state`,
    ``FleetView.bench_ok_last``, Rule 8's last own benchmark); building a dict for every result of the week at
    every run was the part of ``check`` that grew with the week (issue 29). So the newest :data:`FIRST_BUILT`
    of every GPU are built at once (:meth:`of_fleet`: all of a GPU with few), and a read further back builds at
    least as many again as are built (a read of all of them builds each once, a few at a time). Reading any
    result gives what :func:`normalise` gives of the file; a change (gpu-monitor's reading inserted) builds them
    all first, and from then on it is a plain list."""

    FIRST_BUILT = 4  # Rules 4, 8 and 9 read this many of a GPU at its baseline (3 successes), or fewer
    ALL_BUILT = 2 * FIRST_BUILT  # a GPU with no more than this many results has them all built
    __slots__ = ("_absent", "_columns", "_from", "_rows", "_start")

    def __init__(self, columns: list[list[Any]], start: int, n: int, absent: dict[int, tuple[str, ...]]) -> None:
        """``columns``: the index's (checked: one per CHECK_FIELD), of which rows ``start`` to ``start + n``;
        ``absent``: by row of the columns, the fields that result did not have."""
        self._columns = columns
        self._start = start
        self._absent = absent
        self._rows: list[dict[str, Any]] = [_UNBUILT] * n  # the results from ``_from`` on (never read before it)
        self._from = n

    @classmethod
    def of_fleet(
        cls, columns: list[list[Any]], counts: dict[str, int], absent: dict[int, tuple[str, ...]]
    ) -> dict[str, list[dict[str, Any]] | IndexedResults]:
        """Every GPU's results (``counts``: how many of each, in the columns' order), the newest
        :data:`FIRST_BUILT` of each built in one pass for the fleet (one per GPU costs more than the rows); a GPU
        with few more (:data:`ALL_BUILT`) has them all built, in a plain list (early in the week, every GPU)."""
        lazy: dict[str, IndexedResults] = {}
        picks: list[int] = []
        start = 0
        for alias, n in counts.items():
            lo = 0 if n <= cls.ALL_BUILT else n - cls.FIRST_BUILT
            if lo:
                lazy[alias] = part = cls(columns, start, n, absent)
                part._from = lo
            picks += range(start + lo, start + n)
            start += n
        built = _rows_at(columns, picks if len(picks) < start else range(start), absent)  # all: in slices
        out: dict[str, list[dict[str, Any]] | IndexedResults] = {}
        at = 0
        for alias, n in counts.items():
            some = lazy.get(alias)
            if some is None:
                out[alias], at = built[at : at + n], at + n
            else:
                out[alias] = some
                some._rows[some._from :], at = built[at : at + some.built], at + some.built
        return out

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def built(self) -> int:
        """How many of the results are built (the newest ones): what reading them has cost."""
        return len(self._rows) - self._from

    def _build_from(self, i: int) -> None:
        """Build the results from ``i`` on (and at least as many again as are built)."""
        hi = self._from
        lo = max(0, min(i, hi - max(self.FIRST_BUILT, len(self._rows) - hi)))
        self._rows[lo:hi] = _rows_at(self._columns, range(self._start + lo, self._start + hi), self._absent)
        self._from = lo

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        rows = range(len(self._rows))[i]  # a negative one counted from the end; IndexError past it
        if isinstance(rows, int):
            first = rows
        else:  # the oldest of a slice's
            first = (rows[0] if rows.step > 0 else rows[-1]) if rows else self._from
        if first < self._from:
            self._build_from(first)
        return self._rows[i]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._built())

    def __reversed__(self) -> Iterator[dict[str, Any]]:
        """Those built, as a list's reversed iterator; older ones built as a reader gets to them."""
        newest: Iterator[dict[str, Any]] = reversed(self._rows[self._from :] if self._from else self._rows)
        return chain(newest, self._older(self._from)) if self._from else newest

    def _older(self, below: int) -> Iterator[dict[str, Any]]:
        for i in range(below - 1, -1, -1):
            if i < self._from:
                self._build_from(i)
            yield self._rows[i]

    def _built(self) -> list[dict[str, Any]]:
        """Every result built (before a change moves them from their rows of the columns)."""
        if self._from:
            self._build_from(0)
        return self._rows

    def __setitem__(self, i: Any, value: Any) -> None:
        self._built()[i] = value

    def __delitem__(self, i: int | slice) -> None:
        del self._built()[i]

    def insert(self, index: int, value: dict[str, Any]) -> None:
        self._built().insert(index, value)

    def __eq__(self, other: object) -> bool:
        """Equal to a list (or another's) of the same results, as the list :func:`normalise` gives."""
        if isinstance(other, IndexedResults | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return repr(list(self))


def _packed_column(field: str, values: list[Any]) -> Any:
    """A column of the index as written: ``{"f64": BASE64}`` (float64, little-endian; NaN: null) for ``at`` and
    ``gen_tok_s`` when every value is a finite float (``gen_tok_s``: or null), ``{"runs": [[VALUE, COUNT], ...]}``
    for another field when every value is a scalar (a result's ``ok``, ``source``, ``n_ctx``: mostly one value
    all week), else the plain list. A week of 100 GPUs' results is ~2,800 rows: parsing their numbers from JSON
    text was over half of reading the index every cron run, and grew with the week (issue 29)."""
    if field in _FLOAT_FIELDS and all(
        (type(v) is float and math.isfinite(v)) or (v is None and field != "at") for v in values
    ):
        packed = array("d", [math.nan if v is None else v for v in values])
        if sys.byteorder == "big":
            packed.byteswap()
        return {"f64": binascii.b2a_base64(packed.tobytes(), newline=False).decode("ascii")}
    if field not in _FLOAT_FIELDS and all(type(v) in _SCALARS for v in values):
        return {"runs": [[v, len(list(group))] for (_, v), group in groupby(values, key=lambda v: (type(v), v))]}
    return values


def _plain_columns(columns: Any, n: int) -> list[Any] | None:
    """The index's columns as plain lists (:func:`_packed_column`'s inverse); ``None`` when one is packed
    otherwise than it writes: base64 that is not ``n`` float64, a NaN ``at``, runs that are not ``n`` scalars."""
    if not isinstance(columns, list) or len(columns) != len(CHECK_FIELDS):
        return None
    plain: list[Any] = []
    for field, column in zip(CHECK_FIELDS, columns, strict=True):
        if type(column) is dict:
            column = _unpacked_column(field, column, n)
        if not isinstance(column, list) or len(column) != n:
            return None  # ``at`` first, never runs: its size bounds the runs' counts (a hostile one allocates nothing)
        plain.append(column)
    return plain


def _unpacked_column(field: str, column: dict[str, Any], n: int) -> list[Any] | None:
    """One column written as ``{"f64": ...}`` or ``{"runs": ...}``, as a list of ``n``; ``None``: not one."""
    if list(column) == ["f64"] and field in _FLOAT_FIELDS and type(column["f64"]) is str:
        try:
            raw = binascii.a2b_base64(column["f64"], strict_mode=True)
        except (binascii.Error, ValueError):
            return None
        if len(raw) != 8 * n:
            return None
        packed = array("d")
        packed.frombytes(raw)
        if sys.byteorder == "big":
            packed.byteswap()
        if field != "at":  # from_index refuses an ``at`` that is not finite
            return _PackedRates(packed.tolist())
        values: list[Any] = packed.tolist()
        return values
    runs = column.get("runs") if list(column) == ["runs"] and field not in _FLOAT_FIELDS else None
    if type(runs) is not list or not set(map(type, runs)) <= {list} or not set(map(len, runs)) <= {2}:
        return None
    scalars, counts = list(map(itemgetter(0), runs)), list(map(itemgetter(1), runs))
    if not set(map(type, scalars)) <= set(_SCALARS) or not set(map(type, counts)) <= {int}:
        return None
    if min(counts, default=1) <= 0 or sum(counts) != n:
        return None  # the counts summed before any list is built
    return list(chain.from_iterable(map(repeat, scalars, counts)))  # passes in C: a week's runs every run (issue 29)


class _PackedRates(list[float]):
    """``gen_tok_s`` as packed (:func:`_packed_column`): a value that is not finite is a failed run's null rate,
    read as ``None`` when its result is built (:func:`_rows_at`), not in a pass over a week of them (issue 29)."""

    __slots__ = ()


def _rows_at(columns: list[list[Any]], rows: Sequence[int], absent: dict[int, tuple[str, ...]]) -> list[dict[str, Any]]:
    """The results at ``rows`` of the index's columns (CHECK_FIELDS' order), less the fields ``absent`` says
    they did not have."""
    if isinstance(rows, range) and rows.step == 1:
        picked = [column[rows.start : rows.stop] for column in columns]
    else:
        picked = [list(map(column.__getitem__, rows)) for column in columns]
    if type(columns[1]) is _PackedRates and not all(map(math.isfinite, picked[1])):
        picked[1] = [v if math.isfinite(v) else None for v in picked[1]]  # NaN: a failed run's null rate
    built = [
        {"at": at, "gen_tok_s": gen, "ok": ok, "source": source, "error": error, "n_ctx": n_ctx, "slots": slots}
        for at, gen, ok, source, error, n_ctx, slots in zip(*picked, strict=True)
    ]
    if absent:
        for j, row in zip(rows, built, strict=True):
            for field in absent.get(j, ()):
                del row[field]
    return built


def _finite_ats(ats: list[Any]) -> bool:
    """Whether the ``at`` column holds numbers (not a bool, as :func:`normalise` would keep) all finite."""
    if not set(map(type, ats)) <= {int, float}:
        return False
    try:
        return all(map(math.isfinite, ats))
    except OverflowError:  # an integer past a float's range
        return False


def _absent_rows(absent: Any, n: int) -> dict[int, tuple[str, ...]] | None:
    """The index's ``absent`` (``{FIELD: [row, ...]}``) by row: the fields that result did not have; ``None``
    when it is not an index's (a field not a CHECK_FIELD but ``at``, a row not one of ``n``, or one twice)."""
    if not isinstance(absent, dict):
        return None
    out: dict[int, tuple[str, ...]] = {}
    for field, indexes in absent.items():
        if field not in CHECK_FIELDS[1:] or not isinstance(indexes, list):
            return None
        for i in indexes:
            if type(i) is not int or not 0 <= i < n or field in out.get(i, ()):
                return None
            out[i] = (*out.get(i, ()), field)
    return out


def last_monitor_at(items: Sequence[dict[str, Any]]) -> Any:
    """The time of the newest gpu-monitor reading among ``items`` (one GPU's results), ``None`` when none.
    From the index's results (:class:`IndexedResults`: times finite and in order, from_index checked) that is the
    last one, read from the newest back: gpu-monitor's readings are checked against it at every poll (issue 29).
    Otherwise the greatest, as a hand-edited file's results may hold a NaN, which no order puts in its place."""
    if isinstance(items, IndexedResults):
        return next((r["at"] for r in reversed(items) if r.get("source") == "monitor"), None)
    return max((r["at"] for r in items if r.get("source") == "monitor"), default=None)


def add_result(data: dict[str, Any], alias: str, result: dict[str, Any]) -> None:
    items = data["results"].setdefault(alias, [])
    if items and result["at"] <= items[-1]["at"]:
        return  # same instant twice (a re-read monitor entry): keep the first
    items.append(result)


def results(data: dict[str, Any], alias: str, since_s: float | None = None) -> list[dict[str, Any]]:
    items = data["results"].get(alias, [])
    return [r for r in items if since_s is None or r["at"] >= since_s]


def ok_results(data: dict[str, Any], alias: str, since_s: float | None = None) -> list[dict[str, Any]]:
    """:func:`results` that succeeded with a rate (one pass: Rules 4 and 9 read a week of them every poll)."""
    return [r for r in data["results"].get(alias, []) if _is_sample(r, since_s)]


def _is_sample(result: dict[str, Any], since_s: float | None) -> bool:
    """Whether ``result`` is one of Rule 4's and 9's samples: from ``since_s`` on, succeeded, with a rate."""
    return (since_s is None or result["at"] >= since_s) and bool(result.get("ok")) and bool(result.get("gen_tok_s"))


def baseline(data: dict[str, Any], alias: str, config_baseline: float | None) -> tuple[float | None, str]:
    """The baseline in force: the rolling one once computed, else the seed (:func:`seed`)."""
    b = data["baselines"].get(alias)
    if b is not None:
        return float(b["baseline_tok_s"]), str(b.get("source", "rolling-30d"))
    return seed(data, alias, config_baseline)


def seed(data: dict[str, Any], alias: str, config_baseline: float | None) -> tuple[float | None, str]:
    """Rule 4's seed until a week of results exists: the configured baseline (source ``config``),
    else gpu-monitor's latest (``monitor``), else not known (``None``, ``config``)."""
    configured = tok_s(config_baseline)
    if configured is not None:
        return configured, "config"
    monitor = monitor_baseline(data, alias)
    if monitor is not None:
        return monitor, "monitor"
    return None, "config"


def monitor_baseline(data: dict[str, Any], alias: str) -> float | None:
    """gpu-monitor's latest baseline for ``alias`` (recorded by :func:`note_monitor_baseline`)."""
    b = (data.get("monitor_baselines") or {}).get(alias)
    return tok_s(b.get("baseline_tok_s")) if isinstance(b, dict) else None


def monitor_baseline_changes(data: dict[str, Any], alias: str, value: Any) -> bool:
    """Whether :func:`note_monitor_baseline` would keep ``value``: a figure, other than the one kept."""
    v = tok_s(value)
    return v is not None and monitor_baseline(data, alias) != v


def note_monitor_baseline(data: dict[str, Any], alias: str, value: Any, now_s: float) -> bool:
    """Keep gpu-monitor's baseline for ``alias`` when it is a figure and differs from the one kept
    (so an unchanged one does not rewrite the file every poll); a bad or missing one changes
    nothing. Returns whether ``data`` changed."""
    if not monitor_baseline_changes(data, alias, value):
        return False
    v = tok_s(value)
    data.setdefault("monitor_baselines", {})[alias] = {"baseline_tok_s": v, "seen_at": now_s}
    return True


def recompute_baseline(
    data: dict[str, Any],
    alias: str,
    now_s: float,
    config_baseline: float | None,
    window_days: float = 30.0,
    seed_days: float = 7.0,
    every_days: float = 7.0,
) -> None:
    """Design Decision 6: rolling 30-day average, recalculated weekly, seeded (from the config, else
    gpu-monitor) until a week of (non-excluded, successful) results exists."""
    current = data["baselines"].get(alias)
    if current is not None and now_s - float(current.get("computed_at", 0)) < every_days * DAY_S:
        return
    usable = [
        r for r in ok_results(data, alias, now_s - window_days * DAY_S) if not r.get("excluded")
    ]
    if not usable or now_s - usable[0]["at"] < seed_days * DAY_S:
        return  # not a week of history yet: the config seed stays in force
    mean = sum(r["gen_tok_s"] for r in usable) / len(usable)
    data["baselines"][alias] = {
        "baseline_tok_s": round(mean, 2),
        "source": "rolling-30d",
        "computed_at": now_s,
        "n": len(usable),
        "seed_tok_s": seed(data, alias, config_baseline)[0],
    }


def prune(data: dict[str, Any], now_s: float, keep_days: float, aliases: tuple[str, ...] | None = None) -> None:
    cut = now_s - keep_days * DAY_S
    for alias in list(data["results"]):
        if aliases is not None and alias not in aliases:
            del data["results"][alias]
            data["baselines"].pop(alias, None)
            continue
        data["results"][alias] = [r for r in data["results"][alias] if r["at"] >= cut]
    monitor = data.get("monitor_baselines", {})
    for alias in [a for a in monitor if aliases is not None and a not in aliases]:
        del monitor[alias]  # a GPU no longer configured (it may never have had a result)


# --------------------------------------------------------------------------- bounded history
# History is kept for ``keep_days`` (prune) and thinned as it ages, so a cron that benchmarks every
# few minutes still leaves a file of bounded size: results older than DOWNSAMPLE_AFTER_DAYS keep at
# most one per DOWNSAMPLE_BUCKET_S (the bucket's median successful, non-excluded result — the ones
# the baseline averages — else its first result), and no GPU keeps more than MAX_RESULTS.
DOWNSAMPLE_AFTER_DAYS = 7.0
DOWNSAMPLE_BUCKET_S = 3600.0
MAX_RESULTS = 5000


def downsample(
    data: dict[str, Any],
    now_s: float,
    after_days: float = DOWNSAMPLE_AFTER_DAYS,
    bucket_s: float = DOWNSAMPLE_BUCKET_S,
    max_results: int = MAX_RESULTS,
) -> None:
    cut = now_s - after_days * DAY_S
    for alias, items in data["results"].items():
        old = [r for r in items if r["at"] < cut]
        recent = [r for r in items if r["at"] >= cut]
        buckets: dict[int, list[dict[str, Any]]] = {}
        for r in old:
            buckets.setdefault(int(r["at"] // bucket_s), []).append(r)
        kept = []
        for _, group in sorted(buckets.items()):
            usable = [r for r in group if r.get("ok") and r.get("gen_tok_s") and not r.get("excluded")]
            if usable:
                usable.sort(key=lambda r: r["gen_tok_s"])
                kept.append(usable[(len(usable) - 1) // 2])
            else:
                kept.append(group[0])
        merged = sorted(kept, key=lambda r: r["at"]) + recent
        data["results"][alias] = merged[-max_results:] if max_results > 0 else merged


# --------------------------------------------------------------------------- Rule 4 state


def _last_samples(
    items: Sequence[dict[str, Any]],
    since_s: float | None,
    baseline_tok_s: float | None,
    drop_ratio: float,
    recovered_within_ratio: float,
    min_results: int,
) -> list[dict[str, Any]]:
    """The tail of :func:`ok_results` (``since_s`` on) that decides :func:`regression_state`: read from the
    newest back to the last result at or above both the slow threshold and the recovered one that has at
    least ``min_results`` after it (itself included), or to the oldest.

    Such a result ends any slow run and any regression, whatever came before it: Rule 4's scan from it on
    ends as the scan of every result does, and the "improving" test reads the last ``min_results``. So a GPU
    at its baseline costs one result a run, not a week of them (issue 29); a regressing one, its run.
    Without a baseline only the newest result is read (the current rate)."""
    need = max(1, int(min_results))
    if baseline_tok_s is None or baseline_tok_s <= 0:
        need, ends_all = 1, -math.inf  # only the current rate is reported
    else:
        ends_all = max(baseline_tok_s * (1 - drop_ratio), baseline_tok_s * (1 - recovered_within_ratio))
    tail: list[dict[str, Any]] = []
    for r in reversed(items):
        if _is_sample(r, since_s):
            tail.append(r)
            if len(tail) >= need and float(r["gen_tok_s"]) >= ends_all:
                break
    tail.reverse()
    return tail


def regression_state(
    data: dict[str, Any],
    alias: str,
    baseline_tok_s: float | None,
    drop_ratio: float = 0.2,
    min_results: int = 3,
    recovered_within_ratio: float = 0.1,
    since_s: float | None = None,
) -> dict[str, Any]:
    """Rule 4 over the recorded successful results, oldest first (pure).

    A regression starts when ``min_results`` consecutive results are more than ``drop_ratio``
    below the baseline — never after one slow run — and ends when a result is back within
    ``recovered_within_ratio`` of it (Rule 4 "Verify"); results in between keep it open. Failed
    benchmarks (timeouts, 401, loading) are not samples and neither break nor extend a run.
    Excluded results count here (they are real measurements); they only stay out of the baseline.
    ``since_s``: only results from then on (Rule 4's ``max_age_h``); older ones say nothing now.

    Returns ``{"trend": "stable|improving|regressing|unknown", "current_tok_s", "slow_run",
    "regressing_since", "threshold_tok_s", "recovered_tok_s"}`` (epoch seconds, tok/s or None).
    """
    samples = _last_samples(data["results"].get(alias, []), since_s, baseline_tok_s, drop_ratio,
                            recovered_within_ratio, min_results)
    return scan_state(samples, baseline_tok_s, drop_ratio, min_results, recovered_within_ratio)


def scan_state(
    samples: Sequence[dict[str, Any]],
    baseline_tok_s: float | None,
    drop_ratio: float,
    min_results: int,
    recovered_within_ratio: float,
) -> dict[str, Any]:
    """Rule 4's scan of successful results, oldest first: :func:`regression_state`'s answer for ``samples``
    (its tail of them, or every one: the same answer, ``tests/test_bench_tail.py``)."""
    current = float(samples[-1]["gen_tok_s"]) if samples else None
    out: dict[str, Any] = {
        "trend": "unknown",
        "current_tok_s": current,
        "slow_run": 0,
        "regressing_since": None,
        "threshold_tok_s": None,
        "recovered_tok_s": None,
    }
    if baseline_tok_s is None or baseline_tok_s <= 0 or not samples:
        return out
    slow_below = baseline_tok_s * (1 - drop_ratio)
    recovered_at = baseline_tok_s * (1 - recovered_within_ratio)
    out["threshold_tok_s"] = round(slow_below, 2)
    out["recovered_tok_s"] = round(recovered_at, 2)
    need = max(1, int(min_results))
    run, run_start = 0, samples[0]  # the consecutive slow results up to now, and the first of them
    regressing_since: float | None = None
    for r in samples:
        value = float(r["gen_tok_s"])
        if value < slow_below:
            run, run_start = run + 1, run_start if run else r
        else:
            run = 0
        if regressing_since is None and run >= need:
            regressing_since = float(run_start["at"])
        elif regressing_since is not None and value >= recovered_at:
            regressing_since = None
    out["slow_run"] = run
    if regressing_since is not None:
        out["trend"] = "regressing"
        out["regressing_since"] = regressing_since
        return out
    recent = samples[-need:]
    fast_above = baseline_tok_s * (1 + recovered_within_ratio)
    if len(recent) >= need and all(float(r["gen_tok_s"]) > fast_above for r in recent):
        out["trend"] = "improving"
    else:
        out["trend"] = "stable"
    return out
