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
