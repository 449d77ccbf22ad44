"""Which processes use *this* AMD GPU, and how much of its VRAM each holds, on a host with several
(issue 27 item 12). Pure: argv lists in, parsed records out.

``rocm-smi --showpids`` lists each process once with its VRAM summed over every GPU it uses and does not
say which (rocm_smi.py's showPids), so on a host with several AMD GPUs its figure is not this GPU's. The
kernel's KFD driver keeps the per-GPU figure (``drivers/gpu/drm/amd/amdkfd/kfd_process.c``,
``kfd_procfs_add_sysfs_files``): one directory per process, ``/sys/class/kfd/kfd/proc/<pid>/``, holding
``vram_<gpu_id>`` for each GPU the process opened — its VRAM on that GPU in bytes, printed ``"%llu\\n"`` —
where ``gpu_id`` is the KFD id of the GPU (``topology/nodes/<n>/gpu_id``), the value rocm-smi prints as
``GUID`` ("also referred as GPU ID — reported by KFD"; formats.md §3.3: ``"GUID": "26967"`` under
``--showproductname``). So, where the GPU's commands run:

1. ``rocm-smi -d N --showproductname --json`` → this GPU's ``GUID`` (its KFD ``gpu_id``);
2. the pids of ``rocm-smi --showpids --json`` (the snapshot already taken);
3. ``grep -H -e ^ /sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id> ...`` → one ``path:bytes`` line per process
   that uses this GPU (``-H`` names the file on every line; a process without the file does not use it, and
   grep says so on stderr and goes on).

Anything that cannot be read is "not known" — never a guess at which GPU a process uses.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuheal.parse.values import number_text

if TYPE_CHECKING:
    from gpuheal.core.remedy import RemedyContext

KFD_PROC = "/sys/class/kfd/kfd/proc"
PID_MAX = 4_194_304  # the kernel's pid_max ceiling
MAX_VRAM_BYTES = 2.0**50  # 1 PiB: beyond it, a value is garbage
MAX_PIDS = 512  # more processes than this on one GPU: the list is not read (bounded argv)
MAX_TEXT = 1024 * 1024
_LINE = re.compile(rf"^{re.escape(KFD_PROC)}/(\d{{1,7}})/vram_(\d{{1,10}}):(.*)$")


def guid_argv(gpu_index: int) -> tuple[str, ...]:
    return ("rocm-smi", "-d", str(int(gpu_index)), "--showproductname", "--json")


def parse_guid(text: str, card: int) -> int | None:
    """The ``GUID`` (KFD ``gpu_id``) of ``card<N>`` in a ``--showproductname --json`` answer; ``None``
    when it is not there or not a whole number."""
    start = text.find("{")
    try:
        doc = json.loads(text[start:][:MAX_TEXT]) if start >= 0 else None
    except (ValueError, RecursionError):
        return None
    entry = doc.get(f"card{card}") if isinstance(doc, dict) else None
    raw = entry.get("GUID") if isinstance(entry, dict) else None
    if not isinstance(raw, str | int) or isinstance(raw, bool) or not str(raw).strip().isdigit():
        return None
    value = int(str(raw).strip())
    return value if 0 < value < 2**32 else None


def vram_argv(pids: tuple[int, ...], gpu_id: int) -> tuple[str, ...]:
    """The read of each process's VRAM on this GPU (``grep -H``: every line names its file)."""
    return ("grep", "-H", "-e", "^", *(f"{KFD_PROC}/{int(p)}/vram_{int(gpu_id)}" for p in pids))


@dataclass(frozen=True)
class KfdVram:
    """Each process's VRAM on one GPU (MiB, by pid); ``unreadable``: lines that were not such a value."""

    used_mb: dict[int, float]
    unreadable: int = 0


def parse_vram(text: str, gpu_id: int) -> KfdVram:
    """``path:bytes`` lines of :func:`vram_argv`'s answer for ``gpu_id``; a line of another file, a value
    that is not a whole number of bytes, or a pid out of range is unreadable, never a guess."""
    used: dict[int, float] = {}
    bad = 0
    for line in text[:MAX_TEXT].splitlines():
        if not line.strip():
            continue
        m = _LINE.match(line.strip())
        pid = int(m.group(1)) if m else 0
        value = number_text(m.group(3).strip(), hi=MAX_VRAM_BYTES) if m else None
        if m is None or int(m.group(2)) != gpu_id or not 0 < pid <= PID_MAX or value is None or value < 0 \
                or value != int(value) or pid in used:
            bad += 1
            continue
        used[pid] = round(value / 1048576, 1)
    return KfdVram(used, bad)


@dataclass(frozen=True)
class OnGpu:
    """The pids among those asked that use this GPU, with their VRAM on it (MiB); ``why``: not known."""

    used_mb: dict[int, float] | None
    why: str = ""
    gpu_id: int | None = None


def on_this_gpu(ctx: RemedyContext, pids: tuple[int, ...]) -> OnGpu:
    """Ask the KFD where the context's GPU's commands run which of ``pids`` use that GPU (its
    ``gpu_index``) and how much VRAM each holds on it. Two reads; nothing changes."""
    g = ctx.cfg.gpu(ctx.gpu)
    if g.gpu_index is None:
        return OnGpu(None, "the GPU has no gpu_index")
    if len(pids) > MAX_PIDS:
        return OnGpu(None, f"{len(pids)} processes, more than {MAX_PIDS}")
    where = g.host if g.transport == "ssh" else "local"
    seen = ctx.run(guid_argv(g.gpu_index), where)
    gpu_id = parse_guid(seen.outcome.stdout or "", g.gpu_index) if seen.outcome.rc == 0 else None
    if gpu_id is None:
        return OnGpu(None, f"rocm-smi -d {g.gpu_index} --showproductname printed no GUID (the KFD gpu_id)")
    if not pids:
        return OnGpu({}, gpu_id=gpu_id)
    read = ctx.run(vram_argv(pids, gpu_id), where)
    if read.outcome.rc not in (0, 1, 2) or read.outcome.error or read.outcome.timed_out:
        return OnGpu(None, f"{KFD_PROC}/<pid>/vram_{gpu_id} not read ({read.outcome.error or read.outcome.rc})",
                     gpu_id)  # fmt: skip
    found = parse_vram(read.outcome.stdout or "", gpu_id)
    if found.unreadable:
        return OnGpu(None, f"{found.unreadable} unreadable line(s) in {KFD_PROC}", gpu_id)
    return OnGpu(found.used_mb, gpu_id=gpu_id)
