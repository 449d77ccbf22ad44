"""gpu-monitor's ``/gpu-data`` as the GPU source (contract "gpu-monitor /gpu-data"), and its Rule 7.3
fallback: while gpu-monitor is unusable, nvidia-smi / rocm-smi over each GPU's own transport, so the
same rules keep judging (issue 19). Declared in :mod:`gpuheal.source_kinds.monitor`; its reader is
:func:`read_poll`, which returns the typed poll every source returns (:class:`~gpuheal.model.SourcePoll`).

An answer that lists no GPUs, or lacks a configured GPU, is unusable for the GPUs it lacks (the spec's
Rule 7 "gpu-monitor returns no GPUs"; contract "Rule timing"; issue 27 defect 1: an exporter restarted
and lost its devices): those GPUs are read through the fallback and judged like any reading, and Rule 7
fires for them as for a refused monitor. An answer that lists none of the fleet is a refused monitor.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from gpuheal import provenance as prov
from gpuheal.config import Config, GpuConfig
from gpuheal.errors import GpuhealError
from gpuheal.model import DataFault, GpuValues, SourcePoll
from gpuheal.parse.gpu_data import InvalidDocument, MonitorDocument, parse_gpu_data
from gpuheal.source_kinds.monitor import KIND, MonitorConfig
from gpuheal.sources.http import HttpFault, printable, request

FALLBACK = KIND.fallback.source if KIND.fallback is not None else KIND.name
MAX_NAMED = 3  # the lacking GPUs a fault names before it counts the rest


def section(cfg: Config) -> MonitorConfig:
    """``monitor:``. This reader runs only where gpu-monitor is the configured source (the config
    loader makes a source without its section a config error); one clear line otherwise."""
    mon = cfg.monitor
    if mon is None:
        raise GpuhealError("gpu-monitor is not configured: the config has no monitor: section")
    return mon


def fetch_monitor(cfg: Config) -> tuple[MonitorDocument | None, list[DataFault], list[str]]:
    """Fetch and parse gpu-monitor; (document or None, faults, warnings)."""
    mon = section(cfg)
    result = request(
        "GET",
        mon.url,
        deadline_s=mon.timeout_s,
        connect_timeout_s=mon.connect_timeout_s,
        max_bytes=mon.max_response_bytes,
    )
    if isinstance(result, HttpFault):
        warnings = []
        if result.kind == "oversized":
            warnings.append(
                f"gpu-monitor response larger than max_response_bytes ({mon.max_response_bytes}); "
                "skipping the monitor this cycle (Lesson L5)"
            )
        return None, [DataFault("monitor", result.kind, result.detail)], warnings
    if result.status != 200:
        return None, [DataFault("monitor", f"http-{result.status:03d}", _snippet(result.body))], []
    try:
        decoded = json.loads(result.body)
        doc = parse_gpu_data(decoded)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, InvalidDocument
        reason = str(exc) if isinstance(exc, InvalidDocument) else f"not JSON: {str(exc)[:120]}"
        return None, [DataFault("monitor", "invalid", reason)], []
    faults = []
    if doc.problems:
        shown = "; ".join(doc.problems[:3])
        more = f" (+{len(doc.problems) - 3} more)" if len(doc.problems) > 3 else ""
        faults.append(DataFault("monitor", "invalid", shown + more))
    return doc, faults, []


def monitor_values(doc: MonitorDocument, gpu: GpuConfig, shared_host: bool) -> tuple[dict[str, Any], str, bool]:
    """gpu-monitor's readings of one configured GPU, matched by (host, index) (contract "Direct
    sensing"): the entry with ``index`` = ``gpu_index`` when the monitor sends indexes, else the
    host's entry — but on a host several configured GPUs share, never another GPU's entry. Model
    counts and breakers by ``name`` / ``model`` = the alias, else (one GPU on the host) by hostname;
    the host's benchmark only for the host's only GPU. → (values, problem or "", whether the answer
    lacks the GPU: no entry for its host, or none with its index)."""
    values: dict[str, Any] = {}
    problem = ""
    lacking = False
    reading = doc.by_index.get((gpu.host, gpu.gpu_index)) if gpu.gpu_index is not None else None
    if reading is None:
        entries = doc.host_entries.get(gpu.host, 0)
        if gpu.host not in doc.hosts:
            problem, lacking = f"gpu-monitor reports no GPU with hostname {gpu.host!r}", True
        elif gpu.gpu_index is not None and any(h == gpu.host for h, _ in doc.by_index):
            problem, lacking = f"gpu-monitor reports no GPU with index {gpu.gpu_index} on {gpu.host!r}", True
        elif shared_host or entries > 1:
            problem = (f"gpu-monitor lists {entries} GPU entr{'y' if entries == 1 else 'ies'} for {gpu.host!r} "
                       "without an index: cannot tell which is this GPU")
        else:
            reading = doc.hosts[gpu.host]
    if reading is not None:
        values.update(reading.values)
        values["name"] = reading.name
        values["running"] = reading.running
    counts = doc.models_by_name.get(gpu.alias) or (None if shared_host else doc.models.get(gpu.host))
    if counts is not None:
        values["requests_60s"] = counts.requests_60s
        values["failures_60s"] = counts.failures_60s
        values["consecutive_timeouts"] = counts.consecutive_timeouts
    values["breaker"] = doc.breakers_by_model.get(gpu.alias) or (None if shared_host else doc.breakers.get(gpu.host))
    bench = None if shared_host else doc.benchmarks.get(gpu.host)
    if bench is not None:
        values["bench_tok_s"], values["bench_measured_at"] = bench
        values["bench_baseline_tok_s"] = doc.bench_baselines.get(gpu.host)
    return values, problem, lacking


def read_poll(cfg: Config, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll:
    """gpu-monitor's ``/gpu-data``, each configured GPU's values from it; when it is unusable, every
    GPU through the Rule 7.3 fallback; when its answer lacks some of the GPUs, those through it."""
    doc, faults, warnings = fetch_monitor(cfg)
    if doc is None:
        return _fallback(cfg, cfg.gpus, deadline_s, transports, faults, warnings)
    on_host: dict[str, int] = {}
    for gpu in cfg.gpus:
        on_host[gpu.host] = on_host.get(gpu.host, 0) + 1
    configured = set(on_host)
    unmatched = tuple(sorted(h for h in doc.hosts if h not in configured))
    found: dict[str, tuple[dict[str, Any], str]] = {}
    lacking: list[tuple[GpuConfig, str]] = []
    for gpu in cfg.gpus:
        values, problem, lacks = monitor_values(doc, gpu, on_host[gpu.host] > 1)
        found[gpu.alias] = (values, "" if lacks else problem)
        if lacks:
            lacking.append((gpu, problem))
    if not lacking:
        return SourcePoll(KIND.name, True, _values(found), tuple(faults), tuple(warnings), unmatched_hosts=unmatched)
    fault = DataFault("monitor", "invalid", _lacks(doc, lacking, len(cfg.gpus)))
    missing = tuple(g.alias for g, _ in lacking)
    if len(lacking) == len(cfg.gpus):  # none of the fleet listed: as a refused monitor
        return _fallback(cfg, cfg.gpus, deadline_s, transports, [fault, *faults], warnings, missing, unmatched)
    gpus = _values(found)
    if section(cfg).fallback_smi:
        from gpuheal.sources.smi_sense import sense_hosts

        readings = sense_hosts(cfg, deadline_s, transports, [g for g, _ in lacking])
        for gpu, _ in lacking:
            smi = readings.values.get(gpu.alias)
            if smi:
                gpus[gpu.alias] = GpuValues((*gpus[gpu.alias].parts, (prov.smi(gpu.vendor, gpu.transport), smi)))
        if readings.faults:
            warnings = [*warnings, fallback_warning(readings.faults)]
    return SourcePoll(KIND.name, True, gpus, (fault, *faults), tuple(warnings), lacking=missing,
                      unmatched_hosts=unmatched)


def _values(found: dict[str, tuple[dict[str, Any], str]]) -> dict[str, GpuValues]:
    """Each GPU's values from the document, and its own fault (an entry that cannot be told apart)."""
    return {alias: GpuValues(((prov.MONITOR, values),), (DataFault(alias, "invalid", problem),) if problem else ())
            for alias, (values, problem) in found.items()}


def _lacks(doc: MonitorDocument, lacking: list[tuple[GpuConfig, str]], configured: int) -> str:
    """The fault of an answer that lacks configured GPUs: how many, which, and why each."""
    if not doc.hosts:
        head = "the answer lists no GPUs (the spec's \"returns no GPUs\": an exporter that lost its devices?)"
    else:
        head = f"the answer lacks {len(lacking)} of the {configured} configured GPUs"
    shown = "; ".join(f"{gpu.alias}: {problem.removeprefix('gpu-monitor ')}" for gpu, problem in lacking[:MAX_NAMED])
    more = f" (+{len(lacking) - MAX_NAMED} more)" if len(lacking) > MAX_NAMED else ""
    return f"{head}: {shown}{more}"


def _fallback(
    cfg: Config, gpus: tuple[GpuConfig, ...], deadline_s: float, transports: Any, faults: list[DataFault],
    warnings: list[str], lacking: tuple[str, ...] = (), unmatched: tuple[str, ...] = (),
) -> SourcePoll:
    """gpu-monitor unusable: nvidia-smi / rocm-smi on every host over each GPU's own transport, local
    or ssh (Rule 7.3), unless ``monitor.fallback_smi`` is off."""
    if not section(cfg).fallback_smi:
        return SourcePoll(KIND.name, False, {}, tuple(faults), tuple(warnings), lacking=lacking,
                          unmatched_hosts=unmatched)
    from gpuheal.sources.smi_sense import gpu_values, sense_hosts

    readings = sense_hosts(cfg, deadline_s, transports)
    if readings.faults:  # the monitor's fault says why; these say what else failed
        warnings = [*warnings, fallback_warning(readings.faults)]
    return SourcePoll(FALLBACK, False, gpu_values(gpus, readings), tuple(faults), tuple(warnings),
                      fallback_ok=readings.hosts_ok > 0, lacking=lacking, unmatched_hosts=unmatched)


def fallback_warning(faults: list[DataFault]) -> str:
    """One line for the Rule 7.3 fallback's failures: gpu-monitor's own fault already makes the poll
    degraded, so they are not per-GPU faults every poll of the outage."""
    shown = "; ".join(f"{f.source}: {f.detail}" for f in faults[:3])
    more = f" (+{len(faults) - 3} more)" if len(faults) > 3 else ""
    return f"Rule 7.3 fallback (nvidia-smi / rocm-smi while gpu-monitor is unusable) failed for {shown}{more}"


def _snippet(body: bytes, limit: int = 120) -> str:
    return printable(body[:limit].decode("utf-8", "replace"), limit)
