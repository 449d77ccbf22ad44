"""Rule 3's failure ratio from LiteLLM's own counters, poll over poll. Pure (issue 20).

LiteLLM's ``prometheus`` callback counts every request to each deployment and every failure since the
proxy started (:mod:`gpuheal.parse.litellm_metrics`). The difference between two polls is what users
saw in between — at cron's cadence the spec's "over 60 s". Kept in the issue book's memory
(``memory["litellm"][ALIAS]``) so one-shot cron runs see the sequence::

    {"total", "failures": the counters, "at_s": this poll,
     "requests", "failed": since the previous poll (None on the first poll and after a proxy restart)}

A counter that went down is a restart of the proxy: never a rate, the run starts again.
"""

from __future__ import annotations

from typing import Any

from gpuheal.core import memory_rows
from gpuheal.model import Observation


def remember_litellm(memory: dict[str, Any], obs: Observation, aliases: tuple[str, ...]) -> None:
    """Fold this poll's counters into ``memory["litellm"]``. Mutates ``memory`` only."""
    book = memory_rows.rows(memory, "litellm", aliases)
    now_s = obs.at.timestamp()
    for alias in aliases:
        sample = obs.gpus.get(alias)
        total = _count(getattr(sample, "litellm_requests_total", None))
        failures = _count(getattr(sample, "litellm_failures_total", None))
        if total is None:
            continue
        failures = failures or 0.0
        prev, seen = memory_rows.previous(book, alias, now_s)
        if seen:
            continue  # the same poll again, or a clock step back
        entry: dict[str, Any] = {"total": total, "failures": failures, "at_s": now_s, "requests": None, "failed": None}
        if prev is not None and None not in (_count(prev.get("total")), _count(prev.get("failures"))):
            requests, failed = total - prev["total"], failures - prev["failures"]
            if requests >= 0 and failed >= 0:
                entry.update(requests=requests, failed=min(failed, requests))
        book[alias] = entry


def litellm_window(memory: dict[str, Any], alias: str, now_s: float) -> tuple[float, float] | None:
    """(requests, failed) since the previous poll, when this poll knew them."""
    entry = memory.get("litellm", {}).get(alias)
    if not isinstance(entry, dict) or entry.get("at_s") != now_s or entry.get("requests") is None:
        return None
    return float(entry["requests"]), float(entry["failed"])


def _count(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < 0:
        return None
    return float(value) if value != float("inf") else None
