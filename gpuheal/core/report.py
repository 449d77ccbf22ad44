"""The pure half of ``gpuheal report``'s summary (split out of :mod:`gpuheal.steps.report` by issue
10, item 1): the state documents as read, parsed and tolerated in, the ``report --json`` summary out
(its shape: the step's docstring). Values in, values out, time as a parameter: no file is read here.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from gpuheal import benchdata
from gpuheal.clock import format_epoch, format_iso
from gpuheal.config.model import Config, GpuConfig
from gpuheal.core import timing
from gpuheal.core.alerts import AlertQueue
from gpuheal.core.heal_state import HOUR_S, HealState

STALE_AFTER_S = 600.0
SENSED_STATUSES = ("healthy", "degraded", "down")


def summary(
    cfg: Config,
    health: dict[str, Any],
    health_at: datetime | None,
    hs: HealState,
    bench: dict[str, Any],
    alerts: Any,
    now: datetime,
) -> dict[str, Any]:
    """The current health summary from ``gpu-health.json`` (``health``, its ``generated_at`` parsed
    as ``health_at``), the heal state (:meth:`HealState.from_json`, its one reader), the
    normalised bench results and ``alerts.json`` as stored."""
    now_s = now.timestamp()
    sensed = _object(health.get("gpus"))
    gpus = {
        g.alias: _gpu_summary(cfg, g, _object(sensed.get(g.alias)), bench, hs, now_s)
        for g in cfg.gpus
    }
    issues = []
    for issue in health.get("issues") or []:
        if not isinstance(issue, dict) or "gpu" not in issue or "issue" not in issue:
            continue
        key = (issue["gpu"], issue["issue"], issue.get("since"))
        attempts = [a for a in hs.attempts.values() if (a.gpu, a.issue, a.since) == key]
        escalated = f"{issue['gpu']}/{issue['issue']}" in hs.escalated
        issues.append({**issue, "attempts": len(attempts), "escalated": escalated})
    return {
        "kind": "summary",
        "generated_at": format_iso(now),
        "status": health.get("status") if health.get("status") in SENSED_STATUSES else "unknown",
        "health_at": format_iso(health_at) if health_at else None,
        "stale": health_at is None or now_s - health_at.timestamp() > STALE_AFTER_S,
        "gpus": gpus,
        "issues": issues,
        "fleet_paused": hs.paused_fleet.reason if hs.paused_fleet else None,
        "alerts": _alerts_summary(alerts, now_s),
    }


def _object(value: Any) -> dict[str, Any]:
    """A JSON object from a stored document, ``{}`` for anything else (a damaged file)."""
    return value if isinstance(value, dict) else {}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _gpu_summary(
    cfg: Config, g: GpuConfig, row: dict[str, Any], bench: dict[str, Any], hs: HealState, now_s: float
) -> dict[str, Any]:
    """One GPU's line of the summary: its last readings, speed against baseline, restart budget."""
    ok = [r for r in benchdata.ok_results(bench, g.alias) if r["at"] <= now_s]
    baseline, source = benchdata.baseline(bench, g.alias, g.baseline_tok_s)
    max_restarts = cfg.heal.max_restarts_per_hour
    restarts = sum(1 for t in hs.restarts.get(g.alias, ()) if timing.within_last(now_s, t, HOUR_S))
    own = hs.paused_gpus.get(g.alias)
    paused = None
    if hs.paused_fleet:
        paused = f"fleet: {hs.paused_fleet.reason}"
    elif own:
        paused = own.reason
    elif g.paused:
        paused = "config (paused: true)"
    return {
        "endpoint": row.get("endpoint") if isinstance(row.get("endpoint"), str) else None,
        "temp_c": _num(row.get("temp_c")),
        "vram_used_mb": _num(row.get("vram_used_mb")),
        "vram_total_mb": _num(row.get("vram_total_mb")) or g.vram_total_mb,
        "util_pct": _num(row.get("util_pct")),
        "power_w": _num(row.get("power_w")),
        "current_tok_s": round(float(ok[-1]["gen_tok_s"]), 1) if ok else None,
        "baseline_tok_s": round(baseline, 1) if baseline is not None else None,
        "baseline_source": source if baseline is not None else None,
        "restarts_last_hour": restarts,
        "max_restarts_per_hour": max_restarts,
        "restart_budget_left": max(0, max_restarts - restarts),
        "paused": paused,
    }


def _alerts_summary(stored: Any, now_s: float) -> dict[str, Any]:
    """The alert queue (``alerts.json`` as stored) at a glance; a damaged time in it is left out,
    never fatal."""
    queue = AlertQueue.from_json(stored)

    def calendar(times: Iterable[float | None]) -> list[float]:
        return [t for t in times if t is not None and abs(t) < 2.5e11]  # within the calendar

    errors = [a.delivery.last_error for a in queue.queue if a.delivery is not None]
    created = calendar(a.created_at for a in queue.queue)
    not_before = calendar(a.delivery.not_before for a in queue.queue if a.delivery is not None)
    return {
        "queued": len(queue.queue),
        "oldest_queued_at": format_epoch(min(created)) if created else None,
        "last_error": next((e for e in reversed(errors) if e), None),
        "not_before": format_epoch(max(not_before)) if not_before and max(not_before) > now_s else None,
        "clean_cycles": queue.clean_cycles,
    }
