"""Human output of ``gpuheal bench``: one row per GPU benchmarked, then issues and alerts; while it
runs, a progress bar on stderr (:class:`ProgressBar`).

Network-sourced text (model names, server error messages) goes through :func:`clean` into plain
cells, never markup (see :mod:`gpuheal.render.human`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuheal.model import BenchOutcome
from gpuheal.render.human import clean, fmt_num, print_line, print_table

if TYPE_CHECKING:
    from rich import progress as rp
    from rich.progress import TaskID

TREND_STYLE = {"stable": "green", "improving": "green", "regressing": "bold red", "unknown": "dim"}
SEVERITY_STYLE = {"critical": "red", "warning": "yellow"}

# progress callback of ``gpuheal.steps.bench.run``: (alias, index, total, outcome or None when starting)
Progress = Callable[[str, int, int, BenchOutcome | None], None]


def render_bench(doc: dict[str, Any]) -> None:
    """``gpuheal bench`` for people: ``doc`` is what ``bench --json`` prints; its issues are read back
    once, as typed records (:class:`~gpuheal.core.issue.Reported`)."""
    from gpuheal.core.issue import Reported

    regressions = doc.get("regressions", {})
    rows = []
    for r in doc.get("results", []):
        reg = regressions.get(r["gpu"], {})
        base = reg.get("baseline_tok_sec")
        gen = r.get("gen_tok_s")
        vs = f"{100 * gen / base:.0f}%" if gen is not None and base else "?"
        if r["ok"]:
            status, style = ("ok (excluded)", "dim") if r.get("excluded") else ("ok", "green")
        else:
            status, style = clean(r.get("error"), 40), "red"
        trend = reg.get("trend", "unknown")
        rows.append(
            [
                (clean(r["gpu"]), "bold"),
                (status, style),
                (fmt_num(gen, digits=1), None),
                (fmt_num(r.get("prompt_tok_s"), digits=1), None),
                (fmt_num(r.get("tokens")), None),
                (fmt_num(base, digits=1), None),
                (vs, None),
                (trend, TREND_STYLE.get(trend)),
                (fmt_num(r.get("n_ctx")), None),
                (clean(r.get("model"), 48), None),
            ]
        )
    print_table(
        f"gpuheal bench at {doc.get('generated_at', '?')}",
        ["gpu", "result", "gen tok/s", "prompt tok/s", "tokens", "baseline", "vs base", "trend", "ctx", "model"],
        rows,
    )
    for r in doc.get("results", []):
        if not r["ok"] and r.get("detail"):
            print_line(f"FAILED   {clean(r['gpu'])} {clean(r.get('error'))}: {clean(r['detail'], 200)}", "red")
        elif r.get("excluded"):
            print_line(f"EXCLUDED {clean(r['gpu'])} from the baseline: {clean(r.get('excluded_reason'))}", "dim")
    for s in doc.get("skipped", []):
        print_line(f"SKIPPED  {clean(s['gpu'])}: {clean(s['reason'])}", "dim")
    for v in doc.get("context_changes", []):  # Rule 9: re-benchmark after a context change
        style = {"verified": "green", "perf-loss": "yellow"}.get(v.get("state"), "dim")
        print_line(
            f"CONTEXT  {clean(v['gpu'])} n_ctx {fmt_num(v.get('from_n_ctx'))} -> {fmt_num(v.get('to_n_ctx'))}: "
            f"{clean(v.get('state'))}, {fmt_num(v.get('gen_tok_s'), digits=1)} tok/s = "
            f"{fmt_num(v.get('ratio_pct'), digits=1)} % of target {fmt_num(v.get('target_tok_s'), digits=1)}",
            style,
        )
    for issue in Reported.all_of(doc.get("issues")):
        text = f"{(issue.severity or '?').upper():8} {clean(issue.gpu)} {clean(issue.issue)} ({issue.state})"
        if issue.summary:
            text += f": {clean(issue.summary, 200)}"
        print_line(text, SEVERITY_STYLE.get(issue.severity or "") if issue.state == "firing" else "dim")


class ProgressBar:
    """A rich progress bar on stderr when stderr is a terminal; otherwise nothing at all.

    stdout stays the document's alone (``--json``) or the table's; the bar is transient.
    """

    def __init__(self) -> None:
        self._progress: rp.Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Progress | None:
        if not sys.stderr.isatty():
            return None
        from rich import progress as rp

        from gpuheal.render.human import console

        self._progress = bar = rp.Progress(
            rp.TextColumn("bench {task.description}", markup=False),
            rp.BarColumn(),
            rp.MofNCompleteColumn(),
            rp.TimeElapsedColumn(),
            console=console(stderr=True),
            transient=True,
        )
        bar.start()
        return self._update

    def _update(self, alias: str, index: int, total: int, outcome: BenchOutcome | None) -> None:
        from gpuheal.render.human import clean

        bar = self._progress
        if bar is None:  # stderr is no terminal: __enter__ handed out no updater
            return
        if self._task is None:
            self._task = bar.add_task(clean(alias), total=total)
        if outcome is None:
            bar.update(self._task, description=clean(alias))
        else:
            bar.update(self._task, completed=index + 1)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
