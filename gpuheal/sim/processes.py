"""The simulated GPU's compute processes, once, for every look-alike that lists them: the sim's own
per-process query (``/_sim/smi``, Rule 2's attribution), the ``nvidia-smi --query-compute-apps``
look-alike and the ``rocm-smi --showpids`` one (Rule 4's competing process). Each renders them in its
real tool's shape; who runs on the GPU is decided here only.

The GPU's llama-server has pid ``40000 + 1000 × GPU index + restarts`` (a restart gives it a new pid,
as a real one gets) and holds the GPU's VRAM less the driver's context and less what a competing
process (``competing_pid`` / ``competing_vram_mb``, scenario values) holds. A dead server lists none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SIM_PID_BASE = 40000
CONTEXT_MB = 250  # memory.used counts the driver's context too; the processes' list does not
LLAMA_SERVER = "/usr/local/bin/llama-server"
COMPETITOR = "python3"


@dataclass(frozen=True)
class SimProcess:
    pid: int
    name: str
    used_mb: int


def gpu_processes(values: Mapping[str, Any], index: int, restart_count: int, alive: bool) -> list[SimProcess]:
    """``values``: the GPU's live values as ``/_sim/state`` reports them (``vram_used_mb``,
    ``competing_pid``, ``competing_vram_mb``)."""
    competing_pid = int(values.get("competing_pid") or 0)
    other_mb = int(values.get("competing_vram_mb") or 0) if competing_pid else 0
    used_mb = float(values.get("vram_used_mb") or 0.0)
    out = []
    if alive:
        own_mb = max(round(used_mb - CONTEXT_MB) - other_mb, 0)
        out.append(SimProcess(SIM_PID_BASE + 1000 * index + restart_count, LLAMA_SERVER, own_mb))
    if competing_pid:
        out.append(SimProcess(competing_pid, COMPETITOR, other_mb))
    return out
