"""What the toy rule remembers between cron runs, per GPU: the highest draw of the current run of hot
polls (``peak_w``), reset by a poll at or under the threshold. Pure; the engine keeps the rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from gpuheal.core.memory import number
from gpuheal.core.remember import Remember

if TYPE_CHECKING:
    from gpuheal.core.view import FleetView

THRESHOLD_W: Final = 400.0  # the toy's power_w (tests/test_toy_rule.py PARAMS)


@dataclass(frozen=True, slots=True)
class PeakRow:
    at_s: float | None
    peak_w: float | None  # None: the last known poll was not hot

    def to_json(self) -> dict[str, object]:
        return {"at_s": self.at_s, "peak_w": self.peak_w}

    @classmethod
    def load(cls, data: object) -> PeakRow | None:
        if not isinstance(data, dict):
            return None
        at_s, peak = data.get("at_s"), data.get("peak_w")
        if number(at_s) is None or (peak is not None and number(peak) is None):
            return None
        return cls(at_s=number(at_s), peak_w=number(peak))


def fold(prev: PeakRow | None, view: FleetView, alias: str) -> PeakRow | None:
    sample = view.sample(alias)
    power = None if sample is None else sample.power_w
    if power is None:
        return None  # not known: the row stays as it was
    if power <= THRESHOLD_W:
        return PeakRow(at_s=view.now_s, peak_w=None)
    earlier = prev.peak_w if prev is not None and prev.peak_w is not None else power
    return PeakRow(at_s=view.now_s, peak_w=max(earlier, power))


PEAK: Final = Remember("toy_peak", PeakRow.load, fold)
REMEMBER: Final = (PEAK,)
