"""The simulator's nvidia-smi look-alike (gpuheal/sim/smi.py) answers Rule 4's queries as the real
tool does: the same shape as real captures (../shared/fixtures/smi), parsed by the same parsers,
and ``-pl`` changes what the next query and the next completion show."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from lab import scenario
from smi_captures import FIXTURES, NVIDIA_CAPTURES, ROCM_CAPTURES
from test_rule4_decisions import power_row

from gpuheal.parse.smi import parse_compute_apps
from gpuheal.rules.benchmark_regression.parse import PowerLimits, parse_power_limits
from gpuheal.sim import Scenario, SimFleet

POWER_QUERY = ["--query-gpu=power.limit,power.default_limit,power.max_limit", "--format=csv,noheader,nounits"]
APPS_QUERY = ["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"]
WATTS = r"(\d+\.\d\d|\[N/A\])"
POWER_ROW = re.compile(rf"^{WATTS}, {WATTS}, {WATTS}\n$")
APP_ROW = re.compile(r"^\d+, \S.*, \d+ MiB$")


@pytest.fixture
def fleet():
    gpu = {"alias": "gpu-a", "host": "ct1", "vendor": "nvidia", "vram_total_mb": 24576, "vram_used_mb": 23300,
           "baseline_tok_s": 75.0, "util_pct": 97, "power_limit_w": 250, "power_default_limit_w": 350,
           "power_max_limit_w": 400, "competing_pid": 4242, "competing_vram_mb": 2300}  # fmt: skip
    with SimFleet(Scenario.from_dict(scenario([gpu])), host="127.0.0.1", ports="ephemeral") as f:
        yield f


def smi(fleet, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "gpuheal.sim.smi", fleet.control_url, "--sim-gpu", "gpu-a", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(len(NVIDIA_CAPTURES) < 4, reason="the real smi captures are not here")
def test_power_query_has_the_real_tools_shape(fleet):
    out = smi(fleet, *POWER_QUERY)
    assert out.returncode == 0 and out.stdout == "250.00, 350.00, 400.00\n"
    for capture in NVIDIA_CAPTURES:  # the real rows have the same shape
        assert POWER_ROW.match(power_row(capture)), capture
    assert POWER_ROW.match(out.stdout) and parse_power_limits(out.stdout) == PowerLimits(250.0, 350.0, 400.0)
    fleet.set("gpu-a", {"power_default_limit_w": None})
    assert smi(fleet, *POWER_QUERY).stdout == "250.00, [N/A], 400.00\n"


@pytest.mark.skipif(len(NVIDIA_CAPTURES) < 4, reason="the real smi captures are not here")
def test_compute_apps_have_the_real_tools_shape(fleet):
    real = (FIXTURES / "linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt").read_text().splitlines()
    at = real.index("# load :: query-compute-apps (per-process)")
    header = [h.strip() for h in real[at + 3].split(", ")]
    cols = [header.index(c) for c in ("pid", "process_name", "used_gpu_memory [MiB]")]
    rows = [", ".join(line.split(", ")[c] for c in cols) for line in real[at + 4 : at + 6]]
    assert rows == ["5268, ffmpeg, 370 MiB", "5267, ffmpeg, 230 MiB"]
    with_units = smi(fleet, "--query-compute-apps=pid,process_name,used_memory", "--format=csv").stdout.splitlines()
    assert with_units[0] == "pid, process_name, used_gpu_memory [MiB]"
    assert all(APP_ROW.match(r) for r in rows + with_units[1:])
    apps = parse_compute_apps(smi(fleet, *APPS_QUERY).stdout)
    assert [(p.pid, p.name, p.used_mb) for p in apps] == [(40000, "/usr/local/bin/llama-server", 20750.0),
                                                          (4242, "python3", 2300.0)]  # fmt: skip


def _tok_s(fleet) -> float:
    import json
    import urllib.request

    with urllib.request.urlopen(fleet.monitor_url, timeout=5) as resp:
        return json.loads(resp.read())["benchmarks"]["ct1"]["current_tok_s"]


def test_power_limit_set_shows_in_the_next_query_and_speeds_up_generation(fleet):
    slow = fleet.state()["gpus"]["gpu-a"]
    assert _tok_s(fleet) == pytest.approx(75.0 * 250 / 350, abs=0.1)  # throttled: proportionally slower
    done = smi(fleet, "-pl", "350")
    assert done.returncode == 0 and done.stdout.startswith("Power limit for GPU 00000000:01:00.0 was set to 350.00 W")
    assert smi(fleet, *POWER_QUERY).stdout == "350.00, 350.00, 400.00\n"
    refused = smi(fleet, "-pl", "999")
    assert refused.returncode == 2 and "is not a valid power limit" in refused.stderr
    assert smi(fleet, "--query-gpu=power.bogus", "--format=csv").returncode == 2
    assert slow["power_limit_w"] == 250 and fleet.state()["gpus"]["gpu-a"]["power_limit_w"] == 350
    assert _tok_s(fleet) == pytest.approx(75.0, abs=0.1)


def rocm(fleet, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "gpuheal.sim.rocm_smi", fleet.control_url, "--sim-gpu", "gpu-a", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.mark.skipif(not ROCM_CAPTURES, reason="the real rocm-smi captures are not here")
def test_rocm_smi_answers_with_the_real_tools_keys_and_shapes(fleet):
    import json

    from gpuheal.parse.smi import parse_rocm_pids, parse_rocm_smi
    from gpuheal.rules.benchmark_regression.parse import parse_rocm_power_cap

    real_keys, real_pids = set(), []
    for capture in ROCM_CAPTURES:
        doc = json.loads((FIXTURES / capture).read_text())
        for key, entry in doc.items():
            if key.startswith("card"):
                real_keys |= set(entry)
        real_pids += [v for k, v in doc.get("system", {}).items() if k.startswith("PID")]
    flags = ["--showtemp", "--showmeminfo", "vram", "gtt", "--showuse", "--showpower", "--showmaxpower",
             "--showpids", "--json"]  # fmt: skip
    out = rocm(fleet, *flags)
    assert out.returncode == 0
    doc = json.loads(out.stdout)
    assert set(doc["card0"]) <= real_keys and all(isinstance(v, str) for v in doc["card0"].values())
    pid_shape = re.compile(r"^[^,]+(, \d+){4}$")
    assert real_pids and all(pid_shape.match(v) for v in real_pids + list(doc["system"].values()))
    assert parse_rocm_power_cap(out.stdout, None) == PowerLimits(250.0)
    assert [(p.pid, p.name, p.used_mb) for p in parse_rocm_pids(out.stdout)[0]] == [
        (40000, "llama-server", 20750.0), (4242, "python3", 2300.0)]  # fmt: skip
    row = parse_rocm_smi(out.stdout)[0]
    assert row["vram_used_mb"] == 23300 and row["util_pct"] == 97
