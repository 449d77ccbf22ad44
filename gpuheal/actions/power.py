"""Perform a :class:`~gpuheal.core.actions.CapPower` and Rule 4.2's
:class:`~gpuheal.core.actions.RestorePowerLimit` (:func:`restore_power_limit`). A cap: read the GPU's
power limits, set the cap, read it back
(:mod:`gpuheal.core.power` decides; this module runs the argv lists where the GPU's commands run). Never
raises for what the world does; the change counts only when the read-back shows it, and only then does the
step carry the ``effect`` that ``restore-power-limit`` puts back after the GPU stayed cool.

A failure the setup causes — the tool missing or refusing, limits it cannot print, a board that ignores
the cap — is ``impossible``: as for a LiteLLM that cannot store a change (issue 11), with no command of
the operator's to fall back on the thermal issue is escalated in the same run. A command that timed out
is not: the next run tries again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuheal.actions.runner import Run
from gpuheal.core import power
from gpuheal.core.actions import CapPower, RestorePowerLimit, StepResult
from gpuheal.core.catalog import gpu_flag, on_gpu
from gpuheal.parse.power import PowerLimits


def cap_power(step: CapPower, run: Run) -> StepResult:
    """Cap (``step.ratio``) or put back (``step.watts``) the board power limit, proven by a read-back."""
    query_argv = power.query_argv(step.vendor, step.gpu_index)
    query = run(query_argv, step.note)
    if not query.ok:
        return _failed(query, f"power limits not read ({query.error})")
    limits = power.read_limits(step.vendor, query.stdout or query.output, step.gpu_index)
    before = None if limits is None else limits.current_w
    if step.ratio is not None:
        plan = power.cap_plan(step.vendor, limits, step.ratio)
        if plan.before_w is None:
            return _failed(query, f"{plan.why}: {' '.join(query_argv)} answered no limit", impossible=True)
        if plan.target_w is None:
            return replace(query, note=plan.why)  # nothing to lower: done, and nothing to put back
        target, why = plan.target_w, plan.why
    elif step.watts is not None:
        target, why = step.watts, f"power limit back to {step.watts:g} W"
        if power.seen(limits, target):
            return replace(query, note=f"power limit already {target:g} W")
    else:
        return _failed(query, "nothing to set (no ratio, no watts)", impossible=True)
    setter = run(power.set_argv(step.vendor, step.gpu_index, target))
    if not setter.ok:
        return replace(_failed(setter, setter.error), note=why, check={"before_w": before, "target_w": target})
    back = run(query_argv)
    after = power.read_limits(step.vendor, back.stdout or back.output, step.gpu_index) if back.ok else None
    after_w = None if after is None else after.current_w
    check = {"before_w": before, "target_w": target, "after_w": after_w}
    if not power.seen(after, target):
        reads = "not read" if after_w is None else f"reads {after_w:g} W"
        unseen = f"the new power limit {target:g} W is not seen on the board ({reads})"
        return replace(_failed(setter, unseen, impossible=back.ok), note=why, check=check)
    effect = {"kind": power.POWER_EFFECT, "before_w": before, "after_w": after_w} if step.ratio is not None else None
    return replace(setter, note=f"{why}: set, read back", check=check, effect=effect)


def _failed(res: StepResult, error: str | None, impossible: bool | None = None) -> StepResult:
    """``res`` failed with ``error``: impossible (the setup's doing: the tool missing or refusing) unless
    it timed out, when the next run may do better."""
    transient = res.rc is None and "timed out" in (res.error or "")
    return replace(res, ok=False, error=error, impossible=not transient if impossible is None else impossible)


def reset_rocm_cap(
    query: StepResult, limits: PowerLimits | None, step: RestorePowerLimit, card: int | None,
    run: Run,
) -> StepResult:
    """Rule 4.2 on AMD (issue 27 item 12): rocm-smi prints the cap in force but no default, so whether the
    board is throttled is known only by setting it — ``rocm-smi -d N --resetpoweroverdrive`` puts the cap
    to the board's own default (rocm_smi.py's setPowerOverDrive with 0) — and reading it back: higher
    than before, it was throttled and is restored (re-benchmarked to verify); the same, it was at its
    default and nothing changed. Lower (an operator had raised it above the default) is said, and the
    cap found is set back. A cap not read before or after changes nothing and is "not known"."""
    from gpuheal.rules.benchmark_regression.checks import PowerCheck, Verdict

    before = None if limits is None else limits.current_w
    if before is None:
        unknown = PowerCheck(Verdict.NOT_KNOWN, "power cap not read (rocm-smi --showmaxpower printed none)", limits)
        return replace(query, note=unknown.why, check=unknown.record())
    reset = run(on_gpu(("rocm-smi", "--resetpoweroverdrive"), card))
    if not reset.ok:
        failed = PowerCheck(Verdict.NOT_KNOWN, f"cap {before:g} W; rocm-smi --resetpoweroverdrive failed", limits)
        return replace(reset, note=failed.why, check=failed.record())
    back = run(step.query_argv)
    after_w = None
    if back.ok:
        seen = power.read_limits("amd", back.stdout or back.output, card)
        after_w = None if seen is None else seen.current_w
    if after_w is None:
        unseen = PowerCheck(Verdict.NOT_KNOWN, f"cap {before:g} W; reset, but the cap is not read back", limits)
        return replace(reset, ok=False, error="the power cap is not seen after the reset", note=unseen.why,
                       check=unseen.record())  # fmt: skip
    tol = power.READ_BACK_TOLERANCE_W
    check_of = {"before_w": before, "after_w": after_w}
    if after_w > before + tol:
        fixed = PowerCheck(Verdict.YES, f"power cap {before:g} W was below the board's default {after_w:g} W",
                           PowerLimits(before, after_w), after_w)
        return replace(reset, note=f"{fixed.why}: reset (rocm-smi --resetpoweroverdrive), read back",
                       check={**fixed.record(), **check_of})  # fmt: skip
    if after_w >= before - tol:
        at = PowerCheck(Verdict.NO, f"power cap {before:g} W is the board's default (the reset changed nothing)",
                        PowerLimits(before, after_w))
        return replace(reset, note=at.why, check={**at.record(), **check_of})
    undo = run(power.set_argv("amd", card, before))
    back_again = "set back" if undo.ok else f"not set back ({undo.error}): it stays at the default"
    raised = PowerCheck(Verdict.NO, f"power cap {before:g} W was above the board's default {after_w:g} W "
                        f"(raised by an operator); {back_again}", PowerLimits(before, after_w))  # fmt: skip
    return replace(reset, note=raised.why, check={**raised.record(), **check_of})


def restore_power_limit(step: RestorePowerLimit, run: Run) -> StepResult:
    """Rule 4.2, "if throttled, restore to max": query the limits, judge them
    (:func:`~gpuheal.rules.benchmark_regression.checks.judge_power`: below the board's default, or its
    max with ``heal.power_restore: max``), and only when throttled set the target read from the board
    with ``nvidia-smi -pl``, then read it back: the change counts only when the board shows it. A limit
    not known (``[N/A]``, garbage, above the max, a query that failed) changes nothing and fails
    nothing: the check, kept in ``check``, says "not known" and why. On AMD rocm-smi prints the cap in
    force but no default: the cap is reset to the board's own default and read back
    (:func:`reset_rocm_cap`, issue 27 item 12)."""
    from gpuheal.rules.benchmark_regression.checks import PowerCheck, Verdict, judge_power
    from gpuheal.rules.benchmark_regression.parse import parse_power_limits, parse_rocm_power_cap

    query = run(step.query_argv, step.note)
    if not query.ok:
        unread = PowerCheck(Verdict.NOT_KNOWN, f"power limits not read ({query.error})")
        return replace(query, ok=True, error=None, note=unread.why, check=unread.record())
    if step.query_argv[0] == "rocm-smi":
        flag = gpu_flag(step.query_argv)
        card = int(flag[1]) if flag else None
        return reset_rocm_cap(query, parse_rocm_power_cap(query.stdout or query.output, card), step, card, run)
    judged = judge_power(parse_power_limits(query.output), step.restore)
    if judged.throttled is not Verdict.YES or judged.target_w is None:  # nothing to do, or not known: change nothing
        return replace(query, note=judged.why, check=judged.record())
    setter = run(("nvidia-smi", *gpu_flag(step.query_argv), "-pl", f"{judged.target_w:g}"))
    if not setter.ok:
        return replace(setter, note=judged.why, check=judged.record())
    seen = run(step.query_argv)
    after = parse_power_limits(seen.output) if seen.ok else None
    check: dict[str, Any] = {**judged.record(), "after_w": None if after is None else after.current_w}
    if after is None or after.current_w is None or abs(after.current_w - judged.target_w) > 1.0:
        unseen = "the new power limit is not seen on the board"
        return replace(setter, ok=False, error=unseen, note=judged.why, check=check)
    return replace(setter, note=f"{judged.why}: set to {judged.target_w:g} W, read back", check=check)
