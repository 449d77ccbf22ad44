"""Human output of ``gpuheal replay``: the timeline of issues going pending, firing, resolved or
dropped, poll by poll, then what was still open at the end of the trace."""

from __future__ import annotations

from typing import Any

from gpuheal.render.human import clean, print_line

EVENT_STYLE = {"firing": "bold", "resolved": "green", "pending": "dim", "dropped": "dim"}
SEVERITY_STYLE = {"critical": "red", "warning": "yellow", "info": "cyan"}


def timeline_lines(doc: dict[str, Any]) -> list[tuple[str, str | None]]:
    lines: list[tuple[str, str | None]] = [
        (
            f"replay of {clean(doc['trace'], 200)}: {doc['polls']} polls, {doc['start']} → {doc['end']}, "
            f"{len(doc['gpus'])} GPUs",
            "bold",
        )
    ]
    if not doc["timeline"]:
        lines.append(("  no issue went pending or firing", None))
    for t in doc["timeline"]:
        event = t["event"]
        style = SEVERITY_STYLE.get(t["severity"]) if event == "firing" else EVENT_STYLE.get(event)
        lines.append(
            (
                f"  {t['at']}  #{t['poll']:<4} {event.upper():8} {t['severity']:8} {clean(t['gpu']):14} "
                f"{t['issue']:24} {clean(t['summary'], 160)}",
                style,
            )
        )
    totals = f"fired: {doc['fired']} · resolved: {doc['resolved']} · open at end: {len(doc['open_at_end'])}"
    lines.append((totals, "bold"))
    for issue in doc["open_at_end"]:
        where = f"{clean(issue['gpu'])} {issue['issue']}"
        lines.append((f"  open: {issue['severity']:8} {where} ({issue['state']} since {issue['since']})", None))
    return lines


def render_timeline(doc: dict[str, Any]) -> None:
    for text, style in timeline_lines(doc):
        print_line(text, style)
