"""The in-run confirmation judges the same on every source path (issue 28 item 1; brief: "same
judgement on every source path"): a poll from gpu-monitor, from nvidia-smi without it, from the Rule
7.3 fallback or from Prometheus, each seeing one GPU refused, timing out or its task loop silent, is
confirmed by the run's re-probes at the same evidence — and a poll whose liveness is Prometheus's
``up`` (no direct probe to repeat) never waits. Each poll is ``check.run`` on the given observation
(the rules engine and state directory as cron runs them), the re-probes a fake prober, on a jittered
fake clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from servers import closed_url, fleet_config

from gpuheal.clock import parse_iso
from gpuheal.config import load_config_dict
from gpuheal.model import GpuSample, Observation
from gpuheal.state.store import StateDir
from gpuheal.steps import check, confirm
from tests.test_confirm_in_run import FakeClock

NOW = datetime(2026, 7, 18, 8, 0, 1, 300000, tzinfo=UTC)
FAULTS = {
    "refused": (GpuSample(endpoint="refused"), "host-unreachable", 20),
    "timeout": (GpuSample(endpoint="timeout"), "host-unreachable", 20),
    "taskloop": (GpuSample(endpoint="ok", metrics="timeout", slots="timeout"), "model-stuck", 20),  # silent_hold_s
}
HEALTHY = GpuSample(endpoint="ok", metrics="ok", slots="idle", n_decode_total=10, requests_processing=0,
                    temp_c=55, vram_used_mb=8000, vram_total_mb=24576)


def config(**sections):
    raw = fleet_config("http://127.0.0.1:9/gpu-data", [("gpu-a", "ct1", closed_url()), ("gpu-b", "ct2", closed_url())],
                       heal={"confirm_budget_s": 30, "confirm_interval_s": 5}, **sections)
    return load_config_dict(raw)


def observation(source: str, sample: GpuSample) -> Observation:
    monitor_ok = source in ("monitor", "smi", "prometheus")
    return Observation(at=NOW, gpus={"gpu-a": sample, "gpu-b": HEALTHY}, monitor_ok=monitor_ok, source=source,
                       fallback_ok=source == "smi-fallback")


@pytest.mark.parametrize("source", ["monitor", "smi", "smi-fallback", "prometheus"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_every_source_confirms_a_hard_fault_at_the_same_evidence(tmp_path, source, fault):
    sample, issue, hold_s = FAULTS[fault]
    cfg = config()
    asked: list[list[str]] = []

    def prober(cfg, aliases, canary):
        asked.append(sorted(aliases))
        return {a: sample for a in aliases}

    clock = FakeClock(jitter_s=1.1, seed=len(source))
    with StateDir(tmp_path, 1) as store:
        result = check.run(cfg, store, NOW, obs=observation(source, sample))
        after = confirm.run(cfg, store, result, clock.clock, prober)
    assert set(map(tuple, asked)) == {("gpu-a",)}  # only the faulty GPU is re-probed
    fired = [i for i in after.issues if i.issue == issue and i.state == "firing"]
    assert [i.gpu for i in fired] == ["gpu-a"], after.issues
    probes = fired[0].detected["probes"]
    span_s = parse_iso(probes[-1]["at"]).timestamp() - parse_iso(probes[0]["at"]).timestamp()
    assert hold_s - 5 / 4 <= span_s <= hold_s + 5 + 1.1, probes
    assert sum(clock.sleeps) <= 30


def test_prometheus_up_as_liveness_has_nothing_to_reprobe(tmp_path):
    cfg = load_config_dict({**{k: v for k, v in fleet_config(
        "http://127.0.0.1:9/gpu-data", [("gpu-a", "ct1", closed_url())]).items() if k != "monitor"},
        "prometheus": {"url": "http://127.0.0.1:9", "probe_endpoints": False},
        "heal": {"confirm_budget_s": 30}})

    def prober(*_a):
        raise AssertionError("re-probed though the source gives no direct probe")

    clock = FakeClock()
    with StateDir(tmp_path, 1) as store:
        result = check.run(cfg, store, NOW, obs=observation("prometheus", GpuSample(endpoint="refused")))
        assert confirm.run(cfg, store, result, clock.clock, prober) is result
    assert clock.sleeps == []
