"""Every rule under every source mode (issue 19, "Done when"): the same scenario fed through
gpu-monitor, through nvidia-smi without it, and through a gpu-monitor outage with the Rule 7.3
fallback gives the same issue at the same poll — or the rule is listed in ``rules_off`` with its
reason. Each poll is a real ``check`` (the real sense over loopback: gpu-monitor a loopback server,
nvidia-smi a fake on PATH printing the real CSV shape, every llama-server a loopback ``/health``),
on a jittered cron clock. Prometheus mode is walked through the declarations here and through the
real engine in ``tests/realprom/test_equivalence.py``.
"""

from __future__ import annotations

import os
import random
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from servers import HEALTH_OK, LoopbackServer, Reply, closed_url, fleet_config, json_reply, monitor_document

from gpuheal.config import load_config_dict
from gpuheal.core.coverage import rules_off
from gpuheal.model import GpuSample, Observation
from gpuheal.rules import ALL
from gpuheal.signals import ALWAYS, SOURCES, Source, spec, unmet
from gpuheal.state.store import StateDir
from gpuheal.steps import check

START = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
POLLS = 12
MODES = ("monitor", "smi", "fallback")
NOT_501 = Reply(501, '{"error":{"code":501,"message":"This server does not support metrics endpoint.",'
                     '"type":"not_supported_error"}}')


def dense(poll: int) -> dict[str, float]:
    """gpu-dense rises 3 °C a minute from 66 °C (the issue's measurement) and leaks 40 MB a minute."""
    return {"temp_c": min(66 + 3 * poll, 93), "vram_used_mb": 12000 + 40 * poll}


def cool(poll: int) -> dict[str, float]:
    return {"temp_c": 55, "vram_used_mb": 8000}


READINGS = {"gpu-dense": ("ct8", dense), "gpu-cool": ("ct9", cool)}
FAST_LEAK = {"vram-leak": {"window_h": 0.25, "min_samples": 5, "min_span_h": 0.08, "recover_span_h": 0.1,
                           "recover_min_samples": 3}}


def smi_row(index: int, values: dict[str, float]) -> str:
    """One ``--query-gpu=index,name,temperature.gpu,memory.used,memory.total,utilization.gpu,power.draw,
    power.limit --format=csv,noheader,nounits`` line, as a real RTX 3090 prints it."""
    return (f"{index}, NVIDIA GeForce RTX 3090, {values['temp_c']:g}, {values['vram_used_mb']:g}, 24576, 87, "
            f"281.40, 350.00")


class Fleet:
    """One mode's sources, driven poll by poll from :data:`READINGS`."""

    def __init__(self, tmp: Path, mode: str, monkeypatch) -> None:
        self.mode, self.tmp = mode, tmp
        self.servers = [LoopbackServer({"/health": HEALTH_OK, "/metrics": NOT_501,
                                        "/props": json_reply({"is_sleeping": False})}).start() for _ in READINGS]
        self.monitor = LoopbackServer({}).start()
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        tool = bin_dir / "nvidia-smi"  # both hosts are local here: the CSV names the host's own rows
        tool.write_text(f'#!/bin/sh\ncat {tmp}/rows.csv\n')
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        url = self.monitor.url + "/gpu-data" if mode == "monitor" else closed_url() + "/gpu-data"
        raw = fleet_config(url, [(a, h, s.url) for (a, (h, _)), s in zip(READINGS.items(), self.servers,
                                                                        strict=True)], timeout_s=1.0)
        for i, g in enumerate(raw["gpus"]):
            g["gpu_index"] = i
            g["rules"] = FAST_LEAK
        raw["litellm"] = {"api_key": "test-key"}
        if mode == "smi":
            del raw["monitor"]
        self.cfg = load_config_dict(raw)

    @staticmethod
    def config_only(tmp: Path, mode: str):
        """The same config, for replay (no servers are contacted)."""
        raw = fleet_config(closed_url() + "/gpu-data", [(a, h, closed_url()) for a, (h, _) in READINGS.items()])
        for i, g in enumerate(raw["gpus"]):
            g["gpu_index"] = i
            g["rules"] = FAST_LEAK
        if mode == "smi":
            del raw["monitor"]
        return load_config_dict(raw)

    def feed(self, poll: int) -> None:
        values = {alias: fn(poll) for alias, (_, fn) in READINGS.items()}
        doc = monitor_document([])
        doc["gpus"] = [{"hostname": h, "index": i, "name": "NVIDIA GeForce RTX 3090", "vendor": "nvidia",
                        "vram_total_mb": 24576, "util_pct": 87, "power_w": 281.4, "power_limit_w": 350,
                        **values[a]} for i, (a, (h, _)) in enumerate(READINGS.items())]
        self.monitor.set("/gpu-data", json_reply(doc))
        rows = [smi_row(i, values[a]) for i, a in enumerate(READINGS)]
        (self.tmp / "rows.csv").write_text("\n".join(rows) + "\n")

    def close(self) -> None:
        for s in (*self.servers, self.monitor):
            s.stop()


def run_mode(tmp_path: Path, mode: str, monkeypatch, seed: int) -> tuple[dict, list[dict]]:
    """→ ({(gpu, issue): first poll it fired}, the last poll's rules_off); the polls are recorded
    in ``<mode>/trace.jsonl`` (``check --record``)."""
    rng = random.Random(seed)
    (tmp_path / mode).mkdir()
    fleet = Fleet(tmp_path / mode, mode, monkeypatch)
    fired: dict[tuple[str, str], int] = {}
    off: list[dict] = []
    LAST.pop(mode, None)
    try:
        for poll in range(POLLS):
            fleet.feed(poll)
            now = START + timedelta(seconds=60 * poll + rng.uniform(0.3, 1.7))  # cron starts late
            with StateDir(tmp_path / mode / "state", 10) as store:
                result = check.run(fleet.cfg, store, now, record=tmp_path / mode / "trace.jsonl")
            for issue in result.issues:
                if issue["state"] == "firing":
                    fired.setdefault((issue["gpu"], issue["issue"]), poll)
            off = result.health["rules_off"]
            LAST[mode] = result.issues
    finally:
        fleet.close()
    return fired, off


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("modes")


@pytest.fixture(scope="module")
def outcomes(base):
    mp = pytest.MonkeyPatch()
    try:
        out = {mode: run_mode(base, mode, mp, seed=i) for i, mode in enumerate(MODES)}
        out["cfg"] = {mode: Fleet.config_only(base / mode, mode) for mode in MODES}
        return out
    finally:
        mp.undo()


@pytest.mark.parametrize("mode", MODES)
def test_a_trace_replays_as_it_ran_in_every_mode(outcomes, base, mode):
    """A trace recorded without gpu-monitor replays with the semantics it ran with: the same
    issues at the same polls and the same rules_off (``source`` was read back as "monitor")."""
    from gpuheal.steps.replay import read_trace, replay

    observations, _ = read_trace(base / mode / "trace.jsonl")
    assert {o.source for o in observations} == {"smi-fallback" if mode == "fallback" else mode}
    result = replay(outcomes["cfg"][mode], observations)
    replayed: dict[tuple[str, str], int] = {}
    for t in result.timeline:
        if t["event"] == "firing":
            replayed.setdefault((t["gpu"], t["issue"]), t["poll"])
    live, off = outcomes[mode]
    assert replayed == live
    assert result.rules_off == off


LAST: dict[str, list[dict]] = {}  # each mode's last poll's issues
GPU_READING_RULES = ("thermal-warning", "thermal-rising", "thermal-critical", "vram-leak")


@pytest.mark.parametrize("issue", GPU_READING_RULES)
@pytest.mark.parametrize("mode", ("smi", "fallback"))
def test_a_reading_rule_fires_at_the_same_poll_whatever_the_source(outcomes, mode, issue):
    """The issue's bug: through nvidia-smi (or the fallback while gpu-monitor is down) Rule 8 and
    Rule 2 never fired; only thermal-critical, at 87 °C."""
    through_monitor, _ = outcomes["monitor"]
    fired, off = outcomes[mode]
    assert ("gpu-dense", issue) in through_monitor, through_monitor
    assert fired.get(("gpu-dense", issue)) == through_monitor[("gpu-dense", issue)], (mode, fired)
    assert issue not in {o["rule"] for o in off}


def test_rule8_fires_at_72_degrees_as_through_gpu_monitor(outcomes):
    for mode in MODES:
        fired, _ = outcomes[mode]
        assert dense(fired[("gpu-dense", "thermal-warning")])["temp_c"] <= 75, mode


def test_the_fallback_judges_while_rule7_fires(outcomes):
    fired, off = outcomes["fallback"]
    open_now = {(i["gpu"], i["issue"]): i for i in LAST["fallback"]}
    dsu = open_now[("fleet", "data-source-unreachable")]["detected"]
    assert dsu["source"] == "monitor" and dsu["fault"] == "refused", dsu
    assert fired.get(("fleet", "data-source-unreachable")) == 2  # the 3rd poll of the outage
    # gpu-monitor is configured: its rules are "not known" this outage, never listed off
    assert not {o["rule"] for o in off} & {"circuit-breaker-stuck", "workload-misrouted", "data-source-unreachable"}


def test_no_gpu_fires_on_the_cool_gpu_and_no_extra_issue_anywhere(outcomes):
    for mode in MODES:
        fired, _ = outcomes[mode]
        assert not [k for k in fired if k[0] == "gpu-cool"], (mode, fired)
        extra = {k for k in fired if k[1] not in GPU_READING_RULES} - {("fleet", "data-source-unreachable")}
        assert not extra, (mode, extra)


@pytest.mark.parametrize("source", [s for s in Source if s != Source.FALLBACK])
def test_every_rule_judges_or_is_listed_off_in_every_mode(source):
    """By construction: a rule the configured source cannot feed is in rules_off, with why and fix."""
    obs = Observation(at=START, gpus={"g": GpuSample(endpoint="ok", metrics="ok")}, monitor_ok=True,
                      source=source.value)
    listed = {o["rule"]: o for o in rules_off(source.value, obs, ALL)}
    for rule in ALL:
        can = not unmet(rule.NEEDS, SOURCES[source].provides | ALWAYS)
        assert can != (rule.ID in listed), (source, rule.ID)
        if rule.ID in listed:
            assert listed[rule.ID]["why"] and listed[rule.ID]["fix"], listed[rule.ID]


def test_smi_mode_lists_exactly_the_monitor_only_rules_off():
    obs = Observation(at=START, gpus={"g": GpuSample(endpoint="ok", metrics="ok")}, monitor_ok=True, source="smi")
    listed = {o["rule"] for o in rules_off("smi", obs, ALL)}
    assert listed == {"circuit-breaker-stuck", "workload-misrouted", "data-source-unreachable"}


def test_a_gpu_without_metrics_and_without_monitor_lists_model_stuck_for_it():
    obs = Observation(at=START, gpus={"a": GpuSample(endpoint="ok", metrics="disabled"),
                                      "b": GpuSample(endpoint="ok", metrics="ok")}, monitor_ok=True, source="smi")
    off = {o["rule"]: o for o in rules_off("smi", obs, ALL)}
    assert off["model-stuck"]["gpus"] == ["a"] and "--metrics" in off["model-stuck"]["fix"]


def test_an_unknown_recorded_source_provides_nothing():
    """A damaged trace's source judges nothing rather than something wrong."""
    assert spec("bogus").provides == frozenset()
    assert Observation.from_dict({"at": "2026-07-18T08:00:00Z", "monitor_ok": True, "gpus": {},
                                  "source": "bogus"}).source.startswith("unknown:")
