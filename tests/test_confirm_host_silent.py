"""A network blip is not a crash (issue 29 item 5, the chaos week's finding): when a poll sees a GPU's
``/health`` refused or timing out, the run asks the GPU's host over SSH (Rule 6.1's process check)
before confirming in-run. A host that does not answer either is silent as a whole — a one-poll network
blip (benign: acting on it is a false action) or the host down — and the run does not restart over an
SSH that cannot arrive: nothing fires in-run, cron's poll holds judge it (Rule 6: "host itself
unreachable → infrastructure alert"). A crashed or frozen server sits on a host that answers: confirmed
at 20 s as before. The same on every source path; and against real sockets: a SIGKILLed server's port
refused, a host whose SSH accepts and never answers (a blip's silence), refuses, or answers."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager

import pytest
from servers import closed_port, closed_url, fleet_config
from test_confirm_sources import FAULTS, NOW, observation

from gpuheal.config import load_config_dict
from gpuheal.core import confirm as core
from gpuheal.model import GpuSample
from gpuheal.state.store import StateDir
from gpuheal.steps import check, confirm
from tests.test_confirm_in_run import FakeClock

ANSWERS = b"SSH-1.0-OpenSSH_1.0\r\n"
SOURCES = ["monitor", "smi", "smi-fallback", "prometheus"]


def config(**heal):
    raw = fleet_config("http://127.0.0.1:9/gpu-data", [("gpu-a", "ct1", closed_url()), ("gpu-b", "ct2", closed_url())],
                       heal={"confirm_budget_s": 30, "confirm_interval_s": 5, **heal})
    return load_config_dict(raw)


def _confirm(tmp_path, source: str, sample: GpuSample, silent: set[str]):
    cfg, asked, reached = config(), [], []

    def prober(cfg, aliases, canary):
        asked.append(sorted(aliases))
        return {a: sample for a in aliases}

    def reach(cfg, aliases):
        reached.append(sorted(aliases))
        return silent & set(aliases)

    clock = FakeClock(jitter_s=1.1, seed=len(source))
    with StateDir(tmp_path, 1) as store:
        result = check.run(cfg, store, NOW, obs=observation(source, sample))
        after = confirm.run(cfg, store, result, clock.clock, prober, reach=reach)
    return after, asked, reached, clock


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fault", ["refused", "timeout"])
def test_a_refused_or_silent_health_on_a_silent_host_is_not_confirmed_in_run(tmp_path, source, fault):
    sample, issue, _hold_s = FAULTS[fault]
    after, asked, reached, clock = _confirm(tmp_path, source, sample, {"gpu-a"})
    assert reached == [["gpu-a"]]  # its host was asked, once, before any re-probe
    assert asked == [] and clock.sleeps == []  # no re-probe, no wait: nothing to confirm in-run
    assert [i.state for i in after.issues if i.issue == issue] == ["pending"], after.issues
    assert not after.evaluation.fired


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("fault", ["refused", "timeout"])
def test_the_same_fault_on_a_host_that_answers_is_confirmed_at_20_s(tmp_path, source, fault):
    sample, issue, hold_s = FAULTS[fault]
    after, asked, reached, _clock = _confirm(tmp_path, source, sample, set())
    assert reached == [["gpu-a"]] and asked and set(map(tuple, asked)) == {("gpu-a",)}
    fired = [i for i in after.issues if i.issue == issue and i.state == "firing"]
    assert [i.gpu for i in fired] == ["gpu-a"], after.issues


@pytest.mark.parametrize("source", SOURCES)
def test_a_silent_task_loop_behind_an_ok_health_never_asks_the_host(tmp_path, source):
    """``/health`` answered: the host is there, only the server's task loop is silent (model-stuck)."""
    sample, issue, _hold_s = FAULTS["taskloop"]
    after, _asked, reached, _clock = _confirm(tmp_path, source, sample, {"gpu-a"})
    assert reached == []
    assert [i.gpu for i in after.issues if i.issue == issue and i.state == "firing"] == ["gpu-a"]


@pytest.mark.parametrize(("error", "timed_out", "silent"), [
    ("refused", False, True), ("timeout", False, True), ("unreachable", False, False),
    ("timeout", True, False),  # connected; the check itself was slow: the host answered
    ("auth failed", False, False), ("host key unknown", False, False), ("ssh error", False, False),
    (None, False, False),
])  # fmt: skip
def test_which_transport_errors_mean_the_host_is_silent(error, timed_out, silent):
    assert core.host_silent(error, timed_out) is silent


# --------------------------------------------------------------------------- real sockets, real processes


@contextmanager
def _listener(banner: bytes | None) -> Iterator[int]:
    """A TCP listener on loopback: ``banner None`` accepts and never answers (a blip's silence: the SYN
    is answered, nothing after), else sends ``banner`` and reads until the client hangs up (a host whose
    SSH answers: an SSH-1 banner, which the client refuses at once — the host answered)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            if banner is None:
                held.append(conn)
            else:
                with closing(conn):
                    conn.sendall(banner)
                    conn.settimeout(2)
                    try:
                        while conn.recv(4096):  # read what the client says until it hangs up: no reset
                            pass
                    except OSError:
                        pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield sock.getsockname()[1]
    finally:
        stop.set()
        t.join(2)
        for c in held:
            c.close()
        sock.close()


@contextmanager
def _killed_server() -> Iterator[str]:
    """A real HTTP server process, SIGKILLed: its port now refuses (a crash)."""
    port = closed_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with closing(socket.socket()) as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()


def _ssh_config(endpoint: str, ssh_port: int):
    raw = fleet_config("http://127.0.0.1:9/gpu-data", [("gpu-a", "127.0.0.1", endpoint)],
                       heal={"confirm_budget_s": 30, "confirm_interval_s": 5, "ssh_connect_timeout_s": 1,
                             "known_hosts": "/dev/null"})  # fmt: skip
    raw["gpus"][0].update(transport="ssh", ssh_port=ssh_port, restart_command=["systemctl", "restart", "llama"])
    return load_config_dict(raw)


@pytest.mark.parametrize("host", ["accepts-never-answers", "refuses"])
def test_real_reach_a_host_silent_or_refusing_on_ssh_is_silent(host):
    with _listener(None) as silent_port:
        port = silent_port if host == "accepts-never-answers" else closed_port()
        cfg = _ssh_config(closed_url(), port)
        t0 = time.monotonic()
        assert confirm.real_reach(cfg, ["gpu-a"]) == {"gpu-a"}
        assert time.monotonic() - t0 < 10  # one connect timeout (1 s here), not a hang


def test_real_reach_a_host_whose_ssh_answers_is_not_silent():
    with _listener(ANSWERS) as port:
        assert confirm.real_reach(_ssh_config(closed_url(), port), ["gpu-a"]) == set()


def test_real_reach_a_real_sshd_answers(sshd):
    cfg = _ssh_config(closed_url(), sshd.port)
    assert confirm.real_reach(cfg, ["gpu-a"]) == set()  # it answered (here: unknown host key), not silent


def test_real_reach_never_asks_a_gpu_on_this_machine():
    cfg = load_config_dict(fleet_config("http://127.0.0.1:9/gpu-data", [("gpu-a", "ct1", closed_url())]))
    assert confirm.real_reach(cfg, ["gpu-a"]) == set()  # transport local


@pytest.mark.parametrize("host", ["answers", "silent"])
def test_a_sigkilled_server_is_confirmed_in_run_only_on_a_host_that_answers(tmp_path, host):
    """Real processes end to end (the re-probes and the host's SSH are real sockets, the sleeps fake): a
    SIGKILLed server's refused port on a host whose SSH answers fires Rule 6 in-run at 20 s; the same
    refusal on a host whose SSH accepts and never answers (a network blip) is left to cron's polls."""
    with _killed_server() as endpoint, _listener(ANSWERS if host == "answers" else None) as port:
        cfg = _ssh_config(endpoint, port)
        refused = GpuSample(endpoint="refused")
        obs = observation("monitor", refused)
        obs = type(obs)(at=obs.at, gpus={"gpu-a": refused}, monitor_ok=True, source="monitor")
        clock = FakeClock(jitter_s=0.5)
        with StateDir(tmp_path, 1) as store:
            result = check.run(cfg, store, NOW, obs=obs)
            after = confirm.run(cfg, store, result, clock.clock)
    states = [i.state for i in after.issues if i.issue == "host-unreachable"]
    if host == "answers":
        assert states == ["firing"] and 15 <= sum(clock.sleeps) <= 30, (after.issues, clock.sleeps)
    else:
        assert states == ["pending"] and clock.sleeps == [], after.issues
