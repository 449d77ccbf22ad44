"""What the rules remember between one-shot cron runs: typed rows, per memory and subject. Pure.

A rule that needs more than this poll declares ``remember`` (:mod:`gpuheal.core.rule`): a tuple of
:class:`~gpuheal.core.remember.Remember` records, each naming one memory (its ``key`` in the issue
book), the loader of its row record and a pure ``fold`` — Rule 3's decode progress, hung task loop and
LiteLLM counters, Rule 5's breaker first seen open, Rule 9's running context, Rule 10's request counts
and LiteLLM counters. What every memory shares is owned here and by
:func:`gpuheal.core.engine.remember`, once:

- **missing data neither advances nor resets**: a fold returns ``None`` for "this poll cannot say",
  and the row stays as it was;
- **a poll already folded in** — the same poll again, or a clock stepped back (``now_s`` at or
  before the row's ``at_s``) — is never folded twice;
- **a damaged row** (hand-edited, cut short, written by another version) is replaced, never trusted:
  its loader answers ``None`` and the fold starts again from this poll;
- **a GPU no longer configured** is dropped, and so is a memory no rule declares any more.

The store (:class:`Memory`) is the issue book's ``memory`` (``issues.json``), on disk in the shape
earlier versions wrote, so a state directory from before loads::

    {KEY: {SUBJECT: ROW}}      # e.g. "decode": {"gpu-dense": {"n": 158, "at_s": ..., ...}}

A memory is decoded into its row records the first time it is asked for (a bench-only run that reads
none decodes none), and written back from them; what nobody asked for is written back as it was read.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Protocol, TypeVar, cast


class Row(Protocol):
    """One remembered row: a frozen record that says which poll it last folded in."""

    @property
    def at_s(self) -> float | None:
        """The poll this row last folded in (epoch s); ``None`` when not known (an older version's row)."""
        ...

    def to_json(self) -> object:
        """The row as stored in ``issues.json``; ``None``: a row that says nothing a later run reads (a
        server not loading, a rise not known), not written and read back as no row — at 10,000 GPUs one
        such row per GPU and memory cost the state directory issue 13's 5 MB."""
        ...


R = TypeVar("R", bound=Row)
K = TypeVar("K", bound=Row, covariant=True)


class Kept(Protocol[K]):
    """What the store needs of a declared memory (:class:`~gpuheal.core.remember.Remember`): its
    ``key`` in the issue book and the loader of its rows."""

    @property
    def key(self) -> str: ...

    @property
    def load(self) -> Callable[[object], K | None]: ...


class Memory:
    """The issue book's ``memory``: each declared memory's rows by subject, typed."""

    __slots__ = ("_rows", "_stored")

    def __init__(self, stored: Mapping[str, object] | None = None) -> None:
        self._stored: dict[str, object] = dict(stored) if stored else {}
        self._rows: dict[str, dict[str, Row]] = {}

    @classmethod
    def from_json(cls, data: object) -> Memory:
        """The store from ``issues.json``'s ``memory``; anything but a mapping is an empty store."""
        return cls({str(k): v for k, v in data.items()} if isinstance(data, Mapping) else None)

    def rows(self, key: str, load: Callable[[object], R | None]) -> dict[str, R]:
        """The rows of memory ``key`` by subject: live (what the caller puts in, the store keeps).
        Read with ``load`` on the first ask; a damaged row, or a damaged memory, is dropped."""
        rows = self._rows.get(key)
        if rows is None:
            stored = self._stored.pop(key, None)
            loaded: dict[str, Row] = {}
            if isinstance(stored, Mapping):
                for subject, data in stored.items():
                    row = load(data)
                    if row is not None:
                        loaded[str(subject)] = row
            rows = self._rows[key] = loaded
        return cast("dict[str, R]", rows)

    def of(self, memory: Kept[R]) -> dict[str, R]:
        """The rows of a declared memory (see :meth:`rows`)."""
        rows = self._rows.get(memory.key)
        if rows is None:
            return self.rows(memory.key, memory.load)
        return cast("dict[str, R]", rows)

    def get(self, memory: Kept[R], subject: str) -> R | None:
        """``subject``'s row of a declared memory (asked by the rules for every GPU at every poll: the rows
        already read are looked up directly)."""
        rows = self._rows.get(memory.key)
        if rows is None:
            rows = self.rows(memory.key, memory.load)
        return cast("R | None", rows.get(subject))

    def keep(self, keys: Collection[str], subjects: Collection[str]) -> None:
        """Forget the memories no rule declares and the rows of subjects no longer configured."""
        for key in [k for k in self._stored if k not in keys]:
            del self._stored[key]
        for key in [k for k in self._rows if k not in keys]:
            del self._rows[key]
        for key, stored in list(self._stored.items()):
            if isinstance(stored, Mapping) and any(s not in subjects for s in stored):
                self._stored[key] = {s: v for s, v in stored.items() if s in subjects}
        for rows in self._rows.values():
            for subject in [s for s in rows if s not in subjects]:
                del rows[subject]

    def to_json(self) -> dict[str, object]:
        """``issues.json``'s ``memory``."""
        out = dict(self._stored)
        for key, rows in self._rows.items():
            out[key] = {subject: data for subject, row in rows.items() if (data := row.to_json()) is not None}
        return out


# --------------------------------------------------------------------------- readers for loaders


def number(value: object) -> float | None:
    """A finite number stored in a row (an int stays an int: evidence shows it as it was read);
    anything else — a bool, text, NaN, infinity — is ``None``. Asked for every field of every row
    at load (tens of thousands at 1,000 GPUs)."""
    if type(value) is float:  # JSON's own types first, without isinstance's walk (a bool is not an int here)
        return value if value - value == 0.0 else None  # NaN and ±infinity: not 0
    if type(value) is int:
        return value
    if isinstance(value, float):
        return value if value - value == 0.0 else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def whole(value: object) -> int | None:
    """A stored whole number (``3``, not ``3.5``, ``True`` or ``"3"``)."""
    if type(value) is int:
        return value
    return value if isinstance(value, int) and not isinstance(value, bool) else None
