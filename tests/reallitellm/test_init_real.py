"""``gpuheal init --from-litellm`` and the doctor's drift check against the real LiteLLM 1.108.7 with
its models in ``config.yaml`` (issue 27 item 16): what the proxy's ``/v1/model/info`` really lists
becomes a config that ``gpuheal config validate`` accepts, and a config that drifted from it is
named. The bad answers (down, slow, garbage, 401) are in ``tests/test_init.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuheal import doctor
from gpuheal.config import load_config_dict
from gpuheal.doctor.drift import drift_checks

pytestmark = pytest.mark.reallitellm
GPUHEAL = str(Path(sys.executable).with_name("gpuheal"))


def run(tmp_path: Path, *args: str, key: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")}, "LITELLM_MASTER_KEY": key}
    return subprocess.run([GPUHEAL, "-c", str(tmp_path / "gpuheal.yaml"), *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path)  # fmt: skip


def test_init_writes_the_deployments_the_real_proxy_routes_to(real_litellm, sim_backends, tmp_path):
    proc = run(tmp_path, "init", "--from-litellm", real_litellm.url, "--monitor", sim_backends.monitor_url,
               "--json", key=real_litellm.master_key)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gpus"] == ["gpu-dense", "gpu-light", "strix-moe", "gpu-solo"]
    raw = yaml.safe_load((tmp_path / "gpuheal.yaml").read_text())
    got = {g["alias"]: (g["endpoint"], g["litellm_model_id"], g["labels"]["model_group"]) for g in raw["gpus"]}
    want = {a: (url, a, "solo" if a == "gpu-solo" else "qwen") for a, url in sim_backends.endpoints.items()}
    assert got == want
    # every server is on 127.0.0.1: each gets an index, marked not known (gpu-monitor names ct8, ct110, ...)
    assert sorted(g["gpu_index"] for g in raw["gpus"]) == [0, 1, 2, 3]
    text = (tmp_path / "gpuheal.yaml").read_text()
    assert "gpu-monitor reports no GPU on host 127.0.0.1" in text and real_litellm.master_key not in text
    check = run(tmp_path, "config", "validate", key="")
    assert check.returncode == 0 and "valid (4 GPUs" in check.stdout, check.stdout + check.stderr
    again = run(tmp_path, "init", "--from-litellm", real_litellm.url, key=real_litellm.master_key)
    assert again.returncode == 3 and "--force" in again.stderr and (tmp_path / "gpuheal.yaml").read_text() == text


def test_init_with_a_wrong_admin_key_is_one_line_exit_3(real_litellm, tmp_path):
    proc = run(tmp_path, "init", "--from-litellm", real_litellm.url, key="sk-not-the-master-key")
    assert proc.returncode == 3 and "rejected the admin key" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "gpuheal.yaml").exists()


def drift_rows(real_litellm, raw: dict, tmp_path: Path):
    raw["litellm"] = {"url": real_litellm.url, "timeout_s": 10}
    ctx = doctor.Context(load_config_dict(raw), str(tmp_path), {"LITELLM_MASTER_KEY": real_litellm.master_key})
    return drift_checks(ctx, 10.0)


def test_doctor_finds_no_drift_when_the_config_matches(real_litellm, sim_backends, tmp_path):
    (row,) = drift_rows(real_litellm, sim_backends.config_dict(), tmp_path)
    assert row.status == "ok" and "4 deployments match gpus[]" in row.detail


def test_doctor_names_a_deployment_not_watched_and_a_gpu_not_routed(real_litellm, sim_backends, tmp_path):
    raw = sim_backends.config_dict()
    raw["gpus"] = [g for g in raw["gpus"] if g["alias"] != "gpu-light"]
    raw["gpus"].append({"alias": "gpu-retired", "host": "ct99", "endpoint": "http://127.0.0.1:9"})
    rows = drift_rows(real_litellm, raw, tmp_path)
    assert {(r.target, r.status) for r in rows} == {("litellm", "warn"), ("gpu-retired", "warn")}, rows
    (unwatched,) = [r for r in rows if r.target == "litellm"]
    assert sim_backends.endpoints["gpu-light"] + "/v1" in unwatched.detail and "'gpu-light'" in unwatched.detail
    assert all(r.fix for r in rows)
