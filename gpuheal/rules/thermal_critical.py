"""Rule 1: GPU temperature critical — above 85 °C for 2+ consecutive polls.

Fires at the 2nd consecutive hot poll (one hot poll never fires: the engine's ``hold_polls``).
Clears only below 80 °C (the spec's "Verify: temp drops below 80 °C"): a GPU hovering at 82 °C
stays critical instead of flapping.
"""

from __future__ import annotations

from gpuheal.core.engine import Finding
from gpuheal.rules._util import show
from gpuheal.signals import Need, Signal, needs

ID = "thermal-critical"
SCOPE = "gpu"
SEVERITY = "critical"
NEEDS: tuple[Need, ...] = needs(Signal.TEMP)


def detect(view, alias, p):
    sample = view.sample(alias)
    temp = None if sample is None else sample.temp_c
    if temp is None:
        return None
    if temp > p["temp_c"]:
        return Finding(
            {"temp_c": temp, "threshold_c": p["temp_c"], "clear_below_c": p["clear_below_c"]},
            f"{alias} at {show(temp)} °C, above {show(p['temp_c'])} °C",
        )
    return False


def recovered(view, alias, p, record):
    sample = view.sample(alias)
    temp = None if sample is None else sample.temp_c
    if temp is None:
        return None
    return temp < p["clear_below_c"]
