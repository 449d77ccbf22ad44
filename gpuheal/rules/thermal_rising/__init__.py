"""Rule 8, tier 2: predictive thermal critical — above 80 °C and still rising.

"Still rising" is a least-squares rise over the last ``window_s`` above ``rise_c_per_min`` (a small
positive margin, so a steady 82 °C with a jittery sensor is not "rising"). ``critical``: full alert and
aggressive load shedding — the spec's "apply Rule 1 logic": Rule 1's shed, then its redirect (on a fleet
whose LiteLLM cannot redirect, the shed alone: the power cap, issue 27 item 7). Recovers when the
temperature drops below 80 °C (the spec's verify), not merely when it stops rising. Its fix fails (and
is escalated: "possible hardware failure") only when the GPU is *still rising* as its verification
window passes; falling above 80 °C keeps the load shed and is judged again (``remedy.py``, from the rise
it remembers poll by poll: ``memory.py``).
"""

from __future__ import annotations

from typing import Final

from gpuheal.core.issue import IssueRecord
from gpuheal.core.remedy import Incident, Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.rules._util import THERMAL
from gpuheal.rules.thermal_rising import remedy
from gpuheal.rules.thermal_rising.memory import REMEMBER
from gpuheal.rules.thermal_warning import RiseParams, current_temp, rising_above
from gpuheal.signals import Need, Signal, needs, trend

ID: Final = "thermal-rising"
SCOPE: Final = "gpu"
SEVERITY: Final = "critical"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.TEMP, trend(Signal.TEMP_TREND, "window_s", spans=("min_span_s",),
                                                          above="temp_c"))
INHIBITS: Final = None
JUDGED_FROM_BENCH: Final = False
hold: Final = None  # the engine's hold_polls / hold_s
remember: Final = REMEMBER  # the last poll's temperature and rise: "still rising" when its window passes


class Params(RiseParams):
    clear_below_c: float  # a firing issue clears only below this, not when it stops rising


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    return rising_above(view, alias, p, "still rising {rise} °C/min: redirect new requests away")


def recovered(view: FleetView, alias: str, p: Params, record: IssueRecord) -> bool | None:
    temp = current_temp(view, alias)
    if temp is None:
        return None
    return temp < p.clear_below_c


REMEDY: Final = Remedy(
    ("shed-load", "redirect-traffic"),  # the spec's "redirect all new requests away ... apply Rule 1 logic"
    alert_now=True,
    why_escalate="still rising 5 minutes after tier 2 — possible hardware failure (Rule 8)",
    incident=Incident(THERMAL, 1),
    recheck=remedy.recheck,
)
