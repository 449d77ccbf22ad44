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
   cause is shared (network, monitor, LiteLLM): escalate instead of restarting them all.

The heal state (``heal-state.json``, internal) is a plain dict::

    {"restarts": {ALIAS: [epoch_s, ...]},
     "attempts": {KEY: ATTEMPT},
     "escalated": {"ALIAS/ISSUE": {"at": epoch_s, "reason": str, "since": ISO}},
     "paused": {"fleet": {"reason", "at"} | None, "gpus": {ALIAS: {"reason", "at"}}},
     "active": {ALIAS: {"actions": [...], "issue": ID}},  # load-side mitigations to undo
     "litellm_restarts": [epoch_s, ...],   # circuit-breaker-status.json "last_reset"
     "run_seq": {"day": "YYYYMMDD", "n": int}}
    ATTEMPT = {"key", "gpu", "issue", "since", "n", "actions": [...], "status":
               "running" | "pending" | "resolved" | "failed" | "superseded",
               "started_at", "verify_by", "run_id", "verification": {...}}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuheal.actions.catalog import ACTIONS, RECOMMENDATIONS, REMEDIES, Remedy

HOUR_S = 3600.0
CANNOT_SERVE = frozenset({"host-unreachable", "model-stuck"})
OPEN_ATTEMPT = frozenset({"running", "pending"})


def empty_state() -> dict[str, Any]:
    return {"restarts": {}, "attempts": {}, "escalated": {}, "paused": {"fleet": None, "gpus": {}}, "active": {}, "run_seq": {}, "litellm_restarts": []}


def normalise_state(data: Any) -> dict[str, Any]:
    """A damaged heal state loses the damaged part only, never the run."""
    state = empty_state()
    if not isinstance(data, dict):
        return state
    for key in ("restarts", "attempts", "escalated", "active", "run_seq"):
        if isinstance(data.get(key), dict):
            state[key] = data[key]
    lite = data.get("litellm_restarts")
    state["litellm_restarts"] = [float(t) for t in lite if isinstance(t, int | float)] if isinstance(lite, list) else []
    state["restarts"] = {
        a: [float(t) for t in ts if isinstance(t, int | float)]
        for a, ts in state["restarts"].items()
        if isinstance(ts, list)
    }
    state["attempts"] = {k: v for k, v in state["attempts"].items() if isinstance(v, dict) and "gpu" in v and "issue" in v}
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
    failing_gpus = {i["gpu"] for i in firing if i["issue"] in CANNOT_SERVE}
    guard_tripped = n_gpus >= 2 and len(failing_gpus) > float(heal["fleet_guard_fraction"]) * n_gpus
    items: list[PlanItem] = []
    for issue in firing:
        gpu, issue_id = issue["gpu"], issue["issue"]
        if gpu_filter and gpu != gpu_filter:
            continue
        if issue_filter and issue_id != issue_filter:
            continue
        items.append(
            _plan_one(issue, state, cfg, now_s, guard_tripped, len(failing_gpus), n_gpus)
        )
    return items


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
    note = ""
    if argv is None and action == "restart-llama-server-memcap":
        argv = g.command("restart_command") or ACTIONS["restart-llama-server"].default_argv
        note = "no memcap_restart_command configured: plain restart"
    if argv is None and action == "snapshot-processes":
        argv = default_smi_argv(g.vendor)
    if argv is None:
        argv = spec.default_argv
    if argv is None:
        return None
    return Step(action, tuple(argv), target, note)


def _section_cmd(value) -> tuple[str, ...] | None:
    from gpuheal.config.load import split_command

    return None if value is None else split_command(value)


def _iso(epoch: Any) -> str:
    from datetime import UTC, datetime

    from gpuheal.clock import format_iso

    if not isinstance(epoch, int | float):
        return "?"
    return format_iso(datetime.fromtimestamp(epoch, UTC))
