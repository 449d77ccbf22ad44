"""GPU readings without gpu-monitor: ``nvidia-smi`` / ``rocm-smi`` on each host, through each GPU's
transport (contract "Direct sensing (gpu-monitor optional)"; issue 12).

One call per host per poll — every GPU of the host in one command — concurrently across hosts, each
bounded by the probe deadline, parsed by the same parsers as Rule 7's fallback
(:mod:`gpuheal.parse.smi`). Each configured GPU takes its own row, matched by (host, index)
(:func:`~gpuheal.parse.smi.select_row`): never row 0 of a multi-GPU host. SSH goes through a
:class:`~gpuheal.transport.TransportPool`, so a host's GPUs share one connection per run.

Nothing here raises for what a host does: a failed call (no smi, driver gone, SSH refused, timeout,
garbage) is a :class:`~gpuheal.model.DataFault` for each GPU of that host, and its readings are not
known.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuheal import provenance as prov
from gpuheal.config import Config, GpuConfig
from gpuheal.model import DataFault, GpuValues, SourcePoll
from gpuheal.parse.values import printable
from gpuheal.source_kinds.smi import KIND

READING_KEYS = ("temp_c", "vram_used_mb", "vram_total_mb", "util_pct", "power_w", "power_limit_w")
# (host, argv, timeout_s) -> CommandOutcome-like (ok, rc, stdout, error, timed_out, detail)
Runner = Callable[[GpuConfig, Sequence[str], float], Any]


@dataclass
class SmiReadings:
    """Per alias the readings (``None`` = not known), the faults, and how many calls were made."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: list[DataFault] = field(default_factory=list)
    calls: int = 0
    hosts_ok: int = 0


def host_groups(gpus: Iterable[GpuConfig]) -> dict[tuple[str, str, str], list[GpuConfig]]:
    """GPUs grouped by (host, transport, vendor): one smi call each."""
    groups: dict[tuple[str, str, str], list[GpuConfig]] = {}
    for gpu in gpus:
        groups.setdefault((gpu.host, gpu.transport, gpu.vendor), []).append(gpu)
    return groups


# rocm-smi with the product name and gfx id: an APU is known by what it is (issue 12, item 5)
ROCM_SENSE_ARGV = ("rocm-smi", "--showproductname", "--showtemp", "--showmeminfo", "vram", "gtt", "--showuse",
                   "--showpower", "--json")


def smi_argv(vendor: str) -> tuple[str, ...]:
    from gpuheal.parse.smi import QUERY_GPU_FIELDS

    if vendor == "amd":
        return ROCM_SENSE_ARGV
    return ("nvidia-smi", f"--query-gpu={','.join(QUERY_GPU_FIELDS)}", "--format=csv,noheader,nounits")


def sense_smi(
    cfg: Config, deadline_s: float, runner: Runner, max_workers: int = 64, gpus: Sequence[GpuConfig] | None = None
) -> SmiReadings:
    """Run every host's smi once, concurrently; readings per alias (of ``gpus``: every configured GPU
    unless named)."""
    groups = host_groups(cfg.gpus if gpus is None else gpus)
    out = SmiReadings()
    if not groups:
        return out
    workers = max(1, min(max_workers, len(groups)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="smi") as pool:
        futures = {
            key: pool.submit(_call, gpus[0], smi_argv(key[2]), deadline_s, runner) for key, gpus in groups.items()
        }
        for key, gpus in groups.items():
            outcome = futures[key].result()
            out.calls += 1
            if _read_host(key, gpus, outcome, out):
                out.hosts_ok += 1
    return out


def _call(gpu: GpuConfig, argv: Sequence[str], timeout_s: float, runner: Runner) -> Any:
    try:
        return runner(gpu, argv, timeout_s)
    except Exception as exc:  # noqa: BLE001 - a transport bug must not stop the poll of other hosts
        return _Failed(f"{type(exc).__name__}: {str(exc)[:160]}")


@dataclass
class _Failed:
    detail: str
    ok: bool = False
    rc: int | None = None
    stdout: str = ""
    error: str = "invalid"
    timed_out: bool = False


def _read_host(key: tuple[str, str, str], gpus: list[GpuConfig], outcome: Any, out: SmiReadings) -> bool:
    from gpuheal.parse.smi import parse_query_gpu, parse_rocm_smi, select_row

    host, _, vendor = key
    tool = "rocm-smi" if vendor == "amd" else "nvidia-smi"
    if not getattr(outcome, "ok", False):
        kind = _fault_kind(outcome)
        detail = _describe(outcome)
        for gpu in gpus:
            out.faults.append(DataFault(gpu.alias, kind, f"{tool} on {host}: {printable(str(detail))}"))
        return False
    text = outcome.stdout or ""
    rows = parse_rocm_smi(text) if vendor == "amd" else parse_query_gpu(text)
    if not rows:
        for gpu in gpus:
            out.faults.append(DataFault(gpu.alias, "invalid", f"{tool} on {host}: no readable GPU row"))
        return False
    for gpu in gpus:
        row = select_row(rows, gpu.gpu_index)
        if row is None:
            out.faults.append(
                DataFault(gpu.alias, "invalid", f"{tool} on {host}: no GPU with index {gpu.index} ({len(rows)} rows)")
            )
            continue
        if vendor == "amd" and gpu.unified_memory is not None:
            row = _with_unified(row, gpu.unified_memory)
        values: dict[str, Any] = {k: row.get(k) for k in READING_KEYS}
        if isinstance(row.get("name"), str):
            values["name"] = row["name"]
        out.values[gpu.alias] = values
    return True


def _with_unified(row: dict[str, Any], unified: bool) -> dict[str, Any]:
    """The config's ``gpus[].unified_memory`` over what the product name said."""
    from gpuheal.parse.smi import apply_unified

    base = dict(row)
    if "carveout_total_mb" in base:  # undo the automatic choice first
        base["vram_total_mb"], base["vram_used_mb"] = base.pop("carveout_total_mb"), base.pop("carveout_used_mb")
    return apply_unified(base, unified)


def _fault_kind(outcome: Any) -> str:
    """The transport's error code as a contract fault word (timeout | refused | invalid)."""
    if getattr(outcome, "timed_out", False):
        return "timeout"
    error = str(getattr(outcome, "error", "") or "")
    if error == "timeout":
        return "timeout"
    if error in ("refused", "unreachable", "auth failed", "host key unknown", "host key changed", "ssh error"):
        return "refused"
    return "invalid"  # not found: nvidia-smi, a non-zero exit (driver gone), cannot run


def _describe(outcome: Any) -> str:
    error = getattr(outcome, "error", None)
    detail = getattr(outcome, "detail", None)
    if error:
        return f"{error} ({detail})" if detail else str(error)
    first = (getattr(outcome, "stdout", "") or getattr(outcome, "stderr", "") or "").strip().splitlines()
    return f"exit status {getattr(outcome, 'rc', '?')}" + (f": {first[0][:120]}" if first else "")


def pool_runner(cfg: Config, transports: Any) -> Runner:
    """A :data:`Runner` over a :class:`~gpuheal.transport.TransportPool` (one SSH connection per
    host per run, shared by its GPUs and by ``heal``'s actions)."""
    from gpuheal.transport import Target

    def run(gpu: GpuConfig, argv: Sequence[str], timeout_s: float) -> Any:
        return transports.get(Target.for_gpu(gpu, cfg.heal)).run(list(argv), timeout_s)

    return run


# --------------------------------------------------------------------------- the source's reader


def sense_hosts(
    cfg: Config, deadline_s: float, transports: Any, gpus: Sequence[GpuConfig] | None = None
) -> SmiReadings:
    """nvidia-smi / rocm-smi on the hosts of ``gpus`` (every configured GPU unless named), within the
    probe deadline, over ``transports`` or a pool of its own (the smi source, and gpu-monitor's Rule 7.3
    fallback)."""
    if transports is not None:
        return sense_smi(cfg, deadline_s, pool_runner(cfg, transports), cfg.probe.max_workers, gpus)
    from gpuheal.transport import TransportPool

    with TransportPool.from_config(cfg.heal) as own:
        return sense_smi(cfg, deadline_s, pool_runner(cfg, own), cfg.probe.max_workers, gpus)


def gpu_values(gpus: Iterable[GpuConfig], readings: SmiReadings) -> dict[str, GpuValues]:
    """Each GPU's readings as the typed poll carries them, with the call that gave them (provenance:
    the tool on the GPU's host, over its transport); a GPU whose host did not answer has none."""
    out: dict[str, GpuValues] = {}
    for gpu in gpus:
        values = readings.values.get(gpu.alias)
        if values:
            out[gpu.alias] = GpuValues(((prov.smi(gpu.vendor, gpu.transport), values),))
    return out


def read_poll(cfg: Config, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll:
    """The smi source's reader (``source_kinds/smi.py``): no gpu-monitor, one call per host over each
    GPU's transport (issue 12)."""
    readings = sense_hosts(cfg, deadline_s, transports)
    return SourcePoll(KIND.name, readings.hosts_ok > 0, gpu_values(cfg.gpus, readings), tuple(readings.faults))
