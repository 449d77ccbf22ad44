"""The per-GPU rows rules remember between one-shot cron runs, in the issue book's ``memory``.

Rule 3's decode progress (:mod:`~gpuheal.core.decode`), hung task loop (:mod:`~gpuheal.core.taskloop`)
and LiteLLM counters (:mod:`~gpuheal.core.litellm_rate`), Rule 9's running context
(:mod:`~gpuheal.core.context_change`) and Rule 10's counters (:mod:`~gpuheal.core.routing`) each keep
one row per GPU. What they share is here, once: a damaged book is replaced, not trusted; a GPU no
longer configured is dropped; and a poll already folded in — the same poll again, or a clock step
back — is never counted twice. Pure: values in, values out (the book is mutated in place).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def rows(memory: dict[str, Any], key: str, aliases: Collection[str]) -> dict[str, Any]:
    """``memory[key]``, keyed by alias, less the GPUs not in ``aliases`` (a new book when damaged)."""
    book = memory.get(key)
    if not isinstance(book, dict):
        book = memory[key] = {}
    for alias in [a for a in book if a not in aliases]:
        del book[alias]
    return book


def previous(book: dict[str, Any], alias: str, now_s: float) -> tuple[dict[str, Any] | None, bool]:
    """(the GPU's earlier row, ``None`` when absent or damaged; whether ``now_s`` is already in it)."""
    prev = book.get(alias)
    at_s = prev.get("at_s") if isinstance(prev, dict) else None
    if isinstance(at_s, bool) or not isinstance(at_s, int | float):
        return None, False
    return prev, now_s <= at_s
