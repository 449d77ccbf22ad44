"""``doctor`` reads the llama-server unit's stop timeout and restart kill signal over the transport
when the restart command is a ``systemctl restart`` of it (issues 20, 28): a frozen server ignores
SIGTERM, so unless a restart sends SIGKILL first (``RestartKillSignal=SIGKILL``) a stop timeout past
10 s warns, with the drop-in that fixes it (a systemd older than 244 does not show
``RestartKillSignal``: its fix is the short stop timeout alone). Tested with a stand-in ``systemctl``
on PATH printing systemd's real format, and with garbage."""

from __future__ import annotations

import math

import pytest

from gpuheal.doctor.checks import command_checks
from gpuheal.parse.systemd import parse_timespan_s, timeout_stop_s
from gpuheal.transport import LocalTransport

VALUES = {"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:9"}


@pytest.mark.parametrize("text, want", [
    ("1min 30s", 90.0), ("15s", 15.0), ("500ms", 0.5), ("2min 5s 300ms", 125.3), ("1h", 3600.0),
    ("infinity", math.inf), ("", None), ("90", None), ("1 min", None), ("-5s", None), ("15s; rm -rf /", None),
    ("1min 30s " * 50, None),
])
def test_parse_timespan(text, want):
    assert parse_timespan_s(text) == want


def test_timeout_stop_reads_only_its_property():
    assert timeout_stop_s("TimeoutStopUSec=1min 30s\n") == 90.0
    assert timeout_stop_s("TimeoutStartUSec=15s\n") is None
    assert timeout_stop_s("\x00\xff garbage") is None


def fake_systemctl(tmp_path, monkeypatch, show_output: str, show_rc: int = 0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "show.txt").write_text(show_output)
    script = bin_dir / "systemctl"
    script.write_text(f"""#!/bin/sh
case "$1" in
  cat) echo "# /etc/systemd/system/llama-server.service"; echo "[Service]" ;;
  show) cat {tmp_path / 'show.txt'}; exit {show_rc} ;;
  *) exit 1 ;;
esac
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def rows(template=("systemctl", "restart", "llama-server")):
    out = command_checks(LocalTransport(), "gpu-a", "restart_command", template, VALUES, False)
    return {r.check: r for r in out}


SHOW = "KillSignal=15\nRestartKillSignal={restart}\nTimeoutStopUSec={stop}\n"  # systemd >= 244's answer


def test_the_default_90_s_warns_and_says_how_to_fix(tmp_path, monkeypatch):
    fake_systemctl(tmp_path, monkeypatch, SHOW.format(restart=15, stop="1min 30s"))
    row = rows()["stop timeout"]
    assert row.status == "warn" and "90 s" in row.detail and "MTTR target 90 s" in row.detail
    assert row.fix == ("systemctl edit llama-server: [Service] RestartKillSignal=SIGKILL and TimeoutStopSec=10 "
                       "(README: install)")


@pytest.mark.parametrize("stop, status", [("15s", "warn"), ("10s", "ok"), ("5s", "ok"), ("infinity", "warn")])
def test_past_ten_seconds_a_frozen_servers_restart_breaks_the_target(tmp_path, monkeypatch, stop, status):
    fake_systemctl(tmp_path, monkeypatch, SHOW.format(restart=15, stop=stop))
    got = rows()
    assert got["restart_command"].status == "ok"
    assert got["stop timeout"].status == status


@pytest.mark.parametrize("show", [SHOW.format(restart=9, stop="1min 30s"),  # RestartKillSignal=SIGKILL
                                  "KillSignal=9\nTimeoutStopUSec=1min 30s\n"])  # systemd < 244, KillSignal=SIGKILL
def test_a_restart_that_sends_sigkill_first_waits_no_stop_timeout(tmp_path, monkeypatch, show):
    fake_systemctl(tmp_path, monkeypatch, show)
    row = rows()["stop timeout"]
    assert row.status == "ok" and "SIGKILL first" in row.detail and "=9" in row.detail


def test_a_systemd_without_restart_kill_signal_is_told_the_short_stop_timeout(tmp_path, monkeypatch):
    fake_systemctl(tmp_path, monkeypatch, "KillSignal=15\nTimeoutStopUSec=1min 30s\n")  # systemd 239 (RHEL 8)
    row = rows()["stop timeout"]
    assert row.status == "warn" and row.fix == "systemctl edit llama-server: [Service] TimeoutStopSec=5 (README: install)"


@pytest.mark.parametrize("restart", ["SIGKILL", "-9", "9999", "9; rm -rf /", ""])
def test_a_restart_kill_signal_that_is_not_a_number_is_not_sigkill(tmp_path, monkeypatch, restart):
    fake_systemctl(tmp_path, monkeypatch, SHOW.format(restart=restart, stop="1min 30s"))
    assert rows()["stop timeout"].status == "warn"


@pytest.mark.parametrize("output, rc", [("TimeoutStopUSec=soon\n", 0), ("\x1b[31mboom\x1b[0m\n", 0), ("", 1)])
def test_garbage_or_a_failure_is_not_known_in_one_line(tmp_path, monkeypatch, output, rc):
    fake_systemctl(tmp_path, monkeypatch, output, rc)
    row = rows()["stop timeout"]
    assert row.status == "warn" and "not known" in row.detail and "\n" not in row.detail and "\x1b" not in row.detail


def test_not_asked_for_other_commands_or_verbs(tmp_path, monkeypatch):
    fake_systemctl(tmp_path, monkeypatch, "TimeoutStopUSec=1min 30s\n")
    assert "stop timeout" not in rows(("systemctl", "stop", "llama-server"))
    out = command_checks(LocalTransport(), "gpu-a", "kill_command", ("systemctl", "restart", "x"), VALUES, False)
    assert all(r.check != "stop timeout" for r in out)


def test_a_restart_may_run_the_stop_timeout_longer_than_other_commands():
    from gpuheal.actions.execute import step_timeout_s
    from gpuheal.config import load_config_dict
    from gpuheal.core.catalog import ACTIONS

    cfg = load_config_dict({"heal": {"command_timeout_s": 60, "stop_timeout_s": 15},
                            "gpus": [{"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:9"}]})
    assert step_timeout_s(cfg, ACTIONS["restart-llama-server"], 60.0) == 75.0
    assert step_timeout_s(cfg, ACTIONS["shed-load"], 60.0) == 60.0
