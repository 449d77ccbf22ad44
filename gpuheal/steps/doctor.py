"""``gpuheal doctor``: run every preflight check once and report (issue 11; contract:
"Preflight: gpuheal doctor"). Changes nothing; the checks live in :mod:`gpuheal.doctor.checks`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuheal.doctor import Check
    from gpuheal.runtime import CommandResult, Runtime


def command(rt: Runtime, environ: dict[str, str] | None = None) -> CommandResult:
    from gpuheal import doctor
    from gpuheal.doctor import checks, drift  # noqa: F401  (registers the built-in checks)
    from gpuheal.runtime import CommandResult

    ctx = doctor.Context(cfg=rt.cfg, state_dir=rt.state_dir, environ=environ)
    try:
        rows = doctor.run_all(ctx)
    finally:
        pool = ctx.extras.get("pool")
        if pool is not None:
            pool.close()
    return CommandResult(doctor.document(rows), doctor.exit_code(rows), lambda: render(rows))


SYMBOL = {"ok": ("✔", "green"), "warn": ("⚠", "yellow"), "fail": ("✘", "bold red"), "skip": ("–", "dim")}


def render(rows: list[Check]) -> None:
    """A table grouped by target; every string from the network goes in as text, never markup."""
    from gpuheal import doctor
    from gpuheal.render.human import clean, print_line, print_table

    table = []
    for target, checks in doctor.grouped(rows):
        for i, r in enumerate(checks):
            mark, style = SYMBOL.get(r.status, ("?", None))
            shown_fix = r.fix and r.status in ("fail", "warn")
            text = clean(r.detail, 160) + (f" → {clean(r.fix, 160)}" if shown_fix else "")
            table.append(
                [
                    (clean(target, 24) if i == 0 else "", "bold"),
                    (mark, style),
                    (clean(r.check, 32), None),
                    (text, style if r.status != "ok" else None),
                ]
            )
    status = doctor.overall(rows)
    print_table("gpuheal doctor", ["target", "", "check", "detail"], table)
    counts = {s: sum(r.status == s for r in rows) for s in ("ok", "warn", "fail", "skip")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    print_line(f"doctor: {status} ({summary})", {"ok": "green", "warn": "yellow", "fail": "bold red"}[status])
