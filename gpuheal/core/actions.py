"""The things a plan asks for, one frozen record per kind (issue 10, item 2). Pure data.

Each variant carries its contract action name (``action``: ``restart-llama-server``,
``shed-load``, ...; contract "Action names"), so the audit trail and the ``actions`` list of
``gpu-health.json`` name it the same whatever performs it. :mod:`gpuheal.actions.execute`
dispatches on the type:

- :class:`RunCommand` — an argv (placeholders ``{alias} {host} {endpoint}`` filled at run time,
  never a shell) on ``target``: ``"local"`` or an SSH host; ``then``: the wait that proves it
  worked, inside the run;
- :class:`LiteLLMUpdate` — set one field of a LiteLLM deployment (``POST /model/update``): an HTTP
  call, never disguised as a command;
- :class:`RestorePowerLimit` — Rule 4.2 built in: read the limits, raise a lowered one to the
  board's default, nothing else;
- :class:`CapPower` — set a GPU's board power limit with its vendor's tool (``nvidia-smi -pl``, ``rocm-smi
  --setpoweroverdrive``): a share of the limit in force (the thermal load-side cap, issue 27 item 7) or
  a value to put back; done only when a read-back shows it (:mod:`gpuheal.core.power`);
- :class:`RewriteLiteLLM` — Rule 1.2's redirect to a cooler GPU where LiteLLM keeps its models in
  ``config.yaml`` (:mod:`gpuheal.core.litellm_config`): the file rewritten, LiteLLM restarted, its
  ``/v1/model/info`` read back; or the original put back the same way;
- :class:`WaitReady` — the wait after a llama-server restart: ``/health`` polled up to
  ``heal.reload_wait_s``, then a real completion (Rule 3's verify, inside the run).

What performing one gives back is a :class:`StepResult` (a command's answer: :class:`CommandOutcome`).

Every other verification is across runs, from fresh data (:mod:`gpuheal.core.verify`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

LITELLM_API = "litellm-api"  # the ``target`` shown for a LiteLLM admin call


@dataclass(frozen=True)
class WaitReady:
    action: str  # the restart it waits for
    alias: str
    note: str = ""


@dataclass(frozen=True)
class RunCommand:
    action: str
    argv: tuple[str, ...]
    target: str  # "local" or the SSH host
    note: str = ""
    then: WaitReady | None = None


@dataclass(frozen=True)
class CapPower:
    """Set the board power limit of one GPU (``vendor``: nvidia | amd; ``gpu_index``: its index on a host
    with several) on ``target``: ``ratio`` x the limit in force (never below the board's min), or back to
    ``watts``. Counted only when a read-back of the limit shows it."""

    action: str
    vendor: str
    gpu_index: int | None
    target: str
    ratio: float | None = None
    watts: float | None = None
    note: str = ""


@dataclass(frozen=True)
class RewriteLiteLLM:
    """Point the hot GPU's LiteLLM deployments (``hot_endpoint``) at a cooler GPU (``to_alias``, chosen by
    the planner: none open a load-shedding issue) in LiteLLM's config file ``path`` on ``target``, restart
    LiteLLM (``restart_argv``), read it back; ``restore``: put the original file back the same way."""

    action: str
    path: str
    target: str
    restart_argv: tuple[str, ...]
    hot_endpoint: str
    to_alias: str | None = None
    to_endpoint: str | None = None
    restore: bool = False
    note: str = ""


@dataclass(frozen=True)
class LiteLLMUpdate:
    """``field`` ``"auto"`` (shed-load, redirect-traffic): the executor reads the deployment and
    changes ``weight`` when its model group routes by weight, else ``rpm`` (issue 11); a
    restore-load carries the field and the value found before the first change."""

    action: str
    model_id: str
    field: str  # "auto" | "weight" | "rpm"
    value: float | None = None
    note: str = ""
    instead: CapPower | RewriteLiteLLM | None = None  # performed when LiteLLM's setup rules the change out

    @property
    def target(self) -> str:
        return LITELLM_API


@dataclass(frozen=True)
class RestorePowerLimit:
    action: str
    query_argv: tuple[str, ...]
    target: str
    note: str = ""
    restore: str = "default"  # heal.power_restore: the board's default limit, or its max (Rule 4.2)


Action = RunCommand | LiteLLMUpdate | RestorePowerLimit | CapPower | RewriteLiteLLM


class CommandOutcome(Protocol):
    """What running one argv answered (a transport's ``CommandOutcome``, or LiteLLM's admin client in
    its shape): the exit status, the output, or why it did not run."""

    @property
    def rc(self) -> int | None: ...
    @property
    def stdout(self) -> str: ...
    @property
    def stderr(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def timed_out(self) -> bool: ...


@dataclass(frozen=True)
class NotRun:
    """A command that never ran (its template could not be filled in): a :class:`CommandOutcome`."""

    error: str
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False


@dataclass(frozen=True)
class StepResult:
    """One performed step as the audit trail and the ``actions`` list show it. ``output`` is the
    redacted tail kept in the audit; ``stdout`` the command's whole output, in memory only (never
    written: a parser that needs the full list — Rule 2's snapshot — reads it), ``None`` when the
    command never ran."""

    action: str
    argv: list[str]
    target: str
    ok: bool
    rc: int | None = None
    error: str | None = None
    output: str = ""
    note: str = ""
    command: str = ""  # how it is shown: the argv, or the HTTP call
    effect: dict[str, Any] | None = None  # a LiteLLM change the read-back proved (restore puts back "before")
    impossible: bool = False  # the built-in LiteLLM path cannot work in this setup (not a network fault)
    check: dict[str, Any] | None = None  # what a step that judges before it acts decided (Rule 4.2)
    stdout: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.command:
            object.__setattr__(self, "command", " ".join(self.argv))
