"""What a command does when a healing tool runs it on a simulated host (issue 29).

A GPU host of the scenario (its ``host``, shared by the GPUs with a ``gpu_index``) or the machine
the tool runs on (``host`` None: ``transport: local``) answers the few programs a healer runs, as
the real ones answer, from and onto the :class:`~gpuheal.sim.world.World`:

========================================== =====================================================
``systemctl restart llama-server[@ALIAS]`` restarts that GPU's llama-server (``@ALIAS`` on a host
                                           of several; the bare unit where the host has one)
``systemctl restart gpu-monitor[.service]`` restarts gpu-monitor (the local machine)
``docker restart litellm``                 restarts LiteLLM (the local machine)
``nvidia-smi …``                           the look-alike of :mod:`gpuheal.sim.smi` over this
                                           host's GPUs: ``--query-gpu`` (every board, or ``-i``),
                                           ``--query-compute-apps``, ``-pl``
``kill [-SIG] PID``                        a competing process goes (``World.kill_process``)
``journalctl …``, ``ps -eo …``             a few plausible lines (evidence only)
========================================== =====================================================

Anything else is ``command not found`` (127). A host all of whose GPUs are ``unreachable`` runs
nothing: :func:`run_on_host` returns ``None`` and the caller answers as SSH does for a host that
does not answer. Stdlib only, like the rest of the sim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import smi
from .processes import gpu_processes
from .world import GpuState, World


@dataclass(frozen=True)
class HostAnswer:
    rc: int
    stdout: str = ""
    stderr: str = ""


def host_gpus(world: World, host: str | None) -> list[GpuState]:
    """The GPUs of ``host`` in the scenario's order (none for the local machine)."""
    return [g for g in world.gpus.values() if host is not None and g.spec.host == host]


def unreachable(world: World, host: str | None) -> bool:
    gpus = host_gpus(world, host)
    return bool(gpus) and all(g.fault == "unreachable" for g in gpus)


def run_on_host(world: World, host: str | None, argv: list[str]) -> HostAnswer | None:
    """Run ``argv`` on ``host`` (None: the local machine). None: the host cannot be reached."""
    with world.lock:
        if unreachable(world, host):
            return None
        gpus = host_gpus(world, host)
    if not argv:
        return HostAnswer(127, "", "bash: : command not found\n")
    program = argv[0].rsplit("/", 1)[-1]
    if program == "systemctl":
        return _systemctl(world, host, gpus, argv[1:])
    if program == "docker" and argv[1:] == ["restart", "litellm"] and host is None:
        world.restart("litellm")
        return HostAnswer(0, "litellm\n")
    if program == "nvidia-smi" and gpus:
        return _nvidia_smi(world, gpus, argv[1:])
    if program == "kill" and gpus:
        return _kill(world, gpus, argv[1:])
    if program == "journalctl":
        return HostAnswer(0, "llama-server: main: server is listening on http://0.0.0.0:8080\n")
    if program == "ps":
        return HostAnswer(0, _ps(world, gpus))
    return HostAnswer(127, "", f"bash: {argv[0]}: command not found\n")


def _systemctl(world: World, host: str | None, gpus: list[GpuState], args: list[str]) -> HostAnswer:
    if len(args) != 2 or args[0] != "restart":
        return HostAnswer(1, "", "Too few arguments.\n" if len(args) < 2 else "Unknown command verb.\n")
    unit = args[1].removesuffix(".service")
    if unit == "gpu-monitor" and host is None:
        world.restart("monitor")
        return HostAnswer(0)
    target = None
    if unit == "llama-server" and len(gpus) == 1:
        target = gpus[0].alias
    elif unit.startswith("llama-server@"):
        target = next((g.alias for g in gpus if g.alias == unit.partition("@")[2]), None)
    if target is None:
        return HostAnswer(5, "", f"Failed to restart {args[1]}: Unit {unit}.service not found.\n")
    world.restart(target)
    return HostAnswer(0)


def _board(world: World, g: GpuState) -> tuple[dict[str, Any], int, str]:
    """``(state entry, index on the host, alias)`` of one board, as :mod:`gpuheal.sim.smi` reads it."""
    return world.gpu_entry(g.alias), g.spec.gpu_index or 0, g.alias


def _nvidia_smi(world: World, gpus: list[GpuState], args: list[str]) -> HostAnswer:
    parsed = smi.parse_args(args)
    if parsed is None or parsed["alias"] is not None:
        return HostAnswer(*smi.INVALID)
    index = parsed["index"]
    chosen = gpus if index is None else [g for g in gpus if (g.spec.gpu_index or 0) == index]
    if not chosen:
        return HostAnswer(6, f"No devices were found (index {index})\n")  # nvidia-smi: exit 6, on stdout
    boards = [_board(world, g) for g in chosen]
    if parsed["limit"] is not None:
        if len(chosen) != 1:
            return HostAnswer(*smi.INVALID)
        state, n, alias = boards[0]
        return HostAnswer(*smi.set_limit("", alias, state, n, parsed["limit"], setter=world.set_power_limit))
    if parsed["query"] is not None:
        rc, out = smi.query_gpus(parsed["query"], parsed["fmt"], boards)
        return HostAnswer(rc, out if rc == 0 else "", "" if rc == 0 else out)
    if parsed["apps"]:
        units = "nounits" not in parsed["fmt"]
        lines = [] if "noheader" in parsed["fmt"] else [
            f"pid, process_name, used_gpu_memory{' [MiB]' if units else ''}"]
        for g, (state, _n, _a) in zip(chosen, boards, strict=True):
            place = list(world.gpus).index(g.alias)  # pids stay unique across the fleet
            lines += smi.compute_apps({*parsed["fmt"], "noheader"}, state, place).splitlines()
        return HostAnswer(0, "".join(line + "\n" for line in lines))
    return HostAnswer(*smi.INVALID)


def _kill(world: World, gpus: list[GpuState], args: list[str]) -> HostAnswer:
    pids = [a for a in args if not a.startswith("-")]
    if len(pids) != 1 or not pids[0].isdigit():
        return HostAnswer(2, "", "kill: usage: kill [-s sigspec | -n signum | -sigspec] pid | jobspec ... or kill -l\n")
    pid = int(pids[0])
    if any(world.kill_process(g.alias, pid) for g in gpus):
        return HostAnswer(0)
    return HostAnswer(1, "", f"kill: ({pid}) - No such process\n")


def _ps(world: World, gpus: list[GpuState]) -> str:
    lines = ["    PID USER       RSS COMMAND"]
    for g in gpus:
        state = world.gpu_entry(g.alias)
        place = list(world.gpus).index(g.alias)
        for p in gpu_processes(state, place, g.restart_count, g.fault != "dead"):
            lines.append(f"{p.pid:>7} llama   {max(p.used_mb, 1) * 64:>8} {p.name}")
    return "\n".join(lines) + "\n"
