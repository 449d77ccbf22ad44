"""Texts for Zulip: the alert messages and the current health summary (pure; no IO).

Alert titles are the contract's, exactly (contract "Alerts"; spec "Reporting" §2)::

    🛠 GPU Self-Heal — <alias> <issue> resolved
    ⚠ GPU Self-Heal — <alias> needs attention
    ✅ GPU Fleet: All Clear

The title is the message's first line, unadorned, so it reads the same in Zulip's notification
preview, in an e-mail digest and to a ``grep``. Aliases only (Lesson L6): a host name in the
evidence is dropped. Every value that came from the fleet goes through :func:`md` (printable,
bounded, no stray Markdown that could mention @all or break a table).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime
from typing import Any

from gpuheal.clock import to_datetime
from gpuheal.parse.values import sub_object
from gpuheal.render.human import clean

TITLE_RESOLVED = "🛠 GPU Self-Heal — {gpu} {issue} resolved"
TITLE_ESCALATED = "⚠ GPU Self-Heal — {gpu} needs attention"
TITLE_ALL_CLEAR = "✅ GPU Fleet: All Clear"
TITLE_OTHER = "GPU Self-Heal — {gpu} {issue}: {kind}"

# L6: aliases only; a reading's provenance (issue 19) is for the audit trail and the JSON, not the chat
HIDDEN_EVIDENCE_KEYS = frozenset({"host", "hostname", "provenance"})
_MD_SPECIAL = re.compile(r"([\\`*|@\[\]])")
BLOCK_LIMIT = 1500


# --------------------------------------------------------------------------- small formatters


def md(value: Any, limit: int = 200) -> str:
    """Printable, bounded text with Markdown's active characters escaped (``@**all**`` can never
    become a mention, a ``|`` never splits a table cell)."""
    return _MD_SPECIAL.sub(r"\\\1", clean(value, limit))


def fmt_time(epoch_or_iso: Any) -> str:
    """``2026-07-18 08:00 UTC``; ``?`` when unknown or unparsable."""
    dt = to_datetime(epoch_or_iso)
    return dt.strftime("%Y-%m-%d %H:%M UTC") if dt else "?"


def fmt_duration(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``2 h 5 min``, ``3 d 4 h``."""
    if seconds is None or seconds != seconds:
        return "?"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s} s"
    m = s // 60
    if m < 60:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    return str(value)


# --------------------------------------------------------------------------- alerts


def alert_title(alert: dict[str, Any]) -> str:
    kind = alert.get("kind")
    gpu = clean(alert.get("gpu") or "fleet", 64)
    issue = clean(alert.get("issue") or "", 64)
    if kind == "resolved":
        return TITLE_RESOLVED.format(gpu=gpu, issue=issue)
    if kind == "escalated":
        return TITLE_ESCALATED.format(gpu=gpu)
    if kind == "all-clear":
        return TITLE_ALL_CLEAR
    if kind == "report":
        return clean(alert.get("title") or "GPU Fleet report", 120)
    return TITLE_OTHER.format(gpu=gpu, issue=issue or "-", kind=clean(kind, 32))


def alert_content(
    alert: dict[str, Any],
    now: datetime,
    folded: list[dict[str, Any]] | None = None,
    repeat_interval_h: float = 4.0,
    host_aliases: dict[str, str] | None = None,
    inhibited: list[dict[str, Any]] | None = None,
) -> str:
    """The full message: title line, then the evidence (what, tried, how often, since when).

    ``inhibited``: the same GPU's lower tiers of this issue (one incident, issue 21), one line each.

    ``host_aliases`` ({host: alias}) rewrites host names inside the evidence (journal lines,
    process lists) to the GPU's alias, so the alias stays the only identifier (L6).
    """
    kind = alert.get("kind")
    if kind == "report":
        return str(alert.get("content") or alert_title(alert))
    body = _body(alert, now, folded, repeat_interval_h)
    if inhibited:
        gpu = md(alert.get("gpu"), 64)
        body += f"\n**Also firing on {gpu} (the same incident, a lower tier):**\n"
        body += "\n".join(_folded_line(other, now) for other in inhibited) + "\n"
    if host_aliases:
        body = aliases_for_hosts(body, host_aliases)
    return alert_title(alert) + "\n\n" + body


def aliases_for_hosts(text: str, host_aliases: dict[str, str]) -> str:
    for host, alias in sorted(host_aliases.items(), key=lambda kv: -len(kv[0])):
        if host and host != alias:
            text = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", alias, text)
    return text


def _body(alert: dict[str, Any], now: datetime, folded: list[dict[str, Any]] | None, repeat_interval_h: float) -> str:
    kind = alert.get("kind")
    lines: list[str] = []
    if kind == "all-clear":
        lines += _all_clear_body(alert)
    elif kind == "resolved":
        lines += _resolved_body(alert, now)
    else:
        lines += _escalated_body(alert, now, repeat_interval_h)
        if folded:
            gpu = md(alert.get("gpu"), 64)
            lines += ["", f"**Also open on {gpu} (folded into this alert while it is unreachable):**"]
            for other in folded:
                lines.append(_folded_line(other, now))
    return "\n".join(lines).rstrip() + "\n"


def _issue_line(alert: dict[str, Any], now: datetime, verb: str) -> str:
    issue = md(alert.get("issue") or "-", 64)
    parts = [f"**{issue}**"]
    if alert.get("severity"):
        parts.append(md(alert["severity"], 16))
    since = to_datetime(alert.get("since"))
    if since is not None:
        parts.append(f"{verb} since {fmt_time(since)} ({fmt_duration((now - since).total_seconds())})")
    return " · ".join(parts)


def _escalated_body(alert: dict[str, Any], now: datetime, repeat_interval_h: float) -> list[str]:
    out: list[str] = []
    try:
        reminder = int(alert.get("reminder") or 0)
    except (TypeError, ValueError):
        reminder = 0
    if reminder:
        out.append(
            f"🔁 _Reminder {reminder}: still not resolved; "
            f"repeated every {fmt_duration(repeat_interval_h * 3600)} while it stays so._"
        )
        out.append("")
    out.append(_issue_line(alert, now, "open"))
    if alert.get("summary"):
        out.append(f"> {md(alert['summary'], 400)}")
    out.append("")
    out += _evidence(alert, "Detected")
    tried = _tried_lines(alert.get("tried"))
    out.append(f"- **Tried:** {tried}" if tried else "- **Tried:** nothing yet (escalated before any remediation)")
    attempts = alert.get("attempts")
    if isinstance(attempts, int) and not isinstance(attempts, bool):
        out.append(f"- **Attempts:** {attempts}")
    if alert.get("run_id"):
        out.append(f"- **Run:** `{clean(alert['run_id'], 64)}`")
    return out


def _resolved_body(alert: dict[str, Any], now: datetime) -> list[str]:
    out: list[str] = []
    since = to_datetime(alert.get("since"))
    at = to_datetime(alert.get("created_at")) or now
    if since is not None and at < since:
        at = now
    issue = md(alert.get("issue") or "-", 64)
    if since is not None:
        took = fmt_duration((at - since).total_seconds())
        out.append(f"**{issue}** resolved after {took} (open since {fmt_time(since)}).")
    else:
        out.append(f"**{issue}** resolved at {fmt_time(at)}.")
    if alert.get("summary"):
        out.append(f"> {md(alert['summary'], 400)}")
    out.append("")
    out += _evidence(alert, "Detected")
    tried = _tried_lines(alert.get("tried"))
    if tried:
        out.append(f"- **Fixed by:** {tried}")
    verification = alert.get("verification")
    if isinstance(verification, dict) and verification:
        out.append(f"- **Verified:** {_kv(verification)}")
    attempts = alert.get("attempts")
    if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts:
        out.append(f"- **Attempts:** {attempts}")
    if alert.get("run_id"):
        out.append(f"- **Run:** `{clean(alert['run_id'], 64)}`")
    return out


def _all_clear_body(alert: dict[str, Any]) -> list[str]:
    detected = sub_object(alert, "detected")
    n = detected.get("clean_cycles")
    if isinstance(n, int) and not isinstance(n, bool):
        return [f"{n} clean heal cycles in a row: no open issue, no remediation."]
    return [md(alert.get("summary") or "Clean heal cycles in a row: no open issue, no remediation.", 300)]


def _folded_line(alert: dict[str, Any], now: datetime) -> str:
    line = f"- {_issue_line(alert, now, 'open')}"
    if alert.get("summary"):
        line += f" — {md(alert['summary'], 200)}"
    tried = _tried_lines(alert.get("tried"))
    if tried:
        line += f"; tried: {tried}"
    return line


def _kv(data: dict[str, Any], limit: int = 1200) -> str:
    parts = []
    for key, value in data.items():
        if key in HIDDEN_EVIDENCE_KEYS or value is None:
            continue
        parts.append(f"{md(key, 40)}: {md(fmt_value(value), 200)}")
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _evidence(alert: dict[str, Any], label: str) -> list[str]:
    """Scalars inline; multi-line text (journal tails, process lists) as bounded code blocks."""
    detected = alert.get("detected")
    if not isinstance(detected, dict) or not detected:
        return []
    inline = {k: v for k, v in detected.items() if not (isinstance(v, str) and ("\n" in v or len(v) > 200))}
    blocks = {k: v for k, v in detected.items() if k not in inline and k not in HIDDEN_EVIDENCE_KEYS}
    out = []
    if _kv(inline):
        out.append(f"- **{label}:** {_kv(inline)}")
    for key, text in blocks.items():
        body = str(text).replace("```", "'''")
        body = "\n".join(clean(line, 300) for line in body.splitlines()[-40:])
        if len(body) > BLOCK_LIMIT:
            body = "…" + body[-(BLOCK_LIMIT - 1) :]
        out += [f"- **{md(key, 40)}:**", "```text", body, "```"]
    return out


def _tried_lines(tried: Any) -> str:
    """``restart-llama-server → failed ×3; shed-load → resolved`` (first-seen order, counted)."""
    if not isinstance(tried, list) or not tried:
        return ""
    counts: Counter[str] = Counter()
    for entry in tried:
        if isinstance(entry, dict):
            action = entry.get("action") or "?"
            result = entry.get("result") or entry.get("status")
            text = f"{action} → {result}" if result else str(action)
        else:
            text = str(entry)
        text = clean(text, 160)
        counts[text] += 1
    parts = [md(t, 160) + (f" ×{n}" if n > 1 else "") for t, n in counts.items()]
    joined = "; ".join(parts)
    return joined if len(joined) <= 1200 else joined[:1199] + "…"


# --------------------------------------------------------------------------- current summary


STATUS_ICON = {"healthy": "🟢", "degraded": "🟡", "down": "🔴", "unknown": "⚪"}


def summary_markdown(doc: dict[str, Any]) -> str:
    """The ``report`` document as Zulip Markdown (for ``report --send``)."""
    status = doc.get("status") or "unknown"
    lines = [
        f"{STATUS_ICON.get(status, '⚪')} **GPU Fleet — {status.upper()}**",
        f"health as of {fmt_time(doc.get('health_at'))}; report {fmt_time(doc.get('generated_at'))}",
        "",
        "| GPU | endpoint | temp | VRAM | tok/s (baseline) | restarts (1 h) | paused |",
        "|:--|:--|--:|--:|--:|--:|:--|",
    ]
    for alias, g in doc.get("gpus", {}).items():
        lines.append(
            "| {a} | {e} | {t} | {v} | {tok} | {r} | {p} |".format(
                a=md(alias, 64),
                e=md(g.get("endpoint") or "?", 24),
                t=_num(g.get("temp_c"), "°C"),
                v=_vram(g.get("vram_used_mb"), g.get("vram_total_mb")),
                tok=f"{_num(g.get('current_tok_s'), '', 1)} ({_num(g.get('baseline_tok_s'), '', 1)})",
                r=f"{g.get('restarts_last_hour', 0)}/{g.get('max_restarts_per_hour', '?')}",
                p=md(g.get("paused") or "-", 80),
            )
        )
    issues = doc.get("issues") or []
    lines += ["", f"**Open issues** ({len(issues)})" if issues else "**Open issues:** none"]
    for issue in issues:
        line = (
            f"- {md(issue.get('severity', '?'), 16)} · **{md(issue.get('gpu'), 64)}** "
            f"{md(issue.get('issue'), 64)} ({md(issue.get('state', 'firing'), 16)}, "
            f"since {fmt_time(issue.get('since'))})"
        )
        if issue.get("attempts"):
            line += f" — {issue['attempts']} attempt(s)"
        if issue.get("escalated"):
            line += " — escalated"
        lines.append(line)
    if doc.get("fleet_paused"):
        lines.append(f"\n⏸ Healing paused fleet-wide: {md(doc['fleet_paused'], 160)}")
    alerts = doc.get("alerts") or {}
    lines.append("")
    error = f" (last delivery error: {md(alerts['last_error'], 160)})" if alerts.get("last_error") else ""
    lines.append(f"**Alerts queued:** {alerts.get('queued', 0)}{error}")
    return "\n".join(lines).rstrip() + "\n"


def render_summary(doc: dict[str, Any]) -> None:
    """Human output for ``report`` (a terminal or a pipe)."""
    from gpuheal.render.human import (
        ENDPOINT_STYLE,
        STATUS_STYLE,
        fmt_num,
        fmt_vram,
        print_line,
        print_table,
    )

    status = doc.get("status") or "unknown"
    rows = []
    for alias, g in doc.get("gpus", {}).items():
        endpoint = g.get("endpoint") or "?"
        rows.append(
            [
                (clean(alias), "bold"),
                (clean(endpoint), ENDPOINT_STYLE.get(endpoint, "red")),
                (fmt_num(g.get("temp_c"), "°C"), None),
                (fmt_vram(g.get("vram_used_mb"), g.get("vram_total_mb")), None),
                (f"{fmt_num(g.get('current_tok_s'), '', 1)} / {fmt_num(g.get('baseline_tok_s'), '', 1)}", None),
                (f"{g.get('restarts_last_hour', 0)}/{g.get('max_restarts_per_hour', '?')}", None),
                (clean(g.get("paused") or "-"), "yellow" if g.get("paused") else None),
            ]
        )
    print_table(
        f"gpuheal report — fleet {status.upper()} (health as of {doc.get('health_at') or 'never'})",
        ["alias", "endpoint", "temp", "vram", "tok/s / baseline", "restarts 1h", "paused"],
        rows,
    )
    for issue in doc.get("issues") or []:
        severity, state = str(issue.get("severity", "?")).upper(), clean(issue.get("state", "firing"))
        text = (
            f"{severity:8} {clean(issue.get('gpu'))} {clean(issue.get('issue'))} "
            f"({state}, since {clean(issue.get('since'))})"
        )
        if issue.get("attempts"):
            text += f", {issue['attempts']} attempt(s)"
        if issue.get("escalated"):
            text += ", escalated"
        print_line(text, {"critical": "red", "warning": "yellow"}.get(str(issue.get("severity"))))
    if doc.get("fleet_paused"):
        print_line(f"PAUSED   fleet: {clean(doc['fleet_paused'])}", "yellow")
    alerts = doc.get("alerts") or {}
    line = f"alerts queued: {alerts.get('queued', 0)}"
    if alerts.get("last_error"):
        line += f" (last delivery error: {clean(alerts['last_error'], 160)})"
    print_line(line, "yellow" if alerts.get("queued") else None)
    print_line(f"status: {status}", STATUS_STYLE.get(status))


def _num(value: Any, unit: str = "", digits: int = 0) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "?"
    return f"{value:.{digits}f}{unit}"


def _vram(used: Any, total: Any) -> str:
    if not isinstance(used, int | float) or isinstance(used, bool):
        return "?"
    if isinstance(total, int | float) and total:
        return f"{used / 1024:.1f}/{total / 1024:.1f} GB"
    return f"{used / 1024:.1f} GB"
