"""The GPU source seam (issue 19, item 3): one object per configured source that reads one poll,
declares what it provides and offers its doctor probes.

``sense``, ``check``, ``plan`` and ``doctor`` ask :func:`gpu_source` and never test which config
section exists; :func:`gpuheal.signals.configured_source` is the one place that does. A new source
takes these files:

1. its reader module (``sources/<name>.py``: the requests and the mapping to GPU values);
2. ``signals.py``: its :class:`~gpuheal.signals.Source` name and :class:`~gpuheal.signals.SourceSpec`
   (what it provides, whether it computes trends itself), and the line in ``configured_source``;
3. this module: a class with ``read`` / ``provides`` / ``doctor_probes`` and its line in :data:`KINDS`;
4. its doctor check (``doctor/<name>.py``, named by ``doctor_probes``), if it has one;

plus its config section, which today spans ``config/model.py``, ``config/load.py``,
``config/schema.json`` and ``config/defaults.yaml`` (issue 19 item 4 types the sections).

Coverage (``rules_off``), the engine's per-poll gate, the trend path and Rule 7's restart follow from
its ``SourceSpec`` without further edits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from gpuheal.model import DataFault
from gpuheal.signals import Signal, Source, SourceSpec, configured_source, spec


@dataclass(frozen=True)
class DoctorProbe:
    """A source's doctor probe: ``doctor`` runs ``check`` (``"module:function"``, called with the config,
    returning its rows) as a probe of ``target`` under ``deadline_s``. Named, not imported: doctor
    imports the sources, so a source importing doctor would be a cycle (tests/test_import_graph.py)."""

    target: str
    name: str
    deadline_s: float
    check: str


@dataclass(frozen=True)
class SourcePoll:
    """One poll of a GPU source: its answers (one of ``doc`` / ``prom`` / ``readings`` or, for the
    Rule 7.3 fallback, a failed ``doc`` and the fallback's ``readings``), faults and warnings.

    ``source`` is what the poll's readings came from (``smi-fallback`` while gpu-monitor is unusable);
    ``ok`` whether the source itself answered (the observation's ``monitor_ok``)."""

    source: Source
    ok: bool
    faults: tuple[DataFault, ...] = ()
    warnings: tuple[str, ...] = ()
    doc: Any = None  # parse.gpu_data.MonitorDocument | None
    prom: Any = None  # prometheus.PromReading | None
    readings: Any = None  # smi_sense.SmiReadings | None

    @property
    def fallback_ok(self) -> bool:
        return self.source is Source.FALLBACK and self.readings is not None and self.readings.hosts_ok > 0


class GpuSource(Protocol):
    """What ``sense`` / ``check`` / ``doctor`` need of a GPU source."""

    spec: SourceSpec
    probes_endpoints: bool  # False: llama-server liveness comes from the source (Prometheus's ``up``)

    def provides(self) -> frozenset[Signal]: ...

    def read(self, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll: ...

    def doctor_probes(self) -> Iterable[DoctorProbe]: ...


class _Base:
    kind: Source = Source.SMI
    probes_endpoints = True

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.spec = spec(self.kind)

    def provides(self) -> frozenset[Signal]:
        return self.spec.provides

    def doctor_probes(self) -> Iterable[DoctorProbe]:
        return ()


class MonitorSource(_Base):
    """gpu-monitor's ``/gpu-data``; when it is unusable, nvidia-smi / rocm-smi on every host over each
    GPU's own transport, local or ssh (Rule 7.3), so the same rules keep judging (issue 19)."""

    kind = Source.MONITOR

    def read(self, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll:
        from gpuheal.sources.sense import fallback_warning, fetch_monitor, sense_smi_hosts

        doc, faults, warnings = fetch_monitor(self.cfg)
        if doc is not None or not self.cfg.monitor.fallback_smi:
            return SourcePoll(Source.MONITOR, doc is not None, tuple(faults), tuple(warnings), doc=doc)
        readings = sense_smi_hosts(self.cfg, deadline_s, transports)
        if readings.faults:  # the monitor's fault says why; these say what else failed
            warnings = [*warnings, fallback_warning(readings.faults)]
        return SourcePoll(Source.FALLBACK, False, tuple(faults), tuple(warnings), readings=readings)

    def doctor_probes(self) -> Iterable[DoctorProbe]:
        if getattr(self.cfg.monitor, "url", None):
            yield DoctorProbe("monitor", "gpu-monitor", float(self.cfg.monitor.timeout_s),
                              "gpuheal.doctor.checks:monitor_check")


class SmiSource(_Base):
    """No gpu-monitor: nvidia-smi / rocm-smi, one call per host, over each GPU's transport (issue 12)."""

    kind = Source.SMI

    def read(self, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll:
        from gpuheal.sources.sense import sense_smi_hosts

        readings = sense_smi_hosts(self.cfg, deadline_s, transports)
        return SourcePoll(Source.SMI, readings.hosts_ok > 0, tuple(readings.faults), readings=readings)


class PrometheusSource(_Base):
    """Prometheus (issue 13): the readings and the trends over each rule's window, in PromQL."""

    kind = Source.PROMETHEUS

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.probes_endpoints = bool(cfg.prometheus.probe_endpoints)

    def read(self, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll:
        from gpuheal.sources import prometheus

        prom = prometheus.read(self.cfg, now.timestamp(), memory)
        return SourcePoll(Source.PROMETHEUS, bool(prom.ok), tuple(prom.faults), tuple(prom.warnings), prom=prom)

    def doctor_probes(self) -> Iterable[DoctorProbe]:
        yield DoctorProbe("prometheus", "queries", float(self.cfg.prometheus.timeout_s),
                          "gpuheal.doctor.prometheus:query_checks")


KINDS: dict[Source, type[_Base]] = {Source.MONITOR: MonitorSource, Source.SMI: SmiSource,
                                    Source.PROMETHEUS: PrometheusSource}


def gpu_source(cfg: Any) -> GpuSource:
    """The configured GPU source."""
    return KINDS[configured_source(cfg)](cfg)
