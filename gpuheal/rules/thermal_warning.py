"""Rule 8, tier 1: predictive thermal warning — above 70 °C and rising faster than 2 °C/min.

The rise is a least-squares slope over the last ``window_s`` (5 min), needing ``min_samples`` samples
spanning ``min_span_s`` — a few minutes, never two samples. Reported as a ``warning`` issue; it sends
no Zulip alert (contract: "no alert"). Recovers when the rise drops below ``clear_rise_c_per_min``
(1 °C/min, the spec's verify) or the GPU is back at or below 70 °C.
"""

from __future__ import annotations

from typing import Final

from gpuheal.config.model import RemedyParams
from gpuheal.core import timing
from gpuheal.core.issue import Finding, IssueRecord
from gpuheal.core.remedy import Incident, Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.trend import Fit
from gpuheal.core.view import FleetView
from gpuheal.rules._util import THERMAL, num, show
from gpuheal.signals import Need, Signal, needs, trend

ID: Final = "thermal-warning"
SCOPE: Final = "gpu"
SEVERITY: Final = "warning"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.TEMP, trend(Signal.TEMP_TREND, "window_s", spans=("min_span_s",),
                                                          above="temp_c"))
INHIBITS: Final = None
JUDGED_FROM_BENCH: Final = False
hold: Final = None  # the engine's hold_polls / hold_s (the rise itself spans minutes)
remember: Final = None


class RiseParams(RemedyParams):
    """What both tiers of Rule 8 read to say "hot and rising" (``thermal-rising`` too)."""

    temp_c: float  # above this, a rise counts
    rise_c_per_min: float  # rising faster than this (least squares over the window)
    window_s: float  # the window the rise is fitted over
    min_samples: int  # at least this many samples in it
    min_span_s: float  # spanning at least this long: a few minutes, never two samples


class Params(RiseParams):
    clear_rise_c_per_min: float  # a firing warning clears once the rise is below this (or not hot)


def rise(view: FleetView, alias: str, p: RiseParams) -> Fit | None:
    """°C per minute over the rule's window, or ``None`` when too few samples."""
    fit = view.temp_rise(alias, p.window_s)
    if fit is None or fit.n < p.min_samples:
        return None
    if not timing.at_least(fit.span_s, p.min_span_s, view.tolerance_s):  # spans counted in polls
        return None
    return fit


def current_temp(view: FleetView, alias: str) -> float | None:
    sample = view.sample(alias)
    return None if sample is None else sample.temp_c


def rising_above(view: FleetView, alias: str, p: RiseParams, advice: str) -> Detection:
    """The finding both tiers share: above ``temp_c`` and rising faster than ``rise_c_per_min``
    (``None`` = not known, ``False`` = no). ``advice`` ends the summary line."""
    temp = current_temp(view, alias)
    if temp is None:
        return None
    if temp <= p.temp_c:
        return False
    fit = rise(view, alias, p)
    if fit is None:
        return None
    if fit.slope <= p.rise_c_per_min:
        return False
    return Finding(
        {
            "temp_c": temp,
            "rise_c_per_min": num(fit.slope, 2),
            "threshold_c": p.temp_c,
            "threshold_rise_c_per_min": p.rise_c_per_min,
            "samples": fit.n,
            "window_s": num(fit.span_s, 0),
        },
        f"{alias} at {show(temp)} °C and {advice}".replace("{rise}", show(fit.slope, 1)),
    )


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    return rising_above(view, alias, p, "rising {rise} °C/min: reduce concurrency")


def recovered(view: FleetView, alias: str, p: Params, record: IssueRecord) -> bool | None:
    temp = current_temp(view, alias)
    if temp is None:
        return None
    if temp <= p.temp_c:
        return True
    fit = rise(view, alias, p)
    if fit is None:
        return None
    return fit.slope < p.clear_rise_c_per_min


REMEDY: Final = Remedy(
    ("shed-load",),
    silent=True,
    why_escalate="temperature keeps rising after shedding 50 % of the load (Rule 8 tier 1)",
    incident=Incident(THERMAL, 0),  # the lowest tier: carried in the messages of the tiers above it
)
