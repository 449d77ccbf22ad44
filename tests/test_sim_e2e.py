"""The simulated fleet through the real CLI, one process per poll, as cron runs it."""

from __future__ import annotations

import json

import pytest

from tests.lab import Lab, scenario


@pytest.fixture
def leaking(tmp_path):
    lab = Lab(
        tmp_path,
        scenario(
            [{"alias": "gpu-a", "host": "ct1", "vram_used_mb": 8000}, {"alias": "gpu-b", "host": "ct2"}],
            [{"at": 0, "gpu": "gpu-a", "ramp": {"vram_used_mb": 10.0}}],  # 600 MB/h
        ),
    )
    yield lab
    lab.close()


def test_trend_shows_a_simulated_leak_within_10_percent(leaking):
    for _ in range(45):
        leaking.check()
    proc = leaking.cli("trend", "--json")
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    rate = doc["vram_trend"]["gpu-a"]["rate_mb_per_hour"]
    assert abs(rate - 600) <= 60, rate
    assert abs(doc["vram_trend"]["gpu-b"]["rate_mb_per_hour"]) < 30


def test_cron_runs_recorded_then_replayed_give_the_same_issues(tmp_path):
    lab = Lab(
        tmp_path,
        scenario(
            [{"alias": "gpu-a", "host": "ct1", "temp_c": 80}, {"alias": "gpu-b", "host": "ct2"}],
            [
                {"at": 90, "gpu": "gpu-a", "set": {"temp_c": 88}},
                {"at": 150, "gpu": "gpu-b", "fault": "dead"},
            ],
        ),
    )
    try:
        trace = tmp_path / "trace.jsonl"
        seen = []
        for _ in range(6):
            lab.fleet.advance(60)
            proc = lab.cli("check", "--json", "--record", str(trace))
            assert proc.returncode in (0, 1, 2), proc.stderr
            doc = json.loads(proc.stdout)
            seen.append(sorted((i["gpu"], i["issue"]) for i in doc["issues"] if i["state"] == "firing"))
        assert ("gpu-a", "thermal-critical") in seen[-1] and ("gpu-b", "host-unreachable") in seen[-1]
        assert ("gpu-a", "thermal-critical") not in seen[1], "one hot poll never fires"
        replay = lab.cli("replay", str(trace), "--json")
        assert replay.returncode == 1, replay.stderr
        fired = sorted({(e["gpu"], e["issue"]) for e in json.loads(replay.stdout)["timeline"] if e["event"] == "firing"})
        assert fired == sorted(set(seen[-1]) | {x for s in seen for x in s})
    finally:
        lab.close()
