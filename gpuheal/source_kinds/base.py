"""The record each GPU source declares itself with (issue 19 item 3): :class:`SourceKind`.

Pure: values and functions on values. The source's IO (its reader, its doctor checks) is named
``"module:function"``, never imported here: this package is read by the pure core (coverage, the
engine's per-poll gate, the planner), and tests/test_import_graph.py holds it to that.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuheal.secret import Secret
from gpuheal.signals import SourceSpec


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
class SectionInput:
    """What a source's config builder reads, after the JSON Schema has passed: ``data``, the user's
    document as written (to tell a section written from one left out); ``merged``, the source's own
    section over defaults.yaml; the fleet's GPU records; the fleet's rule parameters, and ``shared``,
    the one parameter object the GPUs that override nothing carry."""

    data: Mapping[str, Any]
    merged: Mapping[str, Any]
    gpus: tuple[Any, ...]
    fleet_rules: Mapping[str, Mapping[str, Any]]
    shared: Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class SourceMemory:
    """What a source keeps between runs because its queries depend on it (Prometheus: its remembered
    fleet-wide trend): ``file`` in the state directory, and two pure functions, named
    ``"module:function"``: ``load`` — ``(cfg, the file's document or {}, window_starts, now_s) ->
    memory`` (``window_starts``: where a GPU restarted by ``heal`` starts its trend windows again) — and
    ``save`` — ``(cfg, memory, observation) -> the document to write, or None``. ``check`` reads and
    writes the file around the poll; the memory is passed to the source's reader."""

    file: str
    load: str
    save: str


def _no_probes(section: Any) -> tuple[DoctorProbe, ...]:
    return ()


def _probes_endpoints(section: Any) -> bool:
    return True


@dataclass(frozen=True)
class SourceKind:
    """One GPU source, declared in one place: its module under :mod:`gpuheal.source_kinds`.

    - ``spec``: its name, what it provides, whether it computes trends itself, whether Rule 7 may
      restart it, and what an operator does to get what it lacks;
    - ``section``: its config section (``None``: it needs none — the one default source, listed last
      in the registry); ``build`` turns the validated section into its record (``cfg.sections[section]``),
      or ``None`` when the user wrote no such section;
    - ``reader``: ``"module:function"`` reading one poll, ``(cfg, now, deadline_s, transports, memory)
      -> gpuheal.model.SourcePoll`` (the one typed poll of every source);
    - ``probes``: its doctor probes, from its section record; ``probes_endpoints``: whether gpuheal
      probes each llama-server's ``/health`` itself (False: the source gives liveness);
    - ``fallback``: the spec of what its polls say while it is unusable and a stand-in answered
      (gpu-monitor's Rule 7.3 smi fallback); such a poll stands for this source (coverage's "home");
    - ``memory``: :class:`SourceMemory`, for a source whose queries depend on what earlier runs left
      (Prometheus's trend cache), read and written by ``check`` around the poll;
    - ``secrets``: the secrets its section reads (:class:`~gpuheal.secret.Secret`): redacted from
      everything gpuheal writes (:func:`gpuheal.credentials.secrets_for`), as every sink's are.
    """

    spec: SourceSpec
    section: str | None = None
    build: Callable[[SectionInput], Any] | None = None
    reader: str = ""
    probes: Callable[[Any], tuple[DoctorProbe, ...]] = _no_probes
    probes_endpoints: Callable[[Any], bool] = _probes_endpoints
    fallback: SourceSpec | None = None
    memory: SourceMemory | None = None
    secrets: tuple[Secret, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.source
