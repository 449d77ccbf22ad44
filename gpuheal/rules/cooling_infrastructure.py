"""Rule 1.3: many GPUs hot at once → the cooling infrastructure, not one GPU (gpu ``fleet``).

The spec's "all GPUs hot" is ``cooling_fraction: 1.0`` over the whole fleet (the default). A site
with racks sets ``group_by: rack`` (a ``gpus[].labels`` key) and, say, ``cooling_fraction: 0.5``: a
rack with half its GPUs hot is a cooling failure there, not 30 separate thermal incidents (issue
21 point 2). "Hot" is each GPU's own Rule 1 threshold, with this rule's hold. A GPU whose
temperature is not known this poll might be hot or cool: a group is hot when its known-hot GPUs
alone reach the fraction, not hot when even counting every unknown one as hot they do not, and
otherwise not known. Each group needs at least ``min_gpus`` GPUs (in a one-GPU group Rule 1 already
says it all). Resolves when no group has that share of GPUs still above their Rule 1 clear
temperature (80 °C): with the defaults, when any GPU is back below it.
"""

from __future__ import annotations

import math
from typing import Final, Literal

from gpuheal.config.model import EngineParams
from gpuheal.core.issue import Finding, IssueRecord
from gpuheal.core.remedy import Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.rules import thermal_critical as rule1
from gpuheal.rules._util import show
from gpuheal.signals import Need, Signal, needs

ID: Final = "cooling-infrastructure"
SCOPE: Final = "fleet"
SEVERITY: Final = "critical"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.TEMP)
INHIBITS: Final = None
JUDGED_FROM_BENCH: Final = False
hold: Final = None  # the engine's: hold_polls hot polls
remember: Final = None
FLEET_GROUP = "fleet"  # the group's name when group_by is "" (the whole fleet)


class Params(EngineParams):
    min_gpus: int  # a group needs at least this many GPUs (in a one-GPU group Rule 1 says it all)
    cooling_fraction: float  # this share of a group's GPUs hot is a cooling failure there
    group_by: str  # a gpus[].labels key (rack, site); "": the whole fleet is one group


def _groups(view: FleetView, p: Params) -> dict[str, list[str]]:
    """GPUs by their ``group_by`` label (GPUs without it are in no group), or the whole fleet."""
    key = p.group_by
    if not key:
        return {FLEET_GROUP: list(view.aliases)}
    out: dict[str, list[str]] = {}
    for alias in view.aliases:
        value = view.gpu(alias).labels.get(key)
        if value:
            out.setdefault(value, []).append(alias)
    return out


def _temp(view: FleetView, alias: str) -> float | None:
    sample = view.sample(alias)
    return None if sample is None else sample.temp_c


def _judge(
    view: FleetView, aliases: list[str], p: Params, limit: Literal["temp_c", "clear_below_c"]
) -> tuple[bool | None, list[str]]:
    """Whether at least the fraction of ``aliases`` is hot — above Rule 1's ``temp_c``, or (for
    recovery) not yet below its ``clear_below_c``: True, False or None (not known), and the GPUs
    known to be so."""
    strict = limit == "temp_c"
    need = math.ceil(p.cooling_fraction * len(aliases) - 1e-9)
    over: list[str] = []
    unknown = 0
    for alias in aliases:
        temp = _temp(view, alias)
        if temp is None:
            unknown += 1
            continue
        hot = view.rule_params(rule1.ID, rule1.Params, alias)
        if temp > hot.temp_c if strict else temp >= hot.clear_below_c:
            over.append(alias)
    if len(over) >= need:
        return True, over
    return (None if len(over) + unknown >= need else False), over


def detect(view: FleetView, subject: str, p: Params) -> Detection:
    hot: dict[str, list[str]] = {}
    unknown = False
    for name, aliases in sorted(_groups(view, p).items()):
        if len(aliases) < p.min_gpus:
            continue
        verdict, over = _judge(view, aliases, p, "temp_c")
        if verdict:
            hot[name] = sorted(over)
        unknown = unknown or verdict is None
    if not hot:
        return None if unknown else False
    gpus = sorted(a for over in hot.values() for a in over)
    temps = [_temp(view, a) for a in gpus]
    hottest = max(t for t in temps if t is not None)
    where = FLEET_GROUP if list(hot) == [FLEET_GROUP] else f"{p.group_by} {', '.join(hot)}"
    count = f"all {len(gpus)}" if p.cooling_fraction >= 1.0 else str(len(gpus))
    return Finding(
        {"where": where, "gpus_hot": len(gpus), "max_temp_c": hottest,
         "min_temp_c": min(t for t in temps if t is not None), "groups": hot, "gpus": gpus},
        f"{count} GPUs in {where} above their critical temperature (hottest {show(hottest)} °C): check the cooling",
    )


def recovered(view: FleetView, subject: str, p: Params, record: IssueRecord) -> bool | None:
    unknown = False
    for aliases in _groups(view, p).values():
        if len(aliases) < p.min_gpus:
            continue
        verdict, _ = _judge(view, aliases, p, "clear_below_c")
        if verdict:
            return False
        unknown = unknown or verdict is None
    return None if unknown else True


REMEDY: Final = Remedy(
    automatic=False,
    why_escalate="GPUs hot together (the whole fleet, or cooling_fraction of a rack or site): "
    "check the cooling infrastructure (Rule 1.3)",
)
