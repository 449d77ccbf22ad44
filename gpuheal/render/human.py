"""Human output: a rich table on a terminal, plain aligned text when piped.

Every string that came from the network (hostnames, GPU names, fault details) goes through
:func:`clean` and into ``rich.text.Text`` cells, never into markup, so a hostname like ``[bold]``
prints as text and an ANSI escape cannot repaint the operator's terminal (issue 2, item 9).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from gpuheal.parse.values import printable

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from gpuheal.core.issue import Reported

STATUS_STYLE = {"healthy": "green", "degraded": "yellow", "down": "bold red"}
ENDPOINT_STYLE = {"ok": "green", "loading": "yellow"}


def clean(value: Any, limit: int = 120) -> str:
    """Printable, bounded text; control characters (ANSI escapes) become spaces."""
    if value is None:
        return "-"
    text = printable(value, limit=None)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def fmt_num(value: float | None, unit: str = "", digits: int = 0) -> str:
    if value is None:
        return "?"
    return f"{value:.{digits}f}{unit}"


def fmt_vram(used: float | None, total: float | None) -> str:
    if used is None:
        return "?" if total is None else f"?/{total / 1024:.1f}G"
    if total is None:
        return f"{used / 1024:.1f}G/?"
    pct = f" {100 * used / total:.0f}%" if total else ""
    return f"{used / 1024:.1f}/{total / 1024:.1f}G{pct}"


def use_rich(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stdout
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def console(stderr: bool = False) -> Console:
    from rich.console import Console


    # rich honours NO_COLOR itself; highlight=False keeps it from colouring numbers in our text.
    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def print_table(title: str, headers: list[str], rows: list[list[tuple[str, str | None]]]) -> None:
    """``rows`` are lists of (text, style) cells. Rich on a terminal, plain columns otherwise."""
    if use_rich():
        from rich.table import Table
        from rich.text import Text

        table = Table(title=Text(title), title_justify="left", header_style="bold")
        for header in headers:
            table.add_column(header)
        for row in rows:
            table.add_row(*(Text(text, style=style or "") for text, style in row))
        console().print(table)
        return
    widths = [len(h) for h in headers]
    for row in rows:
        for i, (text, _) in enumerate(row):
            widths[i] = max(widths[i], len(text))
    out = [title]
    out.append("  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip())
    for row in rows:
        out.append("  ".join(text.ljust(widths[i]) for i, (text, _) in enumerate(row)).rstrip())
    sys.stdout.write("\n".join(out) + "\n")


def print_line(text: str, style: str | None = None) -> None:
    if use_rich():
        from rich.text import Text

        console().print(Text(text, style=style or ""))
    else:
        sys.stdout.write(text + "\n")


def render_health(doc: dict[str, Any], config_gpus: list[dict[str, Any]]) -> None:
    """``gpuheal check`` for people (and ``heal``'s table): ``doc`` is what ``--json`` prints; its
    issues are read back once, as typed records (:class:`~gpuheal.core.issue.Reported`)."""
    from gpuheal.core.issue import Reported

    """The fleet table, then issues, actions and faults (``check``/``heal``)."""
    rows = []
    for gpu in config_gpus:
        alias = gpu["alias"]
        g = doc["gpus"].get(alias, {})
        endpoint = g.get("endpoint") or "?"
        rows.append(
            [
                (clean(alias), "bold"),
                (clean(gpu["host"]), None),
                (clean(g.get("name") or gpu.get("name")), None),
                (fmt_num(g.get("temp_c"), "°C"), _temp_style(g.get("temp_c"))),
                (fmt_vram(g.get("vram_used_mb"), g.get("vram_total_mb") or gpu.get("vram_total_mb")), None),
                (fmt_num(g.get("util_pct"), "%"), None),
                (fmt_num(g.get("power_w"), "W"), None),
                (clean(endpoint), ENDPOINT_STYLE.get(endpoint, "red")),
                (fmt_requests(g), "yellow" if g.get("deferred_growing_polls") else None),
                (fmt_slots(g), None),
            ]
        )
    status = doc["status"]
    print_table(
        f"gpuheal — fleet {status.upper()} at {doc['generated_at']}",
        ["alias", "host", "gpu", "temp", "vram", "util", "power", "endpoint", "requests", "slots"],
        rows,
    )
    render_issues(Reported.all_of(doc.get("issues")))
    for action in doc.get("actions", []):
        result = f"{action['result']}, blocked" if action.get("blocked") else action["result"]
        line = f"ACTION   {clean(action['gpu'])} {action['issue']} → {action['action']} [{result}]"
        if action.get("command"):
            line += f": {clean(action['command'], 200)}"
        elif action.get("why"):
            line += f": {clean(action['why'], 200)}"
        if action.get("error"):
            line += f" ({clean(action['error'], 120)})"
        print_line(line, "cyan")
    for fault in doc.get("faults", []):
        print_line(f"FAULT    {clean(fault['source'])} {fault['fault']}: {clean(fault.get('detail'), 200)}", "yellow")
    for off in doc.get("rules_off", []):
        fix = f" — {clean(off['fix'], 160)}" if off.get("fix") else ""
        gpus = clean(", ".join(off["gpus"]), 120)
        print_line(f"OFF      {off['rule']} ({gpus}): {clean(off['why'], 200)}{fix}", "dim")
    for warning in doc.get("warnings", []):
        print_line(f"WARNING  {clean(warning, 300)}", "yellow")
    print_line(f"status: {status}", STATUS_STYLE.get(status))


def render_issues(issues: Sequence[Reported]) -> None:
    """One line per open issue (``check``, ``heal``), worst first as the engine ordered them."""
    for issue in issues:
        since = "?" if issue.since is None else issue.since
        text = f"{(issue.severity or '?').upper():8} {clean(issue.gpu)} {issue.issue} ({issue.state}, since {since})"
        if issue.summary:
            text += f": {clean(issue.summary, 200)}"
        style = {"critical": "red", "warning": "yellow"}.get(issue.severity or "")
        print_line(text, style if issue.state == "firing" else "dim")


def render_heal(health: dict[str, Any], config_gpus: list[dict[str, Any]], apply: bool) -> None:
    """``gpuheal heal`` for people: the health table and actions, then what dry-run and pauses mean."""
    render_health(health, config_gpus)
    if not apply and any(a["result"] == "planned" for a in health["actions"]):
        print_line("dry-run: nothing was changed; run `gpuheal heal --apply` to act", "dim")
    p = health.get("paused") or {}
    if p.get("fleet"):
        print_line(f"healing PAUSED for the fleet: {p['fleet'].get('reason')}", "yellow")
    for alias, info in (p.get("gpus") or {}).items():
        print_line(f"healing PAUSED for {alias}: {info.get('reason')}", "yellow")


def fmt_requests(g: dict[str, Any]) -> str:
    """llama-server's own ``requests_processing`` / ``requests_deferred`` (issue 12): ``2 + 1 waiting``;
    ``↑N`` when the waiting count grew N polls in a row while no request finished; ``off`` when the
    server serves no ``/metrics``, ``?`` when not known."""
    if g.get("metrics") == "disabled":
        return "off"
    running, waiting = g.get("requests_processing"), g.get("requests_deferred")
    if running is None:
        return "?"
    text = f"{running}" + (f" + {waiting} waiting" if waiting else "")
    growing = g.get("deferred_growing_polls")
    return text + (f" ↑{growing}" if growing else "")


def fmt_slots(g: dict[str, Any]) -> str:
    if g.get("is_sleeping"):
        return "sleeping"
    if g.get("slots") == "disabled":
        return "off"
    busy, total = g.get("slots_busy"), g.get("slots_total")
    if total is None:
        return "?"
    return f"{'?' if busy is None else busy}/{total}"


def _temp_style(temp: float | None) -> str | None:
    if temp is None:
        return "dim"
    if temp > 85:
        return "bold red"
    if temp > 70:
        return "yellow"
    return None
