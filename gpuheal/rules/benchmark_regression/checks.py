"""Rule 4's three checks as decisions, not snapshots (issue 22, item 2). Pure: values in, values out.

The spec's Rule 4 fix: "1. Check GPU utilization — if >90%, other process is competing; 2. Check
power limit — if throttled, restore to max; 3. Check thermal — if hot, apply Rule 1", verified by
"Benchmark returns to within 10% of baseline". Each check here answers yes, no or not known, with
the values that made it say so; :func:`decide` turns the three into what the attempt does:

- **hot** (a thermal issue of this GPU is open): Rule 1's (or Rule 8's) own fix runs; the regression
  joins that incident and does nothing of its own (:func:`hot_join`, used by the planner);
- **competing**: utilisation above ``heal.competing_util_pct`` while a process other than this GPU's
  llama-server holds compute on it → the humans are told which (pid, name, VRAM MB): gpuheal never
  kills it (Rule 2.3's kill is opt-in and about VRAM growth, not load);
- **throttled**: the enforced power limit below the target — the board's default, or its max when
  ``heal.power_restore: max`` (the spec's word; the default is safer) — with a tolerance → set the
  target, read from the board's own limits (never a number from anywhere else), then re-benchmark
  once: the next ``bench`` of that GPU is the verification;
- nothing found and nothing done → the regression is escalated at once ("possible hardware
  degradation"): waiting a day for a benchmark that nothing changed would only delay the humans.

A not-known check never acts: garbage, ``[N/A]``, a limit above the board's max, a process list
that could not be read all say "not known" and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuheal.parse.llama_process import is_llama_server
from gpuheal.parse.smi import GpuProcess
from gpuheal.rules.benchmark_regression.parse import PowerLimits

POWER_RESTORE = ("default", "max")
POWER_TOLERANCE_W = 1.0  # nvidia-smi prints 2 decimals; a limit within 1 W of its target is at it


class Verdict(StrEnum):
    YES = "yes"
    NO = "no"
    NOT_KNOWN = "not known"


@dataclass(frozen=True)
class PowerCheck:
    """Rule 4.2: whether the power limit is throttled, and the limit to set when it is."""

    throttled: Verdict
    why: str
    limits: PowerLimits | None = None
    target_w: float | None = None

    def record(self) -> dict[str, Any]:
        return {"throttled": str(self.throttled), "why": self.why, "target_w": self.target_w,
                **(self.limits.record() if self.limits else {})}  # fmt: skip


def judge_power(limits: PowerLimits | None, restore: str, tolerance_w: float = POWER_TOLERANCE_W) -> PowerCheck:
    """Throttled = the enforced limit below the target (``restore``: ``default`` or ``max``) by more
    than ``tolerance_w``. Any limit not known, or limits that contradict each other (a default or a
    current limit above the board's max), is "not known": never a wrong action."""
    if limits is None:
        return PowerCheck(Verdict.NOT_KNOWN, "power limits not read")
    current, default, top = limits.current_w, limits.default_w, limits.max_w
    for name, value in (("max", top), ("default", default), ("current", current)):
        if top is not None and value is not None and value > top + tolerance_w:
            return PowerCheck(Verdict.NOT_KNOWN, f"{name} limit {value:g} W above the board's max {top:g} W", limits)
    target = top if restore == "max" else default
    if current is None or target is None:
        missing = "current" if current is None else restore
        return PowerCheck(Verdict.NOT_KNOWN, f"{missing} power limit not known", limits)
    if current >= target - tolerance_w:
        return PowerCheck(Verdict.NO, f"power limit {current:g} W is at the {restore} {target:g} W", limits)
    why = f"power limit {current:g} W is below the {restore} {target:g} W"
    return PowerCheck(Verdict.YES, why, limits, target)


@dataclass(frozen=True)
class Competition:
    """Rule 4.1: which other processes hold compute on this GPU while it is busy."""

    competing: Verdict
    why: str
    others: tuple[GpuProcess, ...] = ()

    def record(self) -> dict[str, Any]:
        listed = [process_record(p) for p in self.others]
        return {"competing": str(self.competing), "why": self.why, "processes": listed}

    def named(self) -> str:
        return ", ".join(f"{p.name} (pid {p.pid}, {_mb(p.used_mb)})" for p in self.others)


def process_record(p: GpuProcess) -> dict[str, Any]:
    return {"pid": p.pid, "name": p.name, "vram_mb": p.used_mb}


def _mb(value: float | None) -> str:
    return "VRAM not known" if value is None else f"{value:.0f} MB VRAM"


def is_own(p: GpuProcess, own_pids: frozenset[int]) -> bool | None:
    """Whether ``p`` is this GPU's llama-server: its pid is the one serving the endpoint's port when
    that is known, else its program's name (:func:`gpuheal.parse.llama_process.is_llama_server`);
    ``None`` when neither can tell (``[Not Found]``: a process of another pid namespace, as
    nvidia-smi prints it inside a container)."""
    if own_pids:
        return p.pid in own_pids
    name = p.name.strip()
    if not name or name.startswith("["):
        return None
    return is_llama_server(name)


def judge_competition(
    util_pct: float | None,
    threshold_pct: float,
    processes: list[GpuProcess] | None,
    own_pids: frozenset[int] = frozenset(),
    unread: str = "",
) -> Competition:
    """Competing = utilisation above ``threshold_pct`` while another process holds compute on the GPU.

    Not busy → no, whatever else runs (the spec's condition is the utilisation). Busy with only this
    GPU's llama-server on the list → no: that is its own load. A list not read (``unread`` says why),
    a busy GPU with nothing listed, a utilisation not known, or a process nobody can identify → not
    known, naming what was seen."""
    if util_pct is not None and util_pct <= threshold_pct:
        return Competition(Verdict.NO, f"utilisation {util_pct:g} % is not above {threshold_pct:g} %")
    if processes is None:
        return Competition(Verdict.NOT_KNOWN, unread or "the GPU's process list could not be read")
    if not processes and util_pct is not None:  # busy, yet not even llama-server listed: the list is wrong
        return Competition(Verdict.NOT_KNOWN, f"utilisation {util_pct:g} % but no compute process listed")
    if own_pids and not any(p.pid in own_pids for p in processes):
        own_pids = frozenset()  # the pid on the port is not on the list (another pid namespace): names decide
    mine = [(p, is_own(p, own_pids)) for p in processes]
    others = tuple(p for p, own in mine if own is False)
    unsure = tuple(p for p, own in mine if own is None)
    if util_pct is None:
        return Competition(Verdict.NOT_KNOWN, "utilisation not known", others + unsure)
    if others:
        return Competition(Verdict.YES, f"utilisation {util_pct:g} % with another process on the GPU", others)
    if unsure:
        return Competition(Verdict.NOT_KNOWN, "a process on the GPU cannot be identified", unsure)
    return Competition(Verdict.NO, f"utilisation {util_pct:g} %, only llama-server holds compute")


@dataclass(frozen=True)
class Heat:
    """Rule 4.3: the same poll's thermal state of the GPU."""

    temp_c: float | None
    open_issue: str | None  # the most severe thermal issue open on the GPU

    @property
    def hot(self) -> Verdict:
        if self.open_issue is not None:
            return Verdict.YES
        return Verdict.NOT_KNOWN if self.temp_c is None else Verdict.NO

    def record(self) -> dict[str, Any]:
        return {"hot": str(self.hot), "temp_c": self.temp_c, "thermal_issue": self.open_issue}


def heat_of(temp_c: Any, thermal_open: tuple[str, ...]) -> Heat:
    """The GPU's heat from this poll's reading and its thermal issues open now, most severe first."""
    worst = thermal_open[0] if thermal_open else None
    value = temp_c if isinstance(temp_c, int | float) and not isinstance(temp_c, bool) else None
    return Heat(None if value is None else float(value), worst)


def hot_join(heat: Heat) -> str | None:
    """The planner's reason to leave the regression to the thermal fix (Rule 4.3, "if hot, apply
    Rule 1"): one incident, not two. ``None`` when the GPU is not (known to be) hot."""
    if heat.open_issue is None:
        return None
    temp = "" if heat.temp_c is None else f" at {heat.temp_c:g} °C"
    return f"hot{temp}: {heat.open_issue} is open on this GPU and its fix runs (Rule 4.3); one incident with it"


@dataclass(frozen=True)
class Decision:
    """What the attempt does after the checks: ``pending`` (a fix was applied: re-benchmark to
    verify) or ``escalated`` (the humans are told ``reason``)."""

    result: str
    reason: str
    rebench: bool

    def record(self) -> dict[str, Any]:
        return {"result": self.result, "reason": self.reason, "rebench": self.rebench}


def decide(power: PowerCheck, restored: bool, competition: Competition) -> Decision:
    """The attempt's outcome from the checks; ``restored``: the power limit was set and read back."""
    if competition.competing is Verdict.YES:
        fixed = " (power limit restored too)" if restored else ""
        return Decision("escalated", f"competing process on the GPU: {competition.named()}{fixed} (Rule 4.1)", restored)
    if restored:
        to = "" if power.target_w is None else f": restored to {power.target_w:g} W"
        return Decision("pending", f"{power.why}{to}; re-benchmark to verify", True)
    unknown = [c.why for c in (power, competition) if _verdict(c) is Verdict.NOT_KNOWN]
    if unknown:
        return Decision("escalated", f"regression with a cause not known: {'; '.join(unknown)} (Rule 4)", False)
    return Decision("escalated", "no competing process, power limit not throttled, not hot: possible hardware "
                    "degradation (Rule 4)", False)  # fmt: skip


def _verdict(check: PowerCheck | Competition) -> Verdict:
    return check.throttled if isinstance(check, PowerCheck) else check.competing
