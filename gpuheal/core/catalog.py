"""What each remediation is, as data: the spec's "Fix" steps per issue id (issue 4, item 2).

An :class:`ActionSpec` names the contract action, where its command comes from (a per-GPU config
key, then a default), whether it is a restart (restart budget, startup grace, fleet guard) and how
it is verified. A :class:`Remedy` is the ordered fix for one issue id. Its numbers — how long the
issue may take to clear (``verify_within_s``) and how many failed attempts call the humans
(``escalate_after_failures``) — are rule parameters in ``config/defaults.yaml`` (issue 10), not
code. Pure data: nothing here runs anything; :func:`gpuheal.core.plan.plan` receives it.
"""

from __future__ import annotations

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
            None,  # falls back to restart_command, noted in the audit record
            restarts=True,
            sync_verify=True,
            description="restart llama-server with a memory cap (Rule 2.2)",
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


@dataclass(frozen=True)
class Remedy:
    """The fix for one issue id.

    ``steps``: actions in order. ``alert_now``: the spec alerts on detection (Rule 8 tier 2);
    ``automatic``: False = nothing safe to do, escalate at once. ``silent``: its fix is announced to
    nobody — the spec's "no alert" (Rule 8 tier 1): the audit trail keeps it, and only an escalation
    (the fix failed or cannot be configured) reaches Zulip. The verification window and the failure
    budget are the rule's ``verify_within_s`` / ``escalate_after_failures`` parameters.
    """

    issue: str
    steps: tuple[str, ...] = ()
    alert_now: bool = False
    automatic: bool = True
    why_escalate: str = "remediation did not fix it"
    silent: bool = False


REMEDIES: dict[str, Remedy] = {
    r.issue: r
    for r in (
        Remedy(
            "thermal-critical",
            ("shed-load", "redirect-traffic"),
            why_escalate="still above 85 °C after load shedding (Rule 1)",
        ),
        Remedy(
            "thermal-warning",
            ("shed-load",),
            silent=True,
            why_escalate="temperature keeps rising after shedding 50 % of the load (Rule 8 tier 1)",
        ),
        Remedy(
            "thermal-rising",
            ("redirect-traffic",),
            alert_now=True,
            why_escalate="still rising 5 minutes after tier 2 — possible hardware failure (Rule 8)",
        ),
        Remedy(
            "cooling-infrastructure",
            automatic=False,
            why_escalate="GPUs hot together (the whole fleet, or cooling_fraction of a rack or site): "
            "check the cooling infrastructure (Rule 1.3)",
        ),
        Remedy(
            "vram-leak",
            ("snapshot-processes", "restart-llama-server-memcap"),
            why_escalate="leak persists after restart — hardware investigation (Rule 2)",
        ),
        Remedy(
            "model-stuck",
            ("restart-llama-server",),
            why_escalate="still failing after restarts — GPU hardware check (Rule 3)",
        ),
        Remedy(
            "host-unreachable",
            ("restart-llama-server",),
            why_escalate="llama-server does not come back — infrastructure alert (Rule 6)",
        ),
        Remedy(
            "data-source-unreachable",
            ("restart-gpu-monitor",),
            why_escalate="gpu-monitor does not come back after restarts — networking issue (Rule 7)",
        ),
        Remedy(
            "circuit-breaker-stuck",
            ("restart-litellm",),
            alert_now=True,  # Rule 5.2: "alert but do NOT reset" — the humans hear of it on detection
            why_escalate="LiteLLM restart did not clear the breaker — human investigation (Rule 5)",
        ),
        Remedy(
            "benchmark-regression",
            ("snapshot-processes", "restore-power-limit"),
            why_escalate="persistent regression — possible hardware degradation (Rule 4)",
        ),
        Remedy(
            "api-key-mismatch",
            automatic=False,
            why_escalate="llama-server rejects the LiteLLM api key: align --api-key with litellm.api_key (Lesson L1)",
        ),
        Remedy("context-window", automatic=False, why_escalate=""),
        Remedy("workload-misrouted", automatic=False, why_escalate=""),
    )
}

# Recommendations (severity info) are reported, never acted on and never escalated.
RECOMMENDATIONS = frozenset({"context-window", "workload-misrouted"})
# Shared services gpuheal restarts: one restart serves every issue that asked for it, and each has
# a restart budget of its own (``max_restarts_per_hour``) — a LiteLLM restart cuts the whole fleet.
SERVICE_OF = {"restart-litellm": "litellm", "restart-gpu-monitor": "gpu-monitor"}
# Load-side mitigations, undone by ``restore-load`` once the GPU stayed cool.
MITIGATIONS = ("shed-load", "redirect-traffic")
THERMAL = ("thermal-critical", "thermal-warning", "thermal-rising")


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


@dataclass(frozen=True)
class Catalog:
    """The remediation catalog :func:`gpuheal.core.plan.plan` receives (a test may pass its own)."""

    actions: dict[str, ActionSpec]
    remedies: dict[str, Remedy]
    recommendations: frozenset[str]


CATALOG = Catalog(ACTIONS, REMEDIES, RECOMMENDATIONS)


def primary_action(actions: list[str] | tuple[str, ...]) -> str:
    """The one contract action name that stands for an attempt of several steps (the audit trail's
    ``action``; every step is listed in ``actions``): the first step that changes something
    (``shed-load`` of shed-load + redirect-traffic, the restart after a snapshot), else the first."""
    for name in actions:
        if name in ACTIONS and not ACTIONS[name].evidence:
            return name
    return next((a for a in actions if a in ACTIONS), "alert")
