"""The GPU source seam, IO side (issue 19, item 3): one object per configured source that reads one
poll, declares what it provides and offers its doctor probes.

Each source declares itself in its module under :mod:`gpuheal.source_kinds` (its spec, config section,
doctor probes, and the name of its reader); :func:`gpu_source` wraps the configured one. ``sense``,
``check`` and ``doctor`` ask it and never test which config section exists. Each source's reader lives
in its own module (``sources/monitor.py``, ``sources/smi_sense.py``, ``sources/prometheus.py``; the file
list is in :mod:`gpuheal.source_kinds`) and returns the one typed poll, :class:`~gpuheal.model.SourcePoll`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol

from gpuheal.model import SourcePoll
from gpuheal.named import resolve
from gpuheal.signals import Signal, SourceSpec
from gpuheal.source_kinds import DoctorProbe, SourceKind, configured, section_of

__all__ = ["DoctorProbe", "GpuSource", "gpu_source"]


class GpuSource(Protocol):
    """What ``sense`` / ``check`` / ``doctor`` need of a GPU source."""

    spec: SourceSpec
    kind: SourceKind
    probes_endpoints: bool  # False: llama-server liveness comes from the source (Prometheus's ``up``)

    def provides(self) -> frozenset[Signal]: ...

    def read(self, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll: ...

    def doctor_probes(self) -> Iterable[DoctorProbe]: ...


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
