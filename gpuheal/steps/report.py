"""``gpuheal report``: the current health summary; ``--weekly``: the weekly benchmark report.

Both read only what earlier runs left in the state directory (``gpu-health.json``, the heal
state, the alert queue, benchmark results, the audit trail) and tolerate any of it being absent
or damaged. ``--send`` posts the Markdown to the configured Zulip stream and topic; a weekly
report that cannot be delivered is queued for ``escalate`` (kind ``report``) so a Zulip outage
on Monday morning does not lose the week. Exit status: 0 done, 1 ``--send`` could not deliver,
3 could not run.

``report --json``::

    {"kind": "summary", "generated_at": ISO, "status": "healthy|degraded|down|unknown",
     "health_at": ISO | null, "stale": bool,
     "gpus": {ALIAS: {"endpoint", "temp_c", "vram_used_mb", "vram_total_mb", "util_pct",
                      "power_w", "current_tok_s", "baseline_tok_s", "baseline_source",
                      "restarts_last_hour", "max_restarts_per_hour", "restart_budget_left",
                      "paused": str | null}},
     "issues": [ISSUE + {"attempts": int, "escalated": bool}],
     "fleet_paused": str | null,
     "alerts": {"queued", "oldest_queued_at", "last_error", "not_before", "clean_cycles"},
     "sent": null | {"message_id", "stream", "topic"}, "queued_for_escalate": bool}

``report --weekly --json``: see :func:`gpuheal.render.weekly.build` —
``{"kind": "weekly", "generated_at", "period": {"start", "end"}, "regression_threshold_pct",
"gpus": [{"gpu", "days": [{"date", "mean_tok_s", "n"}], "sparkline", "n_results",
"failed_runs", "mean_tok_s", "min_tok_s", "max_tok_s", "prev_week_mean_tok_s", "change_pct",
"regression", "baseline_tok_s", "baseline_source", "current_tok_s",
"current_vs_baseline_pct"}], "regressions": [...], "incidents": {"total", "resolved", "open",
"by_issue": [...], "list": [...]}, "remediations": [...], "escalations": [...],
"markdown": str, "sent", "queued_for_escalate"}``.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from gpuheal.clock import format_epoch, format_iso
from gpuheal.core import timing
from gpuheal.core.heal_state import HOUR_S, normalise_state
from gpuheal.state import files

log = logging.getLogger("gpuheal")

AUDIT_TAIL_BYTES = 16 << 20  # the report reads at most this much of the audit trail's end
STALE_AFTER_S = 600.0
WEEKLY_FINGERPRINT = "fleet/weekly-report"


# --------------------------------------------------------------------------- readers (tolerant)


def audit_records(store, since_s: float | None = None, max_bytes: int = AUDIT_TAIL_BYTES) -> list[dict[str, Any]]:
    """Audit records at or after ``since_s`` from the trail's last ``max_bytes``; junk skipped."""
    from gpuheal.render.report import to_datetime

    path = store.path / files.AUDIT_LOG
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            start = max(0, size - max_bytes)
            fh.seek(start)
            raw = fh.read()
    except OSError:
        return []
    lines = raw.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first line is cut
    out, junk = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            junk += 1
            continue
        if not isinstance(rec, dict):
            junk += 1
            continue
        if since_s is not None:
            dt = to_datetime(rec.get("timestamp"))
            if dt is None or dt.timestamp() < since_s:
                continue
        out.append(rec)
    if junk:
        store.warnings.append(f"{files.AUDIT_LOG}: skipped {junk} unreadable line(s)")
    return out


def heal_state(store) -> dict[str, Any]:
    """The parts of ``heal-state.json`` (shape: :mod:`gpuheal.core.plan`) a report reads."""
    data = normalise_state(store.read(files.HEAL, None))
    out: dict[str, Any] = {"restarts": {}, "attempts": [], "escalated": {}, "paused": {"fleet": None, "gpus": {}}}
    if not isinstance(data, dict):
        return out
    if isinstance(data.get("restarts"), dict):
        out["restarts"] = {
            a: [float(t) for t in ts if isinstance(t, int | float) and not isinstance(t, bool)]
            for a, ts in data["restarts"].items()
            if isinstance(ts, list)
        }
    if isinstance(data.get("attempts"), dict):
        out["attempts"] = [a for a in data["attempts"].values() if isinstance(a, dict) and "gpu" in a and "issue" in a]
    if isinstance(data.get("escalated"), dict):
        out["escalated"] = {k: v for k, v in data["escalated"].items() if isinstance(v, dict)}
    paused = data.get("paused")
    if isinstance(paused, dict):
        if isinstance(paused.get("fleet"), dict):
            out["paused"]["fleet"] = paused["fleet"]
        if isinstance(paused.get("gpus"), dict):
            out["paused"]["gpus"] = {a: p for a, p in paused["gpus"].items() if isinstance(p, dict)}
    return out


def _health(store) -> dict[str, Any]:
    doc = store.read_raw(files.GPU_HEALTH)
    return doc if isinstance(doc, dict) else {}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# --------------------------------------------------------------------------- summary


def build_summary(cfg, store, now: datetime) -> dict[str, Any]:
    from gpuheal import benchdata
    from gpuheal.render.report import to_datetime

    now_s = now.timestamp()
    health = _health(store)
    hs = heal_state(store)
    bench = benchdata.normalise(store.read(files.BENCH, None))
    fleet_paused = hs["paused"]["fleet"]
    sensed = health.get("gpus") if isinstance(health.get("gpus"), dict) else {}
    gpus = {
        g.alias: _gpu_summary(cfg, g, sensed.get(g.alias) if isinstance(sensed.get(g.alias), dict) else {}, bench, hs,
                              now_s)  # fmt: skip
        for g in cfg.gpus
    }
    issues = []
    for issue in health.get("issues") or []:
        if not isinstance(issue, dict) or "gpu" not in issue or "issue" not in issue:
            continue
        key = (issue["gpu"], issue["issue"], issue.get("since"))
        attempts = [a for a in hs["attempts"] if (a.get("gpu"), a.get("issue"), a.get("since")) == key]
        escalated = f"{issue['gpu']}/{issue['issue']}" in hs["escalated"]
        issues.append({**issue, "attempts": len(attempts), "escalated": escalated})
    health_at = to_datetime(health.get("generated_at"))
    return {
        "kind": "summary",
        "generated_at": format_iso(now),
        "status": health.get("status") if health.get("status") in ("healthy", "degraded", "down") else "unknown",
        "health_at": format_iso(health_at) if health_at else None,
        "stale": health_at is None or now_s - health_at.timestamp() > STALE_AFTER_S,
        "gpus": gpus,
        "issues": issues,
        "fleet_paused": f"{fleet_paused.get('reason', 'maintenance')}" if fleet_paused else None,
        "alerts": _alerts_summary(store.read(files.ALERTS, None), now_s),
    }


def _gpu_summary(cfg, g, row: dict[str, Any], bench, hs: dict[str, Any], now_s: float) -> dict[str, Any]:
    """One GPU's line of the summary: its last readings, speed against baseline, restart budget."""
    from gpuheal import benchdata

    ok = [r for r in benchdata.ok_results(bench, g.alias) if r["at"] <= now_s]
    baseline, source = benchdata.baseline(bench, g.alias, g.baseline_tok_s)
    max_restarts = int(cfg.heal["max_restarts_per_hour"])
    restarts = sum(1 for t in hs["restarts"].get(g.alias, []) if timing.within_last(now_s, t, HOUR_S))
    fleet_paused, own = hs["paused"]["fleet"], hs["paused"]["gpus"].get(g.alias)
    paused = None
    if fleet_paused:
        paused = f"fleet: {fleet_paused.get('reason', 'maintenance')}"
    elif own:
        paused = str(own.get("reason", "maintenance"))
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
    from gpuheal.core.alerts import AlertQueue

    queue = AlertQueue.from_json(stored)

    def calendar(times) -> list[float]:
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


# --------------------------------------------------------------------------- weekly


def build_weekly(cfg, store, now: datetime) -> dict[str, Any]:
    from gpuheal import benchdata
    from gpuheal.render import weekly

    bench = benchdata.normalise(store.read(files.BENCH, None))
    since = now.timestamp() - 2 * weekly.WEEK_DAYS * weekly.DAY_S  # incidents that began last week
    audit = audit_records(store, since)
    return weekly.build(
        list(cfg.aliases),
        {g.alias: g.baseline_tok_s for g in cfg.gpus},
        bench,
        audit,
        now,
    )


# --------------------------------------------------------------------------- command


def command(rt, store, weekly: bool = False, send: bool = False, post=None):
    from gpuheal import exit_codes, kg, zulip
    from gpuheal.redact import redact, redact_text
    from gpuheal.render import report as render_report
    from gpuheal.render import weekly as render_weekly
    from gpuheal.runtime import CommandResult

    cfg = rt.cfg
    secrets = zulip.secrets_for(cfg)
    kg_summary = kg.sync(cfg, store, rt.now, secrets)
    warnings = list(kg_summary.pop("warnings"))
    if weekly:
        doc = build_weekly(cfg, store, rt.now)
        text = render_weekly.markdown(doc)
    else:
        doc = build_summary(cfg, store, rt.now)
        text = render_report.summary_markdown(doc)
    doc = redact(doc, secrets)
    text = redact_text(text, secrets)
    if weekly:
        doc["markdown"] = text
    doc["sent"] = None
    doc["queued_for_escalate"] = False
    code = exit_codes.OK
    status_line = None
    if send:
        stream = str(cfg.zulip.get("stream") or "agent-hub")
        topic = zulip.fit_topic(str(cfg.zulip.get("topic") or "alerts-gpu"))
        error = None
        if not cfg.zulip.get("site"):
            error = "zulip.site is not set in the config"
        else:
            try:
                creds = zulip.load_credentials(cfg)
            except zulip.CredentialsError as exc:
                error = str(exc)
            else:
                outcome = zulip.send_message(
                    cfg.zulip["site"], creds, stream, topic, text, float(cfg.zulip["timeout_s"]), post=post
                )
                if outcome.ok:
                    doc["sent"] = {"message_id": outcome.message_id, "stream": stream, "topic": topic}
                    what = "weekly report" if weekly else "report"
                    status_line = f"{what} sent to #{stream} > {topic} (message {outcome.message_id})"
                else:
                    error = f"Zulip delivery failed: {outcome.detail}"
        if error is not None:
            code = exit_codes.ATTENTION
            note = ""
            if weekly:
                _queue_weekly(store, doc, text, rt.now)
                doc["queued_for_escalate"] = True
                note = "; queued for the next `gpuheal escalate`"
            log.error("report: %s%s", redact_text(error, secrets), note)
            status_line = f"{'weekly report' if weekly else 'report'} not sent{note}"

    def render() -> None:
        import sys

        if status_line is not None:
            sys.stdout.write(status_line + "\n")
        elif weekly:
            sys.stdout.write(text)
        else:
            render_report.render_summary(doc)

    return CommandResult(document=doc, exit_code=code, render=render, warnings=warnings)


def _queue_weekly(store, doc: dict[str, Any], text: str, now: datetime) -> None:
    from gpuheal.core import alerts as alertq
    from gpuheal.steps.escalate import load_alerts

    data = load_alerts(store)
    data.enqueue(
        alertq.Alert(
            WEEKLY_FINGERPRINT,
            "fleet",
            None,
            "report",
            f"weekly:{doc['period']['end']}",
            now.timestamp(),
            "weekly benchmark report",
            title=text.splitlines()[0] if text else "GPU Fleet — Weekly Benchmark Report",
            content=text,
        )
    )
    store.write(files.ALERTS, data.to_json())
