"""Plan remediations for firing issues, with every guard applied first. Pure: values in, values out.

Guards, in order, before any action (issue 4, design "Budgets and blast radius"):

1. paused — an operator paused the fleet or this GPU (maintenance): ``gpuheal pause``, or the GPU's
   ``gpus[].paused: true`` in the config — the same guard either way (:func:`paused_reason`);
2. escalated — after an escalation, nothing more for that (gpu, issue) until it resolves or an
   operator clears it;
3. verifying — an attempt for this issue is still being verified: no new attempt on top of it;
4. failed verifications — ``escalate_after_failures`` failed attempts → escalate, not retry;
5. restart budget — at most ``max_restarts_per_hour`` restarts of a GPU in any 60-minute window
   (Rule 3: "3 restarts in 1 hour → GPU hardware check");
6. startup grace — a host restarted less than ``startup_grace_s`` ago is left alone;
7. fleet guard — when more than ``fleet_guard_fraction`` of the fleet cannot serve at once the
   cause is shared (network, monitor, LiteLLM): escalate instead of restarting them all;
8. shared services (LiteLLM, gpu-monitor) — no second restart while one is being verified, and
   at most ``max_restarts_per_hour`` of each in any 60-minute window;
9. one restart per target per run — a GPU or service already restarted by an earlier item of the
   same plan is not restarted again by a later one.

The heal state is :class:`gpuheal.core.heal_state.HealState`; each rule's remedy
(:class:`gpuheal.core.remedy.Remedy`, ``gpuheal.rules.REMEDIES``) and the action catalog
(:mod:`gpuheal.core.catalog`) are data the planner receives; each planned step is a typed action
(:mod:`gpuheal.core.actions`); a remedy's ``guard`` may hold its fix back (Rule 2 waits for its second
snapshot; Rule 4.3's regression joins its GPU's open thermal incident). Budgets and verification windows
are rule parameters (``config/defaults.yaml``), never numbers in this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuheal.config.model import Config, GpuConfig, RemedyParams
from gpuheal.core import timing
from gpuheal.core.actions import (
    Action,
    CapPower,
    LiteLLMUpdate,
    RestorePowerLimit,
    RewriteLiteLLM,
    RunCommand,
    WaitReady,
)
from gpuheal.core.catalog import (
    ACTIONS,
    MITIGATIONS,
    POWER_QUERY_ARGV,
    ROCM_POWER_QUERY_ARGV,
    SERVICE_OF,
    ActionSpec,
    default_smi_argv,
    on_gpu,
)
from gpuheal.core.heal_state import HOUR_S, HealState, Mitigation, empty_state, num
from gpuheal.core.issue import FIRING, Issue
from gpuheal.core.remedy import NO_REMEDY, Guard, Incident, PlanItem, Planning, Remedy
from gpuheal.core.verify import FAILURES, OPEN
from gpuheal.source_kinds import configured

__all__ = ["CONFIG_PAUSE", "PlanItem", "empty_state", "paused_in", "paused_reason", "plan",
           "resolve_action"]

Actions = Mapping[str, ActionSpec]
LOAD_ACTIONS = frozenset({"shed-load", "redirect-traffic", "restore-load"})
CONFIG_PAUSE = "gpus[].paused in the config"  # the reason a GPU paused in the config is shown with


def paused_in(cfg: Config) -> dict[str, str]:
    """The GPUs the config pauses (``gpus[].paused: true``), each with the reason shown for it."""
    return {g.alias: CONFIG_PAUSE for g in cfg.gpus if g.paused}


def paused_reason(state: HealState, cfg: Config, gpu: str) -> str | None:
    """Why healing of ``gpu`` ("fleet": the fleet's own issues) is paused, or ``None``. The config's
    ``gpus[].paused`` pauses a GPU exactly as ``gpuheal pause --gpu`` does: a paused GPU gets no
    action and no escalation (an operator's own pause, with its reason, is shown first)."""
    own = state.paused_reason(gpu if gpu != "fleet" else "")
    if own or gpu not in (configured := paused_in(cfg)):
        return own
    return f"{gpu} paused ({configured[gpu]})"


def plan(
    issues: Sequence[Issue],
    state: HealState | dict[str, Any],
    cfg: Config,
    now_s: float,
    gpu_filter: str | None = None,
    issue_filter: str | None = None,
    *,
    remedies: Mapping[str, Remedy],
    actions: Actions = ACTIONS,
    tol: float = timing.TOLERANCE_S,
    records: Mapping[str, Any] | None = None,
) -> list[PlanItem]:
    """One :class:`PlanItem` per firing issue (after the filters), guards applied. ``remedies``: each
    rule's :class:`~gpuheal.core.remedy.Remedy` by issue id (``gpuheal.rules.REMEDIES``); ``records``:
    each remedy's own record as last saved, for its ``guard``. Every guard's time (verification
    windows, the restarts-per-hour budgets, the startup grace) is counted in polls with the tolerance
    ``tol`` (core/timing; issue 9): a poll a second early or late decides the same as one on the second."""
    if not isinstance(state, HealState):
        state = HealState.from_json(state)
    firing = [i for i in issues if i.state == FIRING]
    n_gpus = len(cfg.gpus)
    # "At once": a GPU whose failure is already escalated is the humans' now and says nothing
    # about a shared cause behind a new failure elsewhere.
    failing_gpus = {
        i.gpu for i in firing
        if _remedy(remedies, i.issue).cannot_serve and f"{i.gpu}/{i.issue}" not in state.escalated
    }  # fmt: skip
    guard = _FleetGuard(fleet_guard_tripped(len(failing_gpus), n_gpus, cfg.heal.fleet_guard_fraction),
                        len(failing_gpus), n_gpus)  # fmt: skip
    incidents = {i: r.incident for i, r in remedies.items() if r.incident is not None}
    items: list[PlanItem] = []
    restarting: set[str] = set()  # what this run's plan already restarts (a GPU, a service)
    for issue in firing:
        if (gpu_filter and issue.gpu != gpu_filter) or (issue_filter and issue.issue != issue_filter):
            continue
        remedy = _remedy(remedies, issue.issue)
        item = replace(_plan_one(issue, state, cfg, now_s, guard, remedy, actions, tol), remedy=remedy)
        if remedy.guard is not None:
            item = _guarded(item, remedy.guard(_planning(item, issues, incidents, records, now_s, tol, cfg)))
        if item.decision == "act":
            # Two issues of one GPU (model-stuck + vram-leak), or stuck breakers of two GPUs, must
            # not restart the same thing twice in one run: the guards above saw the state before
            # this run's first restart. The most severe issue (listed first) acts; the others wait.
            again = sorted(item.restart_targets & restarting)
            if again:
                item = _held(item, f"{', '.join(again)} is already being restarted by this run")
            restarting |= item.restart_targets
        items.append(item)
    return _cooler_targets(items, issues, remedies, state, cfg)


def _cooler_targets(
    items: list[PlanItem], issues: Sequence[Issue], remedies: Mapping[str, Remedy], state: HealState, cfg: Config
) -> list[PlanItem]:
    """Rule 1.2's "redirect new requests to cooler GPUs": a config-file redirect goes to the first GPU (in
    config order) with no open issue whose fix sheds load, not paused, not the hot GPU itself; none
    found, the step says so when it runs (issue 27 item 7)."""
    hot = {i.gpu for i in issues if set(_remedy(remedies, i.issue).steps) & set(MITIGATIONS)}
    cool = [g for g in cfg.gpus if g.alias not in hot and not state.paused_reason(g.alias)]
    out = []
    for item in items:
        steps = tuple(_to_cooler(s, item.gpu, cool) for s in item.steps)
        out.append(item if steps == item.steps else replace(item, steps=steps))
    return out


def _to_cooler(step: Action, gpu: str, cool: list[GpuConfig]) -> Action:
    target = next((g for g in cool if g.alias != gpu), None)
    if target is None:
        return step
    if isinstance(step, RewriteLiteLLM) and not step.restore:
        return replace(step, to_alias=target.alias, to_endpoint=target.endpoint)
    if isinstance(step, LiteLLMUpdate) and isinstance(step.instead, RewriteLiteLLM):
        return replace(step, instead=replace(step.instead, to_alias=target.alias, to_endpoint=target.endpoint))
    return step


def _remedy(remedies: Mapping[str, Remedy], issue_id: str) -> Remedy:
    return remedies.get(issue_id) or NO_REMEDY


def _held(item: PlanItem, reason: str) -> PlanItem:
    return replace(item, decision="blocked", steps=(), attempt_no=0, key="", reason=reason)


def _planning(
    item: PlanItem, issues: Sequence[Issue], incidents: Mapping[str, Incident], records: Mapping[str, Any] | None,
    now_s: float, tol: float, cfg: Config,
) -> Planning:
    """What the item's guard sees: this poll's open issues of its GPU (firing, or pending their hold)."""
    open_ids = frozenset(i.issue for i in issues if i.gpu == item.gpu)
    record = (records or {}).get(item.issue, {})
    return Planning(item.gpu, item.issue, item.since, item.detected, open_ids, incidents, record, now_s, tol, cfg)


def _guarded(item: PlanItem, guard: Guard) -> PlanItem:
    """The item after its remedy's guard: what it looked at joins ``detected``; an issue that is part of
    another open incident (Rule 4.3) neither acts nor escalates; a fix that waits (Rule 2) does not act."""
    if guard.seen:
        item = replace(item, detected={**item.detected, **guard.seen})
    if guard.joins is not None and item.decision in ("act", "escalate"):
        return _held(item, guard.joins)
    if guard.wait is not None and item.decision == "act":
        return _held(item, guard.wait)
    return item


def fleet_guard_tripped(n_failing: int, n_gpus: int, fraction: float) -> bool:
    """The fleet guard: more than ``heal.fleet_guard_fraction`` of a fleet of two or more GPUs failing (or, for
    drain first, out of routing) at once is a shared cause — no restart, no drain (:mod:`gpuheal.core.drain`)."""
    return n_gpus >= 2 and n_failing > fraction * n_gpus


@dataclass(frozen=True)
class _FleetGuard:
    tripped: bool
    n_failing: int
    n_gpus: int


def _plan_one(
    issue: Issue, state: HealState, cfg: Config, now_s: float, guard: _FleetGuard, remedy: Remedy,
    actions: Actions, tol: float,
) -> PlanItem:
    gpu, issue_id = issue.gpu, issue.issue
    since = issue.since
    base: dict[str, Any] = {
        "gpu": gpu,
        "issue": issue_id,
        "detected": issue.detected or {},
        "since": since,
        "severity": issue.severity,
        "alert_now": remedy.alert_now,
    }

    def held(decision: str, reason: str) -> PlanItem:
        return PlanItem(decision=decision, reason=reason, **base)

    if remedy.recommend:
        return held("recommend", issue.summary or "recommendation")
    reason = paused_reason(state, cfg, gpu)
    if reason:
        return held("blocked", reason)
    esc = state.escalated.get(f"{gpu}/{issue_id}")
    if esc:
        return held(
            "blocked", f"escalated ({esc.reason}); waiting for recovery or `gpuheal heal --clear {gpu}/{issue_id}`"
        )
    if not remedy.automatic:
        return held("escalate", remedy.why_escalate)
    attempts = state.attempts_for(gpu, issue_id, since)
    open_attempts = [a for a in attempts if a.status in OPEN]
    if open_attempts:
        a = open_attempts[-1]
        return held("blocked", f"attempt {a.n} ({', '.join(a.actions)}) is being verified until {_iso(a.verify_by)}")
    failed = sum(1 for a in attempts if a.status in FAILURES)
    escalate_after = cfg.params_as(RemedyParams, issue_id, gpu).escalate_after_failures
    if failed >= min(escalate_after, cfg.heal.max_failed_verifications):
        return held(
            "escalate", f"{failed} failed remediation attempt{'s' if failed != 1 else ''}: {remedy.why_escalate}"
        )
    steps = _steps(remedy, gpu, cfg, actions)
    if not steps:
        return held("escalate", f"no command configured to fix it: {remedy.why_escalate}")
    services = {SERVICE_OF[s.action] for s in steps if s.action in SERVICE_OF}
    restarts = gpu != "fleet" and any(actions[s.action].restarts and s.action not in SERVICE_OF for s in steps)
    n = len(attempts) + 1
    item = PlanItem(
        decision="act",
        reason=f"attempt {n}",
        steps=steps,
        attempt_no=n,
        key=f"{gpu}/{issue_id}/{since}/{n}",
        restarts=restarts,
        restart_targets=frozenset(services | ({gpu} if restarts else set())),
        **base,
    )
    why = _service_guard(services, state, cfg, now_s, remedy, tol) or (
        _restart_guard(gpu, state, cfg, now_s, guard, tol) if restarts else None
    )
    return item if why is None else held(*why)


def _steps(remedy: Remedy, gpu: str, cfg: Config, actions: Actions) -> tuple[Action, ...]:
    """The remedy's actions resolved for ``gpu``; a restart that proves itself in the run carries
    its :class:`WaitReady`. An action with no command configured is left out."""
    out: list[Action] = []
    for name in remedy.steps:
        step = resolve_action(name, gpu, cfg, actions)
        if isinstance(step, RunCommand) and actions[name].sync_verify:
            step = replace(step, then=WaitReady(name, gpu))
        if step is not None:
            out.append(step)
    return tuple(out)


def _service_guard(
    services: set[str], state: HealState, cfg: Config, now_s: float, remedy: Remedy, tol: float
) -> tuple[str, str] | None:
    for service in sorted(services):
        # (only inside its window: an attempt left open because its issue is hidden must not
        # hold back every other GPU's use of the service)
        busy = [
            a
            for a in state.attempts.values()
            if a.status in OPEN
            and not timing.past(now_s, a.verify_by or 0.0, tol)
            and any(SERVICE_OF.get(x) == service for x in a.actions)
        ]
        if busy:
            b = busy[0]
            return "blocked", (
                f"a restart of {service} ({b.gpu} {b.issue}, attempt {b.n}) is being verified until {_iso(b.verify_by)}"
            )
        used = sum(1 for t in state.service_restarts.get(service, ()) if timing.within_last(now_s, t, HOUR_S, tol))
        if used >= cfg.heal.max_restarts_per_hour:
            return (
                "escalate",
                f"restart budget spent: {used} restarts of {service} in the last hour — {remedy.why_escalate}",
            )
    return None


def _restart_guard(
    gpu: str, state: HealState, cfg: Config, now_s: float, guard: _FleetGuard, tol: float
) -> tuple[str, str] | None:
    if guard.tripped:
        return "escalate", (
            f"fleet guard: {guard.n_failing} of {guard.n_gpus} GPUs cannot serve at once — shared cause suspected"
            " (network, monitor, LiteLLM); not restarting them all"
        )
    used = state.restarts_in_window(gpu, now_s, tol=tol)
    if used >= cfg.heal.max_restarts_per_hour:
        return (
            "escalate",
            f"restart budget spent: {used} restarts of {gpu} in the last hour — GPU hardware check (Rule 3)",
        )
    last = state.last_restart(gpu)
    if last is not None and timing.less_than(now_s - last, cfg.heal.startup_grace_s, tol):
        return "blocked", f"startup grace: restarted {now_s - last:.0f} s ago"
    return None


@dataclass(frozen=True)
class NoRestore:
    """Why a cooled GPU's load is not put back by an action, and the result that shows it."""

    why: str
    result: str  # "planned": nothing configured to run; "resolved": nothing to undo


def restore_actions(
    alias: str, mitigation: Mitigation, cfg: Config, actions: Actions = ACTIONS
) -> tuple[Action, ...] | NoRestore:
    """What gives a GPU that stayed cool its load back (step 4 of ``heal``): the power limit a thermal
    cap lowered put back (``restore-power-limit``), then the configured ``restore_load_command``, or the
    LiteLLM values the built-in shed changed put back as they were (``restore-load``)."""
    out: list[Action] = []
    if mitigation.power_w is not None:
        g = cfg.gpu(alias)
        out.append(CapPower("restore-power-limit", g.vendor, g.gpu_index, g.host if g.transport == "ssh" else "local",
                            watts=mitigation.power_w,
                            note=f"undo the thermal power cap: back to {mitigation.power_w:g} W, read back"))
    rewrite = _config_rewrite("restore-load", cfg.gpu(alias), cfg)
    if mitigation.litellm_config is not None and rewrite is None:
        return NoRestore(f"GPU cooled down; LiteLLM's {mitigation.litellm_config} still sends its models elsewhere "
                         "and litellm.config_file / restart_command are not configured now: copy "
                         f"{mitigation.litellm_config}.gpuheal-orig back and restart LiteLLM", "planned")
    if mitigation.litellm_config is not None and rewrite is not None:
        out.append(replace(rewrite, path=mitigation.litellm_config, restore=True,
                           note="put LiteLLM's config file back (the hot GPU served again), read back"))
    step = resolve_action("restore-load", alias, cfg, actions)
    if isinstance(step, LiteLLMUpdate) and mitigation.restore is not None:
        model_id, field_name, value = mitigation.restore
        out.append(replace(step, model_id=model_id, field=field_name, value=value))
    elif step is not None and not isinstance(step, LiteLLMUpdate):
        out.append(step)
    if out:
        return tuple(out)
    if step is None and any(_configured(a, alias, cfg, actions) for a in mitigation.actions):
        return NoRestore("GPU cooled down; no restore_load_command configured", "planned")
    return NoRestore("GPU cooled down; nothing gpuheal changed is left to undo", "resolved")


def _configured(action: str, alias: str, cfg: Config, actions: Actions) -> bool:
    spec = actions.get(action)
    try:
        return bool(spec and spec.command_key and cfg.gpu(alias).command(spec.command_key))
    except KeyError:
        return False


def resolve_action(action: str, gpu: str, cfg: Config, actions: Actions = ACTIONS) -> Action | None:
    """What ``action`` on ``gpu`` is under this config; ``None`` when nothing is configured.

    A configured command always wins; then a built-in: the LiteLLM rpm change for the load
    actions, the NVIDIA power-limit restore, the vendor's smi snapshot, the catalog's default argv.
    """
    spec = actions[action]
    if action == "restart-gpu-monitor":
        if not configured(cfg).spec.restartable:
            return None  # the source (Prometheus, smi) is no service of ours to restart: escalate
        argv = _split(cfg.heal.gpu_monitor_restart_command)
        target = cfg.heal.gpu_monitor_host if cfg.heal.gpu_monitor_transport == "ssh" else "local"
        return RunCommand(action, argv, target or "local") if argv else None
    if action == "restart-litellm":
        argv = cfg.litellm.restart_command
        target = cfg.litellm.host if cfg.litellm.transport == "ssh" and cfg.litellm.host else "local"
        return RunCommand(action, tuple(argv), target) if argv else None
    try:
        g = cfg.gpu(gpu)
    except KeyError:
        return None
    target = g.host if g.transport == "ssh" else "local"
    argv = g.command(spec.command_key) if spec.command_key else None
    if argv is None and action in LOAD_ACTIONS:
        return _builtin_load(action, g, cfg)
    note = ""
    if argv is None and spec.fallback is not None:
        instead = actions[spec.fallback]
        argv = (g.command(instead.command_key) if instead.command_key else None) or instead.default_argv
        note = spec.fallback_note
    if argv is None and action == "restore-power-limit":
        restore, query = cfg.heal.power_restore, POWER_QUERY_ARGV if g.vendor == "nvidia" else ROCM_POWER_QUERY_ARGV
        note = f"built-in: back to the {restore} limit, only if it is below it"
        if g.vendor == "amd":  # rocm-smi prints no default: reset to the board's own, read back (issue 27 item 12)
            note = "built-in: rocm-smi --resetpoweroverdrive (the board's default cap), read back"
        return RestorePowerLimit(action, on_gpu(query, g.gpu_index), target, note, restore)
    if argv is None and action == "snapshot-processes":
        argv = on_gpu(default_smi_argv(g.vendor), g.gpu_index)
    if argv is None:
        argv = spec.default_argv
    return RunCommand(action, tuple(argv), target, note) if argv is not None else None


def _builtin_load(action: str, g: GpuConfig, cfg: Config) -> LiteLLMUpdate | CapPower | RewriteLiteLLM | None:
    """The built-in load action, in this order (issue 27 item 7): LiteLLM's ``/model/update`` where the GPU
    names its deployment — with the alternative ``instead`` when LiteLLM's setup rules it out (no
    database) — else the alternative itself: for ``shed-load`` the power cap (:mod:`gpuheal.core.power`),
    what works on the spec's own fleet out of the box; for ``redirect-traffic`` LiteLLM's config file
    rewritten to send the GPU's models to a cooler GPU (:mod:`gpuheal.core.litellm_config`), when
    ``litellm.config_file`` says where it is."""
    lite = _litellm_load(action, g, cfg)
    ratio = cfg.heal.shed_power_ratio
    other: CapPower | RewriteLiteLLM | None = None
    if action == "shed-load" and ratio is not None:
        where = g.host if g.transport == "ssh" else "local"
        other = CapPower(action, g.vendor, g.gpu_index, where, ratio=ratio,
                         note=f"built-in: cap the board power at {ratio:.0%} of its limit, read back; "
                         "restored after the cool-down")  # fmt: skip
    elif action == "redirect-traffic":
        other = _config_rewrite(action, g, cfg)
    if lite is not None:
        return lite if other is None else replace(lite, instead=other)
    return other


def _config_rewrite(action: str, g: GpuConfig, cfg: Config) -> RewriteLiteLLM | None:
    """Rule 1.2 through LiteLLM's ``config.yaml`` (no database): configured by ``litellm.config_file``, with
    the ``restart_command`` that makes LiteLLM read it and the URL its read-back asks."""
    lite = cfg.litellm
    if not (lite.config_file and lite.restart_command and lite.url):
        return None
    where = lite.host if lite.transport == "ssh" and lite.host else "local"
    return RewriteLiteLLM(action, lite.config_file, where, tuple(lite.restart_command), g.endpoint,
                          note="built-in: LiteLLM's config.yaml sends this GPU's models to a cooler GPU; "
                          "LiteLLM restarted, read back; put back after the cool-down")  # fmt: skip


def _litellm_load(action: str, g: GpuConfig, cfg: Config) -> LiteLLMUpdate | None:
    """The built-in default for load-side cooling (Rules 1 and 8; contract: "LiteLLM load-side
    cooling"): change the GPU's deployment in LiteLLM (``/model/update``). Which field and value
    (``weight`` when its model group routes by weight, else ``rpm``; × ``heal.shed_rpm_ratio`` to
    shed, ``heal.redirect_rpm`` / weight 0 to redirect) is read from LiteLLM when it runs; the
    restore puts back the value found then (the heal step fills it in). Needs the GPU's
    ``litellm_model_id``; without it there is no safe default."""
    if not (g.litellm_model_id and cfg.litellm.url):
        return None
    return LiteLLMUpdate(action, g.litellm_model_id, "auto", None, "built-in: LiteLLM /model/update, read back")


def _split(value: Any) -> tuple[str, ...] | None:
    """A configured command: a string split as a shell would (never run by one), or an argv list."""
    from gpuheal.config.model import split_command

    return None if value is None else split_command(value)


def _iso(epoch: Any) -> str:
    from gpuheal.clock import format_epoch

    value = num(epoch)
    try:
        return "?" if value is None else format_epoch(value)
    except (OverflowError, OSError, ValueError):  # beyond the calendar: a damaged time
        return "?"
