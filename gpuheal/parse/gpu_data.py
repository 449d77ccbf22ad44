"""Parse gpu-monitor's ``/gpu-data`` document (contract: "gpu-monitor /gpu-data"). Pure.

The document is untrusted: every field is optional, every number may be a string, NaN, negative
or absurd. A bad value becomes ``None`` ("not known, never zero") and a note; a document whose
shape is wrong as a whole raises :class:`InvalidDocument`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuheal.clock import parse_iso
from gpuheal.model import Breaker

# Upper bounds beyond which a reading is garbage, not a measurement.
_LIMITS = {
    "temp_c": 200.0,
    "vram_used_mb": 16 * 1024 * 1024.0,
    "vram_total_mb": 16 * 1024 * 1024.0,
    "util_pct": 100.0,
    "power_w": 10000.0,
    "power_limit_w": 10000.0,
    "current_tok_s": 1e6,
    "baseline_tok_s": 1e6,
}
_COUNT_LIMIT = 10**9
_GPU_FIELDS = ("temp_c", "vram_used_mb", "vram_total_mb", "util_pct", "power_w", "power_limit_w")


class InvalidDocument(ValueError):
    """The document is not a gpu-monitor document at all."""


@dataclass
class HostReading:
    hostname: str
    values: dict[str, float | None] = field(default_factory=dict)
    name: str | None = None
    running: bool | None = None


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


def number(value: Any, limit: float | None = None) -> float | None:
    """A finite, non-negative number within ``limit``, or ``None``.

    Accepts numeric strings ("64", "64 C" is rejected); ``bool`` is not a number.
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, int | float):
        return None
    value = float(value)
    if not math.isfinite(value) or value < 0 or (limit is not None and value > limit):
        return None
    return value


def count(value: Any) -> int | None:
    n = number(value, _COUNT_LIMIT)
    return None if n is None else int(n)


def _text(value: Any, max_len: int = 200) -> str | None:
    return value[:max_len] if isinstance(value, str) and value.strip() else None


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        return parse_iso(value)
    except ValueError:
        return None


def _shown(raw: Any) -> str:
    """A short description of a bad value; never ``str()`` of a nested one (deep → RecursionError)."""
    if isinstance(raw, str):
        return repr(raw[:40])
    if isinstance(raw, int | float):
        return repr(raw)[:40]
    return f"a JSON {type(raw).__name__}"


def _host_reading(entry: dict[str, Any], where: str, problems: list[str]) -> HostReading | None:
    hostname = _text(entry.get("hostname"), 253)
    if hostname is None:
        problems.append(f"{where}: no hostname")
        return None
    reading = HostReading(hostname=hostname, name=_text(entry.get("name")))
    for key in _GPU_FIELDS:
        raw = entry.get(key)
        value = number(raw, _LIMITS[key])
        if raw is not None and value is None:
            problems.append(f"{where}.{key}: {_shown(raw)} is not a valid reading")
        reading.values[key] = value
    running = entry.get("running")
    reading.running = running if isinstance(running, bool) else None
    return reading


def parse_gpu_data(doc: Any) -> MonitorDocument:
    """Turn the decoded JSON into a :class:`MonitorDocument`.

    Raises :class:`InvalidDocument` when ``doc`` is not an object or has neither ``gpus`` nor
    ``strix``. If a host appears in both ``gpus`` and ``strix``, the ``gpus`` entry wins
    (contract).
    """
    if not isinstance(doc, dict):
        raise InvalidDocument(f"expected a JSON object, got {type(doc).__name__}")
    gpus = doc.get("gpus")
    strix = doc.get("strix")
    if gpus is None and strix is None:
        raise InvalidDocument("neither 'gpus' nor 'strix' in the document")
    if gpus is not None and not isinstance(gpus, list):
        raise InvalidDocument(f"'gpus' must be a list, got {type(gpus).__name__}")
    problems: list[str] = []
    hosts: dict[str, HostReading] = {}
    for i, entry in enumerate(gpus or []):
        if not isinstance(entry, dict):
            problems.append(f"gpus[{i}]: not an object")
            continue
        reading = _host_reading(entry, f"gpus[{i}]", problems)
        if reading is not None and reading.hostname not in hosts:
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

    benchmarks: dict[str, tuple[float | None, datetime | None]] = {}
    raw_bench = doc.get("benchmarks")
    if isinstance(raw_bench, dict):
        for host, entry in raw_bench.items():
            if isinstance(entry, dict):
                benchmarks[str(host)] = (
                    number(entry.get("current_tok_s"), _LIMITS["current_tok_s"]),
                    _time(entry.get("measured_at")),
                )

    models: dict[str, ModelCounts] = {}
    breakers: dict[str, Breaker] = {}
    summary = doc.get("summary")
    if isinstance(summary, dict):
        for i, entry in enumerate(summary.get("available_models") or []):
            if not isinstance(entry, dict):
                continue
            host = _text(entry.get("hostname"), 253)
            if host is None:
                problems.append(f"summary.available_models[{i}]: no hostname")
                continue
            counts = ModelCounts(
                requests_60s=count(entry.get("requests_60s")),
                failures_60s=count(entry.get("failures_60s")),
                consecutive_timeouts=count(entry.get("consecutive_timeouts")),
            )
            if (
                counts.requests_60s is not None
                and counts.failures_60s is not None
                and counts.failures_60s > counts.requests_60s
            ):
                problems.append(f"summary.available_models[{i}]: more failures than requests")
                counts = ModelCounts(None, None, counts.consecutive_timeouts)
            prior = models.get(host)
            models[host] = counts if prior is None else _add(prior, counts)
        raw_breakers = summary.get("circuit_breakers")
        if isinstance(raw_breakers, list):
            for entry in raw_breakers:
                if not isinstance(entry, dict):
                    continue
                host = _text(entry.get("hostname"), 253)
                is_open = entry.get("open")
                if host is None or not isinstance(is_open, bool):
                    continue
                if is_open or host not in breakers:
                    breakers[host] = Breaker(open=is_open, opened_at=_time(entry.get("opened_at")))
    return MonitorDocument(
        generated_at=_time(doc.get("generated_at")),
        hosts=hosts,
        benchmarks=benchmarks,
        models=models,
        breakers=breakers,
        problems=problems,
    )


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
