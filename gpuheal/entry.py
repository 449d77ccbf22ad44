"""The console entry point: a plain ``check`` without Typer, every other command line through it.

``gpuheal [--config P] [--state-dir D] [--metrics-file F] check [--json]`` is what a monitoring job
runs every minute, and what issue 19's "Performance" holds to 2.5 x a bash + curl sweep of the same
endpoints. Typer costs it ~30 ms of import and ~5-10 ms building its twelve commands, of a
~150-200 ms check: the largest single share. So exactly that command line, each option at most
once and spelt as above, runs the check step here (:func:`plain_check`); anything else — another
command (the shipped crontab's ``heal --apply`` and ``escalate`` too), ``--record``, ``--config=P``,
``-v``, ``--help``, a repeated or missing value — goes to the Typer app (:func:`gpuheal.cli.main`)
unchanged, and so do its usage errors. Both paths call the same ``command.run_step`` and
``command.failed``; ``tests/test_entry.py`` runs the same command lines through each and requires
the same output, state files and exit status.
"""

from __future__ import annotations

import sys

# A run is short and what it allocates mostly lives to its end (a 10,000-GPU config, one poll's
# answers): with Python's default 700-object young generation the collector re-scanned that heap
# ~1,000 times a run — 0.6 s of 2.7 s CPU in issue 13's 10,000-GPU check — and freed almost nothing.
GC_THRESHOLDS = (50_000, 10, 10)

# the global options a plain check may carry, each followed by its value (cli._main's options)
VALUE_OPTIONS = {"--config": "config", "-c": "config", "--state-dir": "state_dir", "--metrics-file": "metrics_file"}


def plain_check(args: list[str]) -> tuple[dict[str, str], bool] | None:
    """``(global options, --json)`` of a plain check command line; None for any other."""
    options: dict[str, str] = {}
    i = 0
    while i < len(args) and args[i] in VALUE_OPTIONS:
        name = VALUE_OPTIONS[args[i]]
        if name in options or i + 1 >= len(args) or args[i + 1].startswith("-"):
            return None  # repeated, or a value Typer may read otherwise: its call
        options[name] = args[i + 1]
        i += 2
    rest = args[i:]
    if rest not in (["check"], ["check", "--json"]):
        return None
    return options, len(rest) == 2


def main(argv: list[str] | None = None) -> None:
    import gc

    gc.set_threshold(*GC_THRESHOLDS)
    args = sys.argv[1:] if argv is None else argv
    plain = plain_check(args)
    if plain is None:
        from gpuheal.cli import main as typer_main

        typer_main(args)
        return
    sys.exit(run_plain_check(*plain))


def run_plain_check(options: dict[str, str], json_out: bool) -> int:
    """What ``cli.check`` does for these options: the same step through ``command.run_step``."""
    try:
        from gpuheal.command import GlobalOptions, run_step
        from gpuheal.runtime import setup_logging
        from gpuheal.steps import check as step

        setup_logging(0)
        return run_step(GlobalOptions(**options), json_out, step.command, record=None)
    except (Exception, KeyboardInterrupt) as exc:
        from gpuheal.command import failed

        code = failed(exc)
        if code is None:
            raise
        return code
