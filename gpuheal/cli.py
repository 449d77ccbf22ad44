"""The command line: a thin Typer shell over ``gpuheal.steps``.

Each command builds the runtime, opens the state directory under its lock, calls one step, prints
and exits. Every expected failure is a :class:`GpuhealError` caught once in :func:`main` and
printed as one line, exit 3; usage errors are mapped to 3 too (contract: "Exit status"). Heavy
modules are imported inside the command that needs them: cron starts gpuheal every minute.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuheal import __version__, exit_codes
from gpuheal.errors import GpuhealError, one_line

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpuheal.command import GlobalOptions
    from gpuheal.runtime import CommandResult, Runtime

app = typer.Typer(
    name="gpuheal",
    help="Self-healing for llama.cpp GPU inference fleets: check, heal, bench, trend, report, escalate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # a traceback must never print a secret
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
config_app = typer.Typer(help="Work with the configuration file.", no_args_is_help=True)
app.add_typer(config_app, name="config")



def _options(ctx: typer.Context) -> GlobalOptions:
    """The global options (``command.GlobalOptions``, loaded with the command: ``--help`` stays light)."""
    from gpuheal.command import GlobalOptions

    obj = ctx.obj
    return obj if isinstance(obj, GlobalOptions) else GlobalOptions()


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else there.")]
GpuOpt = Annotated[str | None, typer.Option("--gpu", help="Only this GPU (its alias).")]


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"gpuheal {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _main(
    ctx: typer.Context,
    config: Annotated[
        str | None, typer.Option("--config", "-c", help="Config file [env GPUHEAL_CONFIG; default ./gpuheal.yaml].")
    ] = None,
    state_dir: Annotated[
        str | None, typer.Option("--state-dir", help="State directory [env GPUHEAL_STATE_DIR; default ./state].")
    ] = None,
    metrics_file: Annotated[
        str | None, typer.Option("--metrics-file", help="Write the Prometheus textfile here after the command.")
    ] = None,
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", count=True, help="More logging on stderr (-vv for debug).")
    ] = 0,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    from gpuheal.command import GlobalOptions
    from gpuheal.runtime import setup_logging

    setup_logging(verbose)
    ctx.obj = GlobalOptions(config=config, state_dir=state_dir, metrics_file=metrics_file)


def _runtime(ctx: typer.Context, json_out: bool, uses_state: bool = True) -> Runtime:
    from gpuheal.command import build_runtime

    return build_runtime(_options(ctx), json_out, uses_state)


def _run_step(ctx: typer.Context, json_out: bool, step: Callable[..., CommandResult], **options: Any) -> None:
    """Open the state under its lock, run the step, print, export metrics, exit with its code."""
    from gpuheal.command import run_step

    raise typer.Exit(run_step(_options(ctx), json_out, step, **options))


@app.command()
def check(
    ctx: typer.Context,
    json_out: JsonOpt = False,
    record: Annotated[
        Path | None, typer.Option("--record", help="Append this poll's observation to a JSON-lines trace (for replay).")
    ] = None,
) -> None:
    """Poll every source once, evaluate the rules and print the fleet's health. Changes nothing.

    Exit status: 0 healthy, 1 degraded, 2 down, 3 could not run.
    """
    from gpuheal.steps import check as step

    _run_step(ctx, json_out, step.command, record=record)


@app.command()
def heal(
    ctx: typer.Context,
    apply: Annotated[bool, typer.Option("--apply", help="Execute the plan (default: dry-run, print it).")] = False,
    gpu: GpuOpt = None,
    issue: Annotated[str | None, typer.Option("--issue", help="Only this issue id.")] = None,
    clear: Annotated[
        str | None, typer.Option("--clear", metavar="ALIAS/ISSUE", help="Lift an escalation so healing may try again.")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check, then plan remediations; with --apply execute, verify, log and queue escalations.

    Exit status: 0 healthy, 1 degraded, 2 down, 3 could not run.
    """
    from gpuheal.steps import heal as step

    _run_step(ctx, json_out, step.command, apply=apply, gpu=gpu, issue=issue, clear=clear)


@app.command()
def bench(ctx: typer.Context, gpu: GpuOpt = None, json_out: JsonOpt = False) -> None:
    """Run the benchmark inference test on each endpoint (one at a time); record tok/s.

    Exit status: 0 done, 1 a regression or a rejected api key, 3 could not run.
    """
    from gpuheal.steps import bench as step

    _run_step(ctx, json_out, step.command, gpu=gpu)


@app.command()
def trend(ctx: typer.Context, gpu: GpuOpt = None, json_out: JsonOpt = False) -> None:
    """VRAM growth and temperature rise per GPU from the recorded history (vram-trend).

    Exit status: 0 done, 1 a leak or a thermal rise needs attention, 3 could not run.
    """
    from gpuheal.steps import trend as step

    _run_step(ctx, json_out, step.command, gpu=gpu)


@app.command()
def report(
    ctx: typer.Context,
    weekly: Annotated[bool, typer.Option("--weekly", help="The weekly benchmark report, Markdown for Zulip.")] = False,
    send: Annotated[bool, typer.Option("--send", help="Post the report to Zulip instead of printing it.")] = False,
    full: Annotated[
        bool, typer.Option("--full", help="Weekly: every GPU's row (with --send, split across messages).")
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Current health summary; --weekly: per-GPU tok/s over 7 days as Markdown on stdout, within
    Zulip's 10,000 characters at any fleet size (the GPUs that moved, then a count of the steady)."""
    from gpuheal.steps import report as step

    _run_step(ctx, json_out, step.command, weekly=weekly, send=send, full=full)


@app.command()
def escalate(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be sent; send nothing.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Send queued alerts to Zulip; unsent ones stay queued for the next run.

    Exit status: 0 done, 1 an alert could not be delivered (it stays queued), 3 could not run.
    """
    from gpuheal.steps import escalate as step

    _run_step(ctx, json_out, step.command, dry_run=dry_run)


@app.command()
def replay(
    ctx: typer.Context,
    trace: Annotated[Path, typer.Argument(help="A JSON-lines trace written by `check --record`.")],
    json_out: JsonOpt = False,
) -> None:
    """Feed a recorded trace through the rules with its own clock; print issues firing and clearing.

    Reads only the trace and the config; the state directory is not touched.
    Exit status: 0 nothing fired, 1 a warning/critical issue fired, 3 the trace could not be read.
    """
    from gpuheal.runtime import emit
    from gpuheal.steps import replay as step

    rt = _runtime(ctx, json_out, uses_state=False)  # replay never touches the state directory
    result = step.command(rt, trace)
    emit(result, json_out)
    raise typer.Exit(result.exit_code)


@app.command()
def pause(
    ctx: typer.Context,
    gpu: GpuOpt = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (shown by heal and report).")] = "maintenance",
    resume: Annotated[bool, typer.Option("--resume", help="Lift the pause instead.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Pause healing for one GPU (--gpu) or the whole fleet (maintenance); --resume lifts it."""
    from gpuheal.steps import pause as step

    _run_step(ctx, json_out, step.command, gpu=gpu, reason=reason, resume=resume)


@app.command()
def wake(ctx: typer.Context) -> None:
    """Serve one webhook POST on stdin/stdout (systemd socket, Accept=yes); 202 runs one heal --apply.

    Bearer token from $GPUHEAL_WAKE_TOKEN (wake.token_env). 401 wrong token, 400 bad request,
    429 a cycle ran within wake.min_interval_s. Exit status: 0 answered 202/429, 1 refused, 3 could not run.
    """
    from gpuheal.steps import wake as step

    raise typer.Exit(step.command(lambda: _runtime(ctx, False)))


@app.command()
def init(
    ctx: typer.Context,
    from_litellm: Annotated[
        str, typer.Option("--from-litellm", metavar="URL", help="LiteLLM proxy whose /v1/model/info lists the fleet.")
    ],
    monitor: Annotated[
        str | None, typer.Option("--monitor", metavar="URL", help="gpu-monitor's /gpu-data: GPU names, memory, index.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing config file.")] = False,
    admin_key_env: Annotated[
        str, typer.Option("--admin-key-env", metavar="NAME", help="Variable holding LiteLLM's admin key.")
    ] = "LITELLM_MASTER_KEY",
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=0.1, max=300, help="Per request.")] = 10.0,
    json_out: JsonOpt = False,
) -> None:
    """Write a starting config (--config, default ./gpuheal.yaml) from the deployments LiteLLM routes to.

    One gpus[] entry per deployment (host and endpoint from api_base, model group, model id); every
    value it cannot know is a comment. Never overwrites without --force. Exit status: 0 written, 3 not.
    """
    from gpuheal.clock import now
    from gpuheal.config import resolve_config_path
    from gpuheal.runtime import emit
    from gpuheal.steps import init as step

    opts = step.InitOptions(from_litellm, monitor, force, admin_key_env, timeout_s)
    result = step.command(resolve_config_path(_options(ctx).config), opts, now())
    emit(result, json_out)
    raise typer.Exit(result.exit_code)


@app.command()
def sim(
    scenario: Annotated[Path, typer.Option("--scenario", help="Scenario YAML (see examples/scenarios/).")],
    write_config: Annotated[
        Path | None, typer.Option("--write-config", help="Write a gpuheal config pointing at the simulated fleet.")
    ] = None,
    ephemeral: Annotated[
        bool, typer.Option("--ephemeral-ports", help="Bind free ports instead of the scenario's.")
    ] = False,
    speed: Annotated[
        float | None, typer.Option("--speed", help="Advance the virtual clock this many seconds per real second.")
    ] = None,
) -> None:
    """Serve a simulated fleet (gpu-monitor, llama-servers, LiteLLM) on 127.0.0.1 until Ctrl-C."""
    from gpuheal.sim import ScenarioError, SimError, run_sim

    try:
        code = run_sim(
            str(scenario),
            host="127.0.0.1",
            ports_mode="ephemeral" if ephemeral else None,
            write_config_path=str(write_config) if write_config else None,
            realtime_speed=speed,
        )
    except (ScenarioError, SimError, OSError) as exc:
        raise GpuhealError(f"sim: {exc}") from None
    raise typer.Exit(code or 0)


@app.command()
def doctor(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Preflight: check every path the config would use (sources, SSH, commands, LiteLLM, Zulip).

    Changes nothing. Exit status: 0 every path works, 1 one would not, 3 could not run.
    """
    from gpuheal.runtime import emit
    from gpuheal.steps import doctor as step

    rt = _runtime(ctx, json_out, uses_state=False)  # the doctor writes nothing but its lock check
    result = step.command(rt)
    emit(result, json_out)
    raise typer.Exit(result.exit_code)


@config_app.command("validate")
def config_validate(
    ctx: typer.Context,
    path: Annotated[str | None, typer.Argument(help="Config file (default: --config).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Validate a config file against the schema; one line naming the key path on error, exit 3."""
    import json

    from gpuheal.config import load_config, resolve_config_path

    target = resolve_config_path(path or _options(ctx).config)
    cfg = load_config(target)
    shown = one_line(str(target))  # a non-UTF-8 file name: valid UTF-8 out, its bytes escaped
    if json_out:
        sys.stdout.write(json.dumps({"valid": True, "path": shown, "gpus": list(cfg.aliases)}) + "\n")
    else:
        sys.stdout.write(
            f"{shown}: valid ({len(cfg.gpus)} GPU{'s' if len(cfg.gpus) != 1 else ''}: {', '.join(cfg.aliases)})\n"
        )


def main(argv: list[str] | None = None) -> None:
    """The Typer app's entry (``gpuheal.entry.main`` hands it every command line but a plain
    check): one place where errors become one line and an exit code."""
    from typer._click.exceptions import ClickException
    from typer.exceptions import Abort, Exit

    args = sys.argv[1:] if argv is None else argv
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="gpuheal", standalone_mode=False)
    except Exit as exc:
        code = exc.exit_code
    except ClickException as exc:  # usage errors, bad option values, unknown command
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `gpuheal`: the help, nothing else
            sys.stderr.write(exc.format_message() + "\n")
            sys.exit(exit_codes.CANNOT_RUN)
        sys.stderr.write(f"gpuheal: {exc.format_message()}\n")
        hint = getattr(exc, "ctx", None)
        if hint is not None:
            sys.stderr.write(f"Try '{hint.command_path} --help'.\n")
        code = exit_codes.CANNOT_RUN
    except Abort:
        sys.stderr.write("gpuheal: aborted\n")
        code = exit_codes.CANNOT_RUN
    except (Exception, KeyboardInterrupt) as exc:  # GpuhealError: one line; a bug: one line too
        from gpuheal.command import failed

        code = failed(exc)
    sys.exit(code if isinstance(code, int) else 0)
