"""Rule 6.1, "SSH to .15 → check llama-server process": before the restart, look whether the
process runs. Running but not answering its ``/health`` is the hung case: restarted; not running is the
down case: started (Rule 6.2, "restart llama-server if not running": :func:`start_argv`). The audit's
``detected`` records which it was and which ran, so the humans see a crash loop apart from a hang.

How it looks: when the restart command is ``[sudo] systemctl restart UNIT``, ``systemctl is-active
UNIT`` (the unit is the truth: a process of another unit is not ours); otherwise ``pgrep -af
llama-server``, keeping only lines whose program is ``llama-server`` listening on the endpoint's
port (``--port N``, default 8080: :mod:`gpuheal.parse.llama_process`, the one answer to "is this our
llama-server?"). Pure: the look is run by the rule's remedy (``remedy.py``) through the heal run's
context, and judged here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuheal.core.actions import CommandOutcome
from gpuheal.parse.llama_process import PGREP_ARGV, read_pgrep

RUNNING, NOT_RUNNING, NOT_KNOWN = "running", "not-running", "not known"
# systemctl is-active's answers (systemctl(1)); activating/reloading: a process is there
_UNIT_RUNNING = frozenset({"active", "activating", "reloading", "deactivating", "refreshing"})
_UNIT_STOPPED = frozenset({"inactive", "failed"})


@dataclass(frozen=True)
class ProcessCheck:
    state: str  # running | not-running | not known
    how: str  # the command that told (shown in the audit)
    pids: tuple[int, ...] = ()
    detail: str = ""

    def case(self) -> str:
        """The one line ``detected`` carries."""
        if self.state == RUNNING:
            pids = f" (pid {', '.join(map(str, self.pids))})" if self.pids else ""
            return f"hung: llama-server runs{pids} but does not answer"
        if self.state == NOT_RUNNING:
            return "down: llama-server is not running"
        return f"not known whether llama-server runs ({self.detail})"

    def record(self) -> dict[str, Any]:
        return {"state": self.state, "case": self.case(), "check": self.how, "pids": list(self.pids)}


def systemd_unit(restart_argv: tuple[str, ...] | None) -> str | None:
    """``UNIT`` of ``[sudo [-n]] systemctl restart UNIT``; ``None`` for any other command."""
    words = list(restart_argv or ())
    while words and (_program(words[0]) == "sudo" or (words[0].startswith("-") and len(words) > 1)):
        words.pop(0)
    if len(words) != 3 or _program(words[0]) != "systemctl" or words[1] != "restart":
        return None
    return words[2] if not words[2].startswith("-") else None


def start_argv(start: tuple[str, ...] | None, restart_argv: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """Rule 6.2's "start llama-server if not running": the command that starts a stopped one, and where
    it came from — ``gpus[].start_command``; else, for ``[sudo [-n]] systemctl restart UNIT`` (the
    default), the same words with ``start``; else the restart command itself (a restart of a stopped
    service starts it: today's behaviour for an operator's own script)."""
    if start:
        return tuple(start), "start_command"
    if systemd_unit(restart_argv) is not None:
        at = max(i for i, w in enumerate(restart_argv) if w == "restart")
        return (*restart_argv[:at], "start", *restart_argv[at + 1:]), "systemctl start (from the restart command)"
    return tuple(restart_argv), "the restart command (no start_command configured)"


def _program(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def check_argv(restart_argv: tuple[str, ...] | None) -> tuple[str, ...]:
    unit = systemd_unit(restart_argv)
    return ("systemctl", "is-active", unit) if unit else PGREP_ARGV


def judge(argv: list[str], outcome: CommandOutcome, port: int | None) -> ProcessCheck:
    """What the check's ``outcome`` (rc, stdout, error, timed_out) says; ``port``: the endpoint's."""
    how = " ".join(argv)
    if outcome.error or outcome.timed_out:
        return ProcessCheck(NOT_KNOWN, how, detail=str(outcome.error or "timed out")[:160])
    stdout = outcome.stdout or ""
    if argv[:2] == ["systemctl", "is-active"]:
        said = (stdout.strip().splitlines() or [""])[0].strip()
        if said in _UNIT_RUNNING:
            return ProcessCheck(RUNNING, how, detail=said)
        if said in _UNIT_STOPPED:
            return ProcessCheck(NOT_RUNNING, how, detail=said)
        return ProcessCheck(NOT_KNOWN, how, detail=f"systemctl said {said[:60]!r} (exit {outcome.rc})")
    if outcome.rc not in (0, 1):  # pgrep: 0 matched, 1 none; 2/3 a usage or fatal error
        return ProcessCheck(NOT_KNOWN, how, detail=f"exit status {outcome.rc}")
    pids = read_pgrep(stdout, port)
    return ProcessCheck(RUNNING if pids else NOT_RUNNING, how, pids)
