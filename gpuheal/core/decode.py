"""Progress of each llama-server's decode loop, poll over poll, from its own ``/metrics``. Pure.

Contract "Rule 3 from llama-server": a poll whose ``/metrics`` shows requests in flight
(``llamacpp:requests_processing`` > 0) and ``llamacpp:n_decode_total`` unchanged since the previous
poll is a stalled poll; ``model-stuck`` fires at the 3rd consecutive poll with requests in flight
and no decode since the first of them. ``n_decode_total`` and not ``tokens_predicted_total``: a
real b11312 server adds to the latter only when a request ends (0 through a whole 2,300-token
generation while ``n_decode_total`` went 158 → 2,301), so a detector on it would restart every
server serving a long answer.

The run of polls is kept in the issue book's memory (``memory["decode"][ALIAS]``) so cron's
one-shot runs and ``replay`` see the same sequence::

    {"n": n_decode_total, "in_flight": bool, "polls": consecutive polls in flight without a decode
     (1 = the first of them), "first_s": that first poll, "at_s": the poll this entry is of,
     "reset_s": the last poll whose counter went down (the server restarted),
     "deferred": requests_deferred, "busy": requests_processing,
     "deferred_growing": consecutive polls whose deferred count grew while no request finished}

A poll that does not know the counters (``/metrics`` disabled, a timeout, garbage) changes
nothing: missing data neither advances nor resets the run. A counter that went down is a restart,
never progress and never a stall: the run starts again from that poll.
"""

from __future__ import annotations

from typing import Any

from gpuheal.core import memory_rows
from gpuheal.model import Observation


def remember_decode(memory: dict[str, Any], obs: Observation, aliases: tuple[str, ...]) -> None:
    """Fold this poll's ``/metrics`` into ``memory["decode"]``. Mutates ``memory`` only."""
    book = memory_rows.rows(memory, "decode", aliases)
    now_s = obs.at.timestamp()
    for alias in aliases:
        sample = obs.gpus.get(alias)
        if sample is None:
            continue
        n, busy = _number(sample.n_decode_total), _number(sample.requests_processing)
        if n is None or busy is None:
            continue
        prev, seen = memory_rows.previous(book, alias, now_s)
        if seen:
            continue  # the same poll again, or a clock step back: never counted twice
        if prev is not None and (isinstance(prev.get("n"), bool) or not isinstance(prev.get("n"), int | float)):
            prev = None  # a damaged row: start again from this poll
        deferred = _number(sample.requests_deferred)
        entry = _next(prev, n, int(busy), None if deferred is None else int(deferred), bool(sample.is_sleeping), now_s)
        book[alias] = entry


def _next(prev: dict[str, Any] | None, n: float, busy: int, deferred: int | None, sleeping: bool,
          now_s: float) -> dict[str, Any]:
    reset = prev is not None and n < prev["n"]
    in_flight = busy > 0 and not sleeping
    entry: dict[str, Any] = {"n": n, "in_flight": in_flight, "at_s": now_s, "busy": busy, "deferred": deferred,
                             "reset_s": now_s if reset else (prev or {}).get("reset_s")}
    if not in_flight:
        entry.update(polls=0, first_s=None)
    elif prev is not None and not reset and prev.get("in_flight") and n == prev["n"] and prev.get("polls", 0) > 0:
        entry.update(polls=int(prev["polls"]) + 1, first_s=prev.get("first_s"))
    else:
        entry.update(polls=1, first_s=now_s)  # the first of a possible run: decoding up to now
    growing = 0
    if prev is not None and not reset and deferred is not None and isinstance(prev.get("deferred"), int):
        freed = isinstance(prev.get("busy"), int) and busy < prev["busy"]
        if deferred > prev["deferred"] and not freed:
            growing = int(prev.get("deferred_growing", 0)) + 1
    entry["deferred_growing"] = growing
    return entry


def _number(value: object) -> float | None:
    """A reading the sources already checked; a hand-made trace may hold anything: not known."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < 0:
        return None
    return float(value) if value != int(value) else value


def decode_state(memory: dict[str, Any], alias: str, now_s: float) -> dict[str, Any] | None:
    """This poll's entry for ``alias``; ``None`` when this poll did not know the counters."""
    entry = memory.get("decode", {}).get(alias)
    if not isinstance(entry, dict) or entry.get("at_s") != now_s:
        return None
    return entry
