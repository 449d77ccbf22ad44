"""The drill's stand-in for systemd: it owns the llama-server processes (it is their parent and
reaps them) and restarts one the way ``systemctl restart UNIT`` does.

A restart: the restart kill signal (``RestartKillSignal=``, systemd >= 244; else ``KillSignal=``;
SIGTERM by default) followed by SIGCONT (systemd always sends SIGCONT after it, so a SIGSTOPped
service can act on it), then up to ``stop_timeout_s`` (``TimeoutStopSec``; default 15 s) for the
process to exit, then SIGKILL (``FinalKillSignal=``, SIGKILL by default), then start again. A hung
llama-server ignores SIGTERM (its handler only asks the frozen task loop to stop), so its restart
costs the whole stop timeout; with ``restart_kill_signal=SIGKILL`` (``RestartKillSignal=SIGKILL``)
it costs none (issue 28, item 4). Like ``systemctl restart`` of a ``Type=simple`` unit it returns
once the new process runs, not once the model has loaded: gpuheal's verify waits for that.

gpuheal reaches it through ``restart_command``, an argv list::

    python benchmarks/drill_supervisor.py SOCKET restart NAME

which asks the supervisor over a Unix socket in the run directory (no network at all) and exits 0
once the service was started again, 1 with one line on stderr otherwise.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_STOP_TIMEOUT_S = 15.0
CLIENT_TIMEOUT_S = 120.0


@dataclass
class Service:
    """One supervised llama-server: its argv, its log, and what a restart should prefix."""

    name: str
    argv: list[str]
    log_path: Path
    restart_prefix: list[str] = field(default_factory=list)  # e.g. the slow-load delayed-exec wrapper
    proc: subprocess.Popen | None = None
    restarts: list[dict] = field(default_factory=list)


class Supervisor:
    """Starts, restarts and finally stops every service; ``before_reap(name, pid)`` ends faults
    (a ptrace tracer) on a process before it is waited for."""

    def __init__(self, socket_path: Path, stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
                 before_reap: Callable[[str, int], None] | None = None,
                 restart_kill_signal: signal.Signals = signal.SIGTERM) -> None:
        self.socket_path = socket_path
        self.stop_timeout_s = stop_timeout_s
        self.restart_kill_signal = restart_kill_signal
        self.before_reap = before_reap or (lambda name, pid: None)
        self.services: dict[str, Service] = {}
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        self._stopping = False

    # ------------------------------------------------------------------ lifecycle of services
    def add(self, service: Service) -> Service:
        self.services[service.name] = service
        self._spawn(service, restart=False)
        return service

    def pid(self, name: str) -> int:
        proc = self.services[name].proc
        assert proc is not None
        return proc.pid

    def _spawn(self, service: Service, *, restart: bool) -> None:
        argv = (service.restart_prefix + service.argv) if restart else service.argv
        with open(service.log_path, "ab") as log:
            service.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def _stop(self, service: Service, timeout_s: float, first: signal.Signals = signal.SIGTERM) -> str:
        """``first`` + SIGCONT, wait, SIGKILL; reap. Returns how it ended: "exited" (on ``first``),
        "killed" (SIGKILL after the stop timeout), "sigkill" (``first`` was SIGKILL), "gone" (dead already)."""
        proc = service.proc
        if proc is None or proc.poll() is not None:
            if proc is not None:
                self.before_reap(service.name, proc.pid)
            return "gone"
        how = "sigkill" if first == signal.SIGKILL else "exited"
        for sig in (first, signal.SIGCONT):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None:
            how = "killed"
            proc.kill()
            deadline = time.monotonic() + 10
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        self.before_reap(service.name, proc.pid)
        proc.wait(timeout=10)
        return how

    def restart(self, name: str) -> dict:
        """``systemctl restart NAME``; returns the record kept in ``service.restarts``."""
        service = self.services[name]
        with self._lock:
            if self._stopping:
                raise RuntimeError("the drill is shutting down")
            t0 = time.time()
            old_pid = service.proc.pid if service.proc else None
            how = self._stop(service, self.stop_timeout_s, self.restart_kill_signal)
            stopped = time.time()
            self._spawn(service, restart=True)
            rec = {"t": t0, "stop": how, "stop_s": round(stopped - t0, 2), "took_s": round(time.time() - t0, 2),
                   "old_pid": old_pid, "new_pid": service.proc.pid if service.proc else None}
            service.restarts.append(rec)
            return rec

    def stop_all(self) -> None:
        """Stop every service (SIGTERM, 5 s, SIGKILL) and reap it; idempotent. A restart in flight
        finishes first (the lock); none starts after."""
        with self._lock:
            self._stopping = True
        for service in self.services.values():
            try:
                self._stop(service, 5.0)
            except Exception as exc:  # keep going: every process must be reaped
                sys.stderr.write(f"drill supervisor: stopping {service.name}: {exc}\n")

    # ------------------------------------------------------------------ the control socket
    def serve(self) -> None:
        """Accept ``restart NAME`` requests on the Unix socket, each in its own thread."""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.socket_path))
        self._sock.listen(16)
        threading.Thread(target=self._accept, name="drill-supervisor", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        if self._sock is not None:
            self._sock.close()
        self.socket_path.unlink(missing_ok=True)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            words = conn.makefile("r").readline().split()
            if len(words) != 2 or words[0] != "restart" or words[1] not in self.services:
                conn.sendall(b"error: expected 'restart NAME' with a known NAME\n")
                return
            try:
                rec = self.restart(words[1])
                conn.sendall(f"ok {words[1]} stop={rec['stop']} took_s={rec['took_s']}\n".encode())
            except Exception as exc:
                conn.sendall(f"error: {type(exc).__name__}: {exc}\n".encode())


def client(argv: list[str]) -> int:
    """``SOCKET restart NAME``: what gpuheal's restart_command runs."""
    if len(argv) != 3 or argv[1] != "restart":
        sys.stderr.write("usage: drill_supervisor.py SOCKET restart NAME\n")
        return 2
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(CLIENT_TIMEOUT_S)
            s.connect(argv[0])
            s.sendall(f"restart {argv[2]}\n".encode())
            answer = s.makefile("r").readline().strip()
    except OSError as exc:
        sys.stderr.write(f"drill supervisor not reachable at {argv[0]}: {exc}\n")
        return 1
    if answer.startswith("ok "):
        sys.stdout.write(answer + "\n")
        return 0
    sys.stderr.write((answer or "no answer from the drill supervisor") + "\n")
    return 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(client(sys.argv[1:]))


def wait_ok(port: int, path: str, within_s: float, every_s: float) -> bool:
    """``GET path`` on 127.0.0.1:``port`` answers 200 within ``within_s`` (a server's ``/health``, the
    proxy's ``/health/liveliness``): the drill's one wait for a started service."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return True
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(every_s)
    return False
