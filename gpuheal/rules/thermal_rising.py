"""Rule 8, tier 2: predictive thermal critical — above 80 °C and still rising.

"Still rising" is a least-squares rise over the last ``window_s`` above ``rise_c_per_min`` (a small
positive margin, so a steady 82 °C with a jittery sensor is not "rising"). ``critical``: full alert
and aggressive load shedding. Recovers when the temperature drops below 80 °C (the spec's verify),
not merely when it stops rising.
"""

from __future__ import annotations

from gpuheal.rules.thermal_warning import current_temp, rising_above
from gpuheal.signals import Need, Signal, needs

ID = "thermal-rising"
SCOPE = "gpu"
SEVERITY = "critical"
NEEDS: tuple[Need, ...] = needs(Signal.TEMP, Signal.TEMP_TREND)


def detect(view, alias, p):
    return rising_above(view, alias, p, "still rising {rise} °C/min: redirect new requests away")


def recovered(view, alias, p, record):
    temp = current_temp(view, alias)
    if temp is None:
        return None
    return temp < p["clear_below_c"]
