"""Per-value provenance of a GPU's reading (issue 19: "each value keeps its provenance: which source
and which request").

A poll's :class:`~gpuheal.model.GpuSample` is filled from several requests: the GPU source's
(gpu-monitor's ``/gpu-data``, nvidia-smi / rocm-smi on the GPU's host, Prometheus's queries), the
direct probe of the GPU's llama-server (``/health``, ``/metrics``, ``/slots``, ``/props``, the
canary) and LiteLLM's ``/metrics``. :class:`Origins` records which request wrote each value as the
sample is merged; the last writer of a value is its provenance, and a value left "not known" has
none.

A request is named relative to the GPU's own configuration (its ``endpoint``, ``host`` and
``transport``; ``monitor.url``, ``prometheus.url``, ``litellm.url``), never by a URL: no credential
in a URL reaches a trace, and GPUs read the same way share one provenance record, so 1,000 GPUs cost
a handful of tuples, not 1,000 dicts (the 1000-GPU check: <= 200 MB). Pure: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Provenance: ((request, (field, ...)), ...), in the order the values were written
Provenance = tuple[tuple[str, tuple[str, ...]], ...]

MONITOR = "gpu-monitor GET /gpu-data"  # monitor.url
PROMETHEUS = "prometheus GET /api/v1/query"  # prometheus.queries.<field>; trends: deriv over *_series
PROMETHEUS_UP = "prometheus GET /api/v1/query up"  # probe_endpoints: false: the target's up
HEALTH = "llama-server GET /health"  # gpus[].endpoint
METRICS = "llama-server GET /metrics"
SLOTS = "llama-server GET /slots"
PROPS = "llama-server GET /props"
CANARY = "llama-server POST /completion (canary)"
LITELLM = "litellm GET /metrics"  # litellm.url
SPEND_LOGS = "litellm GET /spend/logs/v2"  # Rule 10's window of spend logs, tallied per GPU

# llama_telemetry.ServerProbe.values()'s fields by the request each comes from
SERVER_FIELDS: dict[str, str] = {
    "metrics": METRICS, "n_decode_total": METRICS, "tokens_predicted_total": METRICS,
    "requests_processing": METRICS, "requests_deferred": METRICS,
    "slots": SLOTS, "slots_total": SLOTS, "slots_busy": SLOTS,
    "is_sleeping": PROPS, "n_ctx": PROPS, "canary": CANARY,
}

MAX_REQUESTS, MAX_FIELDS = 32, 64  # a recorded provenance past these is damaged (a sample has ~35 fields)
_SHARED: dict[Provenance, Provenance] = {}
_MAX_SHARED = 4096  # distinct shapes kept for sharing; a long-lived process does not grow without end


def smi(vendor: str | None, transport: str | None) -> str:
    """nvidia-smi / rocm-smi on the GPU's host, over its transport (the smi source, or Rule 7.3's fallback)."""
    return f"{'rocm-smi' if vendor == 'amd' else 'nvidia-smi'} over {transport or 'local'}"


class Origins:
    """The values of one GPU's sample as they are merged, and the request that wrote each."""

    __slots__ = ("by", "values")

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.by: dict[str, str] = {}

    def put(self, request: str, new: Mapping[str, Any]) -> None:
        """``new``'s values, all from ``request`` (a later writer of a field replaces an earlier one)."""
        self.values.update(new)
        for key in new:
            self.by[key] = request

    def put_each(self, new: dict[str, Any], requests: dict[str, str], default: str) -> None:
        """``new``'s values, each from ``requests[field]`` (``default`` for a field not named there)."""
        self.values.update(new)
        for key in new:
            self.by[key] = requests.get(key, default)

    def provenance(self, known: dict[str, Any]) -> Provenance:
        """The provenance of the final values: ``known`` is the sample's fields (a ``None`` one is not
        known and has none); one shared record per distinct shape."""
        groups: dict[str, list[str]] = {}
        by = self.by
        for key, value in known.items():  # ~35 fields of every GPU at every poll (issue 29): no list made per field
            if value is not None:
                request = by.get(key)
                if request is not None:
                    keys = groups.get(request)
                    if keys is None:
                        groups[request] = [key]
                    else:
                        keys.append(key)
        return share(tuple((request, tuple(keys)) for request, keys in groups.items()))


def share(shape: Provenance) -> Provenance:
    """One record per distinct shape: GPUs read the same way (in a poll, or in a replayed trace) share it."""
    shared = _SHARED.get(shape)
    if shared is None:
        if len(_SHARED) >= _MAX_SHARED:
            _SHARED.clear()
        shared = _SHARED.setdefault(shape, shape)
    return shared


def to_json(provenance: Provenance) -> dict[str, list[str]]:
    """``{request: [field, ...]}``: the form ``check --json``, ``heal --json`` and a trace show."""
    return {request: list(keys) for request, keys in provenance}


def from_json(data: Any) -> Provenance | None:
    """The inverse of :func:`to_json` for a recorded trace; ``None`` for anything else (a damaged or
    hand-edited trace: the provenance is not known, the values still are; so is a huge one)."""
    if not isinstance(data, dict) or len(data) > MAX_REQUESTS:
        return None
    out = []
    for request, keys in data.items():
        if not isinstance(request, str) or not isinstance(keys, list) or len(keys) > MAX_FIELDS:
            return None
        if not all(isinstance(k, str) for k in keys):
            return None
        out.append((request[:200], tuple(k[:64] for k in keys)))
    return share(tuple(out))
