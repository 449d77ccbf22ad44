"""Rule 4's fix: three checks decide, not snapshots (issue 22, item 2). The hooks of ``REMEDY``
(:mod:`gpuheal.core.remedy`); the decisions are :mod:`~gpuheal.rules.benchmark_regression.checks`'.

- ``guard`` (Rule 4.3, "check thermal — if hot, apply Rule 1"): the regression carries the same poll's
  heat, and while a thermal issue of its GPU is open — firing, or pending its hold — that issue's own
  fix runs and the regression joins its incident: no fix and no escalation of its own;
- ``conclude``: after the regression's steps ran (the process snapshot, the power-limit check), gather
  what the decision needs — the GPU's compute processes, the pid of this GPU's llama-server, the power
  check — and apply :func:`~gpuheal.rules.benchmark_regression.checks.decide` to the attempt. The audit
  trail gets every check's verdict and the values behind it (``detected`` and ``evidence.rule4``); a
  fix that was applied asks for the re-benchmark that verifies it (:mod:`gpuheal.core.rebench`).
"""

from __future__ import annotations

from typing import Any

from gpuheal.config.model import GpuConfig
from gpuheal.core import kfd
from gpuheal.core.actions import StepResult
from gpuheal.core.rebench import Ask
from gpuheal.core.remedy import Execution, Guard, Planning, RemedyContext, Result
from gpuheal.parse.smi import GpuProcess, parse_rocm_pids
from gpuheal.rules.benchmark_regression import checks

POWER_ACTION = "restore-power-limit"


def guard(p: Planning) -> Guard:
    """Rule 4.3: the regression joins its GPU's open thermal incident (:func:`checks.hot_join`): the
    other open issues of its own incident family (``REMEDY.incident``), most severe first."""
    own = p.incidents.get(p.issue)
    if p.gpu == "fleet" or own is None:
        return Guard()
    heat = checks.heat_of(p.detected.get("temp_c"), p.open_in(own.family))
    return Guard(joins=checks.hot_join(heat), seen={"heat": heat.record()})


def conclude(ex: Execution, ctx: RemedyContext) -> None:
    """Decide the attempt whose steps ran and passed: escalate with what was found, or ask for the
    re-benchmark that verifies the fix that was applied."""
    if ex.result is not Result.ACTED or ex.item.gpu == "fleet":
        return
    g = ctx.cfg.gpu(ex.item.gpu)
    util = (ex.item.detected or {}).get("util_pct")
    util = float(util) if isinstance(util, int | float) and not isinstance(util, bool) else None
    processes, unread = processes_of(ex.evidence, g, ctx)
    own = ctx.llama_pids() if processes else frozenset()
    competition = checks.judge_competition(util, ctx.cfg.heal.competing_util_pct, processes, own, unread=unread)
    power_step = next((s for s in ex.steps if s.action == POWER_ACTION), None)
    power = _power(power_step)
    restored = power_step is not None and power_step.ok and power.throttled is checks.Verdict.YES
    decision = checks.decide(power, restored, competition)
    found = {
        "competition": competition.record(),
        "power": power.record(),
        "own_pids": sorted(own),
        "decision": decision.record(),
    }
    ex.evidence["rule4"] = found
    if decision.rebench:
        ex.verification = {**ex.verification, "rebench": "due: the next `gpuheal bench` of this GPU verifies"}
        ex.rebench = Ask(decision.reason, POWER_ACTION)
    if decision.result == "escalated":
        ex.ends(Result.ESCALATED, decision.reason)
    ex.found.update(detected_of(found))


def detected_of(found: dict[str, Any]) -> dict[str, Any]:
    """What the checks found, for the audit's ``detected`` and the alert (one line each)."""
    return {
        "competing": found["competition"]["competing"],
        "competing_processes": found["competition"]["processes"],
        "power_throttled": found["power"]["throttled"],
        "power_check": found["power"]["why"],
        "decision": found["decision"]["reason"],
    }


def processes_of(
    evidence: dict[str, Any], g: GpuConfig, ctx: RemedyContext | None = None
) -> tuple[list[GpuProcess] | None, str]:
    """This GPU's compute processes from the snapshot step, or ``None`` and why not. On a host with several
    AMD GPUs, rocm-smi's list is narrowed to this GPU's processes and their VRAM on it by the KFD
    (:mod:`gpuheal.core.kfd`, issue 27 item 12) — ``ctx`` runs the reads; without it, not known."""
    if "snapshot_error" in evidence or "snapshot_parse_error" in evidence:
        why = evidence.get("snapshot_error") or evidence["snapshot_parse_error"]
        return None, f"the process snapshot failed ({why})"
    if g.vendor == "amd":
        found = parse_rocm_pids(str(evidence.get("snapshot") or ""))
        if found is None:
            return None, "rocm-smi --showpids gave no process list"
        procs, unreadable = found
        if unreadable:
            return None, f"rocm-smi --showpids: {unreadable} entries unreadable"
        if g.gpu_index is None:
            return procs, ""
        if ctx is None:
            return None, "rocm-smi --showpids does not say which of the host's GPUs a process uses"
        on = kfd.on_this_gpu(ctx, tuple(p.pid for p in procs))
        if on.used_mb is None:
            return None, f"which of the host's GPUs each process uses is not known ({on.why})"
        return [GpuProcess(p.pid, p.name, on.used_mb[p.pid]) for p in procs if p.pid in on.used_mb], ""
    listed = evidence.get("gpu_processes")
    if not isinstance(listed, list):
        return None, "no process snapshot was taken"
    return [GpuProcess(int(p["pid"]), str(p["name"]), p.get("used_mb")) for p in listed], ""


def _power(step: StepResult | None) -> checks.PowerCheck:
    if step is None:
        return checks.PowerCheck(checks.Verdict.NOT_KNOWN, "no power-limit check for this GPU (no power_limit_command)")
    check = step.check
    if not isinstance(check, dict):  # a configured power_limit_command: it ran, gpuheal cannot judge its output
        verdict = checks.Verdict.YES if step.ok else checks.Verdict.NOT_KNOWN
        return checks.PowerCheck(verdict, f"power_limit_command ran ({'ok' if step.ok else step.error})",
                                 target_w=None)  # fmt: skip
    return checks.PowerCheck(checks.Verdict(check["throttled"]), str(check["why"]), target_w=check.get("target_w"))
