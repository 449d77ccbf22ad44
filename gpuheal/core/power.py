"""A GPU's board power cap as an action (issue 27 items 7 and 12). Pure: argv in, verdicts out.

**Why.** The spec's own fleet runs LiteLLM from ``config.yaml`` with no database, so LiteLLM's
``/model/update`` cannot change a deployment (500 "No DB Connected", 400 "Model in config") and Rules 1
and 8 had no load-side action at all. Capping the hot GPU's board power is one that needs nothing but the
GPU's own tool, over the same transport as its restart: the board draws less, so it heats less, and every
request still gets an answer (Design Decision 1: load-side cooling, never fans). Built in as
``shed-load``'s default where LiteLLM cannot shed (``heal.shed_power_ratio``: × the limit in force, never
below the board's min), undone with ``restore-power-limit`` once the GPU stayed cool.

**How.** Read the limits (``nvidia-smi -i N --query-gpu=power.limit,power.default_limit,power.min_limit,
power.max_limit --format=csv,noheader,nounits``; ``rocm-smi -d N --showmaxpower --json``), set the cap
(``nvidia-smi -i N -pl W``; ``rocm-smi -d N --setpoweroverdrive W``, whole watts: rocm-smi refuses
anything else), then read it back: the change counts only when the board shows it within
:data:`READ_BACK_TOLERANCE_W`. rocm-smi exits 0 even when the value it set reads differently ("Unable set
power to"), so the read-back is the only proof. Lowering a cap never asks rocm-smi's out-of-spec
question (it asks only above the default), so no ``--autorespond`` is ever sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from gpuheal.core.catalog import on_gpu
from gpuheal.core.heal_state import HealState
from gpuheal.parse.power import PowerLimits, parse_power_limits, parse_rocm_power_cap

NVIDIA_QUERY = ("nvidia-smi", "--query-gpu=power.limit,power.default_limit,power.min_limit,power.max_limit",
                "--format=csv,noheader,nounits")  # fmt: skip
AMD_QUERY = ("rocm-smi", "--showmaxpower", "--json")
READ_BACK_TOLERANCE_W = 1.0  # a limit read back within this of the one set is the one set
POWER_EFFECT = "power-limit"  # the ``kind`` of the effect a cap leaves for its restore
MIN_CAP_W = 10.0  # never a cap below this, whatever the ratio (a board at 5 W serves nothing)


def query_argv(vendor: str, gpu_index: int | None) -> tuple[str, ...]:
    """The read-only command that shows the GPU's limits."""
    return on_gpu(AMD_QUERY if vendor == "amd" else NVIDIA_QUERY, gpu_index)


def set_argv(vendor: str, gpu_index: int | None, watts_: float) -> tuple[str, ...]:
    """The command that sets the cap to ``watts_`` (rocm-smi takes whole watts only)."""
    if vendor == "amd":
        return on_gpu(("rocm-smi", "--setpoweroverdrive", str(int(round(watts_)))), gpu_index)
    return on_gpu(("nvidia-smi", "-pl", f"{watts_:g}"), gpu_index)


def read_limits(vendor: str, text: str, gpu_index: int | None) -> PowerLimits | None:
    """The limits in an answer of :func:`query_argv` (``None``: not read)."""
    return parse_rocm_power_cap(text, gpu_index) if vendor == "amd" else parse_power_limits(text)


@dataclass(frozen=True)
class CapPlan:
    """What a cap does: ``target_w`` from ``before_w`` (``None``: nothing to lower), and why."""

    before_w: float | None
    target_w: float | None
    why: str


def cap_plan(vendor: str, limits: PowerLimits | None, ratio: float) -> CapPlan:
    """The cap ``ratio`` x the limit in force, never below the board's min (NVIDIA prints it) nor
    :data:`MIN_CAP_W`; whole watts on AMD. A limit not known changes nothing (``target_w`` ``None``)."""
    current = None if limits is None else limits.current_w
    if current is None:
        return CapPlan(None, None, "power limit not known")
    floor = max(MIN_CAP_W, limits.min_w or 0.0) if limits is not None else MIN_CAP_W
    target = max(floor, current * ratio)
    target = float(math.floor(target)) if vendor == "amd" else round(target, 2)
    if target >= current - READ_BACK_TOLERANCE_W:
        return CapPlan(current, None, f"power limit {current:g} W is already at the floor {floor:g} W")
    return CapPlan(current, target, f"power limit {current:g} W -> {target:g} W ({ratio:.0%} of it)")


def seen(limits: PowerLimits | None, target_w: float) -> bool:
    """Whether the board shows ``target_w`` as its limit now."""
    current = None if limits is None else limits.current_w
    return current is not None and abs(current - target_w) <= READ_BACK_TOLERANCE_W


def note_restore(state: HealState, alias: str, effects: list[dict[str, Any]]) -> HealState:
    """Remember the power limit a thermal cap found before the first change, so ``restore-power-limit``
    puts back exactly that; a later cap of the same mitigation never overwrites it (as the LiteLLM
    value is kept: :func:`gpuheal.core.verify.note_restore`)."""
    m = state.active.get(alias)
    if m is None or m.power_w is not None:
        return state
    for effect in effects:
        before = effect.get("before_w")
        if effect.get("kind") == POWER_EFFECT and isinstance(before, int | float) and before > 0:
            return state.with_mitigation(alias, replace(m, power_w=float(before)))
    return state
