"""Parse gpu-monitor's ``/gpu-data`` document (contract: "gpu-monitor /gpu-data"). Pure.

The document is untrusted: every field is optional, and any may hold the wrong JSON type, NaN, a
negative or absurd number, a 400-digit integer or a lone surrogate. Every field is read through
:mod:`gpuheal.parse.values` (issue 9, point 2): a bad value becomes ``None`` ("not known, never
zero") plus a problem naming the field — ``"temp_c": "99"`` is a fault, not 99 °C. A document
whose shape is wrong as a whole raises :class:`InvalidDocument`; nothing else raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuheal.model import Breaker
from gpuheal.parse.values import Fields, check_text, shown

# The physical range of each reading, in the unit its name carries; outside it is garbage.
LIMITS = {
    "temp_c": 200.0,
    "vram_used_mb": 16 * 1024 * 1024.0,
    "vram_total_mb": 16 * 1024 * 1024.0,
    "util_pct": 100.0,
    "power_w": 10000.0,
    "power_limit_w": 10000.0,
    "current_tok_s": 1e6,
    "baseline_tok_s": 1e6,
}
MIN_BASELINE_TOK_S = 0.01  # a baseline below this is garbage (1e-320 would make every ratio infinite)
COUNT_LIMIT = 10**9
GPU_FIELDS = ("temp_c", "vram_used_mb", "vram_total_mb", "util_pct", "power_w", "power_limit_w")
HOSTNAME_CHARS = 253
MAX_GPU_INDEX = 1023


class InvalidDocument(ValueError):
    """The document is not a gpu-monitor document at all."""


@dataclass
class HostReading:
    hostname: str
    values: dict[str, float | None] = field(default_factory=dict)
    name: str | None = None
    running: bool | None = None
    index: int | None = None  # the GPU's index on its host, when gpu-monitor sends one (issue 12)


@dataclass
class ModelCounts:
    requests_60s: int | None = None
    failures_60s: int | None = None
    consecutive_timeouts: int | None = None


@dataclass
class MonitorDocument:
    generated_at: datetime | None
    hosts: dict[str, HostReading]
    benchmarks: dict[str, tuple[float | None, datetime | None]]
    models: dict[str, ModelCounts]
    breakers: dict[str, Breaker]
    problems: list[str]
    # Several GPUs per host (issue 12; contract "Direct sensing"): readings by (hostname, index),
    # and model counts / breakers by ``name`` / ``model`` = the GPU's alias.
    by_index: dict[tuple[str, int], HostReading] = field(default_factory=dict)
    models_by_name: dict[str, ModelCounts] = field(default_factory=dict)
    breakers_by_model: dict[str, Breaker] = field(default_factory=dict)
    host_entries: dict[str, int] = field(default_factory=dict)  # GPU entries per hostname
    # ``benchmarks.HOST.baseline_tok_s`` (issue 27 item 14): None when absent or bad, never zero
    bench_baselines: dict[str, float | None] = field(default_factory=dict)


def _host_reading(entry: dict[str, Any], where: str, problems: list[str]) -> HostReading | None:
    f = Fields(entry, where, problems)
    hostname = f.text("hostname", HOSTNAME_CHARS)
    if hostname is None:
        problems.append(f"{where}: no hostname")
        return None
    reading = HostReading(hostname=hostname, name=f.text("name"))
    for key in GPU_FIELDS:
        reading.values[key] = f.number(key, hi=LIMITS[key])
    reading.running = f.flag("running")
    reading.index = f.count("index", hi=MAX_GPU_INDEX)
    return reading


def parse_gpu_data(doc: Any) -> MonitorDocument:
    """Turn the decoded JSON into a :class:`MonitorDocument`.

    Raises :class:`InvalidDocument` when ``doc`` is not an object or has neither ``gpus`` nor
    ``strix``. If a host appears in both ``gpus`` and ``strix``, the ``gpus`` entry wins
    (contract).
    """
    if not isinstance(doc, dict):
        raise InvalidDocument(f"expected a JSON object, got {shown(doc)}")
    gpus = doc.get("gpus")
    strix = doc.get("strix")
    if gpus is None and strix is None:
        raise InvalidDocument("neither 'gpus' nor 'strix' in the document")
    if gpus is not None and not isinstance(gpus, list):
        raise InvalidDocument(f"'gpus' must be a list, got {shown(gpus)}")
    problems: list[str] = []
    top = Fields(doc, "", problems)
    hosts: dict[str, HostReading] = {}
    by_index: dict[tuple[str, int], HostReading] = {}
    host_entries: dict[str, int] = {}
    for i, entry in enumerate(gpus or []):
        if not isinstance(entry, dict):
            problems.append(f"gpus[{i}]: not an object")
            continue
        reading = _host_reading(entry, f"gpus[{i}]", problems)
        if reading is None:
            continue
        host_entries[reading.hostname] = host_entries.get(reading.hostname, 0) + 1
        if reading.index is not None:
            by_index.setdefault((reading.hostname, reading.index), reading)
        if reading.hostname not in hosts:
            hosts[reading.hostname] = reading
    if isinstance(strix, dict):
        reading = _host_reading(strix, "strix", problems)
        if reading is not None:
            if reading.hostname in hosts:
                if hosts[reading.hostname].running is None:
                    hosts[reading.hostname].running = reading.running
            else:
                hosts[reading.hostname] = reading
    elif strix is not None:
        problems.append("strix: not an object")
    summary = top.mapping("summary") or {}
    model_entries = Fields(summary, "summary", problems).array("available_models") or []
    breaker_entries = Fields(summary, "summary", problems).array("circuit_breakers") or []
    by_name: dict[str, ModelCounts] = {}
    by_model: dict[str, Breaker] = {}
    bench_baselines: dict[str, float | None] = {}
    return MonitorDocument(
        generated_at=top.time("generated_at"),
        hosts=hosts,
        benchmarks=_benchmarks(top.mapping("benchmarks"), problems, bench_baselines),
        models=_models(model_entries, problems, by_name),
        breakers=_breakers(breaker_entries, problems, by_model),
        problems=problems,
        by_index=by_index,
        models_by_name=by_name,
        breakers_by_model=by_model,
        host_entries=host_entries,
        bench_baselines=bench_baselines,
    )


def _benchmarks(
    raw: dict[str, Any] | None, problems: list[str], baselines: dict[str, float | None]
) -> dict[str, tuple[float | None, datetime | None]]:
    out: dict[str, tuple[float | None, datetime | None]] = {}
    for host, entry in (raw or {}).items():
        if not isinstance(entry, dict):
            continue
        name = check_text(host, HOSTNAME_CHARS)
        if not isinstance(name, str):
            continue
        f = Fields(entry, f"benchmarks.{name}", problems)
        out[name] = (f.number("current_tok_s", hi=LIMITS["current_tok_s"]), f.time("measured_at"))
        base = entry.get("baseline_tok_s")
        none_yet = type(base) in (int, float) and base == 0  # 0: not measured yet, not a fault
        lo, hi = MIN_BASELINE_TOK_S, LIMITS["baseline_tok_s"]
        baselines[name] = None if none_yet else f.number("baseline_tok_s", lo=lo, hi=hi)
    return out


def _models(entries: list[Any], problems: list[str], by_name: dict[str, ModelCounts]) -> dict[str, ModelCounts]:
    """Counts per hostname (summed over its models), and per ``name`` (the GPU's alias)."""
    models: dict[str, ModelCounts] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        where = f"summary.available_models[{i}]"
        f = Fields(entry, where, problems)
        host = f.text("hostname", HOSTNAME_CHARS)
        if host is None:
            problems.append(f"{where}: no hostname")
            continue
        counts = ModelCounts(
            requests_60s=f.count("requests_60s", hi=COUNT_LIMIT),
            failures_60s=f.count("failures_60s", hi=COUNT_LIMIT),
            consecutive_timeouts=f.count("consecutive_timeouts", hi=COUNT_LIMIT),
        )
        if (
            counts.requests_60s is not None
            and counts.failures_60s is not None
            and counts.failures_60s > counts.requests_60s
        ):
            problems.append(f"{where}: more failures than requests")
            counts = ModelCounts(None, None, counts.consecutive_timeouts)
        prior = models.get(host)
        models[host] = counts if prior is None else _add(prior, counts)
        name = f.text("name")
        if name is not None:
            prior = by_name.get(name)
            by_name[name] = counts if prior is None else _add(prior, counts)
    return models


def _breakers(entries: list[Any], problems: list[str], by_model: dict[str, Breaker]) -> dict[str, Breaker]:
    """Breakers per hostname (open wins), and per ``model`` (the GPU's alias)."""
    breakers: dict[str, Breaker] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        f = Fields(entry, f"summary.circuit_breakers[{i}]", problems)
        host = f.text("hostname", HOSTNAME_CHARS)
        is_open = f.flag("open")
        if host is None or is_open is None:
            continue
        breaker = Breaker(open=is_open, opened_at=f.time("opened_at"))
        if is_open or host not in breakers:
            breakers[host] = breaker
        model = f.text("model")
        if model is not None and (is_open or model not in by_model):
            by_model[model] = breaker
    return breakers


def _add(a: ModelCounts, b: ModelCounts) -> ModelCounts:
    """Two model entries on one host (e.g. a main model and an MTP draft): sum the counts."""

    def plus(x: int | None, y: int | None) -> int | None:
        return None if x is None or y is None else x + y

    return ModelCounts(
        plus(a.requests_60s, b.requests_60s),
        plus(a.failures_60s, b.failures_60s),
        max(a.consecutive_timeouts or 0, b.consecutive_timeouts or 0)
        if (a.consecutive_timeouts is not None or b.consecutive_timeouts is not None)
        else None,
    )
