"""Plan remediations for firing issues, with every guard applied first. Pure: values in, values out.

Guards, in order, before any action (issue 4, design "Budgets and blast radius"):

1. paused — an operator paused the fleet or this GPU (maintenance);
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

The heal state (``heal-state.json``, internal) is a plain dict::

    {"restarts": {ALIAS: [epoch_s, ...]},
     "attempts": {KEY: ATTEMPT},
     "escalated": {"ALIAS/ISSUE": {"at": epoch_s, "reason": str, "since": ISO}},
     "paused": {"fleet": {"reason", "at"} | None, "gpus": {ALIAS: {"reason", "at"}}},
     "active": {ALIAS: {"actions": [...], "issue": ID, "restore_failures": n,
                        "cool_since": epoch_s}},  # load-side mitigations to undo once cool
     "litellm_restarts": [epoch_s, ...],   # circuit-breaker-status.json "last_reset"
     "service_restarts": {"litellm" | "gpu-monitor": [epoch_s, ...]},  # their restart budget
     "run_seq": {"day": "YYYYMMDD", "n": int}}
    ATTEMPT = {"key", "gpu", "issue", "since", "n", "actions": [...], "status":
               "running" | "pending" | "resolved" | "failed" | "superseded",
               "started_at", "verify_by", "run_id", "verification": {...}}
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from gpuheal.actions.catalog import ACTIONS, RECOMMENDATIONS, REMEDIES, Remedy

HOUR_S = 3600.0
CANNOT_SERVE = frozenset({"host-unreachable", "model-stuck"})
OPEN_ATTEMPT = frozenset({"running", "pending"})
# Shared services gpuheal restarts: one restart serves every issue that asked for it, and each has
# a restart budget of its own (``max_restarts_per_hour``) — a LiteLLM restart cuts the whole fleet.
SERVICE_OF = {"restart-litellm": "litellm", "restart-gpu-monitor": "gpu-monitor"}


def empty_state() -> dict[str, Any]:
    return {"restarts": {}, "attempts": {}, "escalated": {}, "paused": {"fleet": None, "gpus": {}}, "active": {}, "run_seq": {}, "litellm_restarts": [], "service_restarts": {}}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value in (float("inf"), float("-inf")):
        return None
    return float(value)


def _times(value: Any) -> list[float]:
    return [t for t in (_num(v) for v in value) if t is not None] if isinstance(value, list) else []


def _attempt(value: Any) -> dict[str, Any] | None:
    """One attempt record, its fields coerced to their types: a hand-edited or damaged record must
    never crash the run that judges it (and so block healing every minute until someone notices)."""
    if not isinstance(value, dict) or not isinstance(value.get("gpu"), str) or not isinstance(value.get("issue"), str):
        return None
    out = dict(value)
    out["actions"] = [a for a in value.get("actions", []) if isinstance(a, str)] if isinstance(value.get("actions"), list) else []
    out["status"] = value.get("status") if isinstance(value.get("status"), str) else "superseded"
    out["n"] = int(_num(value.get("n")) or 0)
    for key in ("started_at", "verify_by", "finished_at"):
        if key in out and _num(out[key]) is None:
            del out[key]  # a missing verify_by is judged at once (failed), never waited on forever
    for key in ("since", "run_id"):
        if key in out and out[key] is not None and not isinstance(out[key], str):
            out[key] = str(out[key])
    if "verification" in out and not isinstance(out["verification"], dict):
        del out["verification"]
    return out


def normalise_state(data: Any) -> dict[str, Any]:
    """A damaged heal state loses the damaged part only, never the run."""
    state = empty_state()
    if not isinstance(data, dict):
        return state
    for key in ("restarts", "attempts", "escalated", "active", "run_seq", "service_restarts"):
        if isinstance(data.get(key), dict):
            state[key] = data[key]
    state["litellm_restarts"] = _times(data.get("litellm_restarts"))
    for key in ("restarts", "service_restarts"):
        state[key] = {a: _times(ts) for a, ts in state[key].items() if isinstance(ts, list)}
    state["attempts"] = {k: a for k, a in ((k, _attempt(v)) for k, v in state["attempts"].items()) if a is not None}
    state["escalated"] = {k: v for k, v in state["escalated"].items() if isinstance(v, dict) and "/" in k}
    state["active"] = {
        a: {
            "actions": [x for x in v.get("actions", []) if isinstance(x, str)] if isinstance(v.get("actions"), list) else [],
            "issue": str(v.get("issue", "thermal-critical")),
            "restore_failures": int(_num(v.get("restore_failures")) or 0),
            **({"cool_since": float(_num(v["cool_since"]))} if _num(v.get("cool_since")) is not None else {}),
        }
        for a, v in state["active"].items()
        if isinstance(v, dict)
    }
    seq = state["run_seq"]
    state["run_seq"] = {"day": seq["day"], "n": int(_num(seq.get("n")) or 0)} if isinstance(seq.get("day"), str) else {}
    paused = data.get("paused")
    if isinstance(paused, dict):
        state["paused"]["fleet"] = paused.get("fleet") if isinstance(paused.get("fleet"), dict) else None
        if isinstance(paused.get("gpus"), dict):
            state["paused"]["gpus"] = {a: p for a, p in paused["gpus"].items() if isinstance(p, dict)}
    return state


@dataclass(frozen=True)
class Step:
    action: str
    argv_template: tuple[str, ...] | None
    target: str  # "local" or the SSH host
    note: str = ""


@dataclass(frozen=True)
class PlanItem:
    gpu: str
    issue: str
    decision: str  # act | escalate | blocked | recommend
    reason: str
    steps: tuple[Step, ...] = ()
    attempt_no: int = 0
    key: str = ""
    detected: dict[str, Any] = field(default_factory=dict)
    since: str | None = None
    severity: str = "warning"
    alert_now: bool = False

    @property
    def restarts(self) -> bool:
        return any(ACTIONS[s.action].restarts for s in self.steps)


def restarts_in_window(state: dict[str, Any], alias: str, now_s: float, window_s: float = HOUR_S) -> int:
    return sum(1 for t in state["restarts"].get(alias, []) if now_s - window_s < t <= now_s)


def last_restart(state: dict[str, Any], alias: str) -> float | None:
    times = state["restarts"].get(alias) or []
    return max(times) if times else None


def attempts_for(state: dict[str, Any], gpu: str, issue: str, since: str | None = None) -> list[dict[str, Any]]:
    out = [a for a in state["attempts"].values() if a["gpu"] == gpu and a["issue"] == issue]
    if since is not None:
        out = [a for a in out if a.get("since") == since]
    return sorted(out, key=lambda a: a.get("n", 0))


def paused_reason(state: dict[str, Any], gpu: str) -> str | None:
    fleet = state["paused"].get("fleet")
    if fleet:
        return f"fleet paused ({fleet.get('reason', 'maintenance')})"
    own = state["paused"]["gpus"].get(gpu)
    if own:
        return f"{gpu} paused ({own.get('reason', 'maintenance')})"
    return None


def plan(
    issues: list[dict[str, Any]],
    state: dict[str, Any],
    cfg,
    now_s: float,
    gpu_filter: str | None = None,
    issue_filter: str | None = None,
) -> list[PlanItem]:
    """One :class:`PlanItem` per firing issue (after the filters), guards applied."""
    heal = cfg.heal
    firing = [i for i in issues if i.get("state", "firing") == "firing"]
    n_gpus = len(cfg.gpus)
    # "At once": a GPU whose failure is already escalated is the humans' now and says nothing
    # about a shared cause behind a new failure elsewhere.
    failing_gpus = {
        i["gpu"] for i in firing if i["issue"] in CANNOT_SERVE and f"{i['gpu']}/{i['issue']}" not in state["escalated"]
    }
    guard_tripped = n_gpus >= 2 and len(failing_gpus) > float(heal["fleet_guard_fraction"]) * n_gpus
    items: list[PlanItem] = []
    restarting: set[str] = set()  # what this run's plan already restarts (a GPU, a service)
    for issue in firing:
        gpu, issue_id = issue["gpu"], issue["issue"]
        if gpu_filter and gpu != gpu_filter:
            continue
        if issue_filter and issue_id != issue_filter:
            continue
        item = _plan_one(issue, state, cfg, now_s, guard_tripped, len(failing_gpus), n_gpus)
        if item.decision == "act":
            # Two issues of one GPU (model-stuck + vram-leak), or stuck breakers of two GPUs, must
            # not restart the same thing twice in one run: the guards above saw the state before
            # this run's first restart. The most severe issue (listed first) acts; the others wait.
            targets = _restart_targets(item)
            again = sorted(targets & restarting)
            if again:
                item = replace(item, decision="blocked", steps=(), attempt_no=0, key="", reason=f"{', '.join(again)} is already being restarted by this run")
            restarting |= targets
        items.append(item)
    return items


def _restart_targets(item: PlanItem) -> set[str]:
    out = set()
    for s in item.steps:
        if s.action in SERVICE_OF:
            out.add(SERVICE_OF[s.action])
        elif ACTIONS[s.action].restarts and item.gpu != "fleet":
            out.add(item.gpu)
    return out


def _plan_one(issue, state, cfg, now_s, guard_tripped, n_failing, n_gpus) -> PlanItem:
    heal = cfg.heal
    gpu, issue_id = issue["gpu"], issue["issue"]
    since = issue.get("since")
    remedy: Remedy = REMEDIES.get(issue_id) or Remedy(issue_id, automatic=False, why_escalate="no remedy known")
    base = {
        "gpu": gpu,
        "issue": issue_id,
        "detected": issue.get("detected") or {},
        "since": since,
        "severity": issue.get("severity", "warning"),
        "alert_now": remedy.alert_now,
    }
    if issue_id in RECOMMENDATIONS:
        return PlanItem(decision="recommend", reason=issue.get("summary") or "recommendation", **base)
    reason = paused_reason(state, gpu if gpu != "fleet" else "")
    if reason:
        return PlanItem(decision="blocked", reason=reason, **base)
    esc = state["escalated"].get(f"{gpu}/{issue_id}")
    if esc:
        return PlanItem(
            decision="blocked",
            reason=f"escalated ({esc.get('reason', '')}); waiting for recovery or `gpuheal heal --clear {gpu}/{issue_id}`",
            **base,
        )
    if not remedy.automatic:
        return PlanItem(decision="escalate", reason=remedy.why_escalate, **base)
    attempts = attempts_for(state, gpu, issue_id, since)
    open_attempts = [a for a in attempts if a.get("status") in OPEN_ATTEMPT]
    if open_attempts:
        a = open_attempts[-1]
        return PlanItem(
            decision="blocked",
            reason=f"attempt {a.get('n')} ({', '.join(a.get('actions', []))}) is being verified until {_iso(a.get('verify_by'))}",
            **base,
        )
    failed = sum(1 for a in attempts if a.get("status") == "failed")
    limit = min(remedy.escalate_after_failures, int(heal["max_failed_verifications"]))
    if failed >= limit:
        return PlanItem(
            decision="escalate",
            reason=f"{failed} failed remediation attempt{'s' if failed != 1 else ''}: {remedy.why_escalate}",
            **base,
        )
    steps = tuple(_step(action, gpu, cfg) for action in remedy.steps)
    steps = tuple(s for s in steps if s is not None)
    if not steps:
        return PlanItem(decision="escalate", reason=f"no command configured to fix it: {remedy.why_escalate}", **base)
    n = len(attempts) + 1
    item = PlanItem(
        decision="act",
        reason=f"attempt {n}",
        steps=steps,
        attempt_no=n,
        key=f"{gpu}/{issue_id}/{since}/{n}",
        **base,
    )
    for service in sorted({SERVICE_OF[s.action] for s in steps if s.action in SERVICE_OF}):
        # (only inside its window: an attempt left open because its issue is hidden must not
        # hold back every other GPU's use of the service)
        busy = [
            a for a in state["attempts"].values()
            if a.get("status") in OPEN_ATTEMPT and now_s <= (_num(a.get("verify_by")) or 0.0)
            and any(SERVICE_OF.get(x) == service for x in a.get("actions", []))
        ]
        if busy:
            return PlanItem(
                decision="blocked",
                reason=f"a restart of {service} ({busy[0]['gpu']} {busy[0]['issue']}, attempt {busy[0].get('n')}) is being verified until {_iso(busy[0].get('verify_by'))}",
                **base,
            )
        used = sum(1 for t in state["service_restarts"].get(service, []) if now_s - HOUR_S < t <= now_s)
        if used >= int(heal["max_restarts_per_hour"]):
            return PlanItem(
                decision="escalate",
                reason=f"restart budget spent: {used} restarts of {service} in the last hour — {remedy.why_escalate}",
                **base,
            )
    if item.restarts and gpu != "fleet":
        if guard_tripped:
            return PlanItem(
                decision="escalate",
                reason=f"fleet guard: {n_failing} of {n_gpus} GPUs cannot serve at once — shared cause suspected (network, monitor, LiteLLM); not restarting them all",
                **base,
            )
        used = restarts_in_window(state, gpu, now_s)
        if used >= int(heal["max_restarts_per_hour"]):
            return PlanItem(
                decision="escalate",
                reason=f"restart budget spent: {used} restarts of {gpu} in the last hour — GPU hardware check (Rule 3)",
                **base,
            )
        last = last_restart(state, gpu)
        if last is not None and now_s - last < float(heal["startup_grace_s"]):
            return PlanItem(
                decision="blocked",
                reason=f"startup grace: restarted {now_s - last:.0f} s ago",
                **base,
            )
    return item


def _step(action: str, gpu: str, cfg) -> Step | None:
    """Resolve the command for ``action`` on ``gpu``; ``None`` when no command is configured."""
    from gpuheal.actions.catalog import default_smi_argv

    spec = ACTIONS[action]
    if action == "restart-gpu-monitor":
        argv = _section_cmd(cfg.heal.get("gpu_monitor_restart_command"))
        target = cfg.heal.get("gpu_monitor_host") if cfg.heal.get("gpu_monitor_transport") == "ssh" else "local"
        return Step(action, argv, target or "local") if argv else None
    if action == "restart-litellm":
        argv = cfg.litellm.restart_command
        target = cfg.litellm.host if cfg.litellm.transport == "ssh" and cfg.litellm.host else "local"
        return Step(action, argv, target) if argv else None
    try:
        g = cfg.gpu(gpu)
    except KeyError:
        return None
    target = g.host if g.transport == "ssh" else "local"
    argv = g.command(spec.command_key) if spec.command_key else None
    if argv is None and action in LOAD_ACTIONS:
        return _litellm_load_step(action, g, cfg)
    note = ""
    if argv is None and action == "restart-llama-server-memcap":
        argv = g.command("restart_command") or ACTIONS["restart-llama-server"].default_argv
        note = "no memcap_restart_command configured: plain restart"
    if argv is None and action == "restore-power-limit" and g.vendor == "nvidia":
        from gpuheal.actions.catalog import POWER_QUERY_ARGV

        return Step(action, POWER_QUERY_ARGV, target, "built-in: back to the default limit, only if it was lowered")
    if argv is None and action == "snapshot-processes":
        argv = default_smi_argv(g.vendor)
    if argv is None:
        argv = spec.default_argv
    if argv is None:
        return None
    return Step(action, tuple(argv), target, note)


LOAD_ACTIONS = frozenset({"shed-load", "redirect-traffic", "restore-load"})
LITELLM_API = "litellm-api"  # Step.target of the built-in load actions: LiteLLM's admin API


def _litellm_load_step(action: str, g, cfg) -> Step | None:
    """The built-in default for load-side cooling (Rules 1 and 8): change the deployment's rpm in
    LiteLLM (``/model/update``) — halve it to shed (Rule 8 tier 1: "by 50%"), drop it to
    ``redirect_rpm`` to redirect, put the normal rpm back to restore. Needs the GPU's
    ``litellm_model_id`` and normal ``litellm_rpm``; without them there is no safe default."""
    from gpuheal.actions.catalog import litellm_update_argv as argv_for

    if not (g.litellm_model_id and g.litellm_rpm and cfg.litellm.url):
        return None
    if action == "shed-load":
        rpm = max(1, round(g.litellm_rpm * float(cfg.heal.get("shed_rpm_ratio", 0.5))))
    elif action == "redirect-traffic":
        rpm = int(cfg.heal.get("redirect_rpm", 1))
    else:
        rpm = g.litellm_rpm
    return Step(action, argv_for(g.litellm_model_id, rpm), LITELLM_API, "built-in: LiteLLM /model/update")


def _section_cmd(value) -> tuple[str, ...] | None:
    from gpuheal.config.model import split_command

    return None if value is None else split_command(value)


def _iso(epoch: Any) -> str:
    from datetime import UTC, datetime

    from gpuheal.clock import format_iso

    if not isinstance(epoch, int | float):
        return "?"
    return format_iso(datetime.fromtimestamp(epoch, UTC))
