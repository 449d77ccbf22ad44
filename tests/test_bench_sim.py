"""``bench`` against the simulated fleet (``gpuheal.sim``), when it is present: the whole path from
config to recorded tok/s and the L1 api-key mismatch, over real HTTP on 127.0.0.1."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuheal.config import load_config_dict
from gpuheal.runtime import Runtime
from gpuheal.state.store import StateDir
from gpuheal.steps import bench as step

sim = pytest.importorskip("gpuheal.sim")

SCENARIO = {
    "name": "bench",
    "start": "2026-07-18T08:00:00Z",
    "gpus": [
        {"alias": "gpu-dense", "host": "ct8", "vram_total_mb": 24576, "baseline_tok_s": 74.8, "tok_s": 74.9},
        {"alias": "gpu-light", "host": "ct110", "vram_total_mb": 12288, "baseline_tok_s": 165.2,
         "tok_s": 169.6, "api_key": "sk-loc-1234-5678"},
        {"alias": "strix-moe", "host": "ct15", "vendor": "amd", "vram_total_mb": 65536,
         "baseline_tok_s": 70.5, "tok_s": 62.9},
    ],
}


@pytest.fixture
def evaluate():
    """The rules engine's bench evaluation, which ``bench`` calls after recording."""
    import gpuheal.steps.evaluate as ev

    return ev


def test_bench_on_the_simulated_fleet(tmp_path, evaluate):
    fleet = sim.SimFleet(sim.Scenario.from_dict(SCENARIO), ports="ephemeral").start()
    try:
        raw = fleet.config_dict()
        raw["bench"] = {"n_predict": 32, "timeout_s": 5}
        cfg = load_config_dict(raw)
        rt = Runtime(cfg=cfg, state_dir=tmp_path, now=datetime(2026, 7, 18, 8, 0, tzinfo=UTC), json_out=True)
        with StateDir(tmp_path) as store:
            res = step.command(rt, store)
    finally:
        fleet.stop()
    by = {r["gpu"]: r for r in res.document["results"]}
    assert by["gpu-dense"]["ok"] and by["gpu-dense"]["gen_tok_s"] == pytest.approx(74.9, rel=0.02)
    assert by["strix-moe"]["ok"] and by["strix-moe"]["gen_tok_s"] == pytest.approx(62.9, rel=0.02)
    assert by["gpu-dense"]["n_ctx"] and by["gpu-dense"]["model"]
    assert by["gpu-light"]["error"] == "unauthorized" and by["gpu-light"]["key_sent"] == "not-needed"
    assert any(i["gpu"] == "gpu-light" and i["issue"] == "api-key-mismatch" for i in res.document["issues"])
    assert res.exit_code == 1
