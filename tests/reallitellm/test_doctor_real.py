"""``gpuheal doctor`` against the real LiteLLM proxy (issue 11, done-when): it names the
load-shedding problem of a config-file deployment and exits 1, changing nothing."""

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


def test_doctor_names_the_config_file_deployment_and_exits_1(real_litellm, sim_backends, tmp_path):
    raw = sim_backends.config_dict()
    raw["litellm"] = {"url": real_litellm.url, "timeout_s": 10}
    for g in raw["gpus"]:
        g["litellm_model_id"] = g["alias"]
    config = tmp_path / "gpuheal.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "LITELLM_MASTER_KEY": real_litellm.master_key}
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("gpuheal")),
            "--config",
            str(config),
            "--state-dir",
            str(tmp_path / "state"),
            "doctor",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {(c["target"], c["check"]): c for c in doc["checks"]}
    assert doc["status"] == "fail"
    assert rows[("litellm", "liveliness")]["status"] == "ok"
    assert rows[("litellm", "admin key accepted")]["status"] == "ok"
    shed = rows[("gpu-dense", "load shedding")]
    assert shed["status"] == "fail"
    assert shed["detail"] == "LiteLLM keeps gpu-dense in config.yaml (db_model false)"
    assert shed["fix"].startswith("load shedding needs STORE_MODEL_IN_DB with a database")
    assert all(rows[(a, "load shedding")]["status"] == "fail" for a in ("gpu-light", "strix-moe", "gpu-solo"))
    # nothing changed: the deployment is as the config file says, no state directory
    assert la.read_deployment(real_litellm.url, real_litellm.master_key, "gpu-dense", 10).weight == 0.55
    assert not (tmp_path / "state").exists()
    # a wrong admin key is named too
    env["LITELLM_MASTER_KEY"] = "sk-not-it-0000"
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("gpuheal")),
            "--config",
            str(config),
            "--state-dir",
            str(tmp_path / "state"),
            "doctor",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    rows = {(c["target"], c["check"]): c for c in json.loads(proc.stdout)["checks"]}
    assert proc.returncode == 1 and rows[("litellm", "admin key accepted")]["status"] == "fail"
    assert "LITELLM_MASTER_KEY" in rows[("litellm", "admin key accepted")]["fix"]
