"""The actions gpuheal can take, as data (issue 4, item 2): the generic catalog every remedy's steps name.

An :class:`ActionSpec` names the contract action, where its command comes from (a per-GPU config
key, then a default, then another action's command it falls back to), whether it is a restart
(restart budget, startup grace, fleet guard) and how it is verified. Which actions fix which issue is
each rule's :class:`~gpuheal.core.remedy.Remedy` (``REMEDY`` at the bottom of the rule's module), not
this module's. Pure data: nothing here runs anything; :func:`gpuheal.core.plan.plan` receives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ActionSpec:
    name: str
    command_key: str | None  # key under gpus[] (or a special section), None = no command
    default_argv: tuple[str, ...] | None = None
    restarts: bool = False  # counts toward the restart budget; mutes the host for the grace
    sync_verify: bool = False  # restart: /health then a real completion, inside the run
    evidence: bool = False  # gathers evidence only, changes nothing
    description: str = ""
    # without its own command: this action's command is used instead, noted in the audit record; the
    # doctor warns (``unconfigured``) while the own command is not configured
    fallback: str | None = None
    fallback_note: str = ""
    unconfigured: str = ""


ACTIONS: dict[str, ActionSpec] = {
    a.name: a
    for a in (
        ActionSpec(
            "restart-llama-server",
            "restart_command",
            ("systemctl", "restart", "llama-server"),
            restarts=True,
            sync_verify=True,
            description="restart llama-server, wait for /health, prove it with a real completion",
        ),
        ActionSpec(
            "restart-llama-server-memcap",
            "memcap_restart_command",
            None,
            restarts=True,
            sync_verify=True,
            description="restart llama-server with a memory cap (Rule 2.2)",
            fallback="restart-llama-server",
            fallback_note="uncapped: no memcap_restart_command configured, plain restart "
            "(Rule 2.2 asks for a memory cap)",
            unconfigured="no memcap_restart_command: a VRAM leak's restart is uncapped (Rule 2.2 asks for a memory "
            "cap flag); configure one that restarts llama-server with e.g. a smaller --ctx-size / --cache-ram",
        ),
        ActionSpec(
            "snapshot-processes",
            "smi_command",
            None,  # vendor default, see default_smi_argv()
            evidence=True,
            description="log a VRAM snapshot with the process list (Rule 2.1)",
        ),
        ActionSpec(
            "kill-process",
            "kill_command",
            ("kill", "-TERM", "{pid}"),
            description="kill an unknown VRAM process (Rule 2.3, opt-in)",
        ),
        ActionSpec(
            "shed-load",
            "shed_load_command",
            None,
            description="reduce concurrency on the GPU (load-side cooling, never fans)",
        ),
        ActionSpec("redirect-traffic", "redirect_command", None, description="route new requests to cooler GPUs"),
        ActionSpec("restore-load", "restore_load_command", None, description="undo shed-load / redirect-traffic"),
        ActionSpec(
            "restore-power-limit", "power_limit_command", None, description="restore the power limit to max (Rule 4.2)"
        ),
        ActionSpec(
            "restart-litellm",
            "litellm.restart_command",
            ("docker", "restart", "litellm"),
            description="restart the LiteLLM container (Rule 5.4)",
        ),
        ActionSpec(
            "restart-gpu-monitor",
            "heal.gpu_monitor_restart_command",
            ("systemctl", "restart", "gpu-monitor.service"),
            description="restart gpu-monitor (Rule 7.1)",
        ),
        ActionSpec("alert", None, description="queue a Zulip alert for the humans"),
    )
}


# Shared services gpuheal restarts: one restart serves every issue that asked for it, and each has
# a restart budget of its own (``max_restarts_per_hour``) — a LiteLLM restart cuts the whole fleet.
SERVICE_OF = {"restart-litellm": "litellm", "restart-gpu-monitor": "gpu-monitor"}
# Load-side mitigations, undone by ``restore-load`` once the GPU stayed cool.
MITIGATIONS = ("shed-load", "redirect-traffic")


def default_smi_argv(vendor: str) -> tuple[str, ...]:
    if vendor == "amd":
        return (
            "rocm-smi",
            "--showtemp",
            "--showmeminfo",
            "vram",
            "gtt",
            "--showuse",
            "--showpower",
            "--showpids",
            "--json",
        )
    return ("nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits")


def on_gpu(argv: tuple[str, ...], gpu_index: int | None) -> tuple[str, ...]:
    """A built-in smi command narrowed to one GPU of a host with several (issue 12): nvidia-smi's
    ``-i INDEX``, rocm-smi's ``-d INDEX``. The power limit restored, the processes snapshot and so
    the kill decision are then that GPU's, never the host's first GPU's. Without ``gpu_index`` (the
    host's only GPU) the command is unchanged."""
    if gpu_index is None or not argv:
        return argv
    flag = {"nvidia-smi": "-i", "rocm-smi": "-d"}.get(argv[0])
    return argv if flag is None else (argv[0], flag, str(int(gpu_index)), *argv[1:])


def gpu_flag(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The ``-i INDEX`` that :func:`on_gpu` put in ``argv`` (to repeat it on a follow-up command)."""
    return tuple(argv[1:3]) if len(argv) >= 3 and argv[1] in ("-i", "-d") else ()


DEFAULT_PS_ARGV = ("ps", "-eo", "pid,user,rss,args", "--sort=-rss")
DEFAULT_JOURNAL_ARGV = ("journalctl", "-u", "llama-server", "-n", "20", "--no-pager", "-o", "cat")

# Rule 4.2 built in for NVIDIA: read the limits, and only if the limit was lowered below the
# board's default, ``nvidia-smi -pl <default>`` (formats.md §2.1: values parsed positionally).
POWER_QUERY_ARGV = (
    "nvidia-smi",
    "--query-gpu=power.limit,power.default_limit,power.max_limit",
    "--format=csv,noheader,nounits",
)
# AMD: the cap in force only (formats.md §3: "Max Graphics Package Power (W)"); read, never set.
ROCM_POWER_QUERY_ARGV = ("rocm-smi", "--showmaxpower", "--json")


def primary_action(actions: Sequence[str]) -> str:
    """The one contract action name that stands for an attempt of several steps (the audit trail's
    ``action``; every step is listed in ``actions``): the first step that changes something
    (``shed-load`` of shed-load + redirect-traffic, the restart after a snapshot), else the first."""
    for name in actions:
        if name in ACTIONS and not ACTIONS[name].evidence:
            return name
    return next((a for a in actions if a in ACTIONS), "alert")
