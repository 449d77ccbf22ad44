"""Run a planned remediation: reserve → audit intent → run → verify → audit outcome.

The attempt is written to the heal state *before* anything runs, under a deterministic key
(``gpu/issue/since/n``), and the state is saved at once: a run killed after that point leaves a
``running`` attempt that the next run judges from fresh data instead of repeating it (design:
"An attempt is reserved before it runs"). Every audit line is appended and fsynced on its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuheal.core.actions import Action, LiteLLMUpdate, RestorePowerLimit, RunCommand, WaitReady
from gpuheal.core.catalog import ACTIONS, DEFAULT_JOURNAL_ARGV, DEFAULT_PS_ARGV, gpu_flag
from gpuheal.core.plan import PlanItem
from gpuheal.parse.smi import GpuProcess, parse_compute_apps, parse_ps, parse_rocm_smi
from gpuheal.redact import redact

# (target, argv, timeout_s) -> CommandOutcome-like object with rc, stdout, stderr, error, timed_out
Runner = Callable[[str, list[str], float], Any]
# (update, timeout_s) -> the same outcome shape, from LiteLLM's admin API
LiteLLMCall = Callable[[LiteLLMUpdate, float], Any]


@dataclass(frozen=True)
class StepResult:
    action: str
    argv: list[str]
    target: str
    ok: bool
    rc: int | None = None
    error: str | None = None
    output: str = ""
    note: str = ""
    command: str = ""  # how it is shown: the argv, or the HTTP call
    effect: dict[str, Any] | None = None  # a LiteLLM change the read-back proved (restore puts back "before")
    impossible: bool = False  # the built-in LiteLLM path cannot work in this setup (not a network fault)
    check: dict[str, Any] | None = None  # what a step that judges before it acts decided (Rule 4.2)

    def __post_init__(self) -> None:
        if not self.command:
            object.__setattr__(self, "command", " ".join(self.argv))


@dataclass
class Execution:
    item: PlanItem
    steps: list[StepResult] = field(default_factory=list)
    result: str = "pending"  # pending (awaiting fresh data) | failed | escalated
    verification: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    escalate_reason: str | None = None
    restarted: bool = False
    fire_snapshot: Any = None  # Rule 2: the vram-leak's per-process snapshot taken as the remedy runs


def expand_argv(template: tuple[str, ...], values: dict[str, str]) -> list[str]:
    """Fill ``{alias} {host} {endpoint}`` (and ``{pid}`` for kill) per argument; never a shell."""
    from gpuheal.transport import expand

    pid = values.get("pid")
    if pid is not None:  # only kill_command knows {pid}; a pid is digits, never text from the network
        template = tuple(arg.replace("{pid}", str(int(pid)) if pid.isdigit() else pid) for arg in template)
    return expand(template, alias=values["alias"], host=values["host"], endpoint=values["endpoint"])


def run_item(
    item: PlanItem,
    cfg,
    runner: Runner,
    verify_restart: Callable[[str], dict[str, Any]],
    secrets: tuple[str, ...],
    litellm: LiteLLMCall | None = None,
    model_health: Callable[[str], dict[str, Any]] | None = None,
    onset: Any = None,
    now_s: float | None = None,
) -> Execution:
    """Execute the steps of one ``act`` item in order; stop at the first failure. ``onset``: the
    vram-leak's per-process snapshot from its onset (:mod:`gpuheal.actions.leak`), ``now_s`` this
    run's time (the fire-time snapshot's)."""
    ex = Execution(item=item)
    timeout_s = cfg.heal.command_timeout_s
    values = values_for(item.gpu, cfg)
    if item.gpu != "fleet" and any(ACTIONS[s.action].restarts or ACTIONS[s.action].evidence for s in item.steps):
        ex.evidence.update(gather_host_evidence(item.gpu, cfg, runner, values, min(timeout_s, 15.0), secrets))
    if item.issue == "host-unreachable":
        _look_first(ex, cfg, runner, values, min(timeout_s, 15.0))
    for step in item.steps:
        if step.action in ("restart-llama-server-memcap", "restart-llama-server") and item.issue == "vram-leak":
            if _leak_stops_restart(ex, step, cfg, runner, values, timeout_s, secrets, onset, now_s):
                return ex
        spec = ACTIONS[step.action]
        if spec.evidence and item.issue == "vram-leak" and isinstance(step, RunCommand):
            res = _fire_snapshot(ex, step, cfg, runner, values, timeout_s, secrets, now_s)
        else:
            res = perform(step, values, runner, litellm, _step_timeout_s(cfg, spec, timeout_s), secrets, cfg)
        ex.steps.append(res)
        if spec.evidence:
            ex.evidence.update(_parse_evidence(res.output, cfg, item.gpu))
            if not res.ok:
                ex.evidence["snapshot_error"] = res.error or f"exit {res.rc}"
            continue  # evidence is best effort: a failed snapshot does not stop the fix
        if not res.ok:
            ex.result = "failed"
            if res.impossible and step.action in ("shed-load", "redirect-traffic") and not _load_command(cfg, item.gpu):
                # issue 11: no verification window for a shed that cannot happen and no command of
                # the operator's to fall back on; tell the humans now
                ex.result = "escalated"
                ex.escalate_reason = f"load shedding through LiteLLM is impossible: {res.output.strip()}"
            unreachable = res.error and any(w in res.error for w in ("host key", "refused", "auth", "timeout"))
            if unreachable and item.issue == "host-unreachable":
                ex.escalate_reason = f"cannot reach host over SSH ({res.error}) — infrastructure alert (Rule 6)"
                ex.result = "escalated"
            return ex
        if spec.restarts:
            ex.restarted = True
        if isinstance(step, RunCommand) and step.then is not None and not _wait_ready(ex, step.then, verify_restart):
            return ex
        if isinstance(step, RunCommand) and step.then is not None and item.issue == "host-unreachable":
            if not _litellm_sees_it(ex, step.then.alias, model_health):
                return ex
    ex.result = "pending"
    if item.issue == "benchmark-regression" and item.gpu != "fleet":  # Rule 4's checks decide (issue 22)
        from gpuheal.actions import rule4

        rule4.conclude(ex, cfg, runner, values, min(timeout_s, 15.0))
    return ex


def _step_timeout_s(cfg, spec, timeout_s: float) -> float:
    """A restart of a hung llama-server waits out the unit's stop timeout before SIGKILL (issue 20):
    ``systemctl restart`` is given ``heal.stop_timeout_s`` more than any other command."""
    if not spec.restarts:
        return timeout_s
    return timeout_s + cfg.heal.stop_timeout_s


def perform(
    step: Action,
    values: dict[str, str],
    runner: Runner,
    litellm: LiteLLMCall | None,
    timeout_s: float,
    secrets,
    cfg=None,
) -> StepResult:
    """Perform one action, dispatching on its type; never raises for what the world does."""
    if isinstance(step, RunCommand):
        return run_command(step, values, runner, timeout_s, secrets)
    if isinstance(step, RestorePowerLimit):
        return _restore_power_limit(step, values, runner, timeout_s, secrets)
    if isinstance(step, LiteLLMUpdate):
        shown = describe_update(cfg.litellm.url if cfg is not None else None, step)
        if litellm is None:
            return StepResult(step.action, [], step.target, ok=False, error="no LiteLLM client", command=shown)
        outcome = litellm(step, timeout_s)
        res = _result(step.action, [], step.target, outcome, secrets, step.note, shown)
        impossible = bool(getattr(outcome, "impossible", False))
        return replace(res, effect=getattr(outcome, "effect", None), impossible=impossible)
    raise TypeError(f"not an action gpuheal performs: {step!r}")


def _wait_ready(ex: Execution, step: WaitReady, verify_restart) -> bool:
    """Rule 3's verify after a restart, inside the run. False: the attempt ends here."""
    ex.verification = verify_restart(step.alias)
    if ex.verification.get("error") == "unauthorized":
        ex.result = "escalated"
        ex.escalate_reason = "after the restart llama-server rejects the configured api key (Lesson L1)"
        return False
    if not ex.verification.get("ok"):
        ex.result = "failed"
        return False
    return True


def _look_first(ex: Execution, cfg, runner: Runner, values: dict[str, str], timeout_s: float) -> None:
    """Rule 6.1: whether llama-server runs, asked where its restart runs, before the restart
    (which is right either way: a hung server needs it too). Only evidence: never stops the fix."""
    from gpuheal.actions import process_check

    restart = next((s for s in ex.item.steps if isinstance(s, RunCommand) and ACTIONS[s.action].restarts), None)
    if restart is None:
        return
    argv = process_check.check_argv(restart.argv)
    try:
        expanded = expand_argv(argv, values)
    except Exception as exc:  # noqa: BLE001 — a bad unit template: the check is not known
        expanded, outcome = list(argv), _NoRun(str(exc))
    else:
        outcome = runner(restart.target, expanded, timeout_s)
    ex.evidence["process"] = process_check.judge(expanded, outcome, values["endpoint"]).record()


@dataclass(frozen=True)
class _NoRun:
    error: str
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False


def _litellm_sees_it(ex: Execution, alias: str, model_health) -> bool:
    """Rule 6's verify, second half: "LiteLLM reports model healthy". An unhealthy verdict fails
    the attempt; LiteLLM not configured, or not answering, is recorded as such and does not."""
    seen = model_health(alias) if model_health is not None else {"litellm": "not asked"}
    ex.verification = {**ex.verification, **seen}
    if seen.get("litellm") == "unhealthy":
        ex.result = "failed"
        ex.verification["error"] = f"LiteLLM reports the deployment unhealthy: {seen.get('litellm_detail', '')}"
        return False
    return True


def _load_command(cfg, gpu: str) -> bool:
    """Whether the operator configured a load-side command of their own for ``gpu``."""
    try:
        g = cfg.gpu(gpu)
    except KeyError:
        return False
    return bool(g.command("shed_load_command") or g.command("redirect_command"))


def _fire_snapshot(ex: Execution, step: RunCommand, cfg, runner, values, timeout_s, secrets, now_s) -> StepResult:
    """Rule 2's second snapshot, taken as the remedy runs; kept for the attribution."""
    from gpuheal.actions import leak

    taken_s = now_s if now_s is not None else time.time()
    res, ex.fire_snapshot = leak.snapshot_step(step, ex.item.gpu, cfg, values, runner, timeout_s, secrets, taken_s)
    return res


def _leak_stops_restart(ex: Execution, step: Action, cfg, runner, values, timeout_s, secrets, onset, now_s) -> bool:
    """Rule 2.2/2.3 before the restart: the process that grew between the onset and fire-time
    snapshots decides (:mod:`gpuheal.core.vram_attribution`). This GPU's llama-server: the restart
    goes ahead. Another process: killed (opt-in, not protected) and alerted, else escalated. Not
    attributable: escalated with both snapshots, no restart, no kill. True: the attempt ends here."""
    from gpuheal.actions import leak
    from gpuheal.core import vram_attribution as va

    heal = cfg.heal
    snap = onset.snapshot if onset is not None else None
    ours = leak.llama_pids(step.target, values["endpoint"], runner, min(timeout_s, 15.0))
    result = va.attribute(snap, ex.fire_snapshot, heal.leak_attribution_share, llama_pids=ours)
    ex.evidence["attribution"] = {**va.record(result, snap, ex.fire_snapshot), "llama_server_pids": sorted(ours)}
    decision = va.decide(result, heal.kill_unknown_processes, tuple(heal.protect_processes or ()))
    ex.evidence["attribution"]["decision"] = decision.kind
    if decision.kind == "restart":
        return False
    ex.result = "escalated"
    ex.escalate_reason = decision.reason
    if decision.kind != "kill" or decision.pid is None:
        return True
    argv = cfg.gpu(ex.item.gpu).command("kill_command") or ACTIONS["kill-process"].default_argv
    res = run_command(
        RunCommand("kill-process", tuple(argv), step.target),
        {**values, "pid": str(decision.pid)}, runner, timeout_s, secrets,
    )  # fmt: skip
    ex.steps.append(replace(res, note=decision.reason))
    if not res.ok:
        ex.escalate_reason = f"could not kill {decision.reason}"
        return True
    snapshot = next((s for s in ex.item.steps if isinstance(s, RunCommand) and ACTIONS[s.action].evidence), None)
    taken_s = now_s if now_s is not None else time.time()
    gone = leak.kill_seen(snapshot, decision.pid, ex.item.gpu, cfg, values, runner, min(timeout_s, 15.0), secrets,
                          taken_s)  # fmt: skip
    ex.verification = {"killed_pid": decision.pid, "gone_from_gpu": gone}
    seen = "gone from the GPU's process list" if gone else f"still listed after {leak.KILL_SEEN_WITHIN_S:g} s"
    ex.escalate_reason = f"killed {decision.reason}; {seen}"
    return True


def gather_host_evidence(
    gpu: str, cfg, runner: Runner, values: dict[str, str], timeout_s: float, secrets
) -> dict[str, Any]:
    """Evidence before acting (issue 4, item 6): the last journal lines and the process list.

    Over SSH the defaults are ``journalctl -u llama-server`` and ``ps``; a ``local`` GPU (the
    lab, or gpuheal on the GPU host itself) gathers only what is configured. Best effort: a
    failed command or an output that cannot be read is a note in the evidence and never stops the
    remediation (issue 9: a ``³`` in ps's RSS column once ended the action after its intent line).
    """
    g = cfg.gpu(gpu)
    over_ssh = g.transport == "ssh"
    out: dict[str, Any] = {}
    for name, key, default in (
        ("journal", "journal_command", DEFAULT_JOURNAL_ARGV),
        ("processes", "ps_command", DEFAULT_PS_ARGV),
    ):
        template = g.command(key) or (default if over_ssh else None)
        if template is None:
            continue
        res = run_command(
            RunCommand(f"evidence-{name}", tuple(template), g.host if over_ssh else "local"),
            values,
            runner,
            timeout_s,
            secrets,
        )
        if not res.ok:
            out[f"{name}_error"] = res.error
            continue
        if name == "journal":
            out[name] = res.output.splitlines()[-20:]
            continue
        try:
            procs = parse_ps(res.output)[:15]
        except Exception as exc:  # noqa: BLE001 — evidence is best effort, whatever the parser trips on
            out["processes_error"] = f"unreadable process list ({type(exc).__name__})"
            continue
        out[name] = [
            {"pid": p.pid, "user": p.user, "rss_mb": p.rss_mb, "command": redact(p.name, secrets)} for p in procs
        ]
    return out


def _restore_power_limit(
    step: RestorePowerLimit, values: dict[str, str], runner: Runner, timeout_s: float, secrets
) -> StepResult:
    """Rule 4.2, "if throttled, restore to max": query the limits, judge them
    (:func:`gpuheal.core.rule4.judge_power`: below the board's default, or its max with
    ``heal.power_restore: max``), and only when throttled set the target read from the board with
    ``nvidia-smi -pl``, then read it back: the change counts only when the board shows it. A limit
    not known (``[N/A]``, garbage, above the max, a query that failed) changes nothing and fails
    nothing: the check, kept in ``check``, says "not known" and why. On AMD only the cap in force is
    read (``rocm-smi --showmaxpower``): rocm-smi prints no default, so it is never "throttled"."""
    from gpuheal.core.rule4 import PowerCheck, Verdict, judge_power
    from gpuheal.parse.rule4 import parse_power_limits, parse_rocm_power_cap

    query = run_command(
        RunCommand(step.action, step.query_argv, step.target, step.note), values, runner, timeout_s, secrets
    )
    if not query.ok:
        unread = PowerCheck(Verdict.NOT_KNOWN, f"power limits not read ({query.error})")
        return replace(query, ok=True, error=None, note=unread.why, check=unread.record())
    if step.query_argv[0] == "rocm-smi":
        flag = gpu_flag(step.query_argv)
        limits = parse_rocm_power_cap(query.output, int(flag[1]) if flag else None)
        power = judge_power(limits, step.restore)
        cap = f"cap {limits.current_w:g} W; " if limits and limits.current_w else ""
        power = replace(power, why=f"{cap}{power.why} (rocm-smi prints no default limit)")
    else:
        power = judge_power(parse_power_limits(query.output), step.restore)
    if power.throttled is not Verdict.YES or power.target_w is None:  # nothing to do, or not known: change nothing
        return replace(query, note=power.why, check=power.record())
    setter = run_command(
        RunCommand(step.action, ("nvidia-smi", *gpu_flag(step.query_argv), "-pl", f"{power.target_w:g}"), step.target),
        values,
        runner,
        timeout_s,
        secrets,
    )
    if not setter.ok:
        return replace(setter, note=power.why, check=power.record())
    seen = run_command(RunCommand(step.action, step.query_argv, step.target), values, runner, timeout_s, secrets)
    after = parse_power_limits(seen.output) if seen.ok else None
    check = {**power.record(), "after_w": None if after is None else after.current_w}
    if after is None or after.current_w is None or abs(after.current_w - power.target_w) > 1.0:
        unseen = "the new power limit is not seen on the board"
        return replace(setter, ok=False, error=unseen, note=power.why, check=check)
    return replace(setter, note=f"{power.why}: set to {power.target_w:g} W, read back", check=check)


def values_for(gpu: str, cfg) -> dict[str, str]:
    """The placeholders of a command for ``gpu``: ``{alias} {host} {endpoint}``."""
    if gpu == "fleet":
        return {"alias": "fleet", "host": "", "endpoint": ""}
    g = cfg.gpu(gpu)
    return {"alias": g.alias, "host": g.host, "endpoint": g.endpoint}


def run_command(step: RunCommand, values: dict[str, str], runner: Runner, timeout_s: float, secrets) -> StepResult:
    try:
        argv = expand_argv(step.argv, values)
    except Exception as exc:  # a bad template is a config problem: report, don't crash the run
        return StepResult(step.action, list(step.argv), step.target, ok=False, error=str(exc))
    return _result(step.action, argv, step.target, runner(step.target, argv, timeout_s), secrets, step.note)


def _result(
    action: str, argv: list[str], target: str, outcome, secrets, note: str = "", command: str = ""
) -> StepResult:
    ok = outcome.error is None and not outcome.timed_out and outcome.rc == 0
    output = (outcome.stdout or "") + (("\n" + outcome.stderr) if outcome.stderr else "")
    error = outcome.error or ("timed out" if outcome.timed_out else (None if ok else f"exit status {outcome.rc}"))
    return StepResult(
        action,
        argv,
        target,
        ok=ok,
        rc=outcome.rc,
        error=error,
        output=redact(output[-4000:], secrets),
        note=note,
        command=command,
    )


def describe_update(base_url: str | None, step: LiteLLMUpdate) -> str:
    """How a LiteLLM admin call is shown (no key, no body secrets)."""
    from gpuheal.sources.litellm_admin import describe_update as shown

    return shown(base_url, step.model_id, step.field, step.value)


def describe(step: Action, gpu: str, cfg) -> str:
    """The exact command a dry run shows for ``step``."""
    import shlex

    if isinstance(step, LiteLLMUpdate):
        return describe_update(cfg.litellm.url, step)
    template = step.argv if isinstance(step, RunCommand) else step.query_argv
    values = {"alias": gpu, "host": "", "endpoint": ""}
    if gpu != "fleet":
        g = cfg.gpu(gpu)
        values = {"alias": g.alias, "host": g.host, "endpoint": g.endpoint}
    try:
        argv = expand_argv(template, {**values, "pid": "PID"})
    except Exception:  # noqa: BLE001 — shown as configured; running it reports the error
        argv = list(template)
    where = "" if step.target == "local" else f"ssh {step.target}: "
    return where + shlex.join(argv)


def _parse_evidence(output: str, cfg, gpu: str) -> dict[str, Any]:
    if gpu == "fleet":
        return {"snapshot": output[-2000:]}
    vendor = cfg.gpu(gpu).vendor
    try:
        procs: list[GpuProcess] = parse_compute_apps(output) if vendor == "nvidia" else []
        smi = parse_rocm_smi(output) if vendor == "amd" else []
    except Exception as exc:  # noqa: BLE001 — evidence is best effort (issue 9, point 6)
        return {"snapshot": output[-2000:], "snapshot_parse_error": f"unreadable snapshot ({type(exc).__name__})"}
    return {
        "gpu_processes": [{"pid": p.pid, "name": p.name, "used_mb": p.used_mb} for p in procs],
        "smi": smi,
        "snapshot": output[-2000:],
    }


def wait_ready_then_complete(
    endpoint: str, api_key: str, reload_wait_s: float, verify_timeout_s: float, n_predict: int = 16
) -> dict[str, Any]:
    """Rule 3's verify: poll ``/health`` up to the reload deadline (never a flat sleep), then prove
    it with a real completion (``/health`` alone is not proof) answered in < ``verify_timeout_s``."""
    from gpuheal.sources.llama_server import benchmark_inference
    from gpuheal.sources.sense import probe_health

    started = time.monotonic()
    deadline = started + reload_wait_s
    state = "unknown"
    while True:
        remaining = deadline - time.monotonic()
        state, _latency, _detail = probe_health(endpoint, max(0.2, min(2.0, remaining)))
        if state == "ok" or time.monotonic() >= deadline:
            break
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    ready_after = round(time.monotonic() - started, 2)
    if state != "ok":
        return {"ok": False, "health": state, "after_s": ready_after, "error": f"not ready within {reload_wait_s:g} s"}
    outcome = benchmark_inference(endpoint, api_key, n_predict=n_predict, deadline_s=verify_timeout_s, warmup=False)
    return {
        "ok": bool(outcome.ok),
        "health": "ok",
        "ready_after_s": ready_after,
        "completion_s": round(outcome.elapsed_s, 2) if outcome.elapsed_s is not None else None,
        "gen_tok_s": outcome.gen_tok_s,
        "error": outcome.error,
    }
