"""Perform one action (:mod:`gpuheal.core.actions`) and say what it did: a command on its target (its
placeholders filled per argument, never a shell), a LiteLLM admin change, Rule 4.2's built-in power
limit restore. Never raises for what the world does; the output kept is redacted.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import replace

from gpuheal.actions.power import cap_power, restore_power_limit
from gpuheal.actions.runner import Runner, bind, command_result, expand_argv, run_command
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

# (update, timeout_s) -> the same shape from LiteLLM's admin API, plus ``effect`` and ``impossible``
LiteLLMCall = Callable[[LiteLLMUpdate, float], CommandOutcome]


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
    if isinstance(step, RestorePowerLimit | CapPower):
        run = bind(step, values, runner, timeout_s, secrets)
        return restore_power_limit(step, run) if isinstance(step, RestorePowerLimit) else cap_power(step, run)
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


def perform_instead(
    refused: StepResult, step: Action, values: dict[str, str], runner: Runner, timeout_s: float,
    secrets: tuple[str, ...], cfg: Config,
) -> StepResult:
    """LiteLLM's setup rules its change out (no database, a ``config.yaml`` deployment): the built-in
    alternative (the power cap) runs instead, and says why. If it fails too, the LiteLLM refusal stands
    (``impossible``: escalated at once) with the alternative's failure added."""
    why = refused.output.strip() or refused.error or "LiteLLM cannot change the deployment"
    done = perform(step, values, runner, None, timeout_s, secrets, cfg)
    if done.ok:
        return replace(done, note=f"LiteLLM cannot shed here ({why}): {done.note}")
    return replace(refused, output=f"{why}; the power cap instead failed too: {done.error}")


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
