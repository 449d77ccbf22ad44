"""Drain first against the real LiteLLM 1.108.7 (issue 28 item 2): a model group of two deployments in
``config.yaml``, no database (``/model/update`` is refused there). One deployment's llama-server refuses
connections: at the first bad poll — the issue still pending, its hold not met — ``heal --apply`` takes it
out of the group (the file rewritten, LiteLLM restarted by its ``restart_command``, ``/v1/model/info`` read
back), users of the group are served by the twin, and after the verified restart it is back in the group,
the operator's file byte for byte."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from lab import BASE_GPU
from litellm_proxy import HOST, MASTER_KEY, deployment, free_port

from gpuheal.sim import Scenario, SimFleet
from gpuheal.sources import litellm_admin as la
from gpuheal.sources.http import request

pytestmark = pytest.mark.reallitellm
LAUNCHER = Path(__file__).resolve().parent.parent / "restart_litellm.py"
HOSTS = {"gpu-a": "ct1", "gpu-b": "ct2"}


@pytest.fixture
def twins(litellm_bin, tmp_path):
    scn = {"name": "drain-first", "start": "2026-07-18T08:00:00Z", "reload_s": 0.3,
           "gpus": [{**BASE_GPU, "alias": a, "host": h} for a, h in HOSTS.items()]}
    fleet = SimFleet(Scenario.from_dict(copy.deepcopy(scn)), ports="ephemeral").start()
    work = tmp_path / "litellm"
    work.mkdir()
    config = work / "config.yaml"
    config.write_text("# the operator's own file\n" + yaml.safe_dump(
        {"model_list": [deployment("qwen", a, fleet.endpoints[a] + "/v1") for a in HOSTS],
         "general_settings": {"master_key": MASTER_KEY}}, sort_keys=False))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LITELLM_MASTER_KEY")}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR", NO_DOCS="True", DISABLE_ADMIN_UI="True")
    state = work / "launcher.json"
    state.write_text(json.dumps({"argv": [litellm_bin, "--config", str(config), "--host", HOST, "--port", str(port),
                                          "--num_workers", "1"],
                                 "env": env, "cwd": str(work), "log": str(work / "litellm.log"),
                                 "pidfile": str(work / "litellm.pid")}))
    url = f"http://{HOST}:{port}"
    try:
        subprocess.run([sys.executable, str(LAUNCHER), str(state)], check=True, timeout=60)
        wait_alive(url, work)
        yield fleet, url, config, state
    finally:
        subprocess.run([sys.executable, str(LAUNCHER), "--stop", str(work / "litellm.pid")], timeout=60)
        fleet.stop()


def wait_alive(url: str, work: Path, within_s: float = 150.0) -> None:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if la.liveliness(url, 2) is None:
            return
        time.sleep(0.5)
    raise AssertionError("LiteLLM never came up:\n" + (work / "litellm.log").read_text(errors="replace")[-2000:])


def routed_to(url: str, group: str) -> set[str]:
    payload = la.read_model_info(url, MASTER_KEY, 20)
    return {e["litellm_params"]["api_base"] for e in payload["data"] if e["model_name"] == group}


def complete(url: str, group: str) -> int | None:
    reply = request("POST", url + "/v1/chat/completions", deadline_s=60, body=json.dumps(
        {"model": group, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode(),
        headers={"Authorization": f"Bearer {MASTER_KEY}", "Content-Type": "application/json"})
    return getattr(reply, "status", None)


def test_a_refused_deployment_leaves_its_group_at_the_first_bad_poll_and_comes_back_after_the_restart(
        twins, tmp_path):  # fmt: skip
    fleet, url, config, state = twins
    original = config.read_bytes()
    raw = fleet.config_dict(api_key="not-needed")
    raw["litellm"] = {"url": url, "timeout_s": 10, "config_file": str(config), "reload_wait_s": 150,
                      "restart_command": [sys.executable, str(LAUNCHER), str(state)]}
    raw["heal"] = {"startup_grace_s": 0, "command_timeout_s": 60, "drain_first": True}
    cfg_path = tmp_path / "gpuheal.yaml"
    cfg_path.write_text(yaml.safe_dump(raw))
    # the in-run confirmation of the simulated refusal: its waits counted, not slept (steps/confirm.default_clock)
    env = {**os.environ, "LITELLM_MASTER_KEY": MASTER_KEY, "NO_COLOR": "1", "GPUHEAL_CONFIRM_WAIT": "simulated"}
    argv = [str(Path(sys.executable).with_name("gpuheal")), "--config", str(cfg_path), "--state-dir",
            str(tmp_path / "st")]

    def heal() -> dict:
        fleet.advance(60)
        env["GPUHEAL_NOW"] = fleet.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        proc = subprocess.run([*argv, "heal", "--apply", "--json"], capture_output=True, text=True, env=env,
                              timeout=400)
        assert proc.returncode in (0, 1, 2), proc.stderr
        return json.loads(proc.stdout)

    def moves() -> list[dict]:
        lines = (tmp_path / "st" / "gpu-self-heal-log.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, lines) if r.get("drain") and r["phase"] == "outcome"]

    a, b = fleet.endpoints["gpu-a"] + "/v1", fleet.endpoints["gpu-b"] + "/v1"
    assert routed_to(url, "qwen") == {a, b}
    fleet.apply({"gpu": "gpu-a", "fault": "dead"})
    first = heal()
    # the first bad poll drains it; the same run then confirms the refusal and restarts it (issue 28 item 1)
    assert [i["state"] for i in first["issues"] if i["gpu"] == "gpu-a"] in (["pending"], ["verifying"])
    assert routed_to(url, "qwen") == {b}  # the real LiteLLM's routing shows it out
    [out] = moves()
    assert out["action"] == "redirect-traffic" and out["result"] == "resolved" and out["drain"] == "out"
    assert out["detected"]["fault"] == "connection refused" and out["run_id"].startswith("gpu-self-heal-")
    served = fleet.state()["gpus"]["gpu-b"]["requests_served"]
    assert [complete(url, "qwen") for _ in range(3)] == [200, 200, 200]  # users are served, by the twin
    assert fleet.state()["gpus"]["gpu-b"]["requests_served"] >= served + 3

    for _ in range(6):
        heal()
        if len(moves()) == 2:
            break
    assert fleet.restart_count("gpu-a") == 1  # the heal's restart, at its hold
    back = moves()[-1]
    assert back["action"] == "restore-load" and back["result"] == "resolved" and back["drain"] == "in"
    assert routed_to(url, "qwen") == {a, b}  # back in the group
    assert config.read_bytes() == original
    text = (tmp_path / "st" / "gpu-self-heal-log.jsonl").read_text()
    assert MASTER_KEY not in text and "not-needed" not in text
