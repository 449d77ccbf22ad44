"""Rule 6 on a real llama-server (issue 27 item 8): "not running → start, running but unreachable →
restart". The server runs under the drill's systemd stand-in (``benchmarks/drill_supervisor.py``), here
also answering ``start NAME`` the way ``systemctl start`` does (nothing when it runs; else spawn it).
The faults are made real: SIGKILL (down: no process any more) and SIGSTOP (hung: the process is there,
``/health`` times out). ``heal --apply`` at three jittered cron times fires ``host-unreachable``, looks
with ``pgrep`` on the endpoint's port, and runs ``start_command`` for the dead one and
``restart_command`` for the hung one; the audit says which case it was and which ran, and the next run
resolves it after a real completion."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from drill import API_KEY, server_argv, wait_health  # noqa: E402
from drill_supervisor import Service, Supervisor  # noqa: E402

pytestmark = pytest.mark.realserver

STOP_TIMEOUT_S = 2.0
# cron starts a second or two late; the 4th run is past the startup grace (30 s): it judges the fix
CRON_TIMES = ("2026-07-18T08:00:01.3Z", "2026-07-18T08:01:00.8Z", "2026-07-18T08:02:02.1Z", "2026-07-18T08:03:01.6Z")
START_CLIENT = """
import socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.settimeout(60)
    s.connect(sys.argv[1])
    s.sendall(("start " + sys.argv[2] + chr(10)).encode())
    answer = s.makefile("r").readline().strip()
print(answer)
sys.exit(0 if answer.startswith("ok ") else 1)
"""


class Systemd(Supervisor):
    """The drill's supervisor, answering ``start NAME`` too; ``verbs`` records what gpuheal asked for."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.verbs: list[str] = []

    def start(self, name: str) -> str:
        service = self.services[name]
        with self._lock:
            if service.proc is not None and service.proc.poll() is None:
                return "already running"
            if service.proc is not None:
                service.proc.wait(10)  # reaped (systemd has already)
            self._spawn(service, restart=False)
            return "started"

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            words = conn.makefile("r").readline().split()
            if len(words) == 2 and words[1] in self.services and words[0] in ("start", "restart"):
                self.verbs.append(words[0])
                if words[0] == "start":
                    conn.sendall(f"ok {words[1]} {self.start(words[1])}\n".encode())
                    return
                rec = self.restart(words[1])
                conn.sendall(f"ok {words[1]} stop={rec['stop']}\n".encode())
                return
            conn.sendall(b"error: expected 'start NAME' or 'restart NAME'\n")


@pytest.fixture
def unit(llama_server_bin, tiny_model, tmp_path):
    run_dir = Path(tempfile.mkdtemp(prefix="r6-"))  # short: a Unix socket path has ~100 bytes
    sup = Systemd(run_dir / "sup.sock", STOP_TIMEOUT_S)
    sup.serve()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sup.add(Service("llama", server_argv(llama_server_bin, tiny_model, port, busy=False), run_dir / "llama.log"))
    assert wait_health(port, 60), (run_dir / "llama.log").read_text()[-2000:]
    client = run_dir / "start_client.py"
    client.write_text(START_CLIENT)
    config = tmp_path / "gpuheal.yaml"
    config.write_text(json.dumps({
        "litellm": {"api_key": API_KEY},
        "probe": {"timeout_s": 1.0},
        "heal": {"reload_wait_s": 30, "verify_timeout_s": 30, "startup_grace_s": 30,
                 "confirm_budget_s": 0},  # cron polls only: the in-run confirmation is test_confirm_real.py
        "gpus": [{"alias": "real", "host": "box", "gpu_index": 0, "endpoint": f"http://127.0.0.1:{port}",
                  "transport": "local",
                  "restart_command": [sys.executable, str(ROOT / "benchmarks" / "drill_supervisor.py"),
                                      str(sup.socket_path), "restart", "llama"],
                  "start_command": [sys.executable, str(client), str(sup.socket_path), "llama"]}],
    }))  # fmt: skip
    try:
        yield sup, port, config
    finally:
        sup.stop_all()
        sup.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def gpuheal(tmp_path: Path, config: Path, now: str) -> dict:
    """``heal --apply --json`` as cron runs it; a stand-in nvidia-smi (no GPU here) prints a real row."""
    from smi_captures import NVIDIA_CAPTURES, multi_gpu_csv

    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        (tmp_path / "rows.csv").write_text(multi_gpu_csv(NVIDIA_CAPTURES[:1]))
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat {tmp_path / 'rows.csv'}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GPUHEAL_NOW": now}
    proc = subprocess.run([sys.executable, "-m", "gpuheal", "--config", str(config), "--state-dir",
                           str(tmp_path / "state"), "heal", "--apply", "--json"], capture_output=True, text=True,
                          env=env, timeout=180)  # fmt: skip
    assert proc.returncode in (0, 1, 2), proc.stderr
    return json.loads(proc.stdout)


def rule6_lines(tmp_path: Path) -> list[dict]:
    path = tmp_path / "state" / "gpu-self-heal-log.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["issue"] == "host-unreachable"]


@pytest.mark.parametrize(("fault", "ran", "case"), [(signal.SIGKILL, "start", "down: llama-server is not running"),
                                                    (signal.SIGSTOP, "restart", "hung: llama-server runs")])
def test_a_dead_server_is_started_and_a_hung_one_restarted(unit, tmp_path, fault, ran, case):
    sup, port, config = unit
    old = sup.pid("llama")
    os.kill(old, fault)
    if fault == signal.SIGKILL:
        sup.services["llama"].proc.wait(10)  # reaped, as systemd does at once
    docs = [gpuheal(tmp_path, config, now) for now in CRON_TIMES[:3]]
    states = [[i["state"] for i in d["issues"] if i["issue"] == "host-unreachable"] for d in docs]
    assert states[:2] == [["pending"], ["pending"]], states
    assert sup.verbs == [ran], sup.verbs  # one command, the right one
    assert sup.pid("llama") != old and wait_health(port, 30)
    acted = [a for a in docs[2]["actions"] if a["issue"] == "host-unreachable"]
    assert [(a["action"], a["result"]) for a in acted] == [("restart-llama-server", "pending")], acted
    after = gpuheal(tmp_path, config, CRON_TIMES[3])
    assert not [i for i in after["issues"] if i["issue"] == "host-unreachable"], after["issues"]
    lines = rule6_lines(tmp_path)
    assert [(r["phase"], r["result"]) for r in lines] == [("intent", "pending"), ("verification", "resolved")]
    outcome = lines[-1]
    process = outcome["evidence"]["process"]
    assert process["ran"] == ran and process["check"].startswith("pgrep -af llama-server")
    assert outcome["detected"]["process"].startswith(case) and outcome["detected"]["process"].endswith(f"{ran}ed")
    if ran == "restart":
        assert process["state"] == "running" and process["pids"] == [old]
    else:
        assert process["state"] == "not-running" and outcome["steps"][0]["note"].startswith("start:")
    assert outcome["steps"][0]["command"][-2:] == [str(sup.socket_path), "llama"] if ran == "start" else True
    assert outcome["checked"]["ok"] is True and outcome["verification"]["completion_s"] is not None
    # no LiteLLM configured: not known, never a pass — resolved on the probe and the completion alone
    assert outcome["verification"]["litellm"] == "not configured" and outcome["verification"]["litellm_means"]
