"""``heal --apply`` with a GPU held above 85 °C in front of the real LiteLLM proxy (models in
config.yaml, no database: the common setup). Done-when of issue 11: gpuheal never reports a shed
that LiteLLM did not apply, and the thermal issue reaches the humans (an alert queued) in the run
where shedding proved impossible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuheal.sources import litellm_admin as la

pytestmark = pytest.mark.reallitellm


def test_hot_gpu_behind_a_config_file_litellm_escalates_in_the_same_run(real_litellm, sim_backends, tmp_path):
    raw = sim_backends.config_dict()
    raw["litellm"] = {"url": real_litellm.url, "timeout_s": 10}
    for g in raw["gpus"]:
        g["litellm_model_id"] = g["alias"]
    config = tmp_path / "gpuheal.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "LITELLM_MASTER_KEY": real_litellm.master_key, "NO_COLOR": "1"}
    argv = [str(Path(sys.executable).with_name("gpuheal")), "--config", str(config), "--state-dir", str(tmp_path / "st")]
    sim_backends.set("gpu-dense", {"temp_c": 90})
    try:
        tried = None
        for poll in range(5):
            sim_backends.advance(60)
            env["GPUHEAL_NOW"] = sim_backends.now().strftime("%Y-%m-%dT%H:%M:%SZ")
            proc = subprocess.run([*argv, "heal", "--apply", "--json"], capture_output=True, text=True, env=env,
                                  timeout=120)
            assert proc.returncode in (0, 1, 2), proc.stderr
            doc = json.loads(proc.stdout)
            mine = [a for a in doc["actions"] if a["gpu"] == "gpu-dense" and not a.get("blocked")]
            sheds = [a for a in mine if a["action"] in ("shed-load", "redirect-traffic")]
            assert all(a["result"] != "resolved" for a in sheds), sheds  # never a shed LiteLLM did not apply
            if sheds:
                tried = poll
                assert sheds[0]["result"] == "failed"
                assert [a["result"] for a in mine if a["action"] == "alert"] == ["escalated"], mine
                break
        assert tried is not None, "thermal-critical fired and a shed was tried"
        alerts = json.loads((tmp_path / "st" / "alerts.json").read_text())["data"]["queue"]
        thermal = [a for a in alerts if a["gpu"] == "gpu-dense" and a["kind"] == "escalated"]
        assert len(thermal) == 1 and thermal[0]["issue"] == "thermal-critical"
        assert "LiteLLM keeps gpu-dense in config.yaml (db_model false)" in thermal[0]["summary"]
        audit = (tmp_path / "st" / "gpu-self-heal-log.jsonl").read_text()
        assert real_litellm.master_key not in audit
        assert la.read_deployment(real_litellm.url, real_litellm.master_key, "gpu-dense", 10).weight == 0.55
    finally:
        sim_backends.set("gpu-dense", {"temp_c": 55})


def test_a_hot_gpu_behind_a_config_file_litellm_gets_its_power_capped_instead(real_litellm, sim_backends, tmp_path):
    """Issue 27 item 7: the same real proxy (config.yaml, no database) answers that it cannot change the
    deployment; in the same attempt the GPU's power is capped instead with its own tool (the simulator's
    nvidia-smi on PATH), read back, and LiteLLM is never changed. Nobody is paged for a shed that worked;
    once cool, the limit found before is put back."""
    import stat

    raw = sim_backends.config_dict()
    raw["litellm"] = {"url": real_litellm.url, "timeout_s": 10}
    raw["heal"] = {"restore_after_s": 120, "startup_grace_s": 0}
    for g in raw["gpus"]:
        g["litellm_model_id"] = g["alias"]
    config = tmp_path / "gpuheal.yaml"
    config.write_text(yaml.safe_dump(raw))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "nvidia-smi"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuheal.sim.smi {sim_backends.control_url} '
                    '--sim-gpu gpu-dense "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "LITELLM_MASTER_KEY": real_litellm.master_key, "NO_COLOR": "1",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    argv = [str(Path(sys.executable).with_name("gpuheal")), "--config", str(config), "--state-dir", str(tmp_path / "st")]
    before = sim_backends.state()["gpus"]["gpu-dense"]["power_limit_w"]

    def heal() -> dict:
        sim_backends.advance(60)
        env["GPUHEAL_NOW"] = sim_backends.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        proc = subprocess.run([*argv, "heal", "--apply", "--json"], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode in (0, 1, 2), proc.stderr
        return json.loads(proc.stdout)

    sim_backends.set("gpu-dense", {"temp_c": 90})
    try:
        for _ in range(4):
            heal()
        assert sim_backends.state()["gpus"]["gpu-dense"]["power_limit_w"] == round(before * 0.7, 2)
        audit = [json.loads(line) for line in (tmp_path / "st" / "gpu-self-heal-log.jsonl").read_text().splitlines()]
        assert [r for r in audit if r["gpu"] == "gpu-dense" and r["phase"] == "intent" and r["action"] == "shed-load"]
        # issue 27 item 13: a pending attempt writes no outcome line; what it did is kept on it until judged
        attempts = json.loads((tmp_path / "st" / "heal-state.json").read_text())["data"]["attempts"].values()
        [outcome] = [a["outcome"] for a in attempts if a["gpu"] == "gpu-dense" and "shed-load" in a["actions"]]
        assert outcome["steps"][0]["ok"] is True
        assert "LiteLLM cannot shed here" in outcome["steps"][0]["note"]
        assert "config.yaml" in outcome["evidence"]["redirect-traffic_impossible"]
        queue = json.loads((tmp_path / "st" / "alerts.json").read_text())["data"]["queue"]
        assert [a for a in queue if a["gpu"] == "gpu-dense" and a["kind"] == "escalated"] == []
        assert la.read_deployment(real_litellm.url, real_litellm.master_key, "gpu-dense", 10).weight == 0.55
        sim_backends.set("gpu-dense", {"temp_c": 55})
        for _ in range(5):
            heal()
        assert sim_backends.state()["gpus"]["gpu-dense"]["power_limit_w"] == before
    finally:
        sim_backends.set("gpu-dense", {"temp_c": 55})
        subprocess.run([str(shim), "-pl", str(before)], capture_output=True, timeout=30)


def test_a_401_behind_a_config_file_litellm_is_told_with_why_it_stays_in_routing(real_litellm, sim_backends, tmp_path):
    """Issue 27 item 15 against the real proxy (config.yaml, no database): taking the GPU that answers 401
    out of LiteLLM's routing is impossible there, so the humans hear it at once, with LiteLLM's reason; the
    deployment is untouched and the key never written."""
    raw = sim_backends.config_dict()
    raw["litellm"] = {"url": real_litellm.url, "timeout_s": 10}
    for g in raw["gpus"]:
        g["litellm_model_id"] = g["alias"]
    config = tmp_path / "gpuheal.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "LITELLM_MASTER_KEY": real_litellm.master_key, "NO_COLOR": "1"}
    argv = [str(Path(sys.executable).with_name("gpuheal")), "--config", str(config), "--state-dir", str(tmp_path / "st")]

    def run(*args: str) -> subprocess.CompletedProcess:
        env["GPUHEAL_NOW"] = sim_backends.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        return subprocess.run([*argv, *args], capture_output=True, text=True, env=env, timeout=120)

    sim_backends.apply({"gpu": "gpu-light", "fault": "wrong-key", "api_key": "sk-local-5678"})
    try:
        sim_backends.advance(60)
        assert run("bench", "--gpu", "gpu-light").returncode == 1
        for _ in range(2):
            sim_backends.advance(60)
            assert run("heal", "--apply", "--json").returncode in (0, 1, 2)
        queue = json.loads((tmp_path / "st" / "alerts.json").read_text())["data"]["queue"]
        [told] = [a for a in queue if a["gpu"] == "gpu-light" and a["kind"] == "escalated"]
        assert told["issue"] == "api-key-mismatch" and "config.yaml" in told["summary"], told["summary"]
        assert la.read_deployment(real_litellm.url, real_litellm.master_key, "gpu-light", 10).weight == 0.15
        text = (tmp_path / "st" / "gpu-self-heal-log.jsonl").read_text() + json.dumps(queue)
        assert "sk-local-5678" not in text and real_litellm.master_key not in text
    finally:
        sim_backends.apply({"gpu": "gpu-light", "fault": "none"})
