"""Rule 8 tier 2 escalates on "still rising", as the spec says (issue 27 item 10): "If Tier 2 triggers
and temp still rising after 5 min → possible hardware failure". A GPU falling above 80 °C when the
verification window passes keeps its load shed and is judged again; only one still rising is escalated.

Each poll is a real ``heal --apply`` run (the real sense over loopback, a state directory opened afresh),
on a jittered cron clock, through every source mode as ``tests/test_source_modes.py`` drives them:
gpu-monitor, nvidia-smi without it, gpu-monitor down with the Rule 7.3 fallback, and a real Prometheus
whose TSDB holds the scenario's dcgm-exporter series at each poll's instant. The load actions are
local commands that append a line to a file (what ran, and how often).
"""

from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prom import PrometheusServer, prometheus_bin  # noqa: F401 - the fixture
from servers import LoopbackServer, Reply, closed_url, fleet_config, json_reply, monitor_document
from test_bench_fakes import completion_body

from gpuheal.config import load_config_dict
from gpuheal.core.memory import Memory
from gpuheal.core.remedy import Rechecking
from gpuheal.rules.thermal_rising import remedy as tier2
from gpuheal.rules.thermal_rising.memory import RISE, RiseRow
from gpuheal.state.store import StateDir
from gpuheal.steps.heal import Heal

START = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
POLLS = 19
MODES = ("monitor", "smi", "fallback")
PROM = pytest.param("prometheus", marks=[pytest.mark.prometheus, pytest.mark.realserver])
NOT_501 = Reply(501, '{"error":{"code":501,"message":"This server does not support metrics endpoint.",'
                     '"type":"not_supported_error"}}')


def rising(poll: int) -> float:
    """66 °C rising 3 °C/min to 84, then 1 °C/min on: still rising when tier 2's window passes."""
    return 66 + 3 * poll if poll <= 6 else 84 + (poll - 6)


def falling(poll: int) -> float:
    """The same climb to 84 °C, then falling 0.5 °C/min: still above 80 °C when tier 2's window passes."""
    return 66 + 3 * poll if poll <= 6 else 84 - 0.5 * (poll - 6)


PROFILES = {"rising": rising, "falling": falling}


def poll_times(seed: int) -> list[datetime]:
    rng = random.Random(seed)
    return [START + timedelta(seconds=60 * poll + rng.uniform(0.3, 1.7)) for poll in range(POLLS)]  # cron is late


def smi_row(index: int, temp_c: float) -> str:
    return f"{index}, NVIDIA GeForce RTX 3090, {temp_c:g}, 12000, 24576, 87, 281.40, 350.00"


class Fleet:
    """One GPU (gpu-dense on ct8) in one source mode, fed one temperature per poll."""

    def __init__(self, tmp: Path, mode: str, profile, monkeypatch, prom_url: str | None = None) -> None:
        self.tmp, self.profile = tmp, profile
        completion = json_reply(completion_body(4))
        self.server = LoopbackServer({"/health": Reply(200, {"status": "ok"}), "/metrics": NOT_501,
                                      "/props": json_reply({"is_sleeping": False}),
                                      ("POST", "/completion"): completion}).start()
        self.monitor = LoopbackServer({}).start()
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        tool = bin_dir / "nvidia-smi"
        tool.write_text(f"#!/bin/sh\ncat {tmp}/rows.csv\n")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        url = self.monitor.url + "/gpu-data" if mode == "monitor" else closed_url() + "/gpu-data"
        raw = fleet_config(url, [("gpu-dense", "ct8", self.server.url)], timeout_s=3.0)
        log = str(tmp / "actions.log")
        raw["gpus"][0].update({
            "gpu_index": 0,
            "shed_load_command": [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('shed\\n')", log],
            "redirect_command": [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('redirect\\n')", log],
            "restore_load_command": [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('restore\\n')",
                                     log],
        })
        raw["rules"] = {"thermal-critical": {"temp_c": 120, "clear_below_c": 110}}  # Rule 8 alone
        raw["heal"] = {"startup_grace_s": 0}
        if mode in ("smi", "prometheus"):
            del raw["monitor"]
        if mode == "prometheus":
            raw["prometheus"] = {"url": prom_url, "timeout_s": 5, "trend_every_s": 0, "at_poll_time": True}
        self.cfg = load_config_dict(raw)

    def feed(self, poll: int) -> None:
        doc = monitor_document([])
        doc["gpus"] = [{"hostname": "ct8", "index": 0, "name": "NVIDIA GeForce RTX 3090", "vendor": "nvidia",
                        "vram_total_mb": 24576, "vram_used_mb": 12000, "util_pct": 87, "power_w": 281.4,
                        "power_limit_w": 350, "temp_c": self.profile(poll)}]
        self.monitor.set("/gpu-data", json_reply(doc))
        (self.tmp / "rows.csv").write_text(smi_row(0, self.profile(poll)) + "\n")

    def actions(self) -> list[str]:
        path = self.tmp / "actions.log"
        return path.read_text().split() if path.exists() else []

    def close(self) -> None:
        self.server.stop()
        self.monitor.stop()


def run(tmp: Path, mode: str, name: str, monkeypatch, seed: int, prom_url: str | None = None) -> dict:
    """Every poll a ``heal --apply``: → the audit, the alert queue and what ran."""
    work = tmp / f"{mode}-{name}"
    work.mkdir()
    fleet = Fleet(work, mode, PROFILES[name], monkeypatch, prom_url)
    states: list[dict] = []
    try:
        for poll, now in enumerate(poll_times(seed)):
            fleet.feed(poll)
            with StateDir(work / "state", 10) as store:
                health = Heal(fleet.cfg, store, now, apply=True).run(None, None)
            states.append({i["issue"]: i["state"] for i in health["issues"]})
    finally:
        fleet.close()
    state = work / "state"
    audit = [json.loads(line) for line in (state / "gpu-self-heal-log.jsonl").read_text().splitlines()]
    queue = json.loads((state / "alerts.json").read_text())["data"]["queue"]
    return {"audit": audit, "queue": queue, "ran": fleet.actions(), "states": states}


def escalations(out: dict) -> list[dict]:
    return [a for a in out["queue"] if a["kind"] == "escalated" and a["issue"] == "thermal-rising"
            and "possible hardware failure" in a["summary"]]  # fmt: skip


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    base = tmp_path_factory.mktemp("tier2")
    mp = pytest.MonkeyPatch()
    try:
        return {(mode, name): run(base, mode, name, mp, seed=3 * i + j)
                for i, mode in enumerate(MODES) for j, name in enumerate(PROFILES)}
    finally:
        mp.undo()


DCGM = (("temp_c", "DCGM_FI_DEV_GPU_TEMP"), ("vram_used_mb", "DCGM_FI_DEV_FB_USED"),
        ("vram_free_mb", "DCGM_FI_DEV_FB_FREE"), ("util_pct", "DCGM_FI_DEV_GPU_UTIL"),
        ("power_w", "DCGM_FI_DEV_POWER_USAGE"))


def openmetrics(profile, times: list[datetime]) -> str:
    lines = []
    for key, metric in DCGM:
        lines += [f"# HELP {metric} {key}", f"# TYPE {metric} gauge"]
        labels = 'gpu="0",UUID="GPU-dense",modelName="NVIDIA GeForce RTX 3090",Hostname="ct8"'
        for poll, at in enumerate(times):
            v = {"temp_c": profile(poll), "vram_used_mb": 12000, "vram_free_mb": 12576, "util_pct": 87,
                 "power_w": 281.4}
            lines.append(f"{metric}{{{labels}}} {v[key]:g} {int(at.timestamp() * 1000) / 1000:.3f}")
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.fixture(scope="module")
def prom_outcomes(tmp_path_factory, prometheus_bin):  # noqa: F811 - the fixture imported above
    base = tmp_path_factory.mktemp("tier2-prom")
    out = {}
    for j, name in enumerate(PROFILES):
        seed = 3 * len(MODES) + j
        work = base / f"tsdb-{name}"
        work.mkdir()
        (work / "series.om").write_text(openmetrics(PROFILES[name], poll_times(seed)))
        promtool = str(Path(prometheus_bin).with_name("promtool"))
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(work / "series.om"),
                        str(work / "prom" / "tsdb")], check=True, capture_output=True, timeout=60)
        mp = pytest.MonkeyPatch()
        with PrometheusServer(work / "prom", {}, binary=prometheus_bin) as srv:
            try:
                out[name] = run(base, "prometheus", name, mp, seed, srv.url)
            finally:
                mp.undo()
    return out


def outcome(request, mode: str, name: str) -> dict:
    if mode == "prometheus":
        return request.getfixturevalue("prom_outcomes")[name]
    return request.getfixturevalue("outcomes")[(mode, name)]


@pytest.mark.parametrize("mode", [*MODES, PROM])
def test_still_rising_five_minutes_after_tier2_is_escalated(request, mode):
    out = outcome(request, mode, "rising")
    assert len(escalations(out)) == 1, out["queue"]
    failed = [r for r in out["audit"] if r["issue"] == "thermal-rising" and r["phase"] == "verification"]
    assert [r["result"] for r in failed] == ["failed"], failed
    assert "redirect" in out["ran"]


@pytest.mark.parametrize("mode", [*MODES, PROM])
def test_falling_above_80_keeps_the_fix_running_and_is_never_escalated(request, mode):
    out = outcome(request, mode, "falling")
    assert escalations(out) == [], out["queue"]
    lines = [r for r in out["audit"] if r["issue"] == "thermal-rising" and r["phase"] == "verification"]
    rechecks = [r for r in lines if r["result"] == "pending"]
    assert rechecks, lines
    assert all("re-checked at" in r["verification"]["recheck"] for r in rechecks)
    assert all(r["verification"]["still_open_after_s"] >= 290 for r in rechecks)
    assert "failed" not in [r["result"] for r in lines]
    # the load stays shed while it is above 80 °C: no restore before the issue cleared
    ran = out["ran"]
    assert "redirect" in ran and ("restore" not in ran or ran.index("restore") > ran.index("redirect"))
    cleared = [n for n, s in enumerate(out["states"]) if "thermal-rising" not in s]
    firing = [n for n, s in enumerate(out["states"]) if "thermal-rising" in s]
    assert firing and cleared and cleared[-1] > firing[-1]  # it cleared below 80 °C, by itself
    assert [r["result"] for r in lines][-1] == "resolved"


# --------------------------------------------------------------------------- the hook itself (pure)


def _seen(row: RiseRow | None, now_s: float = 1000.0) -> Rechecking:
    cfg = load_config_dict(fleet_config(closed_url(), [("gpu-dense", "ct8", closed_url())]))
    memory = Memory()
    if row is not None:
        memory.of(RISE)["gpu-dense"] = row
    return Rechecking("gpu-dense", "thermal-rising", "2026-07-18T08:06:00Z", ("redirect-traffic",), 700.0, {},
                      memory, now_s, 2.0, cfg)


@pytest.mark.parametrize(("row", "kept"), [
    (RiseRow(1000.0, 84.0, -0.7), True),   # falling above 80 °C: re-checked
    (RiseRow(1000.0, 83.0, 0.2), True),    # flat within the margin: not "still rising"
    (RiseRow(1000.0, 84.0, 0.9), False),   # still rising: fails (escalated)
    (RiseRow(1000.0, 84.0, None), False),  # too few samples: not known, fails as before
    (RiseRow(700.0, 84.0, -0.7), False),   # a row from an earlier poll: this poll did not see it
    (None, False),                         # nothing remembered
])
def test_recheck_keeps_only_a_gpu_no_longer_rising(row, kept):
    why = tier2.recheck(_seen(row))
    assert (why is not None) is kept
    if kept:
        assert "re-checked at" in why and "gpu-dense" in why


@pytest.mark.parametrize("stored", [None, "x", [], {}, {"at_s": "1", "temp_c": 80}, {"at_s": 1, "temp_c": float("nan")},
                                    {"at_s": 1, "temp_c": 80, "rise_c_per_min": "fast"},
                                    {"at_s": True, "temp_c": 80, "rise_c_per_min": 1.0}])
def test_a_damaged_rise_row_is_dropped(stored):
    assert RiseRow.load(stored) is None


def test_a_stored_rise_row_loads_back():
    row = RiseRow(5.0, 82.5, -0.25)
    assert RiseRow.load(json.loads(json.dumps(row.to_json()))) == row
    assert RiseRow.load({"at_s": 5, "temp_c": 82, "rise_c_per_min": None}) == RiseRow(5.0, 82.0, None)
