"""gpuheal.transport without SSH: placeholder expansion, the local transport, the pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuheal.config.load import GpuConfig, split_command
from gpuheal.errors import GpuhealError
from gpuheal.transport import (
    OUTPUT_CAP_BYTES,
    TIMEOUT,
    LocalTransport,
    Target,
    TransportPool,
    expand,
    remote_command_line,
)

PY = sys.executable
ECHO_ARGV = [PY, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]
HOSTILE = [
    "a b",
    "'single'",
    '"double"',
    "; touch {dir}/semicolon",
    "$(touch {dir}/dollar)",
    "`touch {dir}/backtick`",
    "&& touch {dir}/and",
    "| touch {dir}/pipe",
    "$HOME",
    "*",
    "~",
    "line\nbreak",
    "",
]


def pid_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (a zombie nobody reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def wait_gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if pid_gone(pid):
            return True
        time.sleep(0.05)
    return pid_gone(pid)


def read_pid(path: Path, within_s: float = 2.0) -> int:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text:
            return int(text)
        time.sleep(0.02)
    raise AssertionError(f"{path} never got a pid")


# --------------------------------------------------------------------------- expand


def test_expand_fills_each_placeholder_inside_its_own_argument():
    argv = expand(
        ["systemctl", "restart", "llama@{alias}.service", "--host={host}", "{endpoint}/health"],
        alias="gpu-dense", host="ct8", endpoint="http://ct8:8080",
    )
    assert argv == ["systemctl", "restart", "llama@gpu-dense.service", "--host=ct8",
                    "http://ct8:8080/health"]


def test_expand_works_on_a_config_string_split_like_a_shell():
    template = split_command("ssh-wrapper --name '{alias} x' {host}")
    assert expand(template, alias="a", host="h", endpoint="e") == ["ssh-wrapper", "--name", "a x", "h"]


def test_hostile_values_stay_one_argument_and_are_not_expanded_again():
    argv = expand(["echo", "{host}", "pre-{alias}-post"],
                  alias="{endpoint} $(id)", host="ct8; rm -rf /", endpoint="http://x")
    assert argv == ["echo", "ct8; rm -rf /", "pre-{endpoint} $(id)-post"]


def test_expand_keeps_escaped_braces_literal():
    assert expand(["awk", "{{print $1}}", "{{host}}"], alias="a", host="h", endpoint="e") == [
        "awk", "{print $1}", "{host}"]


@pytest.mark.parametrize("arg", [
    "{user}", "{0}", "{}", "{host.__class__}", "{host[0]}", "{alias!r}", "{host:>20}",
    "{host:{alias}}", "{", "}", "x{endpoint", "{HOST}",
])
def test_expand_rejects_anything_but_the_three_plain_placeholders(arg):
    with pytest.raises(GpuhealError):
        expand(["cmd", arg], alias="a", host="h", endpoint="e")


@pytest.mark.parametrize("kwargs", [
    {"alias": "a", "host": "-oProxyCommand=touch /tmp/x", "endpoint": "e"},
    {"alias": "a", "host": "h\0x", "endpoint": "e"},
    {"alias": "a", "host": 8, "endpoint": "e"},
])
def test_expand_rejects_option_like_nul_or_non_string_values(kwargs):
    with pytest.raises(GpuhealError):
        expand(["cmd", "{host}"], **kwargs)


def test_expand_rejects_a_string_template_and_an_empty_one():
    with pytest.raises(GpuhealError):
        expand("systemctl restart {alias}", alias="a", host="h", endpoint="e")
    with pytest.raises(GpuhealError):
        expand([], alias="a", host="h", endpoint="e")


def test_remote_command_line_is_quoted_and_wrapped_in_timeout():
    line = remote_command_line(["echo", "a b", "$HOME", "; rm -rf /"], 7.2)
    assert line == "timeout --kill-after=5 8 echo 'a b' '$HOME' '; rm -rf /'"


# --------------------------------------------------------------------------- local


def test_local_command_runs_and_returns_output():
    out = LocalTransport().run([PY, "-c", "print('hello')"], timeout_s=10)
    assert (out.rc, out.stdout, out.stderr, out.timed_out, out.error) == (0, "hello\n", "", False, None)
    assert out.ok and out.host is None and out.elapsed_s < 10
    assert "rc=0" in out.describe()


def test_local_nonzero_exit_is_an_outcome():
    out = LocalTransport().run([PY, "-c", "import sys; sys.stderr.write('bad'); sys.exit(3)"], 10)
    assert (out.rc, out.stderr, out.error, out.ok) == (3, "bad", None, False)


@pytest.mark.parametrize("program", ["gpuheal-no-such-program-xyz", "/nonexistent/dir/prog"])
def test_local_missing_binary_is_an_outcome_not_an_exception(program):
    out = LocalTransport().run([program, "--flag"], timeout_s=5)
    assert out.rc is None and not out.ok
    assert out.error == f"not found: {program}"


def test_local_non_executable_file_is_an_outcome(tmp_path):
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    out = LocalTransport().run([str(script)], timeout_s=5)  # no x bit: EACCES, even for root
    assert out.error == f"not executable: {script}" and out.rc is None


def test_local_timeout_kills_a_forking_hanging_command_and_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pidfile}; sleep 60"
    start = time.monotonic()
    out = LocalTransport().run(["sh", "-c", script], timeout_s=1)
    took = time.monotonic() - start
    assert out.timed_out and out.error == TIMEOUT and out.rc is None
    assert took < 2.0, f"took {took:.2f}s for a 1 s timeout"
    assert wait_gone(read_pid(pidfile), within_s=1.0), "the forked child survived the timeout"


def test_local_timeout_sigkills_children_that_ignore_sigterm(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = f"trap '' TERM; sleep 60 & echo $! > {pidfile}; while :; do sleep 1; done"
    start = time.monotonic()
    out = LocalTransport().run(["sh", "-c", script], timeout_s=1)
    assert out.timed_out and time.monotonic() - start < 2.0
    assert wait_gone(read_pid(pidfile), within_s=1.0)


def test_local_command_that_leaves_a_daemon_returns_without_killing_it(tmp_path):
    pidfile = tmp_path / "daemon.pid"
    # A restart command may start a server in the background that keeps stdout open.
    script = f"sleep 30 & echo $! > {pidfile}; echo started"
    start = time.monotonic()
    out = LocalTransport().run(["sh", "-c", script], timeout_s=10)
    pid = read_pid(pidfile)
    try:
        assert out.ok and out.stdout == "started\n"
        assert time.monotonic() - start < 2.0
        assert not pid_gone(pid), "a daemon started by a successful command must be left alone"
    finally:
        if not pid_gone(pid):
            os.kill(pid, 9)


def test_local_output_is_capped_and_fully_drained():
    code = "import sys; sys.stdout.write('x' * 1_000_000); sys.stderr.write('y' * 300_000)"
    out = LocalTransport().run([PY, "-c", code], timeout_s=10)
    assert out.rc == 0 and out.truncated
    assert out.stdout == "x" * OUTPUT_CAP_BYTES and out.stderr == "y" * OUTPUT_CAP_BYTES


def test_local_input_goes_to_stdin():
    out = LocalTransport().run([PY, "-c", "import sys; print(sys.stdin.read().upper())"], 10,
                               input="over stdin")
    assert out.stdout == "OVER STDIN\n"


def test_local_arguments_stay_literal_no_shell_ever_sees_them(tmp_path):
    args = [a.format(dir=tmp_path) for a in HOSTILE]
    out = LocalTransport().run(ECHO_ARGV + args, timeout_s=10)
    assert out.rc == 0, out.stderr
    assert json.loads(out.stdout) == args
    assert list(tmp_path.iterdir()) == [], "a shell ran something"


def test_local_expanded_hostile_host_is_one_argument(tmp_path):
    marker = tmp_path / "pwned"
    argv = expand(ECHO_ARGV + ["{host}"], alias="a", host=f"ct8; touch {marker}", endpoint="e")
    out = LocalTransport().run(argv, timeout_s=10)
    assert json.loads(out.stdout) == [f"ct8; touch {marker}"]
    assert not marker.exists()


def test_local_rejects_a_command_string():
    with pytest.raises(GpuhealError):
        LocalTransport().run("echo hi; touch /tmp/x", timeout_s=5)


# --------------------------------------------------------------------------- pool, imports


def _gpu(**kw) -> GpuConfig:
    base = dict(alias="gpu-dense", host="ct8", endpoint="http://ct8:8080", vendor="nvidia",
                vram_total_mb=24576, baseline_tok_s=74.8, vram_leak_mb_per_hour=300,
                transport="ssh")
    base.update(kw)
    return GpuConfig(**base)


def _heal(**changes):
    """The ``heal`` record of a config as loaded (defaults.yaml), with ``changes``."""
    from dataclasses import replace

    from gpuheal.config import load_config_dict

    cfg = load_config_dict({"gpus": [{"alias": "g", "host": "h", "endpoint": "http://127.0.0.1:9"}]})
    return replace(cfg.heal, **changes)


def test_target_for_gpu_and_pool_get():
    assert Target.for_gpu(_gpu(transport="local")) == Target("local")
    assert Target.for_gpu(_gpu(ssh_user="ops", ssh_port=2222)) == Target("ssh", "ct8", 2222, "ops")
    heal = _heal(ssh_user="heal", known_hosts="/etc/gpuheal/known_hosts", ssh_connect_timeout_s=3)
    assert Target.for_gpu(_gpu(), heal) == Target("ssh", "ct8", 22, "heal")
    with TransportPool.from_config(heal) as pool:
        assert pool.get(Target("local")) is pool.get(Target("local"))
        a = pool.get(Target("ssh", "ct8", 22, "ops"))
        assert a is pool.get(Target("ssh", "ct8", 22, "ops"))
        assert a is not pool.get(Target("ssh", "ct9", 22, "ops"))
        assert (a.known_hosts, a.connect_timeout_s, a.system_known_hosts) == (
            "/etc/gpuheal/known_hosts", 3.0, False)
        with pytest.raises(GpuhealError):
            pool.get(Target("telnet", "ct8"))


def test_importing_transport_loads_neither_fabric_nor_paramiko():
    code = (
        "import sys, gpuheal.transport as t\n"
        "t.expand(['x', '{host}'], alias='a', host='h', endpoint='e')\n"
        "t.LocalTransport().run(['true'], 5)\n"
        "t.TransportPool().get(t.Target('ssh', 'h'))\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'fabric', 'paramiko', 'invoke'}))\n"
    )
    proc = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_local_timeout_keeps_what_the_command_wrote_as_it_was_killed():
    """The output of a timed-out command is evidence: its SIGTERM handler's last words are read
    after the kill (as the reader threads did before the one-thread ``_collect``)."""
    script = 'trap "echo bye; exit 1" TERM; echo hi; sleep 5 & wait'
    out = LocalTransport().run(["sh", "-c", script], timeout_s=0.5)
    assert out.timed_out and out.error == TIMEOUT
    assert out.stdout == "hi\nbye\n"
