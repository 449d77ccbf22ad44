"""Freeze a real llama-server's task loop, as a deadlocked decode or a stuck CUDA kernel does (issue 20).

llama-server runs its task loop on the main thread — the thread whose id is the pid — and serves HTTP on
others. Stopping only that thread with ptrace (``PTRACE_SEIZE`` + ``PTRACE_INTERRUPT``, stdlib
:mod:`ctypes`) leaves ``/health`` and ``/props`` answering while ``/metrics``, ``/slots`` and every
completion hang: the failure of llama.cpp#27388, made real. SIGSTOP would stop every thread (that is
Rule 6's fault, not this one).

ptrace binds the tracee to the *thread* that attached, so one tracer thread seizes, waits and detaches;
:meth:`Freeze.end` may be called from any thread (a supervisor killing the server) and ends the trace
before the process is reaped — a traced zombie would otherwise wait for its tracer.

Usage::

    with freeze_task_loop(pid) as frozen:   # raises PtraceDenied where ptrace is not permitted
        ...                                 # /health ok, /metrics silent
    # detached: the task loop runs again (if the process still lives)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WALL = 0x40000000  # __WALL: wait for a thread that is not our child


class PtraceDenied(RuntimeError):
    """ptrace is not permitted here (Yama ptrace_scope, no CAP_SYS_PTRACE, seccomp)."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    return libc


class Freeze:
    """One tracer thread holding thread ``tid`` stopped until :meth:`end` (idempotent)."""

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self._libc = _libc()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._trace, name=f"drill-ptrace-{tid}", daemon=True)

    def start(self, timeout_s: float = 10.0) -> Freeze:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self._error = RuntimeError(f"ptrace of {self.tid}: no interrupt stop within {timeout_s} s")
        if self._error is not None:
            self.end()
            raise self._error
        return self

    @property
    def active(self) -> bool:
        return self._thread.is_alive()

    def end(self) -> None:
        """Detach (from any thread). After it the process may be reaped."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(10)

    def _call(self, request: int) -> int:
        ctypes.set_errno(0)
        result = self._libc.ptrace(request, self.tid, None, None)
        return 0 if result == 0 else ctypes.get_errno()

    def _trace(self) -> None:
        err = self._call(PTRACE_SEIZE)
        if err:
            self._error = PtraceDenied(f"PTRACE_SEIZE of {self.tid}: {os.strerror(err)}")
            self._ready.set()
            return
        err = self._call(PTRACE_INTERRUPT)
        if err:
            self._error = RuntimeError(f"PTRACE_INTERRUPT of {self.tid}: {os.strerror(err)}")
        else:
            try:  # the interrupt stop: from here on the thread is halted
                os.waitpid(self.tid, WALL)
            except ChildProcessError as exc:
                self._error = RuntimeError(f"waiting for the ptrace stop of {self.tid}: {exc}")
        self._ready.set()
        if self._error is None:
            self._stop.wait()
        self._call(PTRACE_DETACH)  # ESRCH when it was killed meanwhile: nothing left to release


@contextmanager
def freeze_task_loop(pid: int) -> Iterator[Freeze]:
    """Stop the main thread of ``pid`` (its task loop) for the ``with`` block; other threads run."""
    frozen = Freeze(pid).start()
    try:
        yield frozen
    finally:
        frozen.end()
