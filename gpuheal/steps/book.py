"""The issue book on disk: ``issues.json`` (the open issues and what the rules remember) and its log of
transitions, ``issues-log.jsonl``, apart.

Every cron run reads and rewrites ``issues.json``; until issue 29 the book's log (the last
:data:`~gpuheal.core.engine.LOG_MAX` transitions, ~500 B each) was in it, and no run reads the log: it is
the operators' record of what fired and resolved when. Over the chaos week it grew to hundreds of lines, each
decoded and encoded again at every cycle (issue 29: a week must fit 10 minutes, and a late cycle cost ~50 %
more than an early one). Now a run appends its new transitions to their own file, only when it has any, and
``issues.json`` stays the size of the fleet. The contract leaves both files internal ("Other files are
internal").

``issues-log.jsonl``: one :meth:`~gpuheal.core.engine.Transition.to_json` a line, oldest first, appended
(:meth:`~gpuheal.state.store.StateDir.append_lines`: a torn last line is removed by the next append). It keeps
at least the last ``LOG_MAX`` transitions: past twice that many lines it is rewritten (atomically) with the
last ``LOG_MAX``, so the log is bounded as before and the trim is paid once per ``LOG_MAX`` transitions.

A book stored by an earlier version still has its ``log`` in ``issues.json``: the next save moves those lines
to the log file (first) and writes ``issues.json`` without them. An earlier version reading this one's
``issues.json`` finds no ``log`` and starts one (:func:`gpuheal.core.engine.load_book` reads a book without).
"""

from __future__ import annotations

from typing import Any

from gpuheal.core import engine
from gpuheal.core.engine import IssueBook, TransitionLog, load_book
from gpuheal.state import files
from gpuheal.state.store import StateDir

__all__ = ["load", "log_lines", "save"]


def load(store: StateDir) -> IssueBook:
    """The stored book (a damaged or missing file: an empty one, :func:`load_book`). Its log holds only what an
    earlier version kept in ``issues.json``: the log file is not read (no run reads the transitions)."""
    return load_book(store.read(files.ISSUES, None))


def save(store: StateDir, book: IssueBook) -> None:
    """``issues.json`` without the log, after the book's log (the transitions this run logged, and those an
    earlier version's ``issues.json`` held) is appended to ``issues-log.jsonl``. The log first: a run killed
    between the two leaves a transition logged twice, never one lost. The book's log is emptied then (its lines
    are in the file): a run that saves the same book again (``heal``'s in-run confirmation, after each round of
    probes) appends only what it logged since."""
    doc = book.to_json()
    added: list[dict[str, Any]] = doc.pop("log")
    if added:
        store.append_lines(files.ISSUES_LOG, added)
        _trim(store, engine.LOG_MAX)
        book.log = TransitionLog()
    store.write(files.ISSUES, doc)


def _trim(store: StateDir, keep: int) -> None:
    """Past ``2 * keep`` lines, the log file rewritten with its last ``keep`` (bytes as they are: no decoding)."""
    raw = store.read_bytes(files.ISSUES_LOG)
    if raw is None or raw.count(b"\n") <= 2 * keep:
        return
    cut = len(raw)
    for _ in range(keep + 1):  # the file ends with a newline (append_lines): back to the one before the last keep
        cut = raw.rfind(b"\n", 0, cut)
    store.write_bytes(files.ISSUES_LOG, [raw[cut + 1 :]])


def log_lines(store: StateDir) -> list[dict[str, Any]]:
    """The book's log as an operator reads it: the log file's lines (junk skipped with a warning,
    :meth:`~gpuheal.state.store.StateDir.read_lines`), then any an earlier version left in ``issues.json``; the
    last ``LOG_MAX``, oldest first."""
    stored = store.read(files.ISSUES, None)
    older = load_book(stored).log.to_json() if isinstance(stored, dict) else []
    return [*store.read_lines(files.ISSUES_LOG), *older][-engine.LOG_MAX :]
