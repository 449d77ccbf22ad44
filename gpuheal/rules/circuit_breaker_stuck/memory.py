"""What Rule 5 remembers between polls, per GPU: when a breaker was first seen open (``breaker_open_since``).
Pure; the engine keeps the rows (:mod:`gpuheal.core.memory`).

The open time counts from the monitor's ``opened_at`` when it gives one; else from the first poll that
saw the breaker open, kept here so that one-shot cron runs count the same ten minutes. A poll that does
not know the breakers (gpu-monitor not usable; a source without breakers: Prometheus, smi; the GPU
missing from the poll) neither starts nor resets the count; a known closed breaker resets it (the
monitor lists the breakers it knows: an absent entry is a closed one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from gpuheal.core.memory import Memory, number
from gpuheal.core.remember import Remember

if TYPE_CHECKING:
    from gpuheal.core.view import FleetView


@dataclass(frozen=True, slots=True)
class BreakerRow:
    """At the poll ``at_s``: open since ``open_since_s`` (the first poll that saw it open), or closed
    (``None``)."""

    at_s: float | None
    open_since_s: float | None

    def to_json(self) -> dict[str, object]:
        return {"at_s": self.at_s, "open_since_s": self.open_since_s}

    @classmethod
    def load(cls, data: object) -> BreakerRow | None:
        """A stored row; an earlier version's bare epoch (``{ALIAS: first_seen_open_s}``) is an open
        breaker whose last poll is not known."""
        if number(data) is not None:
            return cls(at_s=None, open_since_s=number(data))
        if not isinstance(data, dict):
            return None
        at_s, since = data.get("at_s"), data.get("open_since_s")
        if (at_s is not None and number(at_s) is None) or (since is not None and number(since) is None):
            return None
        return cls(at_s=number(at_s), open_since_s=number(since))


def fold(prev: BreakerRow | None, view: FleetView, alias: str) -> BreakerRow | None:
    """This poll's breaker after ``prev``; ``None`` when the poll does not know it."""
    obs, sample = view.obs, view.sample(alias)
    if obs is None or not obs.monitor_ok or sample is None or not obs.breakers_known:
        return None
    if sample.breaker is not None and sample.breaker.open:
        since = prev.open_since_s if prev is not None and prev.open_since_s is not None else view.now_s
        return BreakerRow(at_s=view.now_s, open_since_s=since)
    return BreakerRow(at_s=view.now_s, open_since_s=None)


BREAKER: Final = Remember("breaker_open_since", BreakerRow.load, fold)
REMEMBER: Final = (BREAKER,)


def open_since(memory: Memory, alias: str) -> float | None:
    """The first poll that saw ``alias``'s breaker open (and none since saw it closed)."""
    row = memory.get(BREAKER, alias)
    return None if row is None else row.open_since_s
