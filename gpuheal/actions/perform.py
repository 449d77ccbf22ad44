"""Perform one action (:mod:`gpuheal.core.actions`) and say what it did: a command on its target (its
placeholders filled per argument, never a shell), a LiteLLM admin change, Rule 4.2's built-in power
limit restore. Never raises for what the world does; the output kept is redacted.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpuheal.config.model import Config
from gpuheal.core.actions import (
    Action,
    CapPower,
    CommandOutcome,
    LiteLLMUpdate,
    RestorePowerLimit,
    RewriteLiteLLM,
    RunCommand,
    StepResult,
)
from gpuheal.core.catalog import gpu_flag
from gpuheal.redact import redact

# (target, argv, timeout_s) -> what the command did
Runner = Callable[[str, list[str], float], CommandOutcome]
# (update, timeout_s) -> the same shape from LiteLLM's admin API, plus ``effect`` and ``impossible``
LiteLLMCall = Callable[[LiteLLMUpdate, float], CommandOutcome]
OUTPUT_KEPT = 4000  # characters of a command's output kept in its step result (the audit's tail)


def expand_argv(template: tuple[str, ...], values: dict[str, str]) -> list[str]:
    """Fill ``{alias} {host} {endpoint}`` (and ``{pid}`` for kill) per argument; never a shell."""
    from gpuheal.transport import expand

    pid = values.get("pid")
    if pid is not None:  # only kill_command knows {pid}; a pid is digits, never text from the network
        template = tuple(arg.replace("{pid}", str(int(pid)) if pid.isdigit() else pid) for arg in template)
    return expand(template, alias=values["alias"], host=values["host"], endpoint=values["endpoint"])


def values_for(gpu: str, cfg: Config) -> dict[str, str]:
    """The placeholders of a command for ``gpu``: ``{alias} {host} {endpoint}``."""
    if gpu == "fleet":
        return {"alias": "fleet", "host": "", "endpoint": ""}
    g = cfg.gpu(gpu)
    return {"alias": g.alias, "host": g.host, "endpoint": g.endpoint}


def perform(
    step: Action,
    values: dict[str, str],
    runner: Runner,
    litellm: LiteLLMCall | None,
    timeout_s: float,
    secrets: tuple[str, ...],
    cfg: Config | None = None,
) -> StepResult:
    """Perform one action, dispatching on its type; never raises for what the world does."""
    if isinstance(step, RunCommand):
        return run_command(step, values, runner, timeout_s, secrets)
    if isinstance(step, RestorePowerLimit):
        return _restore_power_limit(step, values, runner, timeout_s, secrets)
    if isinstance(step, CapPower):
        from gpuheal.actions.power import cap_power

        return cap_power(step, values, runner, timeout_s, secrets)
    if isinstance(step, RewriteLiteLLM):
        from gpuheal.actions.litellm_config import rewrite

        if cfg is None:
            return StepResult(step.action, [], step.target, ok=False, error="no configuration")
        return rewrite(step, runner, timeout_s, secrets, cfg)
    shown = describe_update(cfg.litellm.url if cfg is not None else None, step)
    if litellm is None:
        return StepResult(step.action, [], step.target, ok=False, error="no LiteLLM client", command=shown)
    outcome = litellm(step, timeout_s)
    res = command_result(step.action, [], step.target, outcome, secrets, step.note, shown)
    impossible = bool(getattr(outcome, "impossible", False))
    return replace(res, effect=getattr(outcome, "effect", None), impossible=impossible)


def run_command(
    step: RunCommand, values: dict[str, str], runner: Runner, timeout_s: float, secrets: tuple[str, ...]
) -> StepResult:
    try:
        argv = expand_argv(step.argv, values)
    except Exception as exc:  # noqa: BLE001 — a bad template is a config problem: report, don't crash the run
        return StepResult(step.action, list(step.argv), step.target, ok=False, error=str(exc))
    return command_result(step.action, argv, step.target, runner(step.target, argv, timeout_s), secrets, step.note)


def command_result(
    action: str,
    argv: list[str],
    target: str,
    outcome: CommandOutcome,
    secrets: tuple[str, ...],
    note: str = "",
    command: str = "",
) -> StepResult:
    """The step result of one command's outcome: ok only on exit status 0, the output's tail redacted."""
    ok = outcome.error is None and not outcome.timed_out and outcome.rc == 0
    output = (outcome.stdout or "") + (("\n" + outcome.stderr) if outcome.stderr else "")
    error = outcome.error or ("timed out" if outcome.timed_out else (None if ok else f"exit status {outcome.rc}"))
    return StepResult(action, argv, target, ok=ok, rc=outcome.rc, error=error,
                      output=redact(output[-OUTPUT_KEPT:], secrets), note=note, command=command,
                      stdout=outcome.stdout or "")  # fmt: skip


def describe_update(base_url: str | None, step: LiteLLMUpdate) -> str:
    """How a LiteLLM admin call is shown (no key, no body secrets)."""
    from gpuheal.sources.litellm_admin import describe_update as shown

    return shown(base_url, step.model_id, step.field, step.value)


def describe(step: Action, gpu: str, cfg: Config) -> str:
    """The exact command a dry run shows for ``step``."""
    if isinstance(step, LiteLLMUpdate):
        shown = describe_update(cfg.litellm.url, step)
        return shown if step.instead is None else f"{shown}; else {describe(step.instead, gpu, cfg)}"
    if isinstance(step, CapPower):
        return _describe_cap(step, gpu, cfg)
    if isinstance(step, RewriteLiteLLM):
        where = "" if step.target == "local" else f"ssh {step.target}: "
        to = f" to {step.to_alias}" if step.to_alias else ""
        return f"{where}rewrite {step.path}{to}; {shlex.join(step.restart_argv)}; read back /v1/model/info"
    template = step.argv if isinstance(step, RunCommand) else step.query_argv
    values = {"alias": gpu, "host": "", "endpoint": ""}
    if gpu != "fleet":
        g = cfg.gpu(gpu)
        values = {"alias": g.alias, "host": g.host, "endpoint": g.endpoint}
    try:
        argv = expand_argv(template, {**values, "pid": "PID"})
    except Exception:  # noqa: BLE001 — shown as configured; running it reports the error
        argv = list(template)
    where = "" if step.target == "local" else f"ssh {step.target}: "
    return where + shlex.join(argv)


def _describe_cap(step: CapPower, gpu: str, cfg: Config) -> str:
    """A cap as a dry run shows it: read, set, read back (the value is known only when it runs)."""
    from gpuheal.core import power

    where = "" if step.target == "local" else f"ssh {step.target}: "
    value = f"{step.watts:g}" if step.watts is not None else f"LIMIT*{step.ratio:g}"
    setter = [*power.set_argv(step.vendor, step.gpu_index, 0)[:-1], value]
    return f"{where}{shlex.join(power.query_argv(step.vendor, step.gpu_index))}; {shlex.join(setter)}; read back"


def _restore_power_limit(
    step: RestorePowerLimit, values: dict[str, str], runner: Runner, timeout_s: float, secrets: tuple[str, ...]
) -> StepResult:
    """Rule 4.2, "if throttled, restore to max": query the limits, judge them
    (:func:`~gpuheal.rules.benchmark_regression.checks.judge_power`: below the board's default, or its
    max with ``heal.power_restore: max``), and only when throttled set the target read from the board
    with ``nvidia-smi -pl``, then read it back: the change counts only when the board shows it. A limit
    not known (``[N/A]``, garbage, above the max, a query that failed) changes nothing and fails
    nothing: the check, kept in ``check``, says "not known" and why. On AMD rocm-smi prints the cap in
    force but no default: the cap is reset to the board's own default and read back
    (:func:`gpuheal.actions.power.reset_rocm_cap`, issue 27 item 12)."""
    from gpuheal.rules.benchmark_regression.checks import PowerCheck, Verdict, judge_power
    from gpuheal.rules.benchmark_regression.parse import parse_power_limits, parse_rocm_power_cap

    def run(argv: tuple[str, ...], note: str = "") -> StepResult:
        return run_command(RunCommand(step.action, argv, step.target, note), values, runner, timeout_s, secrets)

    query = run(step.query_argv, step.note)
    if not query.ok:
        unread = PowerCheck(Verdict.NOT_KNOWN, f"power limits not read ({query.error})")
        return replace(query, ok=True, error=None, note=unread.why, check=unread.record())
    if step.query_argv[0] == "rocm-smi":
        from gpuheal.actions.power import reset_rocm_cap

        flag = gpu_flag(step.query_argv)
        card = int(flag[1]) if flag else None
        return reset_rocm_cap(query, parse_rocm_power_cap(query.stdout or query.output, card), step, card, run)
    power = judge_power(parse_power_limits(query.output), step.restore)
    if power.throttled is not Verdict.YES or power.target_w is None:  # nothing to do, or not known: change nothing
        return replace(query, note=power.why, check=power.record())
    setter = run(("nvidia-smi", *gpu_flag(step.query_argv), "-pl", f"{power.target_w:g}"))
    if not setter.ok:
        return replace(setter, note=power.why, check=power.record())
    seen = run(step.query_argv)
    after = parse_power_limits(seen.output) if seen.ok else None
    check: dict[str, Any] = {**power.record(), "after_w": None if after is None else after.current_w}
    if after is None or after.current_w is None or abs(after.current_w - power.target_w) > 1.0:
        unseen = "the new power limit is not seen on the board"
        return replace(setter, ok=False, error=unseen, note=power.why, check=check)
    return replace(setter, note=f"{power.why}: set to {power.target_w:g} W, read back", check=check)
