"""Rule 1.3: every GPU hot at once → the cooling infrastructure, not one GPU (gpu ``fleet``).

"All GPUs hot" uses each GPU's own Rule 1 threshold and the same hold; a GPU whose temperature is
not known this poll makes the whole finding not known (it might be the cool one). Needs at least
``min_gpus`` GPUs: in a one-GPU fleet Rule 1 already says it all. Resolves when any GPU is back
below its Rule 1 clear temperature (80 °C).
"""

from __future__ import annotations

from gpuheal.core.engine import Finding
from gpuheal.rules._util import show
from gpuheal.signals import Need, Signal, needs

ID = "cooling-infrastructure"
SCOPE = "fleet"
SEVERITY = "critical"
NEEDS: tuple[Need, ...] = needs(Signal.TEMP)
RULE1 = "thermal-critical"


def _temps(view):
    temps = {}
    for alias in view.aliases:
        sample = view.sample(alias)
        temp = None if sample is None else sample.temp_c
        if temp is None:
            return None
        temps[alias] = temp
    return temps


def detect(view, subject, p):
    if len(view.aliases) < p["min_gpus"]:
        return False
    temps = _temps(view)
    if temps is None:
        return None
    hot = {a: t for a, t in temps.items() if t > view.params(RULE1, a)["temp_c"]}
    if len(hot) < len(temps):
        return False
    hottest = max(temps.values())
    return Finding(
        {"gpus_hot": len(hot), "gpus": sorted(hot), "max_temp_c": hottest,
         "min_temp_c": min(temps.values())},
        f"all {len(hot)} GPUs above their critical temperature (hottest {show(hottest)} °C): "
        "check the cooling",
    )


def recovered(view, subject, p, record):
    temps = _temps(view)
    if temps is None:
        return None
    return any(t < view.params(RULE1, a)["clear_below_c"] for a, t in temps.items())
