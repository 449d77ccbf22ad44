"""Issue 19, "Bad input": a source that provides a signal in one poll and not the next makes the rule
"not known" for that poll — its hold neither advances nor resets, and it is not listed in rules_off.
The gap here is a gpu-monitor outage answered by the Rule 7.3 fallback (readings, no request counts
nor circuit breakers), on a jittered cron clock; and a fallback-provenance reading is judged exactly as
one from gpu-monitor."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from gpuheal.config import load_config_dict
from gpuheal.model import Breaker, GpuSample, Observation
from gpuheal.steps.replay import replay

START = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)


def cfg():
    return load_config_dict({
        "monitor": {"url": "http://127.0.0.1:9/gpu-data"},
        "rules": {"model-stuck": {"hold_polls": 3}, "circuit-breaker-stuck": {"open_for_s": 150}},
        "gpus": [{"alias": "gpu-a", "host": "ct1", "endpoint": "http://127.0.0.1:9001"}],
    })


def poll(kind: str, at: datetime, temp_c: float = 50.0) -> Observation:
    """``M``: gpu-monitor delivered (a breaker open, every request failing); ``F``: gpu-monitor refused
    and the fallback read the GPU (no request counts, no breakers: not known, not healthy)."""
    base = {"temp_c": temp_c, "vram_used_mb": 8000, "vram_total_mb": 24576, "endpoint": "ok", "metrics": "ok"}
    if kind == "M":
        sample = GpuSample(**base, requests_60s=10, failures_60s=10, breaker=Breaker(open=True))
        return Observation(at=at, gpus={"gpu-a": sample}, monitor_ok=True, source="monitor")
    # the fallback declares no breakers nor request counts: a value it carries anyway (a damaged or
    # hand-edited trace) is not judged — were it, this closed breaker would restart Rule 5's count
    quiet = GpuSample(**base, requests_60s=10, failures_60s=0, breaker=Breaker(open=False))
    return Observation(at=at, gpus={"gpu-a": quiet}, monitor_ok=False, source="smi-fallback", fallback_ok=True)


def run(pattern: str, seed: int, temps=None):
    rng = random.Random(seed)
    obs = [poll(k, START + timedelta(seconds=60 * i + rng.uniform(0.2, 1.9)), *(temps[i:i + 1] if temps else ()))
           for i, k in enumerate(pattern)]
    result = replay(cfg(), obs)
    fired = {}
    for t in result.timeline:
        if t["event"] == "firing":
            fired.setdefault(t["issue"], t["poll"])
    return fired, [replay(cfg(), obs[:n]).rules_off for n in range(1, len(obs) + 1)]


@pytest.mark.parametrize("seed", range(4))
def test_a_missing_signal_neither_advances_nor_resets_the_hold(seed):
    steady, _ = run("MMMMMM", seed)
    gapped, offs = run("MMFMFM", seed)
    # model-stuck holds 3 delivered polls: polls 0, 1, 3 (not 2: the gap did not advance it, and
    # poll 3 did not start again: it did not reset it)
    assert steady["model-stuck"] == 2 and gapped["model-stuck"] == 3, (steady, gapped)
    # the breaker counts from when it was first seen open (poll 0): a gap that reset it would fire
    # only 150 s after poll 3
    assert steady["circuit-breaker-stuck"] == gapped["circuit-breaker-stuck"] == 3
    for off in offs:  # a poll's gap is not "off": gpu-monitor is configured
        assert not {o["rule"] for o in off} & {"model-stuck", "circuit-breaker-stuck"}, off


@pytest.mark.parametrize("seed", range(3))
def test_a_fallback_reading_is_judged_like_a_monitor_reading(seed):
    temps = [88, 89, 90, 91, 92, 92]
    through_monitor, _ = run("MMMMMM", seed, temps)
    through_fallback, _ = run("MFFFFF", seed, temps)
    assert through_monitor["thermal-critical"] == through_fallback["thermal-critical"]
    assert through_monitor.get("thermal-rising") == through_fallback.get("thermal-rising")


def events(pattern: str, seed: int, issue: str) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    obs = [poll(k, START + timedelta(seconds=60 * i + rng.uniform(0.2, 1.9))) for i, k in enumerate(pattern)]
    return [(t["poll"], t["event"]) for t in replay(cfg(), obs).timeline if t["issue"] == issue]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("issue", ["model-stuck", "circuit-breaker-stuck"])
def test_a_gap_poll_leaves_the_issue_as_it_was(seed, issue):
    """A gap poll is no poll for the rule: a pending issue is not dropped there (and does not start
    again, pending anew, at the next delivered poll), and a firing one does not resolve there. The
    fallback's quiet sample (a closed breaker, no failures) is what the rules would read were the
    poll judged: without the engine's per-poll gate (``_gate_open``), Rule 5 drops at poll 2,
    resolves at poll 4 and fires again at poll 5; without ``FleetView.gap``, Rule 3 drops at each
    gap and starts again. The first firing poll alone hides both (the breaker's start is
    remembered, and a hold of polls counts again from the next delivered one)."""
    assert events("MMFMFM", seed, issue) == [(0, "pending"), (3, "firing")]
    assert events("MMMMFFFM", seed, issue) == [(0, "pending"), (2 if issue == "model-stuck" else 3, "firing")]
