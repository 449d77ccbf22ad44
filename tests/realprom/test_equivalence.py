"""The same scenario through gpu-monitor and through Prometheus gives the same issues at the same
polls (issue 13 "Done when").

One simulated fleet (``gpuheal.sim``, its clock running at real speed) is read two ways at once:
its gpu-monitor, and a real Prometheus scraping a dcgm-exporter look-alike that serves the same
world's values every second. Two gpuheal configs, two state directories, polled at the same
instants. The trend rules' windows are scaled to seconds (Rule 2 and Rule 8: 10.5 s); polls fall
0.5 s after a scrape and events 2 s before a poll, so no window edge comes near a sample of
either source: which samples a window holds does not depend on a few hundred ms of scheduling
(checked offline over a grid of delays before choosing these numbers).
"""

from __future__ import annotations

import copy
import json
import time

import pytest
import yaml

from gpuheal.config import load_config_dict
from gpuheal.sim import Scenario, SimFleet
from gpuheal.sim.dcgm import Exporter, world_readings
from gpuheal.state.store import StateDir
from gpuheal.steps import check
from tests.lab import scenario

# a real-systems tier of about three minutes: out of the fast suite (-m "not realserver") like the
# llama-server tier, on 2 shared cores; `make test` and CI run it
pytestmark = [pytest.mark.prometheus, pytest.mark.realserver]

POLL_S = 3.0
WINDOW_S = 10.5
RULES = {
    "vram-leak": {"window_h": WINDOW_S / 3600, "min_span_h": 4.5 / 3600, "min_samples": 3,
                  "recover_span_h": 4.5 / 3600, "recover_min_samples": 3},
    "thermal-warning": {"window_s": WINDOW_S, "min_span_s": 4.5, "min_samples": 3},
    "thermal-rising": {"window_s": WINDOW_S, "min_span_s": 4.5, "min_samples": 3},
}
# (poll index, what happens 2 s before it); polls 0-5 warm both windows up with a flat fleet
EVENTS = [
    (6, "gpu-a", {"set": {"temp_c": 91}}),
    (6, "gpu-b", {"ramp": {"vram_used_mb": 3000.0}}),  # 50 MB/s
    (9, "gpu-a", {"set": {"temp_c": 60}}),
    (10, "gpu-b", {"ramp": {"vram_used_mb": 0.0}}),
]
POLLS = 17


def _firing_view(health):
    return sorted((i["gpu"], i["issue"], i["state"]) for i in health["issues"])


def test_same_scenario_same_issues_same_polls(prom_server, tmp_path):
    scn = scenario([{"alias": "gpu-a", "host": "ct1", "requests_60s": 0},
                    {"alias": "gpu-b", "host": "ct2", "requests_60s": 0}])
    fleet = SimFleet(Scenario.from_dict(scn), host="127.0.0.1", ports="ephemeral", realtime_speed=1.0).start()
    exporter = Exporter(world_readings(fleet.world, {"gpu-a": ("ct1", 0), "gpu-b": ("ct2", 0)})).start()
    try:
        srv = prom_server({"dcgm": [exporter.target]})
        srv.wait_samples("DCGM_FI_DEV_GPU_TEMP", 3, count=2)
        mon_raw = fleet.config_dict()
        mon_raw.pop("litellm")
        mon_raw["rules"] = copy.deepcopy(RULES)
        # windows of seconds: Rule 2's trend asked every poll, as the history path fits every poll
        # (remembering it for prometheus.trend_every_s is tested in test_prometheus_source.py)
        prom_raw = {"prometheus": {"url": srv.url, "timeout_s": 5, "trend_every_s": 0},
                    "gpus": copy.deepcopy(mon_raw["gpus"]), "rules": copy.deepcopy(RULES)}
        (tmp_path / "prom.yaml").write_text(yaml.safe_dump(prom_raw))
        cfgs = {"monitor": load_config_dict(mon_raw), "prometheus": load_config_dict(prom_raw)}
        seen: dict[str, list] = {"monitor": [], "prometheus": []}
        # polls 0.5 s after a scrape (Prometheus scrapes a target at a fixed phase)
        last = max(float(r["value"][1]) for r in srv.query("timestamp(DCGM_FI_DEV_GPU_TEMP)"))
        t0 = last + int(time.time() - last) + 2.5
        for k in range(POLLS):
            due = t0 + k * POLL_S
            for _, alias, event in [e for e in EVENTS if e[0] == k]:
                time.sleep(max(0.0, due - 2.0 - time.time()))
                fleet.apply({"gpu": alias, **event})
            time.sleep(max(0.0, due - time.time()))
            srv.wait_for(f"timestamp(DCGM_FI_DEV_GPU_TEMP) > {due - 0.7:.3f}", lambda r: len(r) == 2, timeout_s=10)
            now = fleet.now()
            for name, cfg in cfgs.items():
                with StateDir(tmp_path / f"state-{name}", 10) as store:
                    res = check.run(cfg, store, now)
                    seen[name].append(_firing_view(res.health))
        diffs = [(k, a, b) for k, (a, b) in enumerate(zip(seen["monitor"], seen["prometheus"], strict=True)) if a != b]
        assert not diffs, json.dumps(diffs, indent=1)
        fired = {(g, i) for poll in seen["prometheus"] for g, i, s in poll if s == "firing"}
        assert {("gpu-a", "thermal-critical"), ("gpu-b", "vram-leak")} <= fired, seen["prometheus"]
        assert seen["prometheus"][-1] == [], "everything resolved by the last poll"
        assert not (tmp_path / "state-prometheus" / "history.json").exists()
    finally:
        exporter.stop()
        fleet.stop()
