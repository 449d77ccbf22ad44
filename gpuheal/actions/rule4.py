"""Rule 4's checks at the edge (issue 22, item 2): after the regression's steps ran (the process
snapshot, the power-limit check), gather what the pure decision needs — the GPU's compute processes,
the pid of this GPU's llama-server, the power check — and apply :func:`gpuheal.core.rule4.decide` to
the attempt. The audit trail gets every check's verdict and the values behind it (``detected`` and
``evidence.rule4``); a re-benchmark is marked due when a fix was applied (``rebench.json``, taken by
the next ``bench`` of that GPU)."""

from __future__ import annotations

from typing import Any

from gpuheal.actions import process_check
from gpuheal.core import rule4
from gpuheal.parse.smi import GpuProcess, parse_rocm_pids


def conclude(ex, cfg, runner, values: dict[str, str], timeout_s: float) -> None:
    """Decide the attempt ``ex`` (an :class:`~gpuheal.actions.execute.Execution` whose steps ran)."""
    g = cfg.gpu(ex.item.gpu)
    detected = ex.item.detected or {}
    util = detected.get("util_pct")
    util = float(util) if isinstance(util, int | float) and not isinstance(util, bool) else None
    processes, unread = _processes(ex.evidence, g)
    own = _own_pids(g, runner, values, timeout_s) if processes else frozenset()
    competition = rule4.judge_competition(util, cfg.heal.competing_util_pct, processes, own, unread=unread)
    power_step = next((s for s in ex.steps if s.action == "restore-power-limit"), None)
    power = _power(power_step)
    restored = power_step is not None and power_step.ok and power.throttled is rule4.Verdict.YES
    decision = rule4.decide(power, restored, competition)
    ex.evidence["rule4"] = {
        "competition": competition.record(),
        "power": power.record(),
        "own_pids": sorted(own),
        "decision": decision.record(),
    }
    if decision.rebench:
        ex.verification = {**ex.verification, "rebench": "due: the next `gpuheal bench` of this GPU verifies"}
    if decision.result == "escalated":
        ex.result, ex.escalate_reason = "escalated", decision.reason


def found(store, subject, ex, run_id: str, now_s: float):
    """``subject`` with what the checks found in its ``detected`` (the audit line and the alert
    carry it); when a fix was applied, the GPU is marked for its verifying re-benchmark."""
    from dataclasses import replace

    from gpuheal.core import rebench
    from gpuheal.state import files

    if ex.verification.get("rebench"):
        reason = ex.evidence["rule4"]["decision"]["reason"]
        doc = rebench.marked(
            store.read(files.REBENCH, {}), subject.gpu, subject.issue, reason, now_s, run_id, "restore-power-limit"
        )
        store.write(files.REBENCH, doc)
    return replace(subject, detected={**subject.detected, **detected_of(ex)})


def rebench_verdict(store, attempt) -> str | None:
    """``still-broken`` for a pending attempt whose verifying re-benchmark (taken by ``bench``) did
    not reach the recovered level: it fails now, and the regression escalates (Rule 4)."""
    from gpuheal.core import rebench, verify
    from gpuheal.state import files

    if attempt.status != verify.PENDING or attempt.issue != rule4.ISSUE:
        return None
    failed = rebench.disproved(store.read(files.REBENCH, {}), attempt.gpu, attempt.issue, attempt.run_id)
    return verify.STILL_BROKEN if failed else None


def detected_of(ex) -> dict[str, Any]:
    """What the checks found, for the audit's ``detected`` and the alert (one line each)."""
    found = ex.evidence.get("rule4")
    if not isinstance(found, dict):
        return {}
    return {
        "competing": found["competition"]["competing"],
        "competing_processes": found["competition"]["processes"],
        "power_throttled": found["power"]["throttled"],
        "power_check": found["power"]["why"],
        "decision": found["decision"]["reason"],
    }


def _processes(evidence: dict[str, Any], g) -> tuple[list[GpuProcess] | None, str]:
    """This GPU's compute processes from the snapshot step, or ``None`` and why not."""
    if "snapshot_error" in evidence or "snapshot_parse_error" in evidence:
        why = evidence.get("snapshot_error") or evidence["snapshot_parse_error"]
        return None, f"the process snapshot failed ({why})"
    if g.vendor == "amd":
        if g.gpu_index is not None:
            return None, "rocm-smi --showpids does not say which of the host's GPUs a process uses"
        found = parse_rocm_pids(str(evidence.get("snapshot") or ""))
        if found is None:
            return None, "rocm-smi --showpids gave no process list"
        procs, unreadable = found
        return (None, f"rocm-smi --showpids: {unreadable} entries unreadable") if unreadable else (procs, "")
    listed = evidence.get("gpu_processes")
    if not isinstance(listed, list):
        return None, "no process snapshot was taken"
    return [GpuProcess(int(p["pid"]), str(p["name"]), p.get("used_mb")) for p in listed], ""


def _own_pids(g, runner, values: dict[str, str], timeout_s: float) -> frozenset[int]:
    """The pids of the llama-server serving this GPU's endpoint port (``pgrep -af llama-server``,
    where the GPU's commands run); empty when not known — then the program name decides."""
    target = g.host if g.transport == "ssh" else "local"
    try:
        outcome = runner(target, list(process_check.PGREP_ARGV), timeout_s)
    except Exception:  # noqa: BLE001 — a failed look is "not known", never the end of the decision
        return frozenset()
    if outcome.error or outcome.timed_out or outcome.rc != 0:
        return frozenset()
    return frozenset(process_check.read_pgrep(outcome.stdout or "", process_check.endpoint_port(values["endpoint"])))


def _power(step) -> rule4.PowerCheck:
    if step is None:
        return rule4.PowerCheck(rule4.Verdict.NOT_KNOWN, "no power-limit check for this GPU (no power_limit_command)")
    check = step.check
    if not isinstance(check, dict):  # a configured power_limit_command: it ran, gpuheal cannot judge its output
        verdict = rule4.Verdict.YES if step.ok else rule4.Verdict.NOT_KNOWN
        return rule4.PowerCheck(verdict, f"power_limit_command ran ({'ok' if step.ok else step.error})",
                                target_w=None)  # fmt: skip
    return rule4.PowerCheck(rule4.Verdict(check["throttled"]), str(check["why"]), target_w=check.get("target_w"))
