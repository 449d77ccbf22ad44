"""One message for one cause (contract "Alerts", issue 21): a group of GPUs with the same issue, or a
run's over-budget summary, as a compact Markdown table — alias, group label, the reading, what was
tried; the host is left out, as in every alert (Lesson L6: the alias is the one identifier) —
within the sink's message limit (``Destination.max_chars``) whatever the number of GPUs (the rows
that do not fit are named on one line, then counted). Network strings are escaped
(:func:`~gpuheal.render.report.md`)."""

from __future__ import annotations

from typing import Any

from gpuheal.render.report import md

ROOM_FOR_NAMES = 1_500  # what the "and N more" line may take
READING_KEYS = ("temp_c", "rise_c_per_min", "rate_mb_per_hour", "vram_used_mb", "failure_ratio", "endpoint",
                "drop_ratio", "open_for_s", "fault")


def group_title(kind: str, issue: str, gpus: int, summary: bool, cause: str | None = None) -> str:
    """``cause``: a shared cause named for the whole group ("network or site: ...")."""
    if cause and kind != "resolved" and not summary:
        return f"⚠ GPU Self-Heal — {md(cause, 160)}"
    if summary:
        return f"⚠ GPU Self-Heal — and {gpus} more GPU{'s' if gpus != 1 else ''} need attention"
    if kind == "resolved":
        return f"🛠 GPU Self-Heal — {issue} resolved on {gpus} GPUs"
    return f"⚠ GPU Self-Heal — {gpus} GPUs need attention: {issue}"


def group_content(incidents: list[dict[str, Any]], *, kind: str, issue: str, summary: bool,
                  labels: dict[str, str], limit: int, cause: str | None = None) -> str:
    """``limit``: the sink's message limit. ``incidents``: one dict per GPU — the alert document plus
    ``"tiers"`` (the lower tiers it inhibits). ``labels``: alias → its ``alerts.group_by`` label (""
    when none). ``cause``: the shared cause the group points at, named in the title (see
    :func:`group_title`)."""
    gpus = sorted({str(i.get("gpu")) for i in incidents})
    title = group_title(kind, issue, len(gpus), summary, cause)
    head = [title, ""]
    if cause and kind != "resolved" and not summary:
        head += [f"Most of the group's hosts are unreachable at once: suspect the network or the site, not "
                 f"each host (the fleet guard holds the restarts). **{md(issue, 64)}** on {len(gpus)} GPUs:"]
    elif summary:
        head.append("The per-run message budget (alerts.max_messages_per_run) is spent; the rest, in one line each:")
    elif kind == "resolved":
        head.append(f"**{md(issue, 64)}** cleared on each of these GPUs:")
    else:
        head.append(f"**{md(issue, 64)}** on {len(gpus)} GPUs — one cause, one message:")
    grouped = any(labels.get(g) for g in gpus)
    head += ["", f"| GPU |{' group |' if grouped else ''} issue | reading | tried, or why not |",
             f"|---|{'---|' if grouped else ''}---|---|---|"]
    rows, names = _rows(incidents, labels if grouped else None), [md(g, 64) for g in gpus]
    return _fit(head, rows, names, limit)


def _rows(incidents: list[dict[str, Any]], labels: dict[str, str] | None) -> list[tuple[str, str]]:
    out = []
    for inc in incidents:
        gpu = str(inc.get("gpu"))
        issue = md(inc.get("issue"), 40)
        tiers = [md(t, 40) for t in inc.get("tiers") or []]
        if tiers:
            issue += f" (also {', '.join(tiers)})"
        tried = ", ".join(md(t, 40) for t in (inc.get("tried") or [])[:3]) or md(inc.get("summary") or "—", 90)
        group = f" {md(labels.get(gpu) or '—', 64)} |" if labels is not None else ""
        out.append((md(gpu, 64), f"| {md(gpu, 64)} |{group} {issue} | {_reading(inc.get('detected'))} | {tried} |"))
    return out


def _reading(detected: Any) -> str:
    if not isinstance(detected, dict):
        return "—"
    parts = [f"{k} {md(detected[k], 24)}" for k in READING_KEYS if detected.get(k) is not None]
    return ", ".join(parts[:2]) or "—"


def _fit(head: list[str], rows: list[tuple[str, str]], names: list[str], limit: int) -> str:
    """The table rows that fit; the GPUs left out named on one line, then counted."""
    text = "\n".join(head)
    shown: set[str] = set()
    for name, row in rows:
        if len(text) + len(row) + 1 > limit - ROOM_FOR_NAMES:
            break
        text += "\n" + row
        shown.add(name)
    rest = [n for n in names if n not in shown]
    if rest:
        line, listed = "", 0
        for n in rest:
            if len(line) + len(n) + 2 > ROOM_FOR_NAMES - 80:
                break
            line += (", " if line else "") + n
            listed += 1
        more = f" and {len(rest) - listed} more" if listed < len(rest) else ""
        text += f"\n\n**Also:** {line}{more}."
    return text + "\n"
