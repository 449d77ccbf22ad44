"""Rule 7.3: every API path failed — probe nvidia-smi / rocm-smi on the GPU hosts directly (over
SSH) so the fleet is not blind while gpu-monitor is down. Readings fill only what the monitor did
not give; an unreadable answer is a failed probe, never the end of the run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuheal.actions.execute import Runner, run_command, values_for
from gpuheal.core.actions import RunCommand
from gpuheal.core.catalog import QUERY_GPU_ARGV, ROCM_SMI_ARGV

READINGS = ("temp_c", "vram_used_mb", "vram_total_mb", "util_pct", "power_w")
MAX_PROBE_S = 15.0


@dataclass(frozen=True)
class Probe:
    alias: str
    command: str
    target: str
    row: dict[str, Any] | None
    error: str | None = None


def probe_all(cfg, run: Runner, secrets: tuple[str, ...], gpu_filter: str | None) -> list[Probe]:
    from gpuheal.parse.smi import parse_query_gpu, parse_rocm_smi, select_row

    timeout_s = min(float(cfg.heal["command_timeout_s"]), MAX_PROBE_S)
    out = []
    for g in cfg.gpus:
        if (gpu_filter and g.alias != gpu_filter) or g.transport != "ssh":
            continue
        amd = g.vendor == "amd"
        step = RunCommand("snapshot-processes", ROCM_SMI_ARGV if amd else QUERY_GPU_ARGV, g.host)
        res = run_command(step, values_for(g.alias, cfg), run, timeout_s, secrets)
        try:
            rows = (parse_rocm_smi if amd else parse_query_gpu)(res.output) if res.ok else []
        except Exception as exc:  # noqa: BLE001 — a probe that cannot be read is a failed probe
            out.append(Probe(g.alias, res.command, g.host, None, f"unreadable smi output ({type(exc).__name__})"))
            continue
        row = select_row(rows, g.gpu_index)  # this GPU's row, never row 0 of a multi-GPU host
        missing = f"no row for GPU index {g.index}" if rows else "no readable GPU rows"
        out.append(Probe(g.alias, res.command, g.host, row, None if row is not None else res.error or missing))
    return out


def fill(health: dict[str, Any], probe: Probe) -> None:
    """Put the probe's readings into ``health`` where the monitor gave none."""
    if probe.row is None:
        return
    sensed = health["gpus"].setdefault(probe.alias, {})
    for key in READINGS:
        if sensed.get(key) is None and probe.row.get(key) is not None:
            sensed[key] = probe.row[key]
    sensed["source"] = "smi-fallback"
