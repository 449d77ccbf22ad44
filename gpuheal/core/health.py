"""The ``gpu-health`` document (contract: "check --json"). Pure.

``status`` is the worst severity among firing issues (none → healthy, warning → degraded,
critical → down; ``info`` never changes it) — a ``verifying`` issue (its remediation passed its own
checks and waits for fresh data) counts at most as ``degraded`` (contract "Issue state after a
remediation") — raised to at least ``degraded`` by any fault of this
run's sensing — a dead endpoint is never reported healthy, even before its issue's hold has run —
and to ``down`` when no source at all answered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuheal.clock import format_iso
from gpuheal.core.issue import FIRING, VERIFYING, Issue
from gpuheal.model import ENDPOINT_OK, Observation
from gpuheal.provenance import to_json

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
STATUS_BY_RANK = {0: "healthy", 1: "degraded", 2: "down"}


def derive_status(obs: Observation, issues: Sequence[Issue]) -> str:
    rank = 0
    for issue in issues:
        if issue.state == FIRING:
            rank = max(rank, SEVERITY_RANK.get(issue.severity, 0))
        elif issue.state == VERIFYING:
            rank = max(rank, min(1, SEVERITY_RANK.get(issue.severity, 0)))
    if obs.faults:
        rank = max(rank, 1)
    if nothing_answered(obs):
        rank = 2
    return STATUS_BY_RANK[rank]


def nothing_answered(obs: Observation) -> bool:
    """Every source failed: the monitor, LiteLLM (if configured) and every llama-server."""
    if obs.monitor_ok or obs.litellm_ok:
        return False
    return not any(s.endpoint in (ENDPOINT_OK, "loading") for s in obs.gpus.values())


def gpu_rows(obs: Observation, columns: Mapping[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """What was sensed, per alias (contract: gpu-health "gpus"); ``None`` = not known. ``columns``: what a
    rule's memory adds to a GPU's row after the readings (Rule 3's decode progress)."""
    rows: dict[str, dict[str, Any]] = {}
    for alias, s in obs.gpus.items():
        rows[alias] = {
            "name": s.name,
            "temp_c": s.temp_c,
            "vram_used_mb": s.vram_used_mb,
            "vram_total_mb": s.vram_total_mb,
            "util_pct": s.util_pct,
            "power_w": s.power_w,
            "endpoint": s.endpoint,
            # provenance of the readings above (issue 19): monitor | smi | prometheus | smi-fallback
            "source": obs.source,
            # and of each value: {request: [field, ...]} (gpuheal.provenance); null = not known
            "provenance": None if s.provenance is None else to_json(s.provenance),
            # llama-server's own telemetry (issue 12); metrics/slots: ok | disabled | unauthorized | ...
            "metrics": s.metrics,
            "requests_processing": s.requests_processing,
            "requests_deferred": s.requests_deferred,
            "n_decode_total": s.n_decode_total,
            "slots": s.slots,
            "slots_busy": s.slots_busy,
            "slots_total": s.slots_total,
            "is_sleeping": s.is_sleeping,
            "n_ctx": s.n_ctx,  # Rule 9: the running per-slot context (/props)
        }
        if columns is not None:
            rows[alias].update(columns[alias])
    return rows


def health_document(
    obs: Observation,
    issues: Sequence[Issue],
    actions: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
    columns: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The document; its ``issues`` are the typed issues' JSON (the contract's shape)."""
    doc: dict[str, Any] = {
        "status": derive_status(obs, issues),
        "issues": [i.to_json() for i in issues],
        "actions": actions,
        "generated_at": format_iso(obs.at),
        "gpus": gpu_rows(obs, columns),
        "faults": [f.to_dict() for f in obs.faults],
        "warnings": list(obs.warnings),
    }
    if extra:
        doc.update(extra)
    return doc
