"""The drill's own machinery against a real llama-server (issue 20, item 3), so that
``benchmarks/drill.py`` cannot rot between runs: its systemd-like supervisor restarts a server whose
task loop is frozen by ptrace (SIGTERM ignored, SIGKILL after the stop timeout, the trace ended before
the reap), one stopped by SIGSTOP, and a slow-loading one through the delayed-exec wrapper; gpuheal's
``restart_command`` path (the client over the Unix socket) is the one exercised.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from drill import post_completion, server_argv, wait_health  # noqa: E402
from drill_faults import PtraceDenied, freeze_task_loop, send  # noqa: E402
from drill_supervisor import Service, Supervisor  # noqa: E402

pytestmark = pytest.mark.realserver

STOP_TIMEOUT_S = 2.0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health_status(port: int, timeout_s: float = 2.0) -> int | str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__
    finally:
        conn.close()


def all_stopped(pid: int, timeout_s: float = 2.0) -> bool:
    """Every thread of ``pid`` in the stopped state: SIGSTOP's group stop is asynchronous, and a
    thread still running for a moment can answer one more request."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = []
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                pass
        if states and all(s in ("T", "t") for s in states):
            return True
        time.sleep(0.01)
    return False


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True


@pytest.fixture(params=["SIGTERM"])
def supervised(request, llama_server_bin, tiny_model):
    """A factory for one supervised real server; every process stopped, reaped, traces ended. The
    param is the restart's first signal (``RestartKillSignal=``)."""
    run_dir = Path(tempfile.mkdtemp(prefix="drill-t-"))  # short: a Unix socket path has ~100 bytes
    freezes = {}
    sup = Supervisor(run_dir / "sup.sock", STOP_TIMEOUT_S, lambda name, pid: freezes.pop(name).end()
                     if name in freezes else None, getattr(signal, request.param))
    sup.serve()

    def start(name: str, prefix: list[str] | None = None) -> int:
        port = free_port()
        sup.add(Service(name, server_argv(llama_server_bin, tiny_model, port, busy=False), run_dir / f"{name}.log",
                        restart_prefix=prefix or []))
        assert wait_health(port, 60), (run_dir / f"{name}.log").read_text()[-2000:]
        return port

    def restart(name: str) -> subprocess.CompletedProcess:
        """As gpuheal's restart_command runs it: an argv list, the client over the socket."""
        return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "drill_supervisor.py"), str(sup.socket_path),
                               "restart", name], capture_output=True, text=True, timeout=60)

    yield sup, start, restart, freezes
    for f in list(freezes.values()):
        f.end()
    sup.stop_all()
    sup.close()
    shutil.rmtree(run_dir, ignore_errors=True)


def test_a_frozen_task_loop_answers_health_and_is_killed_after_the_stop_timeout(supervised):
    sup, start, restart, freezes = supervised
    port = start("frozen")
    old = sup.pid("frozen")
    try:
        freezes["frozen"] = freeze_task_loop(old)
    except PtraceDenied as exc:
        pytest.skip(f"ptrace not permitted here: {exc}")
    assert health_status(port) == 200  # the HTTP threads still answer
    assert post_completion(port, 4, 2.0) == (False, "TimeoutError")  # the task loop does not

    t0 = time.monotonic()
    done = restart("frozen")
    took_s = time.monotonic() - t0
    assert done.returncode == 0 and "stop=killed" in done.stdout, (done.stdout, done.stderr)
    assert took_s >= STOP_TIMEOUT_S  # SIGTERM was ignored: the whole stop timeout, then SIGKILL
    assert "frozen" not in freezes and gone(old)  # trace ended, old process reaped
    assert wait_health(port, 60)
    assert post_completion(port, 4, 10.0) == (True, "")


@pytest.mark.parametrize("supervised", ["SIGKILL"], indirect=True)
def test_a_frozen_task_loop_restarted_with_sigkill_first_costs_no_stop_timeout(supervised):
    """``RestartKillSignal=SIGKILL`` (issue 28, item 4): the deaf process is gone at once."""
    sup, start, restart, freezes = supervised
    port = start("frozen")
    old = sup.pid("frozen")
    try:
        freezes["frozen"] = freeze_task_loop(old)
    except PtraceDenied as exc:
        pytest.skip(f"ptrace not permitted here: {exc}")
    assert post_completion(port, 4, 2.0) == (False, "TimeoutError")
    done = restart("frozen")
    assert done.returncode == 0 and "stop=sigkill" in done.stdout, (done.stdout, done.stderr)
    assert sup.services["frozen"].restarts[-1]["stop_s"] < STOP_TIMEOUT_S / 2
    assert "frozen" not in freezes and gone(old)
    assert wait_health(port, 60)
    assert post_completion(port, 4, 10.0) == (True, "")


def test_a_sigstopped_server_is_restarted_and_serves(supervised):
    sup, start, restart, _ = supervised
    port = start("hang")
    old = sup.pid("hang")
    assert send(old, signal.SIGSTOP)
    assert all_stopped(old)
    assert health_status(port, 1.0) == "TimeoutError"

    done = restart("hang")
    assert done.returncode == 0, done.stderr
    assert sup.services["hang"].restarts[-1]["stop"] in ("exited", "killed") and gone(old)
    assert wait_health(port, 60)
    assert post_completion(port, 4, 10.0) == (True, "")


def test_a_slow_load_restart_keeps_the_port_closed_then_serves(supervised):
    sup, start, restart, _ = supervised
    wrapper = [sys.executable, str(ROOT / "benchmarks" / "drill_faults.py"), "delayed-exec", "4", "--"]
    port = start("slow-load", prefix=wrapper)
    send(sup.pid("slow-load"), signal.SIGKILL)
    assert restart("slow-load").returncode == 0
    assert sup.services["slow-load"].restarts[-1]["stop"] == "gone"
    assert health_status(port, 1.0) == "ConnectionRefusedError"  # still sleeping before exec
    t0 = time.monotonic()
    assert wait_health(port, 60)
    assert time.monotonic() - t0 >= 1.5
    assert post_completion(port, 4, 10.0) == (True, "")


def test_an_unknown_service_is_one_line_and_exit_1(supervised):
    _, _, restart, _ = supervised
    done = restart("no-such")
    assert done.returncode == 1 and done.stderr.strip().startswith("error: expected 'restart NAME'")
