"""Prometheus as the GPU source (issue 13; contract "Prometheus as a source"): instant queries for the
readings, PromQL over each rule's window for the trends (it keeps its own history, so gpuheal's state
stays flat), and optionally each llama-server's liveness from its scrape target's ``up``. Nothing of
ours to restart: Rule 7 escalates. The reader is :func:`gpuheal.sources.prometheus.read_poll`;
the doctor check :func:`gpuheal.doctor.prometheus.query_checks`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpuheal.errors import ConfigError
from gpuheal.named import resolve
from gpuheal.signals import READINGS, Signal, Source, SourceSpec, Window
from gpuheal.source_kinds.base import DoctorProbe, SectionInput, SourceKind, SourceMemory
from gpuheal.source_kinds.smi import NO_MONITOR_FIX


@dataclass(frozen=True)
class PrometheusConfig:
    """``prometheus:`` — GPU readings from instant queries instead of gpu-monitor (contract:
    "Prometheus as a source"). ``queries`` maps a reading to its PromQL (``None``: not read);
    ``{selector}`` in a query is replaced by ``selector`` (one gpuheal per site, issue 13)."""

    url: str
    timeout_s: float
    connect_timeout_s: float
    max_response_bytes: int
    staleness_s: float
    selector: str
    max_workers: int
    labels: dict[str, str | None]
    queries: dict[str, str | None]
    trend_every_s: float  # the fleet-wide trend (Rule 2's) asked at most this often (its memory between)
    probe_endpoints: bool = True  # False: llama-server liveness from Prometheus's `up` of its target
    at_poll_time: bool = False  # True: every query evaluated at the poll's clock (time=), not Prometheus's now

    def query(self, key: str) -> str | None:
        template = self.queries.get(key)
        return None if template is None else template.replace("{selector}", self.selector)


def trend_reads(rules: Iterable[Any]) -> dict[Signal, tuple[tuple[str, Window], ...]]:
    """Each trend signal with the rules that read it and how (the :class:`~gpuheal.signals.Window` of
    their ``NEEDS``), in registry order: what Prometheus's trend queries are derived from."""
    out: dict[Signal, list[tuple[str, Window]]] = {}
    for rule in rules:
        for need in rule.NEEDS:
            if need.window is not None:
                for signal in need.any_of:
                    out.setdefault(signal, []).append((rule.ID, need.window))
    return {signal: tuple(reads) for signal, reads in out.items()}


@cache
def rule_trends() -> dict[Signal, tuple[tuple[str, Window], ...]]:
    """:func:`trend_reads` of the rule registry. Named, not imported: the rules ask this registry which
    source a poll came from (Rule 7), so an import here would be a cycle (tests/test_import_graph.py)."""
    return trend_reads(resolve("gpuheal.rules:ALL"))


def build(given: SectionInput) -> PrometheusConfig | None:
    """The ``prometheus:`` section when the user wrote one. Its trend windows are PromQL ranges run
    once for the whole fleet (issue 13), so they cannot differ per GPU; ``labels.match`` needs a
    ``prometheus_match`` on every GPU."""
    if given.data.get("prometheus") is None:
        return None
    merged = given.merged
    selector = merged.get("selector") or ""
    if selector and not (selector.startswith("{") and selector.endswith("}")):
        raise ConfigError(
            f"must be a label matcher in braces, like '{{site=\"eu1\"}}', not {selector!r}", "prometheus.selector"
        )
    _check_windows(given)
    labels = dict(merged.get("labels") or {})
    if labels.get("match"):
        missing = [i for i, g in enumerate(given.gpus) if not g.prometheus_match]
        if missing:
            raise ConfigError(
                f"prometheus.labels.match is {labels['match']!r}: every GPU needs prometheus_match",
                f"gpus[{missing[0]}].prometheus_match",
            )
    return PrometheusConfig(
        url=merged["url"].rstrip("/"),
        timeout_s=float(merged["timeout_s"]),
        connect_timeout_s=float(merged["connect_timeout_s"]),
        max_response_bytes=int(merged["max_response_bytes"]),
        staleness_s=float(merged["staleness_s"]),
        selector=selector,
        max_workers=int(merged["max_workers"]),
        labels=labels,
        queries=dict(merged.get("queries") or {}),
        trend_every_s=float(merged["trend_every_s"]),
        probe_endpoints=bool(merged.get("probe_endpoints", True)),
        at_poll_time=bool(merged.get("at_poll_time", False)),
    )


def _check_windows(given: SectionInput) -> None:
    """One PromQL range per trend for the whole fleet: no GPU may set its own window or span, and the
    rules reading one trend signal (both Rule 8 tiers) read one ``deriv()`` window — as the rules'
    ``NEEDS`` declare them (:func:`rule_trends`)."""
    fleet_rules = given.fleet_rules
    reads = rule_trends()
    for i, gpu in enumerate(given.gpus):
        if gpu.rules is given.shared:  # the fleet's own parameters
            continue
        for rule_id, w in (read for per_signal in reads.values() for read in per_signal):
            for key in (w.window, *w.spans):
                if gpu.rules.get(rule_id, {}).get(key) != fleet_rules.get(rule_id, {}).get(key):
                    raise ConfigError(
                        "with prometheus: the trend window is one PromQL range for the whole fleet; "
                        f"set rules.{rule_id}.{key} instead",
                        f"gpus[{i}].rules.{rule_id}.{key}",
                    )
    for signal, ((first_id, first), *others) in reads.items():
        value = fleet_rules.get(first_id, {}).get(first.window)
        for rule_id, w in others:
            other = fleet_rules.get(rule_id, {}).get(w.window)
            if (None if other is None else other * w.unit_s) != (None if value is None else value * first.unit_s):
                raise ConfigError(
                    f"with prometheus: the rules reading the {signal.value} read one deriv() window; make it "
                    f"equal to rules.{first_id}.{first.window} ({value})",
                    f"rules.{rule_id}.{w.window}",
                )


def probes(section: Any) -> tuple[DoctorProbe, ...]:
    return (DoctorProbe("prometheus", "queries", float(section.timeout_s), "gpuheal.doctor.prometheus:query_checks"),)


def probes_endpoints(section: Any) -> bool:
    return bool(section.probe_endpoints)


KIND = SourceKind(
    spec=SourceSpec(
        Source.PROMETHEUS, READINGS | {Signal.SOURCE_HEALTH}, computes_trends=True,
        lacks_why="GPU readings come from Prometheus (prometheus:), which holds no LiteLLM request data",
        lacks_fix=NO_MONITOR_FIX, label="Prometheus",
    ),
    section="prometheus",
    build=build,
    reader="gpuheal.sources.prometheus:read_poll",
    probes=probes,
    probes_endpoints=probes_endpoints,
    # the fleet-wide trend it asks at most every trend_every_s (issue 13), remembered between polls
    memory=SourceMemory("prometheus-trend.json", "gpuheal.sources.prometheus:load_memory",
                        "gpuheal.sources.prometheus:save_memory"),
)
