"""``gpuheal heal``: check, then plan; with ``--apply`` act, verify, audit, queue alerts.

Dry-run by default: without ``--apply`` the plan is printed (what, where, why, the exact command)
and the heal state, the audit trail and the alert queue are not touched. With ``--apply`` each
run, in order:

1. judges the open attempts of earlier runs from this run's fresh data (resolved when the issue
   cleared, failed when its verification window passed, superseded when a new occurrence began);
2. plans the firing issues with every guard (:mod:`gpuheal.core.plan`);
3. executes each ``act`` item (:mod:`gpuheal.actions.execute`), escalates the rest;
4. undoes load-side mitigations of GPUs that cooled down (``restore-load``);
5. queues "resolved" alerts, and the All Clear on every Nth clean cycle.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuheal import alerts as alertq
from gpuheal.actions.catalog import ACTIONS, REMEDIES
from gpuheal.clock import format_iso
from gpuheal.core.plan import (
    LITELLM_API,
    OPEN_ATTEMPT,
    SERVICE_OF,
    PlanItem,
    attempts_for,
    normalise_state,
    paused_reason,
    plan,
    restarts_in_window,
)
from gpuheal.redact import redact
from gpuheal.state import files

THERMAL = ("thermal-critical", "thermal-warning", "thermal-rising")
MITIGATIONS = ("shed-load", "redirect-traffic")  # undone by restore-load once the GPU cooled
MAX_ATTEMPTS_KEPT = 500
ATTEMPT_KEEP_S = 8 * 86400


class Heal:
    """One heal run. Holds the state documents while the run works on them."""

    def __init__(self, cfg, store, now: datetime, apply: bool, runner=None, verify=None) -> None:
        self.cfg = cfg
        self.store = store
        self.now = now
        self.now_s = now.timestamp()
        self.apply = apply
        self.runner = runner
        self.verify = verify
        self.state = normalise_state(store.read(files.HEAL, {}))
        self.alerts = alertq.normalise(store.read(files.ALERTS, {}))
        self.audit: list[dict[str, Any]] = []
        self.actions_doc: list[dict[str, Any]] = []
        self.secrets = _secrets(cfg)
        self.inhibited: set[tuple[str, str]] = set()
        self._pool = None

    # ------------------------------------------------------------------ run
    def run(self, gpu_filter: str | None, issue_filter: str | None) -> dict[str, Any]:
        from gpuheal.steps import check

        if gpu_filter and gpu_filter not in self.cfg.aliases and gpu_filter != "fleet":
            from gpuheal.errors import GpuhealError

            raise GpuhealError(f"--gpu {gpu_filter!r}: no such alias (known: {', '.join(self.cfg.aliases)})")
        result = check.run(self.cfg, self.store, self.now)
        issues = result.issues
        open_keys = {(i["gpu"], i["issue"]): i for i in issues}
        # An inhibited issue (e.g. model-stuck while gpu-monitor is down) is still open, only
        # hidden: its attempts must not be judged resolved on the absence of data.
        self.inhibited = {(i["gpu"], i["issue"]) for i in result.evaluation.inhibited}
        still_open = {**{(i["gpu"], i["issue"]): i for i in result.evaluation.inhibited}, **open_keys}
        if self.apply:
            self._judge_attempts(still_open)
            self._settle_escalations(still_open)
        items = plan(issues, self.state, self.cfg, self.now_s, gpu_filter, issue_filter)
        acted = False
        try:
            for item in items:
                acted |= self._handle(item)
            if self.apply:
                # still_open: a thermal issue hidden because gpu-monitor is down is not known
                # to have cooled — never put the load back on a GPU gpuheal cannot see
                acted |= self._undo_mitigations(still_open, gpu_filter)
        finally:
            if self._pool is not None:
                self._pool.close()
        if self.apply:
            self._count_clean_cycle(issues, acted)
            self._prune()
            self.store.write(files.HEAL, self.state)
            self.store.write(files.ALERTS, self.alerts)
        health = dict(result.health)
        if self.apply and ("fleet", "data-source-unreachable") in open_keys:
            self._smi_fallback(health, gpu_filter)
        health["actions"] = self.actions_doc
        health["mode"] = "apply" if self.apply else "dry-run"
        health["paused"] = self._paused_doc()
        health["budgets"] = {
            g.alias: {
                "restarts_last_hour": restarts_in_window(self.state, g.alias, self.now_s),
                "max_restarts_per_hour": int(self.cfg.heal["max_restarts_per_hour"]),
            }
            for g in self.cfg.gpus
        }
        health["alerts_queued"] = len(self.alerts["queue"]) if self.apply else None
        check.save_health(self.store, health)
        self.warnings = list(result.obs.warnings)
        return health

    # ------------------------------------------------------------------ per item
    def _handle(self, item: PlanItem) -> bool:
        """Show or perform one plan item; True if anything was acted on."""
        if item.decision == "recommend":
            return False
        if item.decision == "blocked":
            self._blocked(item, item.reason)
            return False
        if item.decision == "escalate":
            if not self.apply:
                self._doc(item, "alert", item.reason, result="planned")
                return False
            self._escalate(item, item.reason, tried=self._tried(item))
            return True
        # act
        if not self.apply:
            for step in item.steps:
                self._doc(item, step.action, item.reason, result="planned", command=_render_argv(step, item, self.cfg), target=step.target, note=step.note)
            if item.alert_now:
                self._doc(item, "alert", "alert on detection", result="planned")
            return False
        self._act(item)
        return True

    def _act(self, item: PlanItem) -> None:
        from gpuheal.actions.execute import run_item

        run_id = self._run_id()
        attempt = {
            "key": item.key,
            "gpu": item.gpu,
            "issue": item.issue,
            "since": item.since,
            "n": item.attempt_no,
            "actions": [s.action for s in item.steps],
            "status": "running",
            "started_at": self.now_s,
            "verify_by": self.now_s + self._verify_window_s(item),
            "run_id": run_id,
        }
        if item.key in self.state["attempts"]:  # never repeat a reserved attempt
            self._blocked(item, f"attempt {item.key} already reserved")
            return
        # Reserve before running: a kill after this line never repeats the attempt.
        self.state["attempts"][item.key] = attempt
        if item.restarts and item.gpu != "fleet":
            self.state["restarts"].setdefault(item.gpu, []).append(self.now_s)
        for service in sorted({SERVICE_OF[a] for a in attempt["actions"] if a in SERVICE_OF}):
            self.state["service_restarts"].setdefault(service, []).append(self.now_s)
        # A load-side mitigation is recorded before its command runs, like the attempt: a run
        # killed mid-command must still leave the note that makes a later run restore the load.
        for action in (a for a in attempt["actions"] if a in MITIGATIONS):
            if item.gpu != "fleet":
                active = self.state["active"].setdefault(item.gpu, {"actions": [], "issue": item.issue})
                if action not in active["actions"]:
                    active["actions"].append(action)
        self.store.write(files.HEAL, self.state)
        self._audit(run_id, item, primary_action(attempt["actions"]), "pending", phase="intent", extra={"attempt": item.attempt_no, "actions": attempt["actions"], "commands": [_render_argv(s, item, self.cfg) for s in item.steps]})
        if item.alert_now:
            self._queue(item, "escalated", f"{item.issue}: {item.reason}; acting now", run_id)
        ex = run_item(item, self.cfg, self._runner(), self._verifier(), self.secrets)
        for n, step in enumerate(ex.steps, 1):
            if not step.ok or (n == len(ex.steps) and ex.result == "failed"):
                step_result = "failed"  # the command failed, or its verification did
            elif n == len(ex.steps) and ex.result == "escalated":
                step_result = "escalated"  # it ran, and what it found needs the humans (L1, a kill)
            else:
                step_result = "resolved" if ACTIONS[step.action].evidence else "pending"
            if step.ok and step.action == "restart-litellm":
                self.state["litellm_restarts"] = [*self.state["litellm_restarts"][-49:], self.now_s]
            self._doc(
                item,
                step.action,
                step.note or item.reason,
                result=step_result,
                command=" ".join(step.argv),
                target=step.target,
                error=step.error or (ex.verification.get("error") if step_result == "failed" and ex.verification else None),
            )
        attempt["status"] = {"pending": "pending", "failed": "failed", "escalated": "failed"}[ex.result]
        attempt["verification"] = ex.verification
        if ex.result != "pending":
            attempt["finished_at"] = self.now_s
        self._audit(
            run_id,
            item,
            primary_action([s.action for s in ex.steps] or attempt["actions"]),
            ex.result,
            phase="outcome",
            verification=ex.verification or None,
            escalated=ex.result == "escalated",
            extra={
                "attempt": item.attempt_no,
                "actions": [s.action for s in ex.steps] or attempt["actions"],
                "steps": [
                    {"action": s.action, "command": s.argv, "target": s.target, "ok": s.ok, "rc": s.rc, "error": s.error, "output": s.output[-1500:]}
                    for s in ex.steps
                ],
                "evidence": ex.evidence or None,
            },
        )
        if ex.result == "escalated":
            self._escalate(item, ex.escalate_reason or "remediation escalated", tried=self._tried(item), run_id=run_id)

    def _escalate(self, item: PlanItem, reason: str, tried: list[str], run_id: str | None = None, hold: bool = True) -> None:
        """Tell the humans. ``hold``: and stop acting on this (gpu, issue) until it resolves or is
        cleared (not for an issue that is already closed, like a failed restore-load)."""
        run_id = run_id or self._run_id()
        if hold:
            self.state["escalated"][f"{item.gpu}/{item.issue}"] = {"at": self.now_s, "reason": reason, "since": item.since}
        self._audit(run_id, item, "alert", "escalated", phase="outcome", escalated=True, extra={"reason": reason, "tried": tried})
        self._queue(item, "escalated", reason, run_id, tried=tried)
        self._doc(item, "alert", reason, result="escalated")

    # ------------------------------------------------------------------ verification across runs
    def _judge_attempts(self, open_keys: dict) -> None:
        for attempt in list(self.state["attempts"].values()):
            if attempt.get("status") not in OPEN_ATTEMPT:
                continue
            key = (attempt["gpu"], attempt["issue"])
            if key in self.inhibited:
                continue  # not known now (its data source is down): judged when it is back
            issue = open_keys.get(key)
            item = PlanItem(gpu=attempt["gpu"], issue=attempt["issue"], decision="act", reason="verification", since=attempt.get("since"), detected=(issue or {}).get("detected") or {})
            if issue is None:
                attempt["status"] = "resolved"
                verification = {"resolved_after_s": round(self.now_s - float(attempt.get("started_at", self.now_s)))}
                attempt["verification"] = {**(attempt.get("verification") or {}), **verification}
                self._audit(attempt.get("run_id") or self._run_id(), item, primary_action(attempt["actions"]), "resolved", phase="verification", verification=attempt["verification"], extra={"attempt": attempt.get("n"), "actions": attempt["actions"]})
                self._queue(item, "resolved", f"resolved after {'+'.join(attempt.get('actions', []))} (attempt {attempt.get('n')})", attempt.get("run_id"), tried=[", ".join(attempt.get("actions", []))])
                self._doc(item, primary_action(attempt["actions"]), "verified: the issue cleared", result="resolved")
            elif issue.get("since") != attempt.get("since"):
                attempt["status"] = "superseded"
            elif self.now_s > float(attempt.get("verify_by", 0)):
                attempt["status"] = "failed"
                self._audit(attempt.get("run_id") or self._run_id(), item, primary_action(attempt["actions"]), "failed", phase="verification", verification={"still_open_after_s": round(self.now_s - float(attempt.get("started_at", self.now_s))), "detected": issue.get("detected")}, extra={"attempt": attempt.get("n"), "actions": attempt["actions"]})
                self._doc(item, primary_action(attempt["actions"]), "verification window passed, issue still open", result="failed")

    def _settle_escalations(self, open_keys: dict) -> None:
        for key, esc in list(self.state["escalated"].items()):
            gpu, _, issue = key.partition("/")
            if (gpu, issue) in open_keys:
                continue
            del self.state["escalated"][key]
            if any(a.get("status") == "resolved" and a["gpu"] == gpu and a["issue"] == issue and a.get("since") == esc.get("since") for a in self.state["attempts"].values()):
                continue  # the attempt's own resolution already queued the notice
            item = PlanItem(gpu=gpu, issue=issue, decision="escalate", reason="resolved", since=esc.get("since"))
            self._audit(self._run_id(), item, "alert", "resolved", phase="verification")
            self._queue(item, "resolved", "resolved after escalation", None)

    def _undo_mitigations(self, open_keys: dict, gpu_filter: str | None) -> bool:
        from gpuheal.actions.execute import _run
        from gpuheal.core.plan import _step

        acted = False
        for alias, active in list(self.state["active"].items()):
            if gpu_filter and alias != gpu_filter:
                continue
            if not isinstance(active, dict):
                continue
            if any((alias, t) in open_keys for t in THERMAL):
                active.pop("cool_since", None)  # hot again: the cool-down starts over
                continue
            if paused_reason(self.state, alias) or alias not in self.cfg.aliases:
                continue
            # Hysteresis: put the load back only after the GPU stayed cool for restore_after_s,
            # or the restored load heats it straight back and the issue flaps (and alerts) again.
            cool_since = active.setdefault("cool_since", self.now_s)
            if self.now_s - float(cool_since) < float(self.cfg.heal.get("restore_after_s", 600)):
                continue
            step = _step("restore-load", alias, self.cfg)
            item = PlanItem(gpu=alias, issue=str(active.get("issue", "thermal-critical")), decision="act", reason=f"GPU cooled down: undo {', '.join(active.get('actions', []))}")
            del self.state["active"][alias]
            if step is None:
                self._doc(item, "restore-load", "GPU cooled down; no restore_load_command configured", result="planned")
                continue
            run_id = self._run_id()
            self._audit(run_id, item, "restore-load", "pending", phase="intent")
            res = _run(step, {"alias": alias, "host": self.cfg.gpu(alias).host, "endpoint": self.cfg.gpu(alias).endpoint}, self._runner(), float(self.cfg.heal["command_timeout_s"]), self.secrets)
            self._audit(run_id, item, "restore-load", "resolved" if res.ok else "failed", phase="outcome", extra={"command": res.argv, "error": res.error})
            self._doc(item, "restore-load", item.reason, result="resolved" if res.ok else "failed", command=" ".join(res.argv), target=step.target, error=res.error)
            if not res.ok:
                # A GPU left at reduced load quietly costs capacity: retry next run, and after
                # max_failed_verifications failures tell the humans instead.
                failures = int(active.get("restore_failures", 0)) + 1
                if failures < int(self.cfg.heal["max_failed_verifications"]):
                    self.state["active"][alias] = {**active, "restore_failures": failures}
                else:
                    self._escalate(item, f"could not restore the load on {alias} after {failures} tries ({res.error}); it still runs shed", tried=[f"restore-load × {failures}"], run_id=run_id, hold=False)
            acted = True
        return acted

    def _verify_window_s(self, item: PlanItem) -> float:
        """How long the issue may take to clear after acting: the rule's ``verify_within_s``
        (config, per GPU) when set, else the remedy's default (Rule 1: 5 min; Rule 2: 6 h...)."""
        alias = item.gpu if item.gpu in self.cfg.aliases else None
        value = self.cfg.rule_params(item.issue, alias).get("verify_within_s")
        return float(value) if isinstance(value, int | float) and value > 0 else REMEDIES[item.issue].verify_within_s

    def _smi_fallback(self, health: dict[str, Any], gpu_filter: str | None) -> None:
        """Rule 7.3: every API path failed — probe nvidia-smi / rocm-smi on the GPU hosts directly
        (over SSH, or the configured ``smi_command``) so the fleet is not blind while gpu-monitor
        is down. Readings fill only what the monitor did not give."""
        from gpuheal.actions.catalog import QUERY_GPU_ARGV, ROCM_SMI_ARGV
        from gpuheal.actions.execute import _run
        from gpuheal.core.plan import Step
        from gpuheal.parse.smi import parse_query_gpu, parse_rocm_smi, select_row

        timeout_s = min(float(self.cfg.heal["command_timeout_s"]), 15.0)
        for g in self.cfg.gpus:
            if gpu_filter and g.alias != gpu_filter:
                continue
            if g.transport != "ssh":
                continue
            argv = ROCM_SMI_ARGV if g.vendor == "amd" else QUERY_GPU_ARGV
            res = _run(Step("snapshot-processes", argv, g.host), {"alias": g.alias, "host": g.host, "endpoint": g.endpoint}, self._runner(), timeout_s, self.secrets)
            rows = (parse_rocm_smi if g.vendor == "amd" else parse_query_gpu)(res.output) if res.ok else []
            item = PlanItem(gpu=g.alias, issue="data-source-unreachable", decision="act", reason="Rule 7.3: gpu-monitor unusable, direct smi probe")
            row = select_row(rows, g.gpu_index)  # this GPU's row, never row 0 of a multi-GPU host
            if row is None:
                missing = f"no row for GPU index {g.index}" if rows else "no readable GPU rows"
                self._doc(item, "snapshot-processes", item.reason, result="failed", command=" ".join(res.argv), target=g.host, error=res.error or missing)
                continue
            sensed = health["gpus"].setdefault(g.alias, {})
            for key in ("temp_c", "vram_used_mb", "vram_total_mb", "util_pct", "power_w"):
                if sensed.get(key) is None and row.get(key) is not None:
                    sensed[key] = row[key]
            sensed["source"] = "smi-fallback"
            self._doc(item, "snapshot-processes", item.reason, result="resolved", command=" ".join(res.argv), target=g.host)

    # ------------------------------------------------------------------ alerts, clean cycles
    def _queue(self, item: PlanItem, kind: str, summary: str, run_id: str | None, tried: list[str] | None = None) -> None:
        attempts = attempts_for(self.state, item.gpu, item.issue, item.since)
        alertq.enqueue(
            self.alerts,
            redact(
                {
                    "fingerprint": alertq.fingerprint(item.gpu, item.issue),
                    "gpu": item.gpu,
                    "issue": item.issue,
                    "kind": kind,
                    "state_key": f"{kind}:{item.since}",
                    "created_at": self.now_s,
                    "run_id": run_id,
                    "detected": item.detected,
                    "tried": tried or [],
                    "attempts": len(attempts),
                    "since": item.since,
                    "summary": summary,
                },
                self.secrets,
            ),
        )

    def _count_clean_cycle(self, issues: list, acted: bool) -> None:
        if issues or acted:
            self.alerts["clean_cycles"] = 0
            return
        self.alerts["clean_cycles"] += 1
        every = int(self.cfg.zulip.get("all_clear_every", 100))
        if self.alerts["clean_cycles"] >= every:
            self.alerts["clean_cycles"] = 0
            alertq.enqueue(
                self.alerts,
                {
                    "fingerprint": alertq.fingerprint("fleet", None),
                    "gpu": "fleet",
                    "issue": None,
                    "kind": "all-clear",
                    "state_key": f"all-clear:{self.now_s:.0f}",
                    "created_at": self.now_s,
                    "run_id": None,
                    "detected": {"clean_cycles": every},
                    "tried": [],
                    "attempts": 0,
                    "since": None,
                    "summary": f"{every} clean cycles in a row",
                },
            )

    # ------------------------------------------------------------------ helpers
    def _run_id(self) -> str:
        day = self.now.astimezone(UTC).strftime("%Y%m%d")
        seq = self.state["run_seq"]
        if seq.get("day") != day:
            seq.clear()
            seq.update(day=day, n=0)
        seq["n"] = int(seq.get("n", 0)) + 1
        return f"gpu-self-heal-{day}-{seq['n']:03d}"

    def _audit(self, run_id: str, item: PlanItem, action: str, result: str, phase: str, verification: dict | None = None, escalated: bool = False, extra: dict | None = None) -> None:
        record = {
            "run_id": run_id,
            "timestamp": format_iso(self.now),
            "gpu": item.gpu,
            "issue": item.issue,
            "detected": item.detected,
            "action": action,
            "result": result,
            "verification": verification,
            "escalated": escalated,
            "phase": phase,
        }
        if extra:
            record.update({k: v for k, v in extra.items() if v is not None})
        # Appended and fsynced at once: a kill between intent and outcome loses nothing.
        self.store.append_lines(files.AUDIT_LOG, [redact(record, self.secrets)])

    def _doc(self, item: PlanItem, action: str, why: str, result: str, command: str | None = None, target: str | None = None, note: str = "", error: str | None = None) -> None:
        entry = {"gpu": item.gpu, "issue": item.issue, "action": action, "result": result, "why": why}
        if command:
            entry["command"] = command
        if target:
            entry["target"] = target
        if note:
            entry["note"] = note
        if error:
            entry["error"] = error
        self.actions_doc.append(redact(entry, self.secrets))

    def _blocked(self, item: PlanItem, why: str) -> None:
        """A guard held the remedy back: shown as the action it would take, still ``pending``
        (the contract's action names and results), flagged ``blocked`` with the reason."""
        remedy = REMEDIES.get(item.issue)
        actions = [s.action for s in item.steps] or list(remedy.steps if remedy else ())
        self.actions_doc.append(redact({"gpu": item.gpu, "issue": item.issue, "action": primary_action(actions), "result": "pending", "blocked": True, "why": why}, self.secrets))

    def _tried(self, item: PlanItem) -> list[str]:
        return [
            f"attempt {a.get('n')}: {'+'.join(a.get('actions', []))} → {a.get('status')}"
            for a in attempts_for(self.state, item.gpu, item.issue, item.since)
        ]

    def _paused_doc(self) -> dict[str, Any]:
        p = self.state["paused"]
        return {"fleet": p.get("fleet"), "gpus": p.get("gpus", {})}

    def _prune(self) -> None:
        attempts = self.state["attempts"]
        old = [k for k, a in attempts.items() if a.get("status") not in OPEN_ATTEMPT and self.now_s - float(a.get("started_at", 0)) > ATTEMPT_KEEP_S]
        for k in old:
            del attempts[k]
        if len(attempts) > MAX_ATTEMPTS_KEPT:
            for k in sorted(attempts, key=lambda k: attempts[k].get("started_at", 0))[: len(attempts) - MAX_ATTEMPTS_KEPT]:
                if attempts[k].get("status") not in OPEN_ATTEMPT:
                    del attempts[k]
        for book in (self.state["restarts"], self.state["service_restarts"]):
            for alias in list(book):
                kept = [t for t in book[alias] if self.now_s - t < 86400]
                if kept:
                    book[alias] = kept
                else:
                    del book[alias]

    def _runner(self):
        if self.runner is not None:
            return self.runner
        from gpuheal.transport import Target, TransportPool

        if self._pool is None:
            self._pool = TransportPool.from_config(self.cfg.heal)
        pool = self._pool
        by_host = {g.host: Target.for_gpu(g, self.cfg.heal) for g in self.cfg.gpus if g.transport == "ssh"}

        def run(target: str, argv: list[str], timeout_s: float):
            if target == LITELLM_API:
                from gpuheal.credentials import env_or_dotenv
                from gpuheal.sources.litellm_admin import update_rpm

                admin_key = env_or_dotenv(self.cfg.litellm.admin_key_env, self.cfg.path)
                return update_rpm(str(self.cfg.litellm.url), admin_key, argv[1], int(argv[2]), min(timeout_s, float(self.cfg.litellm.timeout_s) * 2))
            if target == "local":
                where = Target("local")
            else:
                where = by_host.get(target) or Target("ssh", target, 22, self.cfg.heal.get("ssh_user"))
            return pool.get(where).run(argv, timeout_s)

        self.runner = run
        return run

    def _verifier(self):
        if self.verify is not None:
            return self.verify
        from gpuheal.actions.execute import wait_ready_then_complete

        def verify(alias: str) -> dict[str, Any]:
            g = self.cfg.gpu(alias)
            return wait_ready_then_complete(
                g.endpoint,
                self.cfg.litellm.api_key,
                float(self.cfg.heal["reload_wait_s"]),
                float(self.cfg.heal["verify_timeout_s"]),
            )

        return verify


def primary_action(actions: list[str]) -> str:
    """The one contract action name that stands for an attempt of several steps (the audit trail's
    ``action``; every step is listed in ``actions``): the first step that changes something
    (``shed-load`` of shed-load + redirect-traffic, the restart after a snapshot), else the first."""
    for name in actions:
        if name in ACTIONS and not ACTIONS[name].evidence:
            return name
    return next((a for a in actions if a in ACTIONS), "alert")


def _secrets(cfg) -> tuple[str, ...]:
    """Every secret value gpuheal knows of (the api key, the Zulip key, secret-named env vars)."""
    from gpuheal.zulip import secrets_for

    return secrets_for(cfg)


def _render_argv(step, item: PlanItem, cfg) -> str:
    import shlex

    from gpuheal.actions.execute import expand_argv

    values = {"alias": item.gpu, "host": "", "endpoint": ""}
    if item.gpu != "fleet":
        g = cfg.gpu(item.gpu)
        values = {"alias": g.alias, "host": g.host, "endpoint": g.endpoint}
    try:
        argv = expand_argv(step.argv_template or (), {**values, "pid": "PID"})
    except Exception:
        argv = list(step.argv_template or ())
    if step.target == LITELLM_API:
        from gpuheal.sources.litellm_admin import describe

        return describe(cfg.litellm.url, argv)
    where = "" if step.target == "local" else f"ssh {step.target}: "
    return where + shlex.join(argv)


def command(rt, store, apply: bool = False, gpu: str | None = None, issue: str | None = None, clear: str | None = None):
    from gpuheal import exit_codes
    from gpuheal.runtime import CommandResult

    heal = Heal(rt.cfg, store, rt.now, apply)
    if clear:
        _clear(heal, clear)
    health = heal.run(gpu, issue)

    def render() -> None:
        from gpuheal.render.human import print_line, render_health
        from gpuheal.steps.check import _config_rows

        render_health(health, _config_rows(rt.cfg))
        if not apply and any(a["result"] == "planned" for a in health["actions"]):
            print_line("dry-run: nothing was changed; run `gpuheal heal --apply` to act", "dim")
        p = health.get("paused") or {}
        if p.get("fleet"):
            print_line(f"healing PAUSED for the fleet: {p['fleet'].get('reason')}", "yellow")
        for alias, info in (p.get("gpus") or {}).items():
            print_line(f"healing PAUSED for {alias}: {info.get('reason')}", "yellow")

    return CommandResult(health, exit_codes.BY_STATUS[health["status"]], render, warnings=heal.warnings)


def _clear(heal: Heal, target: str) -> None:
    """``--clear ALIAS/ISSUE``: an operator lifts an escalation so healing may try again."""
    from gpuheal.errors import GpuhealError

    gpu, _, issue = target.partition("/")
    if not gpu or not issue:
        raise GpuhealError(f"--clear {target!r}: expected ALIAS/ISSUE, e.g. gpu-dense/model-stuck")
    found = heal.state["escalated"].pop(f"{gpu}/{issue}", None)
    for a in heal.state["attempts"].values():
        if a["gpu"] == gpu and a["issue"] == issue and a.get("status") == "failed":
            a["status"] = "cleared"
    if found is None:
        raise GpuhealError(f"--clear {target!r}: nothing escalated for {gpu}/{issue}")
    heal.store.write(files.HEAL, heal.state)
