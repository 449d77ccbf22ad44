"""Rule 1: GPU temperature critical — above 85 °C for 2+ consecutive polls.

Fires at the 2nd consecutive hot poll (one hot poll never fires: the engine's ``hold_polls``).
Clears only below 80 °C (the spec's "Verify: temp drops below 80 °C"): a GPU hovering at 82 °C
stays critical instead of flapping.
"""

from __future__ import annotations

from typing import Final

from gpuheal.config.model import RemedyParams
from gpuheal.core.issue import Finding, IssueRecord
from gpuheal.core.remedy import Incident, Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.rules._util import THERMAL, show
from gpuheal.signals import Need, Signal, needs

ID: Final = "thermal-critical"
SCOPE: Final = "gpu"
SEVERITY: Final = "critical"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.TEMP)
INHIBITS: Final = None
JUDGED_FROM_BENCH: Final = False
hold: Final = None  # the engine's: hold_polls consecutive hot polls
remember: Final = None


class Params(RemedyParams):
    temp_c: float  # above this a poll is hot
    clear_below_c: float  # a firing issue clears only below this (hysteresis)


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    sample = view.sample(alias)
    temp = None if sample is None else sample.temp_c
    if temp is None:
        return None
    if temp > p.temp_c:
        return Finding(
            {"temp_c": temp, "threshold_c": p.temp_c, "clear_below_c": p.clear_below_c},
            f"{alias} at {show(temp)} °C, above {show(p.temp_c)} °C",
        )
    return False


def recovered(view: FleetView, alias: str, p: Params, record: IssueRecord) -> bool | None:
    sample = view.sample(alias)
    temp = None if sample is None else sample.temp_c
    if temp is None:
        return None
    return temp < p.clear_below_c


REMEDY: Final = Remedy(
    ("shed-load", "redirect-traffic"),
    why_escalate="still above 85 °C after load shedding (Rule 1)",
    incident=Incident(THERMAL, 2),  # the highest tier: its message carries Rule 8's tiers (one incident)
)
