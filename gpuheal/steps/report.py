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
"markdown": str, "sent", "sent_parts": [each message sent], "queued_for_escalate"}``.

The weekly Markdown stays within Zulip's 10,000 characters at any fleet size: every GPU's row
while they fit, else the steady GPUs folded into one line (:mod:`gpuheal.render.weekly`);
``--full`` prints every GPU's row, or with ``--send`` posts them after the summary, split
across messages that each fit.

The summary itself is built by the pure :func:`gpuheal.core.report.summary`; this step reads the files.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuheal.core import report
from gpuheal.core.heal_state import HealState
from gpuheal.state import files
from gpuheal.state.audit import audit_records

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpuheal.config.model import Config
    from gpuheal.runtime import CommandResult, Runtime
    from gpuheal.state.store import StateDir

    Post = Callable[..., Any]  # the sink's HTTP transport (gpuheal.sources.http.request), a fake in tests


log = logging.getLogger("gpuheal")

WEEKLY_FINGERPRINT = "fleet/weekly-report"


# --------------------------------------------------------------------------- readers (tolerant)


def heal_state(store: StateDir) -> HealState:
    """``heal-state.json`` as a report reads it: through its one reader (a damaged value loses that value only)."""
    return HealState.from_json(store.read(files.HEAL, None))


def _health(store: StateDir) -> dict[str, Any]:
    doc = store.read_raw(files.GPU_HEALTH)
    return doc if isinstance(doc, dict) else {}


# --------------------------------------------------------------------------- summary


def build_summary(cfg: Config, store: StateDir, now: datetime) -> dict[str, Any]:
    """Read what earlier runs left (any of it may be absent or damaged) and summarise it."""
    from gpuheal import benchdata
    from gpuheal.clock import to_datetime

    health = _health(store)
    return report.summary(
        cfg,
        health,
        to_datetime(health.get("generated_at")),
        heal_state(store),
        benchdata.normalise(store.read(files.BENCH, None)),
        store.read(files.ALERTS, None),
        now,
    )


# --------------------------------------------------------------------------- weekly


def build_weekly(cfg: Config, store: StateDir, now: datetime) -> dict[str, Any]:
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


def command(
    rt: Runtime, store: StateDir, weekly: bool = False, send: bool = False, post: Post | None = None,
    full: bool = False,
) -> CommandResult:
    """``full``: the weekly report's every GPU row (on stdout; with ``--send``, split across messages
    after the summary, each within the sink's limit)."""
    from gpuheal import exit_codes, kg
    from gpuheal.credentials import secrets_for
    from gpuheal.redact import redact, redact_text
    from gpuheal.render import report as render_report
    from gpuheal.render import weekly as render_weekly
    from gpuheal.runtime import CommandResult
    from gpuheal.sinks import destination

    cfg = rt.cfg
    secrets = secrets_for(cfg)
    kg_summary = kg.sync(cfg, store, rt.now, secrets)
    warnings = list(kg_summary.pop("warnings"))
    extra: list[str] = []
    if weekly:
        doc = build_weekly(cfg, store, rt.now)
        limit = destination(cfg).max_chars  # the sink's message limit, piped or sent
        text = render_weekly.markdown(doc, full=full and not send, limit=limit)
        extra = render_weekly.table_chunks(doc, limit=limit) if full and send else []
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
        what = "weekly report" if weekly else "report"
        sent, error = _deliver(cfg, [text] + [redact_text(c, secrets) for c in extra], post)
        if sent:
            doc["sent"] = sent[0]
            doc["sent_parts"] = sent
            ids = ", ".join(str(s["message_id"]) for s in sent)
            status_line = f"{what} sent to #{sent[0]['stream']} > {sent[0]['topic']} (message {ids})"
        if error is not None:
            code = exit_codes.ATTENTION
            note = ""
            if weekly and not sent:
                _queue_weekly(store, doc, text, rt.now)
                doc["queued_for_escalate"] = True
                note = "; queued for the next `gpuheal escalate`"
            log.error("report: %s%s", redact_text(error, secrets), note)
            status_line = f"{what} not {'wholly ' if sent else ''}sent{note}"

    def render() -> None:
        import sys

        if status_line is not None:
            sys.stdout.write(status_line + "\n")
        elif weekly:
            sys.stdout.write(text)
        else:
            render_report.render_summary(doc)

    return CommandResult(document=doc, exit_code=code, render=render, warnings=warnings)


def _deliver(cfg: Config, parts: list[str], post: Post | None) -> tuple[list[dict[str, Any]], str | None]:
    """Each part as one message through the alert sink, in order, stopping at the first failure:
    (what was sent, the error or None)."""
    from gpuheal.sink import SinkUnavailable
    from gpuheal.sinks import destination, open_sink

    try:
        sink = open_sink(cfg, post)
    except SinkUnavailable as exc:
        return [], exc.detail
    sent: list[dict[str, Any]] = []
    to = destination(cfg)
    stream, topic = to.channel, to.topic
    for part in parts:
        outcome = sink.send(part)
        if not outcome.ok:
            return sent, f"{sink.name} delivery failed: {outcome.detail}"
        sent.append({"message_id": outcome.message_id, "stream": stream, "topic": topic})
    return sent, None


def _queue_weekly(store: StateDir, doc: dict[str, Any], text: str, now: datetime) -> None:
    from gpuheal.core.alert import Alert
    from gpuheal.steps.escalate import load_alerts

    data = load_alerts(store)
    data.enqueue(
        Alert(
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
