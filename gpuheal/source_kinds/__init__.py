"""The GPU sources, each declared in one place, and the one list of them (issue 19 item 3).

A GPU source's module here holds everything gpuheal knows of it: its :class:`~gpuheal.signals.SourceSpec`
(its name, the signals it provides, whether it computes trends itself, whether Rule 7 may restart it,
what an operator does to get what it lacks), its config section's record and builder, its doctor
probes, and the name of its reader. :data:`REGISTRY` names the modules. ``sense``, ``check``,
``plan``, ``coverage``, the engine's per-poll gate, ``doctor`` and the config loader ask this package
and never test which config section exists or which source a name is
(tests/test_source_registry.py reads the code to hold that).

**A new GPU source** (a Kubernetes or AMD device-metrics exporter, say) takes these files:

1. ``gpuheal/source_kinds/<name>.py``: its ``KIND`` (:class:`~gpuheal.source_kinds.base.SourceKind`):
   spec, section record and ``build``, ``probes``, and ``reader`` = ``"module:function"``;
2. its reader module (``gpuheal/sources/<name>.py``: the requests, and the one typed poll every
   reader returns, :class:`~gpuheal.model.SourcePoll` — each GPU's values with the request that gave
   them, the faults — so ``sense`` merges it as any other; the doctor check its probes name), IO, kept
   out of this pure package;
3. its line in :data:`REGISTRY` below;
4. ``gpuheal/config/schema.json``: its section;
5. ``gpuheal/config/defaults.yaml``: its section's defaults;

plus its tests. Coverage (``rules_off``), the per-poll gate, the trend path (from ``computes_trends``),
Rule 7's restart (from ``restartable``), ``check``'s history and ``doctor``'s rows follow without
further edits.

Pure: the IO of a source (its reader, its doctor checks) is named, never imported.
"""

from __future__ import annotations

from typing import Any

from gpuheal.signals import SourceSpec
from gpuheal.source_kinds import monitor, prometheus, smi
from gpuheal.source_kinds.base import DoctorProbe, SectionInput, SourceKind, SourceMemory

__all__ = ["REGISTRY", "SOURCES", "DoctorProbe", "SectionInput", "SourceKind", "SourceMemory", "configured", "home",
           "kind_of", "section_of", "spec"]

# THE REGISTRY: one line per GPU source. A config sets up at most one section of these (the loader
# refuses two); the one source without a section (nvidia-smi / rocm-smi) is the default, listed last.
REGISTRY: tuple[SourceKind, ...] = (
    prometheus.KIND,
    monitor.KIND,
    smi.KIND,
)

# Every name a poll's ``source`` can take, with its declaration: each source's own, and the stand-ins
# that answer for one while it is unusable (gpu-monitor's Rule 7.3 fallback).
SOURCES: dict[str, SourceSpec] = {
    s.source: s for k in REGISTRY for s in (k.spec, *((k.fallback,) if k.fallback is not None else ()))
}
_HOME: dict[str, str] = {k.fallback.source: k.name for k in REGISTRY if k.fallback is not None}


def spec(source: str) -> SourceSpec:
    """The declaration of ``source`` (an unknown name — a damaged trace — provides nothing)."""
    found = SOURCES.get(str(source))
    if found is not None:
        return found
    return SourceSpec(str(source), frozenset(), False, f"unknown GPU source {str(source)[:40]!r}", "")


def home(source: str) -> str:
    """The configured source a poll's source stands for: a stand-in (the Rule 7.3 fallback) stands for
    the source it answers for (gpu-monitor); any other name for itself."""
    return _HOME.get(str(source), str(source))


def kind_of(source: str) -> SourceKind | None:
    """The registered source ``source`` (a poll's source name) stands for; ``None`` when unknown."""
    name = home(source)
    return next((k for k in REGISTRY if k.name == name), None)


def configured(cfg: Any) -> SourceKind:
    """The GPU source a config sets up: the registered one whose section it has (the loader allows at
    most one), else the one that needs no section."""
    sections = getattr(cfg, "sections", {}) or {}
    for kind in REGISTRY:
        if kind.section is None or kind.section in sections:
            return kind
    raise LookupError("no GPU source without a config section is registered")  # tests/test_source_registry.py


def section_of(cfg: Any, kind: SourceKind) -> Any:
    """``kind``'s config record in ``cfg`` (``None``: not written, or it has no section)."""
    return (getattr(cfg, "sections", {}) or {}).get(kind.section) if kind.section else None
