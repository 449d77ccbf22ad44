"""The weekly benchmark report (spec "Reporting" §3): build the document, render Markdown. Pure.

Per GPU: tok/s over the last 7 days as a unicode sparkline of daily means, the week-over-week
change with a regression alert when a GPU degrades more than 10 %, the baseline in force against
the latest result. Then the week's incidents (counts by issue, time to resolve), remediations and
escalations from the audit trail. Markdown that reads well in Zulip (tables, no HTML), so
``gpuheal report --weekly | <zulip sender>`` works as well as ``--send``.

Sized for the alert sink at any fleet size (issue 21 point 6): the default Markdown stays within
``limit`` characters (the sink's message limit, ``Destination.max_chars``: Zulip's 10,000). Every GPU
has its row while all the rows fit — the spec's "per-GPU tok/s trend over 7 days" (issue 27 item 17) —
regressions first, then the largest moves, the steady GPUs last. Only past that are the steady ones
folded: a row for each GPU that regressed or improved more than :data:`STEADY_PCT`, sits far below its
baseline or has no week-over-week figure, as many as fit, then "N GPUs steady (±5 %)" on one line;
every list of names is capped. ``full=True`` renders every GPU's row; :func:`table_chunks` splits that
table into messages that each fit.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta
from typing import Any

from gpuheal.clock import format_epoch, format_iso, to_datetime
from gpuheal.core.mttr import quantile
from gpuheal.parse.values import sub_object
from gpuheal.render.report import fmt_duration, fmt_time, md

DAY_S = 86400.0
WEEK_DAYS = 7
REGRESSION_PCT = 10.0  # spec: "Regression alerts if any GPU degrades >10% week-over-week"
BELOW_BASELINE_PCT = 20.0  # Rule 4's default drop: "gen_tok_per_sec drops >20% below baseline"
STEADY_PCT = 5.0  # issue 21: "N GPUs steady (±5 %)" — a change this small gets no row in the summary
MAX_NAMES = 10  # names listed per finding in the summary; the rest counted ("and 57 more")
MAX_LIST_ROWS = 20  # incident kinds / actions / escalations listed in the summary (audit text is untrusted)
SPARK = "▁▂▃▄▅▆▇█"
NO_DATA = "·"


def sparkline(values: list[float | None]) -> str:
    """One block character per value, scaled between the series' min and max; ``·`` = no data.

    A flat series sits in the middle (``▄``) rather than at the floor: "steady", not "zero".
    """
    known = [v for v in values if v is not None]
    if not known:
        return NO_DATA * len(values)
    lo, hi = min(known), max(known)
    out = []
    for v in values:
        if v is None:
            out.append(NO_DATA)
        elif hi - lo < 1e-9:
            out.append(SPARK[3])
        else:
            out.append(SPARK[min(len(SPARK) - 1, int((v - lo) / (hi - lo) * (len(SPARK) - 1) + 0.5))])
    return "".join(out)


def pct_change(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old <= 0:
        return None
    return round((new - old) / old * 100.0, 1)


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


# --------------------------------------------------------------------------- build


def build(
    aliases: list[str],
    config_baselines: dict[str, float | None],
    bench: dict[str, Any],
    audit: list[dict[str, Any]],
    now: datetime,
    alerts_sent: int | None = None,
) -> dict[str, Any]:
    """The ``report --weekly --json`` document (shape in the module docstring of steps/report)."""
    now_s = now.timestamp()
    start_s = now_s - WEEK_DAYS * DAY_S
    gpus = [_gpu_row(bench, alias, config_baselines.get(alias), start_s, now_s) for alias in aliases]
    regressions = [
        {"gpu": g["gpu"], "prev_week_mean_tok_s": g["prev_week_mean_tok_s"], "mean_tok_s": g["mean_tok_s"],
         "change_pct": g["change_pct"]}
        for g in gpus
        if g["regression"]
    ]
    incidents = incidents_from_audit(audit, start_s, now_s)
    return {
        "kind": "weekly",
        "generated_at": format_iso(now),
        "period": {"start": format_iso(now - timedelta(days=WEEK_DAYS)), "end": format_iso(now)},
        "regression_threshold_pct": REGRESSION_PCT,
        "gpus": gpus,
        "regressions": regressions,
        "incidents": incidents["incidents"],
        "remediations": incidents["remediations"],
        "escalations": incidents["escalations"],
        "alerts_sent": alerts_sent,
    }


def _gpu_row(
    bench: dict[str, Any], alias: str, config_baseline: float | None, start_s: float, now_s: float
) -> dict[str, Any]:
    """One GPU's week: daily means, the change against the week before, the baseline in force."""
    from gpuheal import benchdata

    prev_s = start_s - WEEK_DAYS * DAY_S
    week = [r for r in benchdata.ok_results(bench, alias, start_s) if r["at"] <= now_s]
    prev = [r for r in benchdata.ok_results(bench, alias, prev_s) if r["at"] < start_s]
    failed = [
        r
        for r in benchdata.results(bench, alias, start_s)
        if r["at"] <= now_s and not (r.get("ok") and r.get("gen_tok_s"))
    ]
    days = _days(week, start_s)
    week_vals = [float(r["gen_tok_s"]) for r in week]
    mean = _mean(week_vals)
    prev_mean = _mean([float(r["gen_tok_s"]) for r in prev])
    change = pct_change(mean, prev_mean)
    baseline, source = benchdata.baseline(bench, alias, config_baseline)
    latest = [r for r in benchdata.ok_results(bench, alias) if r["at"] <= now_s]
    current = round(float(latest[-1]["gen_tok_s"]), 1) if latest else None
    vs = pct_change(current, baseline)
    return {
        "gpu": alias,
        "days": days,
        "sparkline": sparkline([d["mean_tok_s"] for d in days]),
        "n_results": len(week_vals),
        "failed_runs": len(failed),
        "mean_tok_s": mean,
        "min_tok_s": round(min(week_vals), 1) if week_vals else None,
        "max_tok_s": round(max(week_vals), 1) if week_vals else None,
        "prev_week_mean_tok_s": prev_mean,
        "change_pct": change,
        "regression": change is not None and change < -REGRESSION_PCT,
        "baseline_tok_s": round(baseline, 1) if baseline is not None else None,
        "baseline_source": source if baseline is not None else None,
        "current_tok_s": current,
        "current_vs_baseline_pct": vs,
        "below_baseline": vs is not None and vs < -BELOW_BASELINE_PCT,
    }


def _days(week: list[dict[str, Any]], start_s: float) -> list[dict[str, Any]]:
    """The week's daily means; the last day includes its closing instant (a result at ``now``)."""
    days = []
    for i in range(WEEK_DAYS):
        lo, hi = start_s + i * DAY_S, start_s + (i + 1) * DAY_S
        vals = [float(r["gen_tok_s"]) for r in week if lo <= r["at"] < hi or (i == WEEK_DAYS - 1 and r["at"] == hi)]
        days.append({"date": format_epoch(lo)[:10], "mean_tok_s": _mean(vals), "n": len(vals)})
    return days


def _ts(record: dict[str, Any]) -> float | None:
    dt = to_datetime(record.get("timestamp"))
    return dt.timestamp() if dt else None


def incidents_from_audit(audit: list[dict[str, Any]], start_s: float, end_s: float) -> dict[str, Any]:
    """Incidents, remediations and escalations of ``[start_s, end_s]`` from audit records.

    An incident of (gpu, issue) opens at its first record, backdated to the ``detected.since`` it
    carries (or by its ``detected.duration_s``: how long the condition had held), and closes at
    the first record whose ``result`` is ``resolved``; time to resolve is the difference. A
    remediation is one (run_id, gpu, issue, action) — its result is the last record of that key
    (intent → outcome → verification; keyed by the record's ``attempt`` number when it has one).
    Junk records are skipped.
    """
    book = _IncidentBook(start_s)
    for t, rec in _dated(audit, end_s):
        book.add(t, rec)
    incidents = [i for i in book.done + list(book.open.values()) if (i["end_s"] or end_s) >= start_s]
    incidents.sort(key=lambda i: (i["start_s"], i["gpu"], i["issue"]))
    return {
        "incidents": {
            "total": len(incidents),
            "resolved": sum(1 for i in incidents if i["end_s"] is not None),
            "open": sum(1 for i in incidents if i["end_s"] is None),
            "by_issue": _by_issue(incidents),
            "list": [_incident_row(i) for i in incidents],
        },
        "remediations": _remediations(book.final, start_s),
        "escalations": book.escalations,
    }


def _dated(audit: list[dict[str, Any]], end_s: float) -> list[tuple[float, dict[str, Any]]]:
    """(time, record) of the well-formed records up to ``end_s``, oldest first."""
    records = []
    for rec in audit:
        if not isinstance(rec, dict) or not isinstance(rec.get("gpu"), str) or not isinstance(rec.get("issue"), str):
            continue
        t = _ts(rec)
        if t is None or t > end_s:
            continue
        records.append((t, rec))
    records.sort(key=lambda x: x[0])
    return records


class _IncidentBook:
    """Audit records folded, oldest first, into incidents (open and done), each remediation's last
    record (``final``), and the escalations from ``start_s`` on."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.open: dict[tuple[str, str], dict[str, Any]] = {}
        self.done: list[dict[str, Any]] = []
        self.final: dict[tuple[str, str, str, str], tuple[float, dict[str, Any]]] = {}
        self.escalations: list[dict[str, Any]] = []

    def add(self, t: float, rec: dict[str, Any]) -> None:
        key = (rec["gpu"], rec["issue"])
        inc = self.open.get(key)
        if inc is None:
            inc = self.open[key] = _new_incident(t, rec)
        action = rec.get("action")
        if isinstance(action, str) and action != "alert" and action not in inc["actions"]:
            inc["actions"].append(action)
        escalated = rec.get("escalated") is True or rec.get("result") == "escalated"
        if escalated and not inc["escalated"]:  # once per incident (outcome + alert records)
            inc["escalated"] = True
            if t >= self.start_s:
                self.escalations.append(
                    {"gpu": rec["gpu"], "issue": rec["issue"], "at": format_epoch(t), "run_id": rec.get("run_id")}
                )
        if isinstance(action, str) and action != "alert" and rec.get("result") != "planned":
            attempt = rec.get("attempt")
            which = str(attempt) if isinstance(attempt, int) and not isinstance(attempt, bool) else action
            self.final[(str(rec.get("run_id")), rec["gpu"], rec["issue"], which)] = (t, rec)
        if rec.get("result") == "resolved":
            inc["end_s"] = t
            self.done.append(self.open.pop(key))


def _new_incident(t: float, rec: dict[str, Any]) -> dict[str, Any]:
    """An incident opened by ``rec`` at ``t``, backdated to when its condition began."""
    start = t
    detected = sub_object(rec, "detected")
    since = to_datetime(detected.get("since"))
    held = detected.get("duration_s")
    if since is not None and since.timestamp() < t:
        start = since.timestamp()
    elif isinstance(held, int | float) and not isinstance(held, bool) and 0 < held < 30 * DAY_S:
        start = t - float(held)
    return {"gpu": rec["gpu"], "issue": rec["issue"], "start_s": start, "end_s": None, "escalated": False,
            "actions": []}


def _by_issue(incidents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per issue: counts and the median / max time to resolve, most frequent first."""
    by_issue: dict[str, dict[str, Any]] = {}
    for inc in incidents:
        row = by_issue.setdefault(
            inc["issue"], {"issue": inc["issue"], "count": 0, "resolved": 0, "open": 0, "escalated": 0, "_times": []}
        )
        row["count"] += 1
        if inc["end_s"] is not None:
            row["resolved"] += 1
            row["_times"].append(inc["end_s"] - inc["start_s"])
        else:
            row["open"] += 1
        if inc["escalated"]:
            row["escalated"] += 1
    issue_rows = []
    for row in sorted(by_issue.values(), key=lambda r: (-r["count"], r["issue"])):
        times = row.pop("_times")
        row["median_resolve_s"] = round(statistics.median(times)) if times else None
        p90 = quantile(times, 0.9)  # issue 20: MTTR per rule, its tail beside the median
        row["p90_resolve_s"] = round(p90) if p90 is not None else None
        row["max_resolve_s"] = round(max(times)) if times else None
        issue_rows.append(row)
    return issue_rows


def _remediations(
    final: dict[tuple[str, str, str, str], tuple[float, dict[str, Any]]], start_s: float
) -> list[dict[str, Any]]:
    """Per action, the outcomes of the remediations that ended in the week, most frequent first."""
    rem: dict[str, dict[str, Any]] = {}
    for t, rec in final.values():
        if t < start_s:
            continue
        row = rem.setdefault(
            rec["action"], {"action": rec["action"], "count": 0, "resolved": 0, "failed": 0, "other": 0}
        )
        row["count"] += 1
        result = rec.get("result")
        if result == "resolved":
            row["resolved"] += 1
        elif result in ("failed", "escalated"):
            row["failed"] += 1
        else:
            row["other"] += 1
    return sorted(rem.values(), key=lambda r: (-r["count"], r["action"]))


def _incident_row(i: dict[str, Any]) -> dict[str, Any]:
    return {
        "gpu": i["gpu"],
        "issue": i["issue"],
        "start": format_epoch(i["start_s"]),
        "end": format_epoch(i["end_s"]) if i["end_s"] is not None else None,
        "resolve_s": round(i["end_s"] - i["start_s"]) if i["end_s"] is not None else None,
        "escalated": i["escalated"],
        "actions": i["actions"],
    }


# --------------------------------------------------------------------------- Markdown


def _n(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f}%"


def markdown(doc: dict[str, Any], *, limit: int, full: bool = False) -> str:
    """The report: a summary within ``limit`` characters (the sink's message limit: stdout piped to a
    sender, or ``--send``, fits one message) at any fleet size, or (``full``) every row."""
    period = doc["period"]
    span = f"{fmt_time(period['start'])} → {fmt_time(period['end'])}"
    head = ["**📊 GPU Fleet — Weekly Benchmark Report**", span, ""]
    cap = None if full else MAX_NAMES
    tail = [
        "",
        *_findings(doc, cap),
        "",
        *_incident_lines(doc["incidents"], None if full else MAX_LIST_ROWS),
        "",
        *_remediation_lines(doc["remediations"], None if full else MAX_LIST_ROWS),
        "",
        *_escalation_lines(doc["escalations"], None if full else MAX_LIST_ROWS),
    ]
    if doc.get("alerts_sent") is not None:
        tail += ["", f"_Zulip alerts sent this week: {doc['alerts_sent']}._"]
    if full:
        table = _gpu_table(doc["gpus"])
    else:
        room = limit - len("\n".join(head + tail)) - 2
        table = _summary_table(doc["gpus"], room)
    return "\n".join(head + table + tail).rstrip() + "\n"


def _notable(g: dict[str, Any]) -> bool:
    """A GPU the summary gives a row: it moved more than ±5 %, runs far below its baseline, or has
    no week-over-week figure (so it cannot be called steady)."""
    change = g["change_pct"]
    return change is None or abs(change) > STEADY_PCT or bool(g.get("below_baseline"))


def _summary_table(gpus: list[dict[str, Any]], room: int) -> list[str]:
    """Every GPU's row when they all fit ``room`` characters (regressions first, the largest moves
    next, the steady GPUs last); else the notable GPUs' rows, as many as fit, then one line each for
    the rows left out and the steady GPUs (issue 27 item 17: fold only what does not fit)."""
    every = _gpu_table(sorted(gpus, key=_row_order))
    if gpus and sum(len(x) + 1 for x in every) <= room:
        return every
    notable = sorted((g for g in gpus if _notable(g)), key=_row_order)
    steady = len(gpus) - len(notable)
    names = [md(g["gpu"], 64) for g in gpus if not _notable(g)]
    footer = [f"{steady} GPU{'s' if steady != 1 else ''} steady (±{STEADY_PCT:g} %): {_names(names, MAX_NAMES)}."]
    footer = footer if steady else []
    lines = _gpu_table([])
    budget = room - sum(len(x) + 1 for x in lines + footer) - 120  # 120: the "and N more" line
    shown = 0
    for g in notable:
        row = _gpu_table([g])[-1]
        if budget - len(row) - 1 < 0:
            break
        lines.append(row)
        budget -= len(row) + 1
        shown += 1
    if shown < len(notable):
        more = len(notable) - shown
        lines.append(f"… and {more} more GPUs changed or without a figure (`report --weekly --full`).")
    if not notable:
        lines = []
    return lines + ([""] if lines and footer else []) + footer


def _row_order(g: dict[str, Any]) -> tuple[bool, bool, bool, float, str]:
    """Regressions, then the other notable GPUs, then the steady ones; within each the largest move
    first, a GPU without a week-over-week figure after those with one."""
    change = g["change_pct"]
    return (not g["regression"], not _notable(g), change is None, -abs(change or 0.0), g["gpu"])


def table_chunks(doc: dict[str, Any], *, limit: int) -> list[str]:
    """Every GPU's row, split into messages of at most ``limit`` characters, each with the header."""
    header, rows = _gpu_table([])[:2], _gpu_table(doc["gpus"])[2:]
    chunks: list[list[str]] = []
    for row in rows:
        title = f"**Weekly report — all GPUs ({len(chunks) + 1})**"
        if not chunks or len("\n".join(chunks[-1] + [row])) > limit:
            chunks.append([title, "", *header])
        chunks[-1].append(row)
    return ["\n".join(c) for c in chunks]


def _names(names: list[str], cap: int | None) -> str:
    if cap is None or len(names) <= cap:
        return ", ".join(names)
    return ", ".join(names[:cap]) + f" and {len(names) - cap} more"


def _gpu_table(gpus: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| GPU | tok/s, 7 days | avg | prev. week | change | baseline | current | vs. baseline |",
        "|:--|:--|--:|--:|--:|--:|--:|--:|",
    ]
    for g in gpus:
        flag = " ⚠" if g["regression"] else ""
        lines.append(
            f"| {md(g['gpu'], 64)}{flag} | `{g['sparkline']}` | {_n(g['mean_tok_s'])} "
            f"| {_n(g['prev_week_mean_tok_s'])} | {_pct(g['change_pct'])} | {_n(g['baseline_tok_s'])} "
            f"| {_n(g['current_tok_s'])} | {_pct(g['current_vs_baseline_pct'])} |"
        )
    return lines


def _findings(doc: dict[str, Any], cap: int | None = None) -> list[str]:
    """Regressions (or their absence), GPUs below their baseline, failed runs, baseline sources;
    with ``cap``, at most that many lines or names per finding, the rest counted."""
    lines = []
    threshold = doc.get("regression_threshold_pct", REGRESSION_PCT)
    regressions = doc["regressions"]
    for r in regressions[:cap]:
        lines.append(
            f"⚠ **Regression: {md(r['gpu'], 64)}** averaged {_n(r['mean_tok_s'])} tok/s this week, "
            f"{_pct(r['change_pct'])} week over week (was {_n(r['prev_week_mean_tok_s'])})."
        )
    if cap is not None and len(regressions) > cap:
        lines.append(f"⚠ … and {len(regressions) - cap} more GPUs regressed more than {threshold:g}%.")
    if not regressions:
        lines.append(f"✅ No GPU degraded more than {threshold:g}% week over week.")
    below = [g for g in doc["gpus"] if g.get("below_baseline")]
    for g in below[:cap]:
        lines.append(
            f"⚠ **{md(g['gpu'], 64)}** runs at {_n(g['current_tok_s'])} tok/s, "
            f"{_pct(g['current_vs_baseline_pct'])} "
            f"against its baseline of {_n(g['baseline_tok_s'])} (Rule 4 alerts below -{BELOW_BASELINE_PCT:g}%)."
        )
    if cap is not None and len(below) > cap:
        lines.append(f"⚠ … and {len(below) - cap} more GPUs below -{BELOW_BASELINE_PCT:g}% of their baseline.")
    notes = [
        f"{md(g['gpu'], 64)}: {g['failed_runs']} failed benchmark run(s)" for g in doc["gpus"] if g.get("failed_runs")
    ]
    if notes:
        lines.append("Failed runs: " + _names(notes, cap) + ".")
    return lines + _baseline_lines(doc["gpus"], cap)


def _baseline_lines(gpus: list[dict[str, Any]], cap: int | None = None) -> list[str]:
    by_source: dict[str, list[str]] = {}
    for g in gpus:
        if g.get("baseline_source"):
            by_source.setdefault(g["baseline_source"], []).append(md(g["gpu"], 64))
    if not by_source:
        return []
    label = {"config": "seeded from the config", "monitor": "seeded from gpu-monitor",
             "rolling-30d": "rolling 30-day average"}
    parts = [
        f"{_names(names, cap)} {label.get(src, md(src, 40))}"
        for src, names in sorted(by_source.items(), key=lambda x: x[0] != "rolling-30d")
    ]
    return ["Baselines: " + "; ".join(parts) + "."]


def _incident_lines(inc: dict[str, Any], cap: int | None = None) -> list[str]:
    if not inc["total"]:
        return ["**Incidents:** none this week."]
    lines = [
        f"**Incidents** — {inc['total']} ({inc['resolved']} resolved, {inc['open']} open)",
        "",
        "| issue | count | resolved | escalated | time to resolve (median / p90 / max) |",
        "|:--|--:|--:|--:|--:|",
    ]
    for row in inc["by_issue"][:cap]:
        ttr = (
            f"{fmt_duration(row['median_resolve_s'])} / {fmt_duration(row.get('p90_resolve_s'))} / "
            f"{fmt_duration(row['max_resolve_s'])}"
            if row["median_resolve_s"] is not None
            else "–"
        )
        lines.append(f"| {md(row['issue'], 64)} | {row['count']} | {row['resolved']} | {row['escalated']} | {ttr} |")
    return lines + _more(inc["by_issue"], cap, "issues")


def _remediation_lines(rem: list[dict[str, Any]], cap: int | None = None) -> list[str]:
    if not rem:
        return ["**Remediations:** none this week."]
    lines = [
        f"**Remediations** — {sum(r['count'] for r in rem)}",
        "",
        "| action | runs | resolved | failed | other |",
        "|:--|--:|--:|--:|--:|",
    ]
    for row in rem[:cap]:
        lines.append(
            f"| {md(row['action'], 80)} | {row['count']} | {row['resolved']} | {row['failed']} | {row['other']} |"
        )
    return lines + _more(rem, cap, "actions")


def _escalation_lines(esc: list[dict[str, Any]], cap: int | None = None) -> list[str]:
    if not esc:
        return ["**Escalations:** none this week."]
    cut = cap is not None and len(esc) > cap
    lines = [f"**Escalations** — {len(esc)}" + (f" (the last {cap} listed)" if cut else "")]
    for e in esc[-(cap or 0) if cut else 0:]:
        run = f" (run `{md(e['run_id'], 64)}`)" if e.get("run_id") else ""
        lines.append(f"- {fmt_time(e['at'])} · {md(e['gpu'], 64)} · {md(e['issue'], 64)}{run}")
    return lines


def _more(rows: list[Any], cap: int | None, what: str) -> list[str]:
    return [f"… and {len(rows) - cap} more {what}."] if cap is not None and len(rows) > cap else []
