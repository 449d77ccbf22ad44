"""What Rule 9 remembers between polls, per GPU: the running context (``context``). Pure; the engine
keeps the rows (:mod:`gpuheal.core.memory`).

Each poll reads ``n_ctx`` (per slot) from llama-server's ``GET /props`` (Lesson L3: the running state,
not the config). A value that differs from the last one known is a context change, recorded with its
target (the GPU's baseline tok/s now) and left pending for its re-benchmark
(:mod:`gpuheal.rules.context_window.change`, which types the rows: ``bench`` reads and updates them). The
first sighting is not a change; a poll that does not know ``n_ctx`` (server down, restarting, a
fault, garbage) changes nothing, so a restart that keeps ``n_ctx`` is not a change either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from gpuheal.core.memory import number
from gpuheal.core.remember import Remember
from gpuheal.parse.llama_metrics import known_n_ctx
from gpuheal.rules.context_window.change import MEMORY_KEY, ContextChange, ContextRow, pending

if TYPE_CHECKING:
    from gpuheal.core.view import FleetView


def fold(prev: ContextRow | None, view: FleetView, alias: str) -> ContextRow | None:
    """This poll's running context after ``prev``; ``None`` when the poll does not know it."""
    sample = view.sample(alias)
    n_ctx = known_n_ctx(None if sample is None else sample.n_ctx)
    if n_ctx is None:
        return None
    last = None if prev is None else prev.n_ctx
    change = None if prev is None else prev.change
    if last is not None and n_ctx != last:
        target = number(view.baseline(alias)[0])  # asked only on a change
        seen = ContextChange(alias, last, n_ctx, view.now_s, target if target is not None and target > 0 else None)
        change = pending(seen)
    return ContextRow(n_ctx, view.now_s, change)


CONTEXT: Final = Remember(MEMORY_KEY, ContextRow.load, fold)
REMEMBER: Final = (CONTEXT,)
