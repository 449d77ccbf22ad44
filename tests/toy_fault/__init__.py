"""A toy rule, known only to this package (issue 26 item 6): a GPU drawing more than ``power_w`` watts
for ``hold_polls`` polls, remembering the peak draw of the run in ``memory.py``. Everything beyond ``detect`` is its ``REMEDY``, with hooks in ``remedy.py``;
the test that registers it for itself (one registry line) is tests/test_toy_rule.py. Not a product
rule: its id is no contract id."""

from __future__ import annotations

from typing import Final

from gpuheal.config.model import RemedyParams
from gpuheal.core.issue import Finding
from gpuheal.core.remedy import Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.signals import Need, Signal, needs
from tests.toy_fault import remedy
from tests.toy_fault.memory import PEAK, REMEMBER

ID: Final = "toy-fault"
SCOPE: Final = "gpu"
SEVERITY: Final = "warning"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.POWER)
INHIBITS: Final = None
recovered: Final = None
hold: Final = None
remember: Final = REMEMBER  # the peak draw of the current hot run, across cron runs
JUDGED_FROM_BENCH: Final = False


class Params(RemedyParams):
    power_w: float  # above this a poll is a toy fault


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    sample = view.sample(alias)
    power = None if sample is None else sample.power_w
    if power is None:
        return None
    if power <= p.power_w:
        return False
    row = view.memory.get(PEAK, alias)  # folded in by the engine before any rule detects
    peak = row.peak_w if row is not None and row.peak_w is not None else power
    return Finding({"power_w": power, "peak_w": peak}, f"{alias} draws {power:g} W (peak {peak:g} W)")


REMEDY: Final = Remedy(
    ("snapshot-processes",),
    why_escalate="the toy fault persists",
    state_file=remedy.STATE_FILE,
    track=remedy.track,
    guard=remedy.guard,
    before_step=remedy.before_step,
    conclude=remedy.conclude,
)
