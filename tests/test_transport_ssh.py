"""SshTransport against a real sshd on 127.0.0.1 (fixture ``sshd``, tests/sshd.py). No mocks.

sshd runs on this machine as this user, so a test can look at the filesystem and the process
table to see what the remote side really did.
"""

from __future__ import annotations

import socket
import time
from contextlib import closing
from pathlib import Path

import pytest

from gpuheal.transport import (
    AUTH_FAILED,
    HOST_KEY_CHANGED,
    HOST_KEY_UNKNOWN,
    OUTPUT_CAP_BYTES,
    REFUSED,
    REMOTE_BACKSTOP_S,
    TIMEOUT,
    SshTransport,
    Target,
    TransportPool,
)

try:
    from tests.sshd import free_port
    from tests.test_transport import HOSTILE, read_pid, wait_gone
except ImportError:  # tests/ itself on sys.path (pytest's rootdir conftest insertion)
    from sshd import free_port
    from test_transport import HOSTILE, read_pid, wait_gone

pytestmark = pytest.mark.sshd


def accepted_logins(sshd) -> int:
    return sshd.log_path.read_text(errors="replace").count("Accepted publickey")


def test_command_runs_and_returns_stdout_stderr_rc(sshd):
    with sshd.transport() as t:
        out = t.run(["sh", "-c", "echo out; echo err >&2; exit 7"], timeout_s=10)
    assert (out.rc, out.stdout, out.stderr, out.error, out.timed_out) == (7, "out\n", "err\n", None, False)
    assert out.host == sshd.host


def test_remote_argv_is_quoted_never_interpolated(sshd, tmp_path):
    args = [a.format(dir=tmp_path) for a in HOSTILE]
    with sshd.transport() as t:
        out = t.run(["printf", "[%s]\\n", *args], timeout_s=10)
    assert out.rc == 0, out.stderr
    assert out.stdout == "".join(f"[{a}]\n" for a in args)
    assert "[$HOME]" in out.stdout and "[a b]" in out.stdout
    assert list(tmp_path.iterdir()) == [], "the remote shell ran something"


def test_unknown_host_key_is_refused_and_nothing_is_added(sshd, tmp_path):
    marker = tmp_path / "ran"
    with sshd.transport(known_hosts=sshd.empty_known_hosts) as t:
        out = t.run(["touch", str(marker)], timeout_s=10)
    assert out.error == HOST_KEY_UNKNOWN and out.rc is None and not out.ok
    assert f"host key for {sshd.host} not in {sshd.empty_known_hosts}" in out.detail
    assert "ssh-keyscan" in out.detail and "SHA256:" in out.detail
    assert not marker.exists()
    assert Path(sshd.empty_known_hosts).read_text() == "", "the key must never be auto-added"


def test_unreadable_known_hosts_file_refuses(sshd, tmp_path):
    with sshd.transport(known_hosts=tmp_path / "missing") as t:
        out = t.run(["true"], timeout_s=10)
    assert out.error == HOST_KEY_UNKNOWN and "cannot read known_hosts" in out.detail


def test_changed_host_key_is_refused_with_its_own_error(sshd, tmp_path):
    before = Path(sshd.wrong_known_hosts).read_text()
    marker = tmp_path / "ran"
    with sshd.transport(known_hosts=sshd.wrong_known_hosts) as t:
        out = t.run(["touch", str(marker)], timeout_s=10)
    assert out.error == HOST_KEY_CHANGED and out.rc is None
    assert "CHANGED" in out.detail and "man-in-the-middle" in out.detail
    assert not marker.exists() and Path(sshd.wrong_known_hosts).read_text() == before


def test_host_key_policy_is_reject_never_auto_add(sshd):
    import paramiko

    with sshd.transport() as t:
        assert t.run(["true"], 10).ok
        policy = t._conn.client._policy
    assert isinstance(policy, paramiko.RejectPolicy)
    assert not isinstance(policy, (paramiko.AutoAddPolicy, paramiko.WarningPolicy))


def test_auth_failure_is_a_clean_outcome(sshd):
    with sshd.transport(key_filename=sshd.unauthorized_key_filename) as t:
        out = t.run(["true"], timeout_s=10)
        again = t.run(["true"], timeout_s=10)
    assert out.error == AUTH_FAILED and out.rc is None
    # A failed connect is remembered for the run: no second attempt, no second wait.
    assert again.error == AUTH_FAILED and again.elapsed_s < 0.1 and t.connects == 0


def test_unreadable_key_file_is_an_auth_failure(sshd, tmp_path):
    missing = tmp_path / "no_such_key"
    with sshd.transport(key_filename=missing) as t:
        out = t.run(["true"], timeout_s=10)
    assert out.error == AUTH_FAILED and str(missing) in out.detail


def test_connection_refused_on_a_closed_port_is_clean(sshd):
    with sshd.transport(port=free_port()) as t:
        out = t.run(["true"], timeout_s=10)
    assert out.error == REFUSED and out.rc is None and out.elapsed_s < 2


def test_connect_timeout_when_no_banner_comes():
    with closing(socket.socket()) as silent:  # accepts TCP (backlog) but never speaks SSH
        silent.bind(("127.0.0.1", 0))
        silent.listen(5)
        port = silent.getsockname()[1]
        t = SshTransport("127.0.0.1", port, "nobody", known_hosts="/dev/null",
                         key_filename="/dev/null", connect_timeout_s=1)
        start = time.monotonic()
        out = t.run(["true"], timeout_s=10)
        t.close()
    assert out.error == TIMEOUT and not out.timed_out and time.monotonic() - start < 3


def test_missing_remote_program_is_not_found(sshd):
    with sshd.transport() as t:
        out = t.run(["gpuheal-no-such-program-xyz"], timeout_s=10)
    assert out.rc == 127 and out.error == "not found: gpuheal-no-such-program-xyz"


def test_remote_hanging_command_is_killed_at_its_timeout(sshd, tmp_path):
    pidfile = tmp_path / "child.pid"
    with sshd.transport() as t:
        assert t.run(["true"], 10).ok  # connect first: time only the command
        start = time.monotonic()
        out = t.run(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], timeout_s=1)
        took = time.monotonic() - start
    assert out.timed_out and out.error == TIMEOUT and out.rc is None
    assert took < 1 + REMOTE_BACKSTOP_S, f"took {took:.2f}s for a 1 s timeout"
    # remote `timeout 1` SIGTERMs the whole remote process group, the forked child included
    assert wait_gone(read_pid(pidfile), within_s=2.0), "the remote child survived"


def test_remote_command_ignoring_sigterm_is_cut_off_and_later_sigkilled(sshd, tmp_path):
    pidfile = tmp_path / "child.pid"
    script = f"trap '' TERM; sleep 60 & echo $! > {pidfile}; while :; do sleep 1; done"
    with sshd.transport() as t:
        assert t.run(["true"], 10).ok
        start = time.monotonic()
        out = t.run(["sh", "-c", script], timeout_s=1)
        took = time.monotonic() - start
    assert out.timed_out and out.error == TIMEOUT
    assert took < 1 + REMOTE_BACKSTOP_S + 0.5
    # remote `timeout --kill-after=5 1`: SIGKILL at ~6 s after the start
    assert wait_gone(read_pid(pidfile), within_s=8.0 - took), "timeout --kill-after did not act"


def test_remote_output_is_capped_and_input_reaches_stdin(sshd):
    with sshd.transport() as t:
        big = t.run(["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x"], timeout_s=10)
        echoed = t.run(["tr", "a-z", "A-Z"], timeout_s=10, input="over ssh")
    assert big.rc == 0 and big.truncated and big.stdout == "x" * OUTPUT_CAP_BYTES
    assert echoed.stdout == "OVER SSH"


def test_pool_reuses_one_connection_per_host_and_closes_it(sshd):
    logins = accepted_logins(sshd)
    target = Target("ssh", sshd.host, sshd.port, sshd.user)
    with TransportPool(known_hosts=sshd.known_hosts, key_filename=sshd.key_filename,
                       connect_timeout_s=5) as pool:
        first = pool.get(target).run(["echo", "one"], timeout_s=10)
        second = pool.get(target).run(["echo", "two"], timeout_s=10)
        transport = pool.get(target)
        assert (first.stdout, second.stdout) == ("one\n", "two\n")
        assert transport.connects == 1 and transport.connected
    assert not transport.connected
    deadline = time.monotonic() + 2
    while accepted_logins(sshd) == logins and time.monotonic() < deadline:
        time.sleep(0.05)
    assert accepted_logins(sshd) - logins == 1, "sshd saw more than one login"

