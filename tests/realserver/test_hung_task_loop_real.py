"""A hung task loop behind a healthy ``/health``, on a real llama-server (issue 20; llama.cpp#27388).

The server's main thread — its task loop — is stopped with ptrace (:mod:`taskloop`); its HTTP threads
run on. ``gpuheal check`` sees ``/health`` ok and ``/metrics`` / ``/slots`` silent; ``heal --apply`` at
three jittered cron times fires ``model-stuck`` and restarts it through a stand-in for ``systemctl
restart`` (SIGTERM, a stop timeout, SIGKILL, start — a hung server ignores SIGTERM), and the restarted
server proves itself with a real completion. Its busy twin — every slot generating, more requests
deferred — answers ``/metrics`` between decode steps and is never touched.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from taskloop import PtraceDenied, freeze_task_loop  # noqa: E402

pytestmark = pytest.mark.realserver

http = requests.Session()
http.trust_env = False
# cron starts a second or two late: three polls a jittered minute apart
CRON_TIMES = ("2026-07-18T08:00:01.3Z", "2026-07-18T08:01:00.8Z", "2026-07-18T08:02:02.1Z")
STOP_TIMEOUT_S = 2.0  # the stand-in unit's TimeoutStopSec
RESTART_SCRIPT = """
import pathlib, sys, time
d = pathlib.Path(sys.argv[1]); (d / "done").unlink(missing_ok=True); (d / "request").write_text("restart")
end = time.monotonic() + 60
while time.monotonic() < end and not (d / "done").exists():
    time.sleep(0.05)
sys.exit(0 if (d / "done").exists() else 1)
"""


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    from make_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("long-model") / "long.gguf", n_embd=512, n_layer=6, n_ff=2048)


def _env(tmp_path: Path, now: str) -> dict[str, str]:
    """A stand-in nvidia-smi (no GPU here) printing one real captured row; the clock pinned."""
    from smi_captures import NVIDIA_CAPTURES, multi_gpu_csv

    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir(parents=True)
        rows = tmp_path / "rows.csv"
        rows.write_text(multi_gpu_csv(NVIDIA_CAPTURES[:1]))
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat {rows}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GPUHEAL_NOW": now}


def _config(tmp_path: Path, srv, restart: str) -> Path:
    path = tmp_path / "gpuheal.yaml"
    path.write_text(json.dumps({
        "litellm": {"api_key": srv.api_key},
        "probe": {"timeout_s": 2.0},
        "heal": {"reload_wait_s": 30, "verify_timeout_s": 30, "startup_grace_s": 30,
                 "confirm_budget_s": 0},  # cron polls only: the in-run confirmation is test_confirm_real.py
        "gpus": [{"alias": "real", "host": "box", "gpu_index": 0, "endpoint": srv.url, "transport": "local",
                  "restart_command": restart}],
    }))
    return path


def _gpuheal(tmp_path: Path, config: Path, now: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "gpuheal", "--config", str(config), "--state-dir",
                           str(tmp_path / "state"), *args, "--json"], capture_output=True, text=True,
                          env=_env(tmp_path, now), timeout=180)
    assert proc.returncode in (0, 1, 2), proc.stderr
    return json.loads(proc.stdout)


def _stuck(doc: dict) -> list[dict]:
    return [i for i in doc["issues"] if i["issue"] == "model-stuck"]


class Supervisor:
    """What systemd does for ``systemctl restart``: SIGTERM, wait the stop timeout, SIGKILL, start the
    unit again on the same port. The freeze ends before the killed process is reaped."""

    def __init__(self, factory, srv, frozen, work: Path) -> None:
        self.factory, self.srv, self.frozen, self.work = factory, srv, frozen, work
        self.new = None
        self.killed = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        request = self.work / "request"
        while not request.exists():
            time.sleep(0.05)
        request.unlink()
        old = self.srv
        old.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and _state(old.proc.pid) not in ("Z", "X", None):
            time.sleep(0.05)
        if _state(old.proc.pid) not in ("Z", "X", None):
            old.proc.kill()
            self.killed = True
        self.frozen.end()
        old.proc.wait(10)
        LlamaServer = type(old)
        self.new = LlamaServer(old.binary, old.model, port=old.port, api_key=old.api_key,
                               args=["-c", "2048", "-np", "2", "-t", "2", "--metrics"],
                               log_path=old.log_path.with_suffix(".restarted.log"))
        self.factory.servers.append(self.new)
        self.new.wait_ready()
        (self.work / "done").write_text("started")

    def join(self) -> None:
        self._thread.join(60)


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def test_a_hung_task_loop_is_seen_fired_at_the_third_poll_restarted_and_proven(real_llama_server, tmp_path):
    srv = real_llama_server()
    work = tmp_path / "unit"
    work.mkdir()
    restart = shlex.join([sys.executable, "-c", RESTART_SCRIPT, str(work)])
    config = _config(tmp_path, srv, restart)
    try:
        freeze = freeze_task_loop(srv.proc.pid)
        frozen = freeze.__enter__()
    except PtraceDenied as exc:
        pytest.skip(f"ptrace is not permitted here, so a task loop cannot be frozen: {exc}")
    supervisor = Supervisor(real_llama_server, srv, frozen, work)
    try:
        assert http.get(srv.url + "/health", timeout=2).json() == {"status": "ok"}
        seen = _gpuheal(tmp_path / "check", config, CRON_TIMES[0], "check")
        g = seen["gpus"]["real"]
        assert (g["endpoint"], g["metrics"], g["slots"]) == ("ok", "timeout", "timeout"), g
        docs = [_gpuheal(tmp_path, config, now, "heal", "--apply") for now in CRON_TIMES]
    finally:
        freeze.__exit__(None, None, None)
        supervisor.join()
    assert [[i["state"] for i in _stuck(d)] for d in docs[:2]] == [[], ["pending"]]
    fired = _stuck(docs[2])
    assert fired and fired[0]["fired_at"] == "2026-07-18T08:02:02Z", docs[2]["issues"]
    before = fired[0]["detected"]["before_action"]  # fired and acted on in this same run
    assert before["source"] == "llama-server task loop" and before["polls_stalled"] == 3
    assert before["answered"] == ["/health"] and before["not_answered"] == ["/metrics", "/slots"]
    actions = [a for a in docs[2]["actions"] if a.get("issue") == "model-stuck"]
    assert [(a["action"], a["result"]) for a in actions] == [("restart-llama-server", "pending")], actions
    assert supervisor.killed, "a hung llama-server ignores SIGTERM: the stop timeout's SIGKILL ended it"
    after = _gpuheal(tmp_path, config, "2026-07-18T08:03:01.6Z", "heal", "--apply")
    assert after["gpus"]["real"]["metrics"] == "ok" and _stuck(after) == [], after["issues"]
    audit = [json.loads(line) for line in (tmp_path / "state" / "gpu-self-heal-log.jsonl").read_text().splitlines()]
    assert [r["issue"] for r in audit if r.get("result") == "resolved"] == ["model-stuck"]
    # the attempt's one outcome line (issue 27 item 13): the restart's own proof, then the proving reading
    proof = [r for r in audit if r.get("phase") == "verification" and r.get("action") == "restart-llama-server"][-1]
    assert proof["checked"]["ok"] is True and proof["checked"]["completion_s"] < 30, proof
    assert proof["verification"]["metrics"] == "ok" and proof["verification"]["completion_s"] is not None, proof
    new = supervisor.new
    r = http.post(new.url + "/completion", json={"prompt": "hello", "n_predict": 4}, headers=new.auth, timeout=30)
    assert r.status_code == 200 and r.json()["timings"]["predicted_n"] == 4


def test_a_busy_server_with_every_slot_taken_and_requests_deferred_never_fires(
        real_llama_server, long_model, tmp_path):
    srv = real_llama_server(long_model, n_parallel=2, threads=1, ctx_size=8192)
    config = _config(tmp_path, srv, "false")
    out: list = []

    def generate(n_predict: int) -> None:
        try:
            r = http.post(srv.url + "/completion", json={"prompt": "hello world", "n_predict": n_predict,
                                                          "cache_prompt": False}, headers=srv.auth, timeout=600)
            out.append(r.status_code)
        except requests.RequestException as exc:
            out.append(type(exc).__name__)

    for n in (3000, 3000, 50, 50):  # both slots generating a long answer, two more deferred
        threading.Thread(target=generate, args=(n,), daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = http.get(srv.url + "/metrics", headers=srv.auth, timeout=5).text
        if "llamacpp:requests_processing 2" in m and "llamacpp:requests_deferred 2" in m:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the server never showed 2 requests processing and 2 deferred")
    docs = [_gpuheal(tmp_path, config, now, "heal", "--apply") for now in CRON_TIMES + ("2026-07-18T08:03:01.7Z",)]
    for doc in docs:
        g = doc["gpus"]["real"]
        assert g["metrics"] == "ok" and g["requests_processing"] == 2 and g["slots_busy"] == 2, g
        assert _stuck(doc) == [] and doc["actions"] == []
    decodes = [d["gpus"]["real"]["n_decode_total"] for d in docs]
    assert decodes == sorted(decodes) and decodes[-1] > decodes[0]
    srv.stop()


def _answers(url: str, key: str | None) -> dict[str, object]:
    """Each path's status code, or "timeout": what a client sees of a hung task loop."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    out: dict[str, object] = {}
    for method, path in (("GET", "/health"), ("GET", "/props"), ("GET", "/metrics"), ("GET", "/slots"),
                         ("POST", "/completion")):
        try:
            r = http.request(method, url + path, headers=headers, timeout=1.5,
                             json={"prompt": "hi", "n_predict": 1} if method == "POST" else None)
            out[path] = r.status_code
        except requests.Timeout:
            out[path] = "timeout"
    return out


def test_the_simulators_taskloop_hang_answers_as_the_frozen_real_server(real_llama_server):
    """gpuheal/sim's ``taskloop-hang`` is a look-alike: it must answer path by path, and be sensed,
    exactly as the real server with its main thread ptrace-stopped."""
    from test_sim import scenario

    from gpuheal.config import load_config_dict
    from gpuheal.sim.fleet import SimFleet
    from gpuheal.sources.sense import sense

    srv = real_llama_server()
    fleet = SimFleet(scenario([{"at": 0, "gpu": "gpu-dense", "fault": "taskloop-hang"}]), ports="ephemeral").start()
    try:
        sim_url = fleet.endpoints["gpu-dense"]
        sim_key = "not-needed"  # the simulated servers' default --api-key (sim/scenario.py)
        try:
            with freeze_task_loop(srv.proc.pid):
                real = _answers(srv.url, srv.api_key)
                real_obs = sense(_sense_config(load_config_dict, srv.url, srv.api_key), datetime_now())
        except PtraceDenied as exc:
            pytest.skip(f"ptrace is not permitted here, so a task loop cannot be frozen: {exc}")
        sim = _answers(sim_url, sim_key)
        sim_obs = sense(_sense_config(load_config_dict, sim_url, sim_key), datetime_now())
    finally:
        fleet.stop()
    assert real == {"/health": 200, "/props": 200, "/metrics": "timeout", "/slots": "timeout",
                    "/completion": "timeout"}
    assert sim == real
    pick = [(g.endpoint, g.metrics, g.slots, g.n_decode_total) for g in (real_obs.gpus["x"], sim_obs.gpus["x"])]
    assert pick[0] == pick[1] == ("ok", "timeout", "timeout", None)


def _sense_config(load, url: str, key: str | None):
    return load({"litellm": {"api_key": key or ""}, "probe": {"timeout_s": 1.5},
                 "gpus": [{"alias": "x", "host": "127.0.0.1", "endpoint": url, "transport": "local"}]})


def datetime_now():
    from datetime import UTC, datetime

    return datetime(2026, 7, 18, 8, 0, 1, 300000, tzinfo=UTC)


def test_a_canary_catches_a_hung_server_started_without_metrics_and_slots(real_llama_server):
    """Without ``--metrics`` and with ``--no-slots`` no task-loop endpoint exists: ``probe.canary``'s
    1-token completion is the signal. Idle: it answers; frozen: it does not, a stalled poll."""
    from gpuheal.config import load_config_dict
    from gpuheal.core.taskloop import classify
    from gpuheal.sources.sense import sense

    srv = real_llama_server(metrics=False, extra_args=["--no-slots"])
    cfg = load_config_dict({"litellm": {"api_key": srv.api_key}, "probe": {"timeout_s": 2.0, "canary": {
        "enabled": True, "timeout_s": 2.0}}, "gpus": [{"alias": "x", "host": "127.0.0.1", "endpoint": srv.url,
                                                       "transport": "local"}]})
    idle = sense(cfg, datetime_now()).gpus["x"]
    assert (idle.endpoint, idle.metrics, idle.slots, idle.canary) == ("ok", "disabled", "disabled", "ok")
    assert classify(idle)[0] is False
    try:
        with freeze_task_loop(srv.proc.pid):
            hung = sense(cfg, datetime_now()).gpus["x"]
    except PtraceDenied as exc:
        pytest.skip(f"ptrace is not permitted here, so a task loop cannot be frozen: {exc}")
    assert (hung.endpoint, hung.canary) == ("ok", "timeout")
    assert classify(hung) == (True, ["/health"], ["/completion"])


def test_a_hung_task_loop_is_confirmed_and_restarted_within_one_run(real_llama_server, tmp_path):
    """Issue 28 item 1: the same freeze, ONE ``heal --apply`` run (real clock for its re-probes): it
    re-probes the silent task loop and restarts it once ``grace_s`` (30 s) of evidence is in, inside the
    cron minute; ``detected.probes`` lists each probe and its answer."""
    srv = real_llama_server()
    work = tmp_path / "unit"
    work.mkdir()
    config = _config(tmp_path, srv, shlex.join([sys.executable, "-c", RESTART_SCRIPT, str(work)]))
    raw = json.loads(config.read_text())
    raw["heal"].update({"confirm_budget_s": 30, "confirm_interval_s": 5})  # the defaults
    config.write_text(json.dumps(raw))
    try:
        freeze = freeze_task_loop(srv.proc.pid)
        frozen = freeze.__enter__()
    except PtraceDenied as exc:
        pytest.skip(f"ptrace is not permitted here, so a task loop cannot be frozen: {exc}")
    supervisor = Supervisor(real_llama_server, srv, frozen, work)
    try:
        started = time.monotonic()
        doc = _gpuheal(tmp_path, config, CRON_TIMES[0], "heal", "--apply")
        took_s = time.monotonic() - started
    finally:
        freeze.__exit__(None, None, None)
        supervisor.join()
    actions = [a for a in doc["actions"] if a.get("issue") == "model-stuck"]
    assert [(a["action"], a["result"]) for a in actions] == [("restart-llama-server", "pending")], doc["issues"]
    audit = [json.loads(line) for line in (tmp_path / "state" / "gpu-self-heal-log.jsonl").read_text().splitlines()]
    intent = [r for r in audit if r.get("phase") == "intent" and r.get("issue") == "model-stuck"]
    probes = intent[0]["detected"]["probes"]
    assert all(p["answer"] == "task loop silent: /metrics, /slots" for p in probes) and len(probes) >= 3, probes
    assert intent[0]["detected"]["confirmation"] == "confirmed"
    assert took_s < 60, took_s
