"""Rule 8, tier 2: predictive thermal critical — above 80 °C and still rising.

"Still rising" is a least-squares rise over the last ``window_s`` above ``rise_c_per_min`` (a small
positive margin, so a steady 82 °C with a jittery sensor is not "rising"). ``critical``: full alert
and aggressive load shedding. Recovers when the temperature drops below 80 °C (the spec's verify),
not merely when it stops rising.
"""

from __future__ import annotations

from gpuheal.core.engine import NEEDS_MONITOR, Finding
from gpuheal.rules._util import num, show
from gpuheal.rules.thermal_warning import rise

ID = "thermal-rising"
SCOPE = "gpu"
SEVERITY = "critical"
NEEDS = frozenset({NEEDS_MONITOR})


def _temp(view, alias):
    sample = view.sample(alias)
    return None if sample is None else sample.temp_c


def detect(view, alias, p):
    temp = _temp(view, alias)
    if temp is None:
        return None
    if temp <= p["temp_c"]:
        return False
    fit = rise(view, alias, p)
    if fit is None:
        return None
    if fit.slope <= p["rise_c_per_min"]:
        return False
    return Finding(
        {
            "temp_c": temp,
            "rise_c_per_min": num(fit.slope, 2),
            "threshold_c": p["temp_c"],
            "samples": fit.n,
            "window_s": num(fit.span_s, 0),
        },
        f"{alias} at {show(temp)} °C and still rising {show(fit.slope, 1)} °C/min: "
        "redirect new requests away",
    )


def recovered(view, alias, p, record):
    temp = _temp(view, alias)
    if temp is None:
        return None
    return temp < p["clear_below_c"]
