"""Process-level faults for the drill (issue 20): a frozen task loop by ptrace, SIGSTOP, SIGKILL,
and a wrapper that makes a restarted server slow to come back.

The frozen task loop: llama-server runs its task loop on the main thread (the thread whose id is
the pid) and serves HTTP on others. Stopping only that thread with ``PTRACE_SEIZE`` +
``PTRACE_INTERRUPT`` (stdlib :mod:`ctypes`) leaves ``/health`` answering ok while ``/metrics``,
``/slots`` and every completion hang, as in llama.cpp#27388. ptrace binds the tracee to the
*thread* that seized it, so one tracer thread seizes, waits for the stop and detaches;
:meth:`Freeze.end` may be called from any thread. The drill's supervisor ends the trace before it
reaps the process (the tracer lives in the supervisor's own process, so the kernel would report the
death to it anyway; ending first keeps no traced zombie behind whatever the order).

``python benchmarks/drill_faults.py delayed-exec SECONDS -- ARGV...`` sleeps, then execs ARGV: the
supervisor starts a restarted "slow-load" server through it, so its port stays closed that long.

The ptrace freezer itself is tests/taskloop.py's (the real-server tier uses the same one).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from taskloop import Freeze, PtraceDenied  # noqa: E402,F401  (PtraceDenied: for the drill's callers)


def freeze_task_loop(pid: int) -> Freeze:
    """Stop the main thread of ``pid`` (llama-server's task loop) until ``.end()``; its HTTP threads
    keep running. The freezer is the real-server tier's (tests/taskloop.py): one copy."""
    return Freeze(pid).start()


def send(pid: int, sig: signal.Signals) -> bool:
    """Signal ``pid``; False when it is already gone."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def delayed_exec(argv: list[str]) -> None:
    """``delayed-exec SECONDS -- ARGV...``: sleep, then replace this process with ARGV."""
    if len(argv) < 3 or argv[0] != "delayed-exec" or argv[2] != "--":
        sys.stderr.write("usage: drill_faults.py delayed-exec SECONDS -- ARGV...\n")
        raise SystemExit(2)
    time.sleep(float(argv[1]))
    os.execv(argv[3], argv[3:])


if __name__ == "__main__":
    delayed_exec(sys.argv[1:])
