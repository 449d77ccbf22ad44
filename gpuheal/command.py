"""Running one command, without Typer: the global options, the runtime they give, the step run
under the state lock, and the one line and exit status of a run that ends in an exception. The
Typer app (:mod:`gpuheal.cli`) and cron's plain check (:mod:`gpuheal.entry`) both run commands
through here, so they cannot differ (issue 19, "Performance"; contract: "Exit status")."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from gpuheal.runtime import CommandResult, Runtime, emit, resolve_state_dir


class GlobalOptions(NamedTuple):
    """The options given before the command (``gpuheal --config X check``), kept on the click
    context (``ctx.obj``) for the command to read: no module state (issue 19 item 6). A NamedTuple,
    not a dataclass: ``gpuheal --help`` does not import dataclasses (cron starts it every minute)."""

    config: str | None = None
    state_dir: str | None = None
    metrics_file: str | None = None


def build_runtime(opts: GlobalOptions, json_out: bool, uses_state: bool = True) -> Runtime:
    """The config (through the state directory's caches when the command uses it), the state
    directory and the run's one clock reading."""
    from gpuheal import clock
    from gpuheal.config import load_config, resolve_config_path

    state_dir = resolve_state_dir(opts.state_dir)
    # the state directory remembers a config text that passed the schema (skips jsonschema)
    cache_dir = state_dir if uses_state else None
    cfg = load_config(resolve_config_path(opts.config), cache_dir=cache_dir)
    return Runtime(
        cfg=cfg,
        state_dir=state_dir,
        now=clock.now(),
        json_out=json_out,
        metrics_file=opts.metrics_file or cfg.metrics_file,
    )


def run_step(opts: GlobalOptions, json_out: bool, step: Callable[..., CommandResult], **options: Any) -> int:
    """Open the state under its lock, run the step, print, export metrics; the step's exit code."""
    from gpuheal.state.store import StateDir

    rt = build_runtime(opts, json_out)
    with StateDir(rt.state_dir, rt.cfg.state.lock_wait_s) as store:
        result = step(rt, store, **options)
        result.warnings[:0] = store.warnings
        if rt.metrics_file:
            from gpuheal.metrics import write_metrics

            write_metrics(rt, store, Path(rt.metrics_file))
    emit(result, json_out)
    return result.exit_code


def failed(exc: BaseException) -> int | None:
    """What every command line does with an exception that ends the run: one line on stderr and
    its exit code; None for one the caller must handle itself (contract: "Exit status")."""
    from gpuheal import exit_codes
    from gpuheal.errors import GpuhealError

    if isinstance(exc, GpuhealError):
        sys.stderr.write(f"gpuheal: {exc}\n")  # one line already: GpuhealError runs errors.one_line
        return exit_codes.CANNOT_RUN
    if isinstance(exc, KeyboardInterrupt):
        sys.stderr.write("gpuheal: interrupted\n")
        return exit_codes.CANNOT_RUN
    if isinstance(exc, BrokenPipeError):
        return exit_codes.OK
    if isinstance(exc, Exception):  # a bug: still one line, never locals or secrets
        sys.stderr.write(f"gpuheal: internal error: {type(exc).__name__}: {exc}\n")
        sys.stderr.write("gpuheal: please report this; run with -vv to log more.\n")
        return exit_codes.CANNOT_RUN
    return None
