"""Rule 2's fix: the process that grew decides (spec: "If llama-server is the growth source → restart with
memory cap flag; if unknown process → kill and alert"). The hooks of ``REMEDY``
(:mod:`gpuheal.core.remedy`), with every capability from the heal run's context:

- ``track``: the per-process VRAM snapshot of each open leak, taken when it opens (its remedy's own
  ``snapshot-processes`` command, where the GPU's commands run) and kept in the rule's record
  (``vram-onset.json``) across cron runs; dropped when the leak clears;
- ``guard``: the fix waits until the onset snapshot is old enough for the second to show growth
  (:func:`~gpuheal.rules.vram_leak.attribution.wait_reason`);
- ``before_step``: before the restart, the two snapshots decide
  (:mod:`~gpuheal.rules.vram_leak.attribution`): this GPU's llama-server grew → the restart goes ahead;
  another process → killed (opt-in, not protected; the kill counts when the process is gone from the
  GPU's list) and alerted, else escalated; not attributable → escalated with both snapshots, no
  restart, no kill.

A snapshot is parsed from the command's whole output (the audit keeps only the tail of a long output; a
list read from a tail would miss processes).
"""

from __future__ import annotations

from dataclasses import replace

from gpuheal.core import kfd
from gpuheal.core.actions import Action, RunCommand, StepResult
from gpuheal.core.catalog import ACTIONS
from gpuheal.core.plan import resolve_action
from gpuheal.core.remedy import Execution, Guard, OpenIssue, Planning, RemedyContext, Result
from gpuheal.rules.vram_leak import attribution as va

STATE_FILE = "vram-onset.json"  # {ALIAS: {"since": ISO, "snapshot": SNAPSHOT}}: one per open leak
LOOK_TIMEOUT_S = 15.0  # a snapshot is a quick query: at most this, or heal.command_timeout_s if less
KILL_SEEN_WITHIN_S = 5.0  # SIGTERM frees a CUDA context in well under a second: still listed after this = not gone
KILL_POLL_S = 0.5


def track(open_leaks: tuple[OpenIssue, ...], ctx: RemedyContext) -> None:
    """Keep one onset snapshot per open leak (taken when it opens), drop those that cleared; saved at
    once, so the cron run that fires the rule finds the one an earlier run took."""
    leaks = {o.gpu: va.OpenLeak(o.since, o.firing) for o in open_leaks if o.gpu in ctx.cfg.aliases}
    book = va.onsets_from_json(ctx.record())
    kept = va.onsets_kept(book, leaks)
    due = va.onsets_due(kept, leaks)
    for gpu in due:
        kept[gpu] = va.Onset(leaks[gpu].since, _take(ctx.for_gpu(gpu)))
    if due or kept != book:
        ctx.save_record(va.onsets_to_json(kept))


def guard(p: Planning) -> Guard:
    """The leak's fix waits until its two snapshots can be compared."""
    if p.gpu not in p.cfg.aliases:
        return Guard()
    onset = va.onsets_from_json(p.record).get(p.gpu)
    return Guard(wait=va.wait_reason(onset, p.now_s, p.cfg.heal.leak_attribution_wait_s, p.tol_s))


def before_step(ex: Execution, step: Action, ctx: RemedyContext) -> bool:
    """Rule 2.2/2.3 before the restart. True: the attempt ends here (escalated, after a kill or not)."""
    if not (isinstance(step, RunCommand) and ACTIONS[step.action].restarts):
        return False
    heal = ctx.cfg.heal
    onset = va.onsets_from_json(ctx.record()).get(ex.item.gpu)
    snap = onset.snapshot if onset is not None else None
    taken = next((s for s in ex.steps if ACTIONS[s.action].evidence), None)
    fire = None if taken is None else snapshot_of(taken, ctx.for_gpu(ex.item.gpu))
    ours = ctx.llama_pids()
    result = va.attribute(snap, fire, heal.leak_attribution_share, llama_pids=ours)
    ex.evidence["attribution"] = {**va.record(result, snap, fire), "llama_server_pids": sorted(ours)}
    decision = va.decide(result, heal.kill_unknown_processes, tuple(heal.protect_processes or ()))
    ex.evidence["attribution"]["decision"] = decision.kind
    ex.found["attribution"] = ex.evidence["attribution"]
    if decision.kind == "restart":
        return False
    ex.ends(Result.ESCALATED, decision.reason)
    if decision.kind == "kill" and decision.pid is not None:
        _kill(ex, step, decision, ctx)
    return True


def _kill(ex: Execution, step: RunCommand, decision: va.LeakDecision, ctx: RemedyContext) -> None:
    """Kill the process that grew; it counts when it is gone from the GPU's process list."""
    assert decision.pid is not None
    argv = ctx.cfg.gpu(ex.item.gpu).command("kill_command") or ACTIONS["kill-process"].default_argv or ()
    res = ctx.perform(RunCommand("kill-process", tuple(argv), step.target), pid=str(decision.pid))
    ex.steps.append(replace(res, note=decision.reason))
    if not res.ok:
        ex.escalate_reason = f"could not kill {decision.reason}"
        return
    snapshot = next((s for s in ex.item.steps if isinstance(s, RunCommand) and ACTIONS[s.action].evidence), None)
    gone = _kill_seen(snapshot, decision.pid, ctx)
    ex.verification = {"killed_pid": decision.pid, "gone_from_gpu": gone}
    seen = "gone from the GPU's process list" if gone else f"still listed after {KILL_SEEN_WITHIN_S:g} s"
    ex.escalate_reason = f"killed {decision.reason}; {seen}"


def _kill_seen(snapshot: RunCommand | None, pid: int, ctx: RemedyContext) -> bool:
    """Whether the killed ``pid`` is gone from the GPU's process list (an action counts only when its
    effect is seen): the snapshot command again, every ``KILL_POLL_S`` for up to ``KILL_SEEN_WITHIN_S``.
    A list that cannot be read proves nothing."""
    if snapshot is None:
        return False
    timeout_s = min(ctx.cfg.heal.command_timeout_s, LOOK_TIMEOUT_S)

    def gone() -> bool:
        snap = snapshot_of(ctx.perform(snapshot, timeout_s), ctx)
        return snap.error is None and all(p.pid != pid for p in snap.processes)

    return ctx.until(gone, KILL_SEEN_WITHIN_S, KILL_POLL_S)


def _take(ctx: RemedyContext) -> va.VramSnapshot:
    """The onset snapshot of the context's GPU, taken now."""
    step = resolve_action("snapshot-processes", ctx.gpu, ctx.cfg)
    if not isinstance(step, RunCommand):
        return va.VramSnapshot(ctx.now_s, (), "no snapshot command for this GPU")
    res = ctx.perform(step, min(ctx.cfg.heal.command_timeout_s, LOOK_TIMEOUT_S))
    return snapshot_of(res, ctx)


def snapshot_of(res: StepResult, ctx: RemedyContext) -> va.VramSnapshot:
    """The per-process snapshot a ``snapshot-processes`` step's whole output gives, or why none. On a host
    with several AMD GPUs rocm-smi's per-process sum is replaced by this GPU's own figure from the KFD
    (:mod:`gpuheal.core.kfd`, issue 27 item 12), and the processes that do not use it are dropped."""
    now_s = ctx.now_s
    if res.stdout is None:
        return va.VramSnapshot(now_s, (), f"snapshot command: {res.error}"[:200])
    if not res.ok:
        return va.VramSnapshot(now_s, (), f"snapshot command failed: {res.error}"[:200])
    g = ctx.cfg.gpu(ctx.gpu)
    try:
        if g.vendor != "amd":
            return va.from_nvidia(res.stdout, now_s)
        snap = va.from_rocm(res.stdout, now_s, several_gpus=g.gpu_index is not None)
    except Exception as exc:  # noqa: BLE001 — an output the parsers trip on is "not known", never a crash
        return va.VramSnapshot(now_s, (), f"unreadable snapshot ({type(exc).__name__})")
    if g.gpu_index is None or snap.error != va.SUMMED:
        return snap
    on = kfd.on_this_gpu(ctx, tuple(p.pid for p in snap.processes))
    if on.used_mb is None:
        return replace(snap, error=f"{va.SUMMED}; per GPU not known ({on.why})"[:200])
    mine = tuple(replace(p, used_mb=on.used_mb[p.pid]) for p in snap.processes if p.pid in on.used_mb)
    return va.VramSnapshot(now_s, mine)
