"""GPU readings without gpu-monitor (issue 12): one real ``nvidia-smi`` / ``rocm-smi`` call per host
per poll through the local transport — a fake smi on PATH printing real captured multi-GPU output
(tests/smi_captures.py) — each GPU matched to its own row by (host, index)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from servers import fleet_config
from smi_captures import NVIDIA_CAPTURES, ROCM_CAPTURES, multi_gpu_csv, rocm_json

from gpuheal.config import load_config_dict
from gpuheal.sources.smi_sense import sense_smi
from gpuheal.transport import TransportPool

pytestmark = pytest.mark.skipif(len(NVIDIA_CAPTURES) < 4, reason="the real smi captures are not here")


def fake_tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def bin_dir(tmp_path, monkeypatch):
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    return d


def cfg_for(gpus, vendor="nvidia"):
    data = fleet_config("http://127.0.0.1:9/gpu-data", [(a, h, "http://127.0.0.1:9") for a, h, _ in gpus])
    for raw, (_, _, index) in zip(data["gpus"], gpus, strict=True):
        raw["vendor"] = vendor
        if index is not None:
            raw["gpu_index"] = index
    return load_config_dict(data)


def sense(cfg, deadline_s=5.0):
    from gpuheal.sources.smi_sense import pool_runner

    with TransportPool() as pool:
        return sense_smi(cfg, deadline_s, pool_runner(cfg, pool))


def test_one_call_per_host_and_each_gpu_its_own_row(bin_dir, tmp_path):
    csv = tmp_path / "rows.csv"
    csv.write_text(multi_gpu_csv(NVIDIA_CAPTURES[:4]))
    calls = tmp_path / "calls"
    fake_tool(bin_dir, "nvidia-smi", f'echo "$@" >> {calls}\ncat {csv}\n')
    cfg = cfg_for([("a0", "h1", 0), ("a1", "h1", 1), ("b2", "h2", 2), ("b3", "h2", 3)])
    out = sense(cfg)
    assert out.faults == [] and out.calls == 2 and out.hosts_ok == 2
    assert len(calls.read_text().splitlines()) == 2  # all GPUs of a host in one command
    assert "--query-gpu=index,name,temperature.gpu" in calls.read_text()
    assert out.values["a0"]["vram_total_mb"] == 8192 and out.values["a0"]["power_w"] == 111.5
    assert out.values["a1"]["temp_c"] == 38
    assert out.values["b2"]["name"] == "NVIDIA GeForce RTX 4080 SUPER"
    assert out.values["b3"]["vram_total_mb"] == 81559 and out.values["b3"]["util_pct"] == 100


def test_sentinels_are_not_known_never_zero(bin_dir, tmp_path):
    csv = tmp_path / "rows.csv"
    csv.write_text(multi_gpu_csv(NVIDIA_CAPTURES, "idle"))  # the MIG captures print [N/A]
    fake_tool(bin_dir, "nvidia-smi", f"cat {csv}\n")
    cfg = cfg_for([(f"g{i}", "h", i) for i in range(len(NVIDIA_CAPTURES))])
    out = sense(cfg)
    assert out.faults == []
    mig = [v for v in out.values.values() if v["util_pct"] is None]
    assert mig, "the H100/H200 MIG captures report utilization.gpu [N/A]"
    assert all(v["vram_total_mb"] for v in out.values.values())


@pytest.mark.parametrize(
    ("script", "kind", "words"),
    [
        ("echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\nexit 9\n",
         "invalid", "exit status 9"),
        ("echo 'Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error'\nexit 15\n",
         "invalid", "Unknown Error"),
        ("printf '0, GPU, [Unknown Error], 1 MiB\\n\\x00\\xff garbage\\n'\n", "invalid", "no readable GPU row"),
        ("sleep 5\n", "timeout", "timeout"),
    ],
)
def test_a_failing_host_is_a_fault_for_each_of_its_gpus(bin_dir, script, kind, words):
    fake_tool(bin_dir, "nvidia-smi", script)
    cfg = cfg_for([("a0", "h1", 0), ("a1", "h1", 1)])
    started = time.monotonic()
    out = sense(cfg, deadline_s=1.0)
    assert time.monotonic() - started < 3.0
    assert {(f.source, f.fault) for f in out.faults} == {("a0", kind), ("a1", kind)}
    assert all(words in f.detail for f in out.faults)
    assert out.values == {}


def test_no_smi_on_the_host(bin_dir, monkeypatch):
    monkeypatch.setenv("PATH", str(bin_dir))
    out = sense(cfg_for([("a0", "h1", None)]))
    assert [(f.source, f.fault) for f in out.faults] == [("a0", "invalid")]
    assert "not found" in out.faults[0].detail


def test_fewer_rows_than_configured_gpus(bin_dir, tmp_path):
    csv = tmp_path / "rows.csv"
    csv.write_text(multi_gpu_csv(NVIDIA_CAPTURES[:2]))
    fake_tool(bin_dir, "nvidia-smi", f"cat {csv}\n")
    out = sense(cfg_for([("a0", "h1", 0), ("a1", "h1", 1), ("a5", "h1", 5)]))
    assert set(out.values) == {"a0", "a1"}
    assert [(f.source, f.fault) for f in out.faults] == [("a5", "invalid")]
    assert "no GPU with index 5 (2 rows)" in out.faults[0].detail


def test_rocm_smi_cards_by_index(bin_dir, tmp_path):
    if "rocm-smi__mi100_rocm602.json" not in ROCM_CAPTURES:
        pytest.skip("the real rocm-smi captures are not here")
    doc = tmp_path / "rocm.json"
    doc.write_text(rocm_json("rocm-smi__mi100_rocm602.json"))
    fake_tool(bin_dir, "rocm-smi", f"cat {doc}\n")
    out = sense(cfg_for([("m0", "mi", 0), ("m3", "mi", 3)], vendor="amd"))
    assert out.faults == [] and out.calls == 1
    # a discrete MI100: its 32 GB of VRAM, not its 126 GB of GTT (issue 12, item 5)
    assert out.values["m0"]["vram_total_mb"] == pytest.approx(34342961152 / 1048576)
    assert out.values["m3"]["temp_c"] is not None


def test_check_without_gpu_monitor_reports_smi_readings_and_the_servers_own_telemetry(bin_dir, tmp_path):
    """``gpuheal check`` on a config with no ``monitor:``: readings from nvidia-smi (one call for
    the two-GPU host), requests and slots from each llama-server's /metrics and /slots, and the
    rules that only gpu-monitor could feed listed once as off — not as faults."""
    import json
    import subprocess
    import sys

    from servers import HEALTH_OK, LoopbackServer, Reply, json_reply, write_config

    data_dir = Path(__file__).parent / "data" / "llama"
    csv = tmp_path / "rows.csv"
    csv.write_text(multi_gpu_csv(NVIDIA_CAPTURES[:2]))
    fake_tool(bin_dir, "nvidia-smi", f"cat {csv}\n")
    busy = {"/health": HEALTH_OK, "/metrics": Reply(200, (data_dir / "metrics-busy-deferred.txt").read_text()),
            "/props": json_reply({"is_sleeping": False}),
            "/slots": Reply(200, (data_dir / "slots-busy.json").read_text())}
    plain = {"/health": HEALTH_OK, "/metrics": Reply(501, (data_dir / "metrics-501.json").read_text()),
             "/props": json_reply({"is_sleeping": False}),
             "/slots": Reply(200, (data_dir / "slots-fresh.json").read_text())}
    with LoopbackServer(busy) as a, LoopbackServer(plain) as b:
        cfg = {"gpus": [
            {"alias": "gpu-0", "host": "box", "endpoint": a.url, "gpu_index": 0, "transport": "local"},
            {"alias": "gpu-1", "host": "box", "endpoint": b.url, "gpu_index": 1, "transport": "local"},
        ], "probe": {"timeout_s": 3}}
        path = write_config(tmp_path / "gpuheal.yaml", cfg)
        proc = subprocess.run([sys.executable, "-m", "gpuheal", "--config", str(path), "--state-dir",
                               str(tmp_path / "state"), "check", "--json"], capture_output=True, text=True,
                              timeout=60, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    g0, g1 = doc["gpus"]["gpu-0"], doc["gpus"]["gpu-1"]
    assert (g0["temp_c"], g0["vram_total_mb"], g1["temp_c"]) == (45, 8192, 38)
    assert (g0["requests_processing"], g0["requests_deferred"], g0["slots_busy"], g0["slots_total"]) == (2, 1, 2, 2)
    assert (g1["metrics"], g1["requests_processing"], g1["slots_busy"], g1["slots_total"]) == ("disabled", None, 0, 4)
    assert doc["faults"] == [] and doc["status"] == "healthy"
    off = {o["rule"]: o for o in doc["rules_off"]}
    assert {"circuit-breaker-stuck", "workload-misrouted", "data-source-unreachable", "model-stuck"} <= set(off)
    assert off["model-stuck"]["gpus"] == ["gpu-1"] and "--metrics" in off["model-stuck"]["fix"]


def test_an_apu_reads_gtt_from_its_product_and_the_config_overrides(bin_dir, tmp_path):
    """Strix Halo (gfx1151): its model lives in GTT; the config's unified_memory wins either way."""
    doc = tmp_path / "apu.json"
    doc.write_text('{"card0": {"Card Series": "AMD Radeon 8060S", "GFX Version": "gfx1151", '
                   '"VRAM Total Memory (B)": "536870912", "VRAM Total Used Memory (B)": "423624704", '
                   '"GTT Total Memory (B)": "137438953472", "GTT Total Used Memory (B)": "10737418240"}}')
    calls = tmp_path / "calls"
    fake_tool(bin_dir, "rocm-smi", f'echo "$@" >> {calls}\ncat {doc}\n')
    out = sense(cfg_for([("strix", "ct15", None)], vendor="amd"))
    assert (out.values["strix"]["vram_total_mb"], out.values["strix"]["vram_used_mb"]) == (131072, 10240)
    assert "--showproductname" in calls.read_text()
    data = cfg_for([("strix", "ct15", None)], vendor="amd")
    from dataclasses import replace

    told = replace(data, gpus=(replace(data.gpus[0], unified_memory=False),))
    assert sense(told).values["strix"]["vram_total_mb"] == 512
