"""Rule 2: which process grew — per-process VRAM at two snapshots, never "the largest process".

Spec, Rule 2: "If llama-server is the growth source → restart with memory cap flag; if unknown
process → kill and alert." The *growth source* is the process whose VRAM went up, so it is read
from two per-process snapshots of the same GPU: one at the leak's onset (the first heal run that
sees ``vram-leak`` open, kept in the state directory) and one when the remedy runs, at least
``heal.leak_attribution_wait_s`` later (:func:`wait_reason`). The
process that grew is the one whose ``used_mb`` went up by more than ``share`` (default 0.5) of
the summed growth of all processes. A pid that appeared since the onset grew from 0; a pid that
has exited is ignored; a pid seen with another name is another process (pid reuse) and grew from 0.

Anything that makes the comparison unsafe gives :class:`Unattributed` with the reason, never a
guess: a missing or failed snapshot, a list cut short or holding unreadable lines, a ``[N/A]``
VRAM figure for a process still there (its growth cannot be known, so no other process can be
said to hold "most" of it), no growth at all, or no single process holding most of it.

Pure: snapshots in, a typed verdict out; the time each snapshot was taken is a parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuheal.core.heal_state import num as _finite  # a finite number, else None (True, "5", NaN, huge ints)
from gpuheal.parse.llama_process import is_llama_server
from gpuheal.parse.smi import PID_MAX, parse_compute_apps, parse_rocm_pids

MAX_PROCESSES = 1024  # a longer list is cut here, and a cut list is never attributed
MIN_GROWTH_MB = 1.0  # summed growth below this is "no process grew"
MAX_USED_MB = 16 * 1024 * 1024.0  # 16 TB: any larger figure is garbage


@dataclass(frozen=True)
class ProcessVram:
    """One process's VRAM on one GPU at one snapshot. ``used_mb`` ``None``: the driver said
    ``[N/A]`` (another PID namespace, insufficient permissions)."""

    pid: int
    name: str
    used_mb: float | None


@dataclass(frozen=True)
class VramSnapshot:
    """The per-process VRAM of one GPU at ``taken_s`` (epoch s). ``error``: the list could not be
    read or is not complete (the reason); an erroneous snapshot is never attributed from."""

    taken_s: float
    processes: tuple[ProcessVram, ...] = ()
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "taken_s": self.taken_s,
            "processes": [{"pid": p.pid, "name": p.name, "used_mb": p.used_mb} for p in self.processes],
            "error": self.error,
        }

    @staticmethod
    def from_json(data: Any) -> VramSnapshot | None:
        """Field by field from the state file; a damaged snapshot is ``None`` (not known)."""
        if not isinstance(data, dict):
            return None
        taken_s, rows, error = _finite(data.get("taken_s")), data.get("processes"), data.get("error")
        if taken_s is None or not isinstance(rows, list) or not (error is None or isinstance(error, str)):
            return None
        if len(rows) > MAX_PROCESSES:
            return VramSnapshot(taken_s, (), "stored list too long")
        procs = tuple(p for p in (_process(r) for r in rows) if p is not None)
        damaged = None if len(procs) == len(rows) else "stored list damaged"
        return VramSnapshot(taken_s, procs, error[:200] if error else damaged)


@dataclass(frozen=True)
class Culprit:
    """The process that grew: ``grew_mb`` of the summed ``total_growth_mb`` between the snapshots."""

    pid: int
    name: str
    grew_mb: float
    total_growth_mb: float
    is_llama_server: bool

    @property
    def share(self) -> float:
        return self.grew_mb / self.total_growth_mb if self.total_growth_mb > 0 else 0.0


@dataclass(frozen=True)
class Unattributed:
    """No process can safely be named; ``reason`` says why (shown in ``detected`` and the audit)."""

    reason: str


Attribution = Culprit | Unattributed


def _process(row: Any) -> ProcessVram | None:
    if not isinstance(row, dict):
        return None
    pid, name, used = row.get("pid"), row.get("name"), row.get("used_mb")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= PID_MAX or not isinstance(name, str):
        return None
    used_mb = _finite(used)
    if used is not None and (used_mb is None or not 0 <= used_mb <= MAX_USED_MB):
        return None
    return ProcessVram(pid, name[:200], used_mb)


def from_nvidia(text: str, taken_s: float) -> VramSnapshot:
    """``nvidia-smi [-i N] --query-compute-apps=pid,process_name,used_memory
    --format=csv,noheader,nounits`` (formats.md §2.3). Empty output is "no process on this GPU".
    A line that is not a process (junk, a cut-off pid) makes the snapshot incomplete."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.strip().lower().startswith("pid")]
    if len(lines) > MAX_PROCESSES:
        return VramSnapshot(taken_s, (), f"{len(lines)} processes listed, more than {MAX_PROCESSES}: truncated")
    procs = tuple(ProcessVram(p.pid, p.name, p.used_mb) for p in parse_compute_apps("\n".join(lines)))
    if len(procs) != len(lines):
        return VramSnapshot(taken_s, procs, f"{len(lines) - len(procs)} unreadable line(s) in the process list")
    return VramSnapshot(taken_s, procs)


SUMMED = "rocm-smi --showpids sums VRAM over all GPUs of the host"  # replaced by the KFD's per-GPU figure


def from_rocm(text: str, taken_s: float, several_gpus: bool) -> VramSnapshot:
    """``rocm-smi --showpids --json``: ``"system": {"PID<pid>": "name, gpus, vram_bytes, sdma, cu"}``.
    rocm-smi sums a process's VRAM over every GPU it uses and does not say which: on a host with
    ``several_gpus`` the figure is not this GPU's, so such a snapshot is not attributed from."""
    found = parse_rocm_pids(text)
    if found is None:
        return VramSnapshot(taken_s, (), "no rocm-smi --showpids JSON in the output")
    rows, unreadable = found
    if len(rows) > MAX_PROCESSES:
        return VramSnapshot(taken_s, (), f"{len(rows)} processes listed, more than {MAX_PROCESSES}: truncated")
    procs = tuple(ProcessVram(p.pid, p.name, p.used_mb) for p in rows)
    if unreadable:
        return VramSnapshot(taken_s, procs, f"{unreadable} unreadable entr(y/ies) in rocm-smi's process list")
    if several_gpus and procs:
        return VramSnapshot(taken_s, procs, SUMMED)
    return VramSnapshot(taken_s, procs)


def attribute(
    onset: VramSnapshot | None,
    now: VramSnapshot | None,
    share: float = 0.5,
    llama_pids: frozenset[int] = frozenset(),
) -> Attribution:
    """The process that grew between ``onset`` and ``now``, or why none can be named.

    ``llama_pids``: this GPU's llama-server as looked up by its endpoint's port, when known; else
    a process is this GPU's llama-server by its name (:func:`gpuheal.parse.llama_process.is_llama_server`)."""
    why = _unusable(onset, now)
    if why is not None:
        return Unattributed(why)
    assert onset is not None and now is not None  # _unusable said both are there
    before = {p.pid: p for p in onset.processes}
    growth: dict[int, float] = {}
    for proc in now.processes:
        old = before.get(proc.pid)
        same = old is not None and old.name == proc.name  # another name: the pid was reused
        if proc.used_mb is None or (same and old is not None and old.used_mb is None):
            return Unattributed(f"VRAM of pid {proc.pid} ({proc.name}) not reported ([N/A])")
        base = old.used_mb if same and old is not None and old.used_mb is not None else 0.0
        growth[proc.pid] = max(proc.used_mb - base, 0.0)
    total = sum(growth.values())
    if total < MIN_GROWTH_MB:
        return Unattributed(f"no process grew between the snapshots ({total:.0f} MB in all)")
    pid = max(growth, key=lambda k: growth[k])
    if growth[pid] <= share * total:
        return Unattributed(
            f"no single process grew by more than {share:.0%} of the {total:.0f} MB growth "
            f"(the most: pid {pid}, {growth[pid]:.0f} MB)"
        )
    proc = next(p for p in now.processes if p.pid == pid)
    llama = pid in llama_pids if llama_pids else is_llama_server(proc.name)
    return Culprit(pid, proc.name, round(growth[pid], 1), round(total, 1), llama)


def _unusable(onset: VramSnapshot | None, now: VramSnapshot | None) -> str | None:
    if onset is None:
        return "no per-process VRAM snapshot from the leak's onset"
    if now is None:
        return "no per-process VRAM snapshot at fire time"
    if onset.error:
        return f"onset snapshot not usable: {onset.error}"
    if now.error:
        return f"fire-time snapshot not usable: {now.error}"
    if now.taken_s <= onset.taken_s:
        return "the two snapshots are not one after the other"
    return None


def record(result: Attribution, onset: VramSnapshot | None, now: VramSnapshot | None) -> dict[str, Any]:
    """``detected.attribution`` and the audit's view of the decision, with both snapshots."""
    out: dict[str, Any]
    if isinstance(result, Culprit):
        out = {
            "attributed": True,
            "pid": result.pid,
            "name": result.name,
            "grew_mb": result.grew_mb,
            "total_growth_mb": result.total_growth_mb,
            "share": round(result.share, 3),
            "is_llama_server": result.is_llama_server,
        }
    else:
        out = {"attributed": False, "reason": result.reason}
    out["onset"] = _shown(onset)
    out["fire"] = _shown(now)
    return out


SHOWN = 20  # processes of each snapshot kept in the audit (the largest); the count says how many


def _shown(snap: VramSnapshot | None) -> dict[str, Any] | None:
    if snap is None:
        return None
    doc = snap.to_json()
    largest = sorted(snap.processes, key=lambda p: -(p.used_mb or 0.0))[:SHOWN]
    doc["processes"] = [{"pid": p.pid, "name": p.name, "used_mb": p.used_mb} for p in largest]
    doc["count"] = len(snap.processes)
    return doc


# --------------------------------------------------------------------------- the onset snapshots
# ``vram-onset.json`` (the remedy's ``state_file``): ``{ALIAS: {"since": ISO, "snapshot": SNAPSHOT}}``, one per
# GPU whose vram-leak is open; kept across runs (cron starts a new process every minute) and
# dropped when the issue clears.


@dataclass(frozen=True)
class Onset:
    """The per-process snapshot taken when occurrence ``since`` of a GPU's vram-leak opened."""

    since: str | None
    snapshot: VramSnapshot


@dataclass(frozen=True)
class OpenLeak:
    """One open vram-leak as the heal step sees it: its occurrence and whether it fired yet."""

    since: str | None
    firing: bool


def onsets_from_json(data: Any) -> dict[str, Onset]:
    """Entry by entry: a damaged one is dropped (its GPU's next run takes a new snapshot)."""
    book: dict[str, Onset] = {}
    for alias, entry in (data.items() if isinstance(data, dict) else ()):
        if not isinstance(alias, str) or not isinstance(entry, dict):
            continue
        since, snap = entry.get("since"), VramSnapshot.from_json(entry.get("snapshot"))
        if snap is not None and (since is None or isinstance(since, str)):
            book[alias] = Onset(since, snap)
    return book


def onsets_to_json(book: dict[str, Onset]) -> dict[str, Any]:
    return {alias: {"since": o.since, "snapshot": o.snapshot.to_json()} for alias, o in sorted(book.items())}


def onsets_due(book: dict[str, Onset], open_leaks: dict[str, OpenLeak]) -> list[str]:
    """The GPUs whose onset snapshot is to be taken now: a leak with none for its occurrence, or
    one whose snapshot failed while the leak is still pending (retried until it fires; after
    that the failed one stands, and the fire-time attribution says it could not be used)."""
    due = []
    for alias, leak in sorted(open_leaks.items()):
        have = book.get(alias)
        if have is None or have.since != leak.since or (have.snapshot.error is not None and not leak.firing):
            due.append(alias)
    return due


def onsets_kept(book: dict[str, Onset], open_leaks: dict[str, OpenLeak]) -> dict[str, Onset]:
    """The book without the GPUs whose vram-leak is no longer open (the issue cleared)."""
    return {alias: o for alias, o in book.items() if alias in open_leaks}


def wait_reason(onset: Onset | None, now_s: float, wait_s: float, tol_s: float) -> str | None:
    """Why the leak's remedy waits this run, or ``None`` to go ahead. Attribution compares two
    snapshots, so the onset one must come from an earlier run and at least ``wait_s``
    (``heal.leak_attribution_wait_s``) ago: Rule 2 fires on the first poll its 6 h fit holds, so
    its onset snapshot is taken then, and the remedy waits for growth the second one can show (a
    leak of 300 MB/h grows 50 MB in 10 minutes). Without any onset snapshot it waits for one."""
    from gpuheal.core import timing

    if onset is None:
        return "waiting for attribution: no per-process VRAM snapshot from the leak's onset yet"
    age_s = now_s - onset.snapshot.taken_s
    if age_s <= 0 or not timing.at_least(age_s, wait_s, tol_s):
        return (
            f"waiting for attribution: the onset snapshot is {max(age_s, 0.0):.0f} s old; the second is "
            f"taken {wait_s:.0f} s after it at the earliest"
        )
    return None


# --------------------------------------------------------------------------- the decision


@dataclass(frozen=True)
class LeakDecision:
    """What Rule 2 does with an attribution: ``restart`` (this GPU's llama-server grew: the memcap
    restart), ``kill`` the process that grew (opt-in, not protected), or ``escalate`` (no restart,
    no kill: the humans get both snapshots). ``reason``: the line the audit and the alert carry."""

    kind: str  # restart | kill | escalate
    reason: str
    pid: int | None = None
    name: str | None = None


def decide(result: Attribution, kill_unknown: bool, protect: tuple[str, ...]) -> LeakDecision:
    """Rule 2.2/2.3 on the attribution. Unattributed: no restart either — a restart on a guess
    frees the VRAM for an hour and hides the real source, and the spec restarts llama-server only
    "if llama-server is the growth source"; the escalation carries both snapshots instead."""
    if isinstance(result, Unattributed):
        return LeakDecision("escalate", f"VRAM growth not attributed ({result.reason}): no restart, no kill")
    who = f"{result.name!r} (pid {result.pid}, grew {result.grew_mb:.0f} of {result.total_growth_mb:.0f} MB)"
    if result.is_llama_server:
        return LeakDecision("restart", f"this GPU's llama-server {who} is the VRAM growth source", result.pid)
    lowered = result.name.lower()
    if any(p and p.lower() in lowered for p in protect):
        return LeakDecision("escalate", f"VRAM growth source is protected process {who}: not touching it")
    if not kill_unknown:
        why = f"unknown process {who} is the VRAM growth source; kill_unknown_processes is off"
        return LeakDecision("escalate", why)
    return LeakDecision("kill", f"unknown process {who} is the VRAM growth source", result.pid, result.name)
