"""Issue 27 defect 1: gpu-monitor answering with no GPUs, with fewer than configured, or without a configured
GPU is Rule 7's (the spec's pseudo-code "gpu-monitor returns no GPUs"; contract "Rule timing"): the GPUs it
lacks are read through the Rule 7.3 fallback (nvidia-smi over their transport) and judged like any reading,
``data-source-unreachable`` fires for them at the 3rd consecutive such poll (as for a refused monitor), and
what the fallback cannot feed is listed in ``rules_off``.

Two setups, each poll a real ``check`` on a jittered cron clock (cron starts 1-2 s late):

- the simulated fleet (``gpuheal.sim``: its gpu-monitor leaves out a GPU whose ``reported`` is false, as an
  exporter that lost its devices does), read through the simulator's nvidia-smi look-alike on PATH;
- the issue's own reproduction: a loopback gpu-monitor answering ``{"gpus": []}`` and a fake nvidia-smi
  printing a real RTX 3090's CSV row at 90 °C.

Before the fix, four polls of ``{"gpus": []}`` gave status degraded, a fault line per GPU, no issue,
temperature null and ``rules_off`` empty.
"""

from __future__ import annotations

import random
import stat
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from lab import Lab, scenario
from servers import HEALTH_OK, LoopbackServer, fleet_config, json_reply

from gpuheal import provenance as prov
from gpuheal.config import load_config_dict
from gpuheal.state.store import StateDir
from gpuheal.steps import check

DSU = "data-source-unreachable"
GPUS = [
    {"alias": "gpu-a", "host": "ct1", "gpu_index": 0, "temp_c": 90},
    {"alias": "gpu-b", "host": "ct2", "gpu_index": 1, "temp_c": 55},
]


def fake_smi(tmp: Path, monkeypatch, control_url: str) -> None:
    """``nvidia-smi`` on PATH: every simulated GPU's row (the look-alike's own index column), as the tool
    on a host prints its GPUs; each configured GPU takes its row by ``gpu_index``."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    rows = "".join(f'{sys.executable} -m gpuheal.sim.smi {control_url} --sim-gpu {g["alias"]} "$@"\n' for g in GPUS)
    tool.write_text("#!/bin/sh\n" + rows)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


@pytest.fixture
def lab(tmp_path, monkeypatch):
    # the look-alike is two Python starts per host: on a loaded machine that is seconds, not the 1 s a
    # real nvidia-smi needs within the probe deadline
    lab = Lab(tmp_path, scenario(GPUS), probe={"timeout_s": 20})
    fake_smi(tmp_path, monkeypatch, lab.fleet.control_url)
    yield lab
    lab.fleet.stop()


def polls(lab: Lab, reported: list[dict[str, bool]], seed: int) -> list[dict]:
    """One ``check`` per entry, each after 60 s ± cron's lateness, with the GPUs' ``reported`` as given."""
    rng = random.Random(seed)
    out = []
    for shown in reported:
        for alias, on in shown.items():
            lab.fleet.set(alias, {"reported": on})
        out.append(lab.check(advance_s=60 + rng.uniform(-0.7, 0.7)))
    return out


def firing(health: dict) -> dict[tuple[str, str], dict]:
    return {(i["gpu"], i["issue"]): i for i in health["issues"] if i["state"] == "firing"}


def test_a_monitor_listing_no_gpus_is_rule7_and_the_fallback_judges_them(lab):
    seen = polls(lab, [{"gpu-a": False, "gpu-b": False}] * 4, seed=1)
    assert [DSU in {i for _, i in firing(h)} for h in seen] == [False, False, True, True]  # the 3rd poll
    dsu = firing(seen[-1])[("fleet", DSU)]["detected"]
    assert dsu["source"] == "monitor" and dsu["fault"] == "invalid" and dsu["gpus"] == ["gpu-a", "gpu-b"]
    assert "lists no GPUs" in dsu["detail"]
    row = seen[-1]["gpus"]["gpu-a"]
    assert row["temp_c"] == 90 and prov.smi("nvidia", "local") in row["provenance"]  # read through nvidia-smi
    assert ("gpu-a", "thermal-critical") in firing(seen[1])  # judged like any reading: the 2nd hot poll
    assert not [f for f in seen[-1]["faults"] if f["source"] in ("gpu-a", "gpu-b")]  # one line, not one per GPU
    off = {o["rule"]: o for o in seen[-1]["rules_off"]}
    assert off["circuit-breaker-stuck"]["gpus"] == ["gpu-a", "gpu-b"] and "lists no GPU" in off[
        "circuit-breaker-stuck"]["why"]


def test_a_monitor_lacking_one_gpu_reads_that_one_through_the_fallback(lab):
    lab.fleet.set("gpu-b", {"temp_c": 91})
    seen = polls(lab, [{"gpu-a": True, "gpu-b": False}] * 4, seed=2)
    assert [DSU in {i for _, i in firing(h)} for h in seen] == [False, False, True, True]
    dsu = firing(seen[-1])[("fleet", DSU)]
    assert dsu["detected"]["gpus"] == ["gpu-b"] and "gpu-b" in dsu["summary"]
    a, b = seen[-1]["gpus"]["gpu-a"], seen[-1]["gpus"]["gpu-b"]
    assert prov.MONITOR in a["provenance"] and b["temp_c"] == 91 and prov.smi("nvidia", "local") in b["provenance"]
    assert {("gpu-a", "thermal-critical"), ("gpu-b", "thermal-critical")} <= set(firing(seen[1]))
    assert seen[-1]["rules_off"] == []  # gpu-monitor still counts and breaks for the rest: nothing is off


def test_a_monitor_flapping_between_empty_and_full_never_fires_rule7(lab):
    flaps = [{"gpu-a": i % 2 == 1, "gpu-b": i % 2 == 1} for i in range(6)]
    seen = polls(lab, flaps, seed=3)
    assert not [h for h in seen if ("fleet", DSU) in firing(h)]  # one bad poll is a fault, not an issue
    assert all(h["gpus"]["gpu-a"]["temp_c"] == 90 for h in seen)  # from the fallback or the monitor alike
    assert ("gpu-a", "thermal-critical") in firing(seen[1])
    lab.fleet.set("gpu-b", {"reported": True})
    lab.fleet.set("gpu-a", {"reported": True})
    assert ("fleet", DSU) not in firing(lab.check())


# --------------------------------------------------------------------------- the issue's reproduction


def smi_row(index: int, temp_c: float) -> str:
    """``--query-gpu=index,name,temperature.gpu,memory.used,memory.total,utilization.gpu,power.draw,power.limit
    --format=csv,noheader,nounits``, as a real RTX 3090 prints it."""
    return f"{index}, NVIDIA GeForce RTX 3090, {temp_c:g}, 21600, 24576, 87, 281.40, 350.00"


def test_four_polls_of_an_empty_gpus_list(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "rows.csv").write_text(smi_row(0, 90) + "\n")
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ncat {tmp_path}/rows.csv\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    rng = random.Random(27)
    start = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
    with LoopbackServer({"/gpu-data": json_reply({"gpus": []})}) as mon, LoopbackServer({"/health": HEALTH_OK}) as srv:
        raw = fleet_config(mon.url + "/gpu-data", [("gpu-hot", "ct8", srv.url)], timeout_s=2.0)
        cfg = load_config_dict(raw)
        for poll in range(4):
            with StateDir(tmp_path / "state", 10) as store:
                result = check.run(cfg, store, start + timedelta(seconds=60 * poll + rng.uniform(0.3, 1.7)))
    health = result.health
    assert result.obs.source == "smi-fallback" and result.obs.lacking == ("gpu-hot",)
    assert health["gpus"]["gpu-hot"]["temp_c"] == 90
    assert {("fleet", DSU), ("gpu-hot", "thermal-critical")} <= set(firing(health))
    assert [f["source"] for f in health["faults"]] == ["monitor"]
    assert {o["rule"] for o in health["rules_off"]} >= {"circuit-breaker-stuck"}


def test_doctor_warns_of_a_monitor_listing_no_gpus(tmp_path):
    from gpuheal.doctor.checks import monitor_check

    with LoopbackServer({"/gpu-data": json_reply({"gpus": []})}) as mon:
        cfg = load_config_dict(fleet_config(mon.url + "/gpu-data", [("gpu-hot", "ct8", "http://127.0.0.1:9")]))
        row = monitor_check(cfg)
    assert row.status == "warn" and "lists no GPUs" in row.detail, row
