"""What Rule 8 tier 2 remembers between polls, per GPU: the last poll's temperature and its rise (``rise``).
Pure; the engine keeps the rows (:mod:`gpuheal.core.memory`).

Tier 2's escalation is on "still rising" (spec Rule 8: "If Tier 2 triggers and temp still rising after 5
min → possible hardware failure"): when its attempt's verification window passes, ``remedy.py`` reads this
row to tell a GPU still rising from one falling (or flat) above 80 °C. The rise is the rule's own — a least
squares fit over ``window_s`` with ``min_samples`` spanning ``min_span_s`` (gpuheal's history, or the
source's own trend through Prometheus) — so every source judges it alike. A poll that does not know the
temperature changes nothing; one that knows it but has too few samples for a fit stores ``None`` for the
rise (not known), never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from gpuheal.core.memory import number
from gpuheal.core.remember import Remember
from gpuheal.rules.thermal_warning import current_temp, rise

if TYPE_CHECKING:
    from gpuheal.core.view import FleetView


@dataclass(frozen=True, slots=True)
class RiseRow:
    """The poll it was seen at, the temperature then and its rise (°C per minute; ``None``: not known)."""

    at_s: float
    temp_c: float
    rise_c_per_min: float | None

    def to_json(self) -> dict[str, object] | None:
        """Kept only with a rise: ``remedy.recheck`` reads a rise not known as no row, and ``fold`` never
        reads the last row."""
        if self.rise_c_per_min is None:
            return None
        return {"at_s": self.at_s, "temp_c": self.temp_c, "rise_c_per_min": self.rise_c_per_min}

    @classmethod
    def load(cls, data: object) -> RiseRow | None:
        """A stored row; a damaged one (a field missing, text, NaN) is none (started again)."""
        if not isinstance(data, dict):
            return None
        at_s, temp = number(data.get("at_s")), number(data.get("temp_c"))
        slope = data.get("rise_c_per_min")
        rate = number(slope)
        if at_s is None or temp is None or (slope is not None and rate is None):
            return None
        return cls(float(at_s), float(temp), None if rate is None else float(rate))


def fold(prev: RiseRow | None, view: FleetView, alias: str) -> RiseRow | None:
    """This poll's temperature and rise; ``None`` when the poll does not know the temperature."""
    from gpuheal.rules.thermal_rising import ID, Params  # the rule module imports this one

    temp = current_temp(view, alias)
    if temp is None:
        return None
    fit = rise(view, alias, view.rule_params(ID, Params, alias))
    return RiseRow(view.now_s, float(temp), None if fit is None else round(fit.slope, 3))


RISE: Final = Remember("rise", RiseRow.load, fold)
REMEMBER: Final = (RISE,)
