"""Rule 2's attribution at the edge: take per-process VRAM snapshots over the GPU's transport and
keep the onset one in the state directory. The decisions are :mod:`gpuheal.core.vram_attribution`'s.

The snapshot is the remedy's own ``snapshot-processes`` command (the configured ``smi_command``,
else ``nvidia-smi -i N --query-compute-apps=...`` / ``rocm-smi -d N ... --showpids --json``), run
where the GPU's commands run (local or SSH). Its whole stdout is parsed (the audit keeps only the
tail of a long output; a list read from a tail would miss processes).
"""

from __future__ import annotations

from typing import Any

from gpuheal.core import vram_attribution as va
from gpuheal.core.actions import RunCommand
from gpuheal.core.plan import resolve_action
from gpuheal.state import files

ISSUE = "vram-leak"


def snapshot_step(
    step: RunCommand, gpu: str, cfg, values: dict[str, str], runner, timeout_s: float, secrets, now_s: float
):
    """Run one snapshot command; the audit's step result and the parsed :class:`VramSnapshot`."""
    from gpuheal.actions.execute import StepResult, _result, expand_argv

    try:
        argv = expand_argv(step.argv, values)
    except Exception as exc:  # noqa: BLE001 — a bad template: the snapshot is not known
        res = StepResult(step.action, list(step.argv), step.target, ok=False, error=str(exc))
        return res, va.VramSnapshot(now_s, (), f"snapshot command: {exc}"[:200])
    outcome = runner(step.target, argv, timeout_s)
    res = _result(step.action, argv, step.target, outcome, secrets, step.note)
    if not res.ok:
        return res, va.VramSnapshot(now_s, (), f"snapshot command failed: {res.error}"[:200])
    return res, parse(outcome.stdout or "", gpu, cfg, now_s)


def parse(stdout: str, gpu: str, cfg, now_s: float) -> va.VramSnapshot:
    g = cfg.gpu(gpu)
    try:
        if g.vendor == "amd":
            return va.from_rocm(stdout, now_s, several_gpus=g.gpu_index is not None)
        return va.from_nvidia(stdout, now_s)
    except Exception as exc:  # noqa: BLE001 — an output the parsers trip on is "not known", never a crash
        return va.VramSnapshot(now_s, (), f"unreadable snapshot ({type(exc).__name__})")


def take(gpu: str, cfg, runner, now_s: float, secrets) -> va.VramSnapshot:
    """The onset snapshot of ``gpu``, taken now."""
    from gpuheal.actions.execute import values_for

    step = resolve_action("snapshot-processes", gpu, cfg)
    if not isinstance(step, RunCommand):
        return va.VramSnapshot(now_s, (), "no snapshot command for this GPU")
    timeout_s = min(cfg.heal.command_timeout_s, 15.0)
    return snapshot_step(step, gpu, cfg, values_for(gpu, cfg), runner, timeout_s, secrets, now_s)[1]


def open_leaks(still_open: dict[tuple[str, str], dict[str, Any]], aliases) -> dict[str, va.OpenLeak]:
    """The GPUs whose vram-leak is open this run (pending or firing, or hidden by an inhibitor)."""
    return {
        gpu: va.OpenLeak(issue.get("since"), issue.get("state") == "firing")
        for (gpu, name), issue in still_open.items()
        if name == ISSUE and gpu in aliases
    }


def track(store, still_open, cfg, runner, now_s: float, secrets) -> dict[str, va.Onset]:
    """Keep one onset snapshot per open vram-leak (taken when it opens), drop those that cleared;
    saved at once, so the cron run that fires the rule finds the one an earlier run took."""
    leaks = open_leaks(still_open, set(cfg.aliases))
    book = onsets(store)
    kept = va.onsets_kept(book, leaks)
    due = va.onsets_due(kept, leaks)
    for gpu in due:
        kept[gpu] = va.Onset(leaks[gpu].since, take(gpu, cfg, runner, now_s, secrets))
    if due or kept != book:
        store.write(files.VRAM_ONSET, va.onsets_to_json(kept))
    return kept


def onsets(store) -> dict[str, va.Onset]:
    """The onset snapshots kept so far, read only (a dry run takes none)."""
    return va.onsets_from_json(store.read(files.VRAM_ONSET, {}))


def waits(onsets: dict[str, va.Onset], issues, cfg, now_s: float, tol_s: float) -> dict[tuple[str, str], str]:
    """``{(gpu, "vram-leak"): why}``: the firing leaks whose remedy waits this run, until their two
    snapshots can be compared (:func:`vram_attribution.wait_reason`); the plan holds them back."""
    wait_s, gpus = cfg.heal.leak_attribution_wait_s, {i["gpu"] for i in issues if i.get("issue") == ISSUE}
    found = {gpu: va.wait_reason(onsets.get(gpu), now_s, wait_s, tol_s) for gpu in gpus & set(cfg.aliases)}
    return {(gpu, ISSUE): why for gpu, why in found.items() if why is not None}


def llama_pids(target: str, endpoint: str, runner, timeout_s: float) -> frozenset[int]:
    """This GPU's llama-server by its endpoint's port: ``pgrep -af llama-server`` where the GPU's
    commands run, the ``llama-server`` programs listening on that port (process_check). Empty when
    not known (pgrep missing or failing, or the server runs under another name): the attribution
    then knows llama-server by its program name."""
    from gpuheal.actions import process_check

    try:
        outcome = runner(target, list(process_check.PGREP_ARGV), timeout_s)
    except Exception:  # noqa: BLE001 — a runner that trips is "not known", never a crash
        return frozenset()
    if outcome.error or outcome.timed_out or outcome.rc != 0:
        return frozenset()
    return frozenset(process_check.read_pgrep(outcome.stdout or "", process_check.endpoint_port(endpoint)))


KILL_SEEN_WITHIN_S = 5.0  # SIGTERM frees a CUDA context in well under a second: still listed after this = not gone
KILL_POLL_S = 0.5


def kill_seen(snapshot: RunCommand | None, pid: int, gpu: str, cfg, values, runner, timeout_s: float, secrets,
              now_s: float) -> bool:
    """Whether the killed ``pid`` is gone from the GPU's process list (an action counts only when
    its effect is seen): the snapshot command again, every ``KILL_POLL_S`` for up to
    ``KILL_SEEN_WITHIN_S``. A list that cannot be read proves nothing."""
    import time

    if snapshot is None:
        return False
    deadline = time.monotonic() + KILL_SEEN_WITHIN_S
    while True:
        snap = snapshot_step(snapshot, gpu, cfg, values, runner, timeout_s, secrets, now_s)[1]
        if snap.error is None and all(p.pid != pid for p in snap.processes):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(KILL_POLL_S)
