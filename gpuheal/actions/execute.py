"""Run a planned remediation: the steps of one ``act`` plan item, in order, with its remedy's hooks.

The attempt is written to the heal state *before* anything runs, under a deterministic key
(``gpu/issue/since/n``), and the state is saved at once (:mod:`gpuheal.steps.heal`): a run killed
after that point leaves a ``running`` attempt that the next run judges from fresh data instead of
repeating it (design: "An attempt is reserved before it runs").

One loop for every issue (:func:`run_item`): the host's evidence first (journal, process list) when a
step restarts or gathers evidence; then each step — the remedy's ``before_step`` may end the attempt
before it (Rule 2's attribution), a failed step ends it (``failed``), a restart must prove itself
with a real completion inside the run (:class:`~gpuheal.core.actions.WaitReady`); evidence steps are
best effort. Then the remedy's ``conclude`` (Rule 4's checks, Rule 6's LiteLLM health). Which issue
it is never matters here: its :class:`~gpuheal.core.remedy.Remedy` says (issue 26).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpuheal.actions.context import Context, Records
from gpuheal.actions.perform import LiteLLMCall, perform, perform_instead, values_for
from gpuheal.actions.runner import Runner, run_command
from gpuheal.clock import Clock
from gpuheal.config.model import Config
from gpuheal.core.actions import Action, LiteLLMUpdate, RunCommand, StepResult, WaitReady
from gpuheal.core.catalog import ACTIONS, DEFAULT_JOURNAL_ARGV, DEFAULT_PS_ARGV, MITIGATIONS, ActionSpec
from gpuheal.core.remedy import Execution, PlanItem, Result
from gpuheal.parse.smi import GpuProcess, parse_compute_apps, parse_ps, parse_rocm_smi
from gpuheal.redact import redact

EVIDENCE_TIMEOUT_S = 15.0  # the journal and the process list: at most this, or command_timeout_s if less
Verifier = Callable[[str], dict[str, Any]]  # (alias) -> a verdict document (a restart's: ok, health, error)


def run_item(
    item: PlanItem,
    cfg: Config,
    runner: Runner,
    verify_restart: Verifier,
    secrets: tuple[str, ...],
    litellm: LiteLLMCall | None = None,
    model_health: Verifier | None = None,
    record: Any = None,
    now_s: float | None = None,
    records: Records | None = None,
    prove: Verifier | None = None,
) -> Execution:
    """Execute the steps of one ``act`` item in order; stop at the first failure. ``record``: the
    item's rule's own record (``records``: all of them, as the heal run holds them); ``now_s`` this
    run's time (when a snapshot the remedy takes counts as taken); ``prove``: a real completion on a
    GPU, for the remedy's hooks."""
    ex = Execution(item=item)
    remedy = item.remedy
    records = records or Records(None, {}, {item.issue: {} if record is None else record})
    ctx = Context(cfg, item.gpu, item.issue, time.time() if now_s is None else now_s, runner, secrets, litellm,
                  model_health, prove, records)
    timeout_s = cfg.heal.command_timeout_s
    values = values_for(item.gpu, cfg)
    if item.gpu != "fleet" and any(ACTIONS[s.action].restarts or ACTIONS[s.action].evidence for s in item.steps):
        ex.evidence.update(gather_host_evidence(item.gpu, cfg, runner, values, min(timeout_s, EVIDENCE_TIMEOUT_S),
                                                secrets))  # fmt: skip
    for planned in item.steps:
        if remedy.before_step is not None and remedy.before_step(ex, planned, ctx):
            break
        step, ex.instead = ex.instead or planned, None  # the remedy may run another action in its place
        res = perform(step, values, runner, litellm, step_timeout_s(cfg, ACTIONS[step.action], timeout_s), secrets,
                      cfg)  # fmt: skip
        if isinstance(step, LiteLLMUpdate) and step.instead is not None and res.impossible:
            res = perform_instead(res, step.instead, values, runner, timeout_s, secrets, cfg)
        if not _done(ex, step, res, cfg, verify_restart):
            break
    if remedy.conclude is not None:
        remedy.conclude(ex, ctx)
    return ex


def _done(ex: Execution, step: Action, res: StepResult, cfg: Config, verify_restart: Verifier) -> bool:
    """Record one performed step; False: the attempt ends here (failed, or escalated)."""
    spec = ACTIONS[step.action]
    ex.steps.append(res)
    if spec.evidence:
        ex.evidence.update(_parse_evidence(res.output, cfg, ex.item.gpu))
        if not res.ok:
            ex.evidence["snapshot_error"] = res.error or f"exit {res.rc}"
        return True  # evidence is best effort: a failed snapshot does not stop the fix
    if not res.ok and res.impossible and step.action in MITIGATIONS and (_shed_already(ex) or _later(ex, step)):
        # another load-side step of this attempt did shed the load, or may still (the power cap, then the
        # redirect: issue 27 item 7): what could not be done is said with the attempt's evidence
        ex.evidence[f"{step.action}_impossible"] = _impossible(step, res)[:500]
        return True
    if not res.ok:
        ex.ends(Result.FAILED)
        if res.impossible and step.action in MITIGATIONS and not _load_command(cfg, ex.item.gpu):
            # issue 11: no verification window for a shed that cannot happen and no command of the
            # operator's to fall back on; tell the humans now (with what the earlier steps could not do)
            earlier = [f"{k.removesuffix('_impossible')}: {v}" for k, v in ex.evidence.items()
                       if k.endswith("_impossible")]  # fmt: skip
            ex.ends(Result.ESCALATED, "; ".join([*earlier, _impossible(step, res)]))
        return False
    if spec.restarts:
        ex.restarted = True
    if isinstance(step, RunCommand) and step.then is not None:
        return _wait_ready(ex, step.then, verify_restart)
    return True


def _impossible(step: Action, res: StepResult) -> str:
    """Why a load-side step cannot work in this setup, in one line."""
    if isinstance(step, LiteLLMUpdate):
        return f"load shedding through LiteLLM is impossible: {res.output.strip()}"
    how = "by the power cap" if step.action == "shed-load" else f"({step.action})"
    return f"load shedding {how} is impossible: {f'{res.error} {res.output.strip()}'.strip()}"


def _later(ex: Execution, step: Action) -> bool:
    """Whether a load-side step comes after ``step`` in this attempt."""
    steps = list(ex.item.steps)
    return step in steps and any(s.action in MITIGATIONS for s in steps[steps.index(step) + 1 :])


def _shed_already(ex: Execution) -> bool:
    """Whether an earlier step of this attempt shed the load and its effect was seen."""
    return any(s.ok and s.effect and s.action in MITIGATIONS for s in ex.steps[:-1])


def step_timeout_s(cfg: Config, spec: ActionSpec, timeout_s: float) -> float:
    """A restart of a hung llama-server waits out the unit's stop timeout before SIGKILL (issue 20):
    ``systemctl restart`` is given ``heal.stop_timeout_s`` more than any other command."""
    if not spec.restarts:
        return timeout_s
    return timeout_s + cfg.heal.stop_timeout_s


def _wait_ready(ex: Execution, step: WaitReady, verify_restart: Verifier) -> bool:
    """Rule 3's verify after a restart, inside the run. False: the attempt ends here."""
    ex.verification = verify_restart(step.alias)
    if ex.verification.get("error") == "unauthorized":
        ex.ends(Result.ESCALATED, "after the restart llama-server rejects the configured api key (Lesson L1)")
        return False
    if not ex.verification.get("ok"):
        ex.ends(Result.FAILED)
        return False
    return True


def _load_command(cfg: Config, gpu: str) -> bool:
    """Whether the operator configured a load-side command of their own for ``gpu``."""
    try:
        g = cfg.gpu(gpu)
    except KeyError:
        return False
    return bool(g.command("shed_load_command") or g.command("redirect_command"))


def gather_host_evidence(
    gpu: str, cfg: Config, runner: Runner, values: dict[str, str], timeout_s: float, secrets: tuple[str, ...]
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
        step = RunCommand(f"evidence-{name}", tuple(template), g.host if over_ssh else "local")
        res = run_command(step, values, runner, timeout_s, secrets)
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


def _parse_evidence(output: str, cfg: Config, gpu: str) -> dict[str, Any]:
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
    endpoint: str, api_key: str, reload_wait_s: float, verify_timeout_s: float, n_predict: int = 16,
    clock: Clock | None = None,
) -> dict[str, Any]:
    """Rule 3's verify: poll ``/health`` up to the reload deadline (never a flat sleep), then prove
    it with a real completion (``/health`` alone is not proof) answered in < ``verify_timeout_s``.
    The deadline and the waits are ``clock``'s (the run's: real seconds unless a caller gives its own —
    the chaos week's moves its simulated fleet on while it waits, as a real fleet's model loads)."""
    from gpuheal.sources.llama_server import benchmark_inference
    from gpuheal.sources.sense import probe_health

    clock = clock or Clock()
    started = clock.now()
    deadline = started + reload_wait_s
    state = "unknown"
    while True:
        remaining = deadline - clock.now()
        state, _latency, _detail = probe_health(endpoint, max(0.2, min(2.0, remaining)))
        if state == "ok" or clock.now() >= deadline:
            break
        clock.sleep(min(0.5, max(0.0, deadline - clock.now())))
    ready_after = round(clock.now() - started, 2)
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
