"""``gpuheal trend`` through the real CLI: the vram-trend object, the temperature rise, the table with
sparklines, exit codes."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from gpuheal.state import files
from gpuheal.state.history import History
from gpuheal.state.store import StateDir

try:
    from tests.series import FLEET_YAML, START, fleet_config, fleet_trace
    from tests.servers import run_gpuheal
except ImportError:
    from series import FLEET_YAML, START, fleet_config, fleet_trace
    from servers import run_gpuheal

CFG = fleet_config()


@pytest.fixture
def recorded(tmp_path) -> tuple[Path, Path, str]:
    """A state directory whose history holds 6 h of the demo: gpu-light leaking 600 MB/h, gpu-dense
    heating 3 °C/min over the last minutes."""
    n = 361
    temps = " ".join(["60"] * (n - 5) + ["64", "67", "70", "73", "76"])
    trace = fleet_trace(CFG, {"gpu-light": {"vram_used_mb": "6000+10x360"}, "gpu-dense": {"temp_c": temps}}, n=n)
    history = History()
    for obs in trace:
        history.add(obs, CFG.aliases)
    state = tmp_path / "state"
    with StateDir(state, 1.0) as store:
        store.write(files.HISTORY, history.to_dict())
    config = tmp_path / "gpuheal.json"
    config.write_text(json.dumps(FLEET_YAML))
    return config, state, trace[-1].at.strftime("%Y-%m-%dT%H:%M:%SZ")


def trend(recorded, *args):
    config, state, now = recorded
    return run_gpuheal("--config", str(config), "--state-dir", str(state), "trend", *args, env={"GPUHEAL_NOW": now})


def test_trend_json_shows_the_leak_within_10_percent_and_the_rise(recorded):
    proc = trend(recorded, "--json")
    assert proc.returncode == 1, proc.stderr  # a leak needs attention
    doc = json.loads(proc.stdout)
    light = doc["vram_trend"]["gpu-light"]
    assert abs(light["rate_mb_per_hour"] - 600) <= 60
    assert light["samples"] == 361 and light["span_h"] == 6.0 and light["current_mb"] == 9600
    assert light["projected_full_in_hours"] == round((12288 - 9600) / light["rate_mb_per_hour"], 2)
    assert doc["vram_trend"]["gpu-dense"]["rate_mb_per_hour"] == 0.0
    assert doc["vram_trend"]["gpu-dense"]["projected_full_in_hours"] is None
    assert doc["leak_threshold_mb_per_hour"] == {"gpu-dense": 300.0, "gpu-light": 300.0, "strix-moe": 200.0}
    assert 3.0 <= doc["temp_rise_c_per_min"]["gpu-dense"] <= 3.5 and doc["temp_c"]["gpu-dense"] == 76.0
    assert {(a["gpu"], a["issue"]) for a in doc["attention"]} == {("gpu-light", "vram-leak"), ("gpu-dense", "thermal-warning")}
    # the public file is refreshed with the same objects
    file_doc = json.loads((recorded[1] / files.VRAM_TREND).read_text())
    assert file_doc == {"schema_version": 1, **doc["vram_trend"]}


def test_trend_human_table_has_sparklines(recorded):
    proc = trend(recorded)
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "gpu-light" in out and "600" in out and "▁" in out and "█" in out
    assert "ATTENTION gpu-light vram-leak" in out


def test_trend_one_gpu(recorded):
    proc = trend(recorded, "--gpu", "strix-moe", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert list(doc["vram_trend"]) == ["strix-moe"] and doc["attention"] == []


def test_trend_unknown_gpu_exits_3(recorded):
    proc = trend(recorded, "--gpu", "gpu-nope")
    assert proc.returncode == 3 and "unknown GPU alias 'gpu-nope'" in proc.stderr


def test_trend_without_history_is_not_known(tmp_path):
    config = tmp_path / "gpuheal.json"
    config.write_text(json.dumps(FLEET_YAML))
    proc = run_gpuheal("--config", str(config), "--state-dir", str(tmp_path / "s"), "trend", "--json",
                       env={"GPUHEAL_NOW": (START + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["vram_trend"]["gpu-dense"]["rate_mb_per_hour"] is None
    assert doc["temp_rise_c_per_min"]["gpu-dense"] is None
