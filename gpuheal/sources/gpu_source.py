"""The GPU source seam, IO side (issue 19, item 3): one object per configured source that reads one
poll, declares what it provides and offers its doctor probes.

Each source declares itself in its module under :mod:`gpuheal.source_kinds` (its spec, config section,
doctor probes, and the name of its reader); :func:`gpu_source` wraps the configured one. ``sense``,
``check`` and ``doctor`` ask it and never test which config section exists. The readers of the
built-in sources are the functions at the end of this module; a new source's reader lives in its own
module (the file list is in :mod:`gpuheal.source_kinds`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from gpuheal.model import DataFault
from gpuheal.signals import Signal, Source, SourceSpec
from gpuheal.source_kinds import DoctorProbe, SourceKind, configured, section_of

__all__ = ["DoctorProbe", "GpuSource", "SourcePoll", "gpu_source", "resolve"]


@dataclass(frozen=True)
class SourcePoll:
    """One poll of a GPU source: its answers, faults and warnings.

    The built-in sources leave their answer whole — one of ``doc`` (gpu-monitor) / ``prom`` / ``readings``
    (nvidia-smi, or for the Rule 7.3 fallback a failed ``doc`` and the fallback's ``readings``); any
    source may give its per-GPU values directly in ``gpu_values`` (alias → ``GpuSample`` fields).

    ``source`` is the name of what the poll's readings came from (``smi-fallback`` while gpu-monitor is
    unusable); ``ok`` whether the source itself answered (the observation's ``monitor_ok``)."""

    source: str
    ok: bool
    faults: tuple[DataFault, ...] = ()
    warnings: tuple[str, ...] = ()
    doc: Any = None  # parse.gpu_data.MonitorDocument | None
    prom: Any = None  # prometheus.PromReading | None
    readings: Any = None  # smi_sense.SmiReadings | None
    gpu_values: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def fallback_ok(self) -> bool:
        return self.source == Source.FALLBACK and self.readings is not None and self.readings.hosts_ok > 0


class GpuSource(Protocol):
    """What ``sense`` / ``check`` / ``doctor`` need of a GPU source."""

    spec: SourceSpec
    kind: SourceKind
    probes_endpoints: bool  # False: llama-server liveness comes from the source (Prometheus's ``up``)

    def provides(self) -> frozenset[Signal]: ...

    def read(self, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll: ...

    def doctor_probes(self) -> Iterable[DoctorProbe]: ...


def resolve(name: str) -> Any:
    """``"module:function"`` → the function (a source's reader, doctor check or memory hook)."""
    module, attr = name.split(":")
    return getattr(importlib.import_module(module), attr)


class ConfiguredSource:
    """The configured GPU source: its declaration with its config section."""

    def __init__(self, cfg: Any, kind: SourceKind) -> None:
        self.cfg, self.kind, self.spec = cfg, kind, kind.spec
        self.section = section_of(cfg, kind)
        self.probes_endpoints = kind.probes_endpoints(self.section)

    def provides(self) -> frozenset[Signal]:
        return self.spec.provides

    def read(self, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll:
        poll: SourcePoll = resolve(self.kind.reader)(self.cfg, now, deadline_s, transports, memory)
        return poll

    def doctor_probes(self) -> Iterable[DoctorProbe]:
        return self.kind.probes(self.section)


def gpu_source(cfg: Any) -> GpuSource:
    """The configured GPU source."""
    return ConfiguredSource(cfg, configured(cfg))


# --------------------------------------------------------------------------- the built-in readers


def read_monitor(cfg: Any, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll:
    """gpu-monitor's ``/gpu-data``; when it is unusable, nvidia-smi / rocm-smi on every host over each
    GPU's own transport, local or ssh (Rule 7.3), so the same rules keep judging (issue 19)."""
    from gpuheal.sources.sense import fallback_warning, fetch_monitor, sense_smi_hosts

    doc, faults, warnings = fetch_monitor(cfg)
    if doc is not None or not cfg.monitor.fallback_smi:
        return SourcePoll(Source.MONITOR, doc is not None, tuple(faults), tuple(warnings), doc=doc)
    readings = sense_smi_hosts(cfg, deadline_s, transports)
    if readings.faults:  # the monitor's fault says why; these say what else failed
        warnings = [*warnings, fallback_warning(readings.faults)]
    return SourcePoll(Source.FALLBACK, False, tuple(faults), tuple(warnings), readings=readings)


def read_smi(cfg: Any, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll:
    """No gpu-monitor: nvidia-smi / rocm-smi, one call per host, over each GPU's transport (issue 12)."""
    from gpuheal.sources.sense import sense_smi_hosts

    readings = sense_smi_hosts(cfg, deadline_s, transports)
    return SourcePoll(Source.SMI, readings.hosts_ok > 0, tuple(readings.faults), readings=readings)


def read_prometheus(cfg: Any, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll:
    """Prometheus (issue 13): the readings and the trends over each rule's window, in PromQL."""
    from gpuheal.sources import prometheus

    prom = prometheus.read(cfg, now.timestamp(), memory)
    return SourcePoll(Source.PROMETHEUS, bool(prom.ok), tuple(prom.faults), tuple(prom.warnings), prom=prom)
