"""Run one command of an action on its target and say what it did: its placeholders filled per
argument (never a shell), the outcome judged (ok only on exit status 0), the output's tail redacted.
The primitive under :mod:`gpuheal.actions.perform` and :mod:`gpuheal.actions.power`; never raises for
what the world does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gpuheal.core.actions import Action, CommandOutcome, RunCommand, StepResult
from gpuheal.redact import redact

# (target, argv, timeout_s) -> what the command did
Runner = Callable[[str, list[str], float], CommandOutcome]
OUTPUT_KEPT = 4000  # characters of a command's output kept in its step result (the audit's tail)


class Run(Protocol):
    """Run one argv of a step on its target (placeholders filled, output redacted): what an action that
    runs several commands — read, set, read back — needs, and nothing more (:func:`bind`)."""

    def __call__(self, argv: tuple[str, ...], note: str = "") -> StepResult: ...


def expand_argv(template: tuple[str, ...], values: dict[str, str]) -> list[str]:
    """Fill ``{alias} {host} {endpoint}`` (and ``{pid}`` for kill) per argument; never a shell."""
    from gpuheal.transport import expand

    pid = values.get("pid")
    if pid is not None:  # only kill_command knows {pid}; a pid is digits, never text from the network
        template = tuple(arg.replace("{pid}", str(int(pid)) if pid.isdigit() else pid) for arg in template)
    return expand(template, alias=values["alias"], host=values["host"], endpoint=values["endpoint"])


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


def bind(step: Action, values: dict[str, str], runner: Runner, timeout_s: float, secrets: tuple[str, ...]) -> Run:
    """``step``'s commands as one :class:`Run`: each argv runs as ``step``'s action on its target."""

    def run(argv: tuple[str, ...], note: str = "") -> StepResult:
        return run_command(RunCommand(step.action, argv, step.target, note), values, runner, timeout_s, secrets)

    return run
