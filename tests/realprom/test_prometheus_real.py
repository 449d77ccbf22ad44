"""gpuheal's Prometheus source against the real engine (issue 13 "Real parts"): a real Prometheus
scraping the dcgm-exporter look-alike every second; every assertion waits for real scrapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpuheal.config import load_config_dict
from gpuheal.sim.dcgm import Exporter, exposition
from gpuheal.sources import prometheus

# a real-systems tier of about three minutes: out of the fast suite (-m "not realserver") like the
# llama-server tier, on 2 shared cores; `make test` and CI run it
pytestmark = [pytest.mark.prometheus, pytest.mark.realserver]

GPUHEAL = str(Path(sys.executable).with_name("gpuheal"))
BASE = {"temp_c": 50, "vram_used_mb": 8000, "vram_total_mb": 24576, "util_pct": 40, "power_w": 210.5}


class Play:
    """A scenario the exporter plays: per GPU a dict of values, changed by the test."""

    def __init__(self, hosts):
        self.t0 = time.time()
        self.values = {h: dict(BASE) for h in hosts}
        self.ramps: dict[str, float] = {}  # host -> MB per second of VRAM growth
        self.ramp_from: dict[str, tuple[float, float]] = {}

    def ramp(self, host, per_s, reading="vram_used_mb"):
        self.ramp_from[host] = (time.time(), self.values[host][reading], reading)
        self.ramps[host] = per_s

    def __call__(self):
        out = []
        now = time.time()
        for host, v in self.values.items():
            v = dict(v)
            if host in self.ramps:
                start, base, reading = self.ramp_from[host]
                v[reading] = base + self.ramps[host] * (now - start)
            out.append((host, 0, v))
        return out


class Endpoints:
    """Every GPU's llama-server ``/health`` on one loopback port (``{url}/{alias}/health``): the
    endpoints are not what these tests are about, only that they answer."""

    def __enter__(self):
        from tests.servers import HEALTH_OK, LoopbackServer, Reply

        self.server = LoopbackServer(
            default=lambda req: HEALTH_OK if req.path.endswith("/health") else Reply(404, ""), record=False
        ).__enter__()
        self.url = self.server.url
        return self

    def __exit__(self, *exc):
        self.server.__exit__(*exc)


def _config(url, hosts, endpoints="http://127.0.0.1:9", **prom):
    return {
        "prometheus": {"url": url, "timeout_s": 5, **prom},
        "rules": {
            "vram-leak": {"window_h": 10 / 3600, "min_span_h": 5 / 3600, "min_samples": 4, "recover_span_h": 5 / 3600},
            "thermal-warning": {"window_s": 10, "min_span_s": 5},
            "thermal-rising": {"window_s": 10, "min_span_s": 5},
        },
        "gpus": [{"alias": f"gpu-{h}", "host": h, "endpoint": f"{endpoints}/gpu-{h}"} for h in hosts],
    }


def test_readings_trends_and_staleness_from_the_real_engine(prom_server):
    play = Play(["ct1", "ct2"])
    play.ramp("ct1", 20.0)  # 72,000 MB/h
    with Exporter(play) as ex:
        srv = prom_server({"dcgm": [ex.target]})
        srv.wait_samples("DCGM_FI_DEV_FB_USED", 8, count=2)
        cfg = load_config_dict(_config(srv.url, ["ct1", "ct2"]))
        got = prometheus.read(cfg, time.time())
        assert got.ok and got.faults == []
        a, b = got.values["gpu-ct1"], got.values["gpu-ct2"]
        assert b["temp_c"] == 50 and b["vram_used_mb"] == 8000 and b["vram_total_mb"] == 24576
        assert b["power_w"] == 210.5 and b["util_pct"] == 40 and b["name"] == "NVIDIA GeForce RTX 3090"
        # deriv() over the ramp the exporter plays: 20 MB/s (the exporter rounds to whole MiB)
        assert abs(a["vram_trend"].slope - 72000) < 72000 * 0.05, a["vram_trend"]
        assert a["vram_trend"].n >= 8 and 5 <= a["vram_trend"].span_s <= 10
        assert abs(b["vram_trend"].slope) < 1
        assert "temp_trend" not in b  # 50 °C: a poll asks Rule 8's rise of the hot GPUs only
        h1, h2 = a["vram_trend"].halves
        assert abs(h1 - 72000) < 72000 * 0.1 and abs(h2 - 72000) < 72000 * 0.1

        # ct2 vanishes from the exporter: Prometheus marks it stale at the next scrape
        del play.values["ct2"]
        srv.wait_for('DCGM_FI_DEV_GPU_TEMP{Hostname="ct2"}', lambda r: r == [])
        got = prometheus.read(cfg, time.time())
        assert got.ok and got.values["gpu-ct2"] == {}
        assert [f.source for f in got.faults] == ["gpu-ct2"]


@pytest.mark.parametrize("named", [True, False], ids=["hosts-named", "heat-wave"])
def test_rule8_rise_is_asked_of_the_hot_gpus_only(prom_server, monkeypatch, named):
    """Rule 8 judges the rise only above its ``temp_c`` (70 °C): a poll asks it, after the
    temperatures, of the GPUs from 65 °C up — by host name (escaped for the real regex engine), or
    past ``MAX_HOT_NAMED`` hot GPUs filtered by temperature in PromQL. The same rises either way."""
    if not named:
        monkeypatch.setattr(prometheus, "MAX_HOT_NAMED", 0)
    hosts = ["ct1", "ct-2.hot", "ct-2xhot"]  # the regex's "." must be escaped: ct-2xhot runs cool
    play = Play(hosts)
    play.values["ct1"]["temp_c"] = 66
    play.values["ct-2.hot"]["temp_c"] = 72
    play.ramp("ct-2.hot", 0.5, "temp_c")  # 30 °C/min
    with Exporter(play) as ex:
        srv = prom_server({"dcgm": [ex.target]})
        srv.wait_samples("DCGM_FI_DEV_GPU_TEMP", 8, count=3)
        cfg = load_config_dict(_config(srv.url, hosts))
        got = prometheus.read(cfg, time.time())
        assert got.ok and got.faults == []
        warm, hot, cool = (got.values[f"gpu-{h}"] for h in hosts)
        assert warm["temp_trend"].slope == 0 and warm["temp_trend"].n >= 8
        assert abs(hot["temp_trend"].slope - 30) < 30 * 0.2, hot["temp_trend"]
        assert hot["temp_trend"].span_s >= 5  # proven to cover min_span_s
        assert cool["temp_c"] == 50 and "temp_trend" not in cool


def test_vram_trend_from_a_recording_rule(prom_server):
    """The large-fleet setup the README gives: Rule 2's ``deriv`` over a recorded average (one point
    per rule evaluation) instead of every raw sample: same slope, fewer points to read."""
    record = "gpuheal:vram_used_mb:avg2s"
    play = Play(["ct1", "ct2"])
    play.ramp("ct1", 20.0)  # 72,000 MB/h
    with Exporter(play) as ex:
        srv = prom_server({"dcgm": [ex.target]}, rules={record: "avg_over_time(DCGM_FI_DEV_FB_USED[2s])"})
        srv.wait_samples(record, 8, count=2)
        cfg = load_config_dict(_config(srv.url, ["ct1", "ct2"], queries={"vram_series": record + "{selector}"}))
        got = prometheus.read(cfg, time.time())
        assert got.ok and got.faults == []
        a, b = got.values["gpu-ct1"]["vram_trend"], got.values["gpu-ct2"]["vram_trend"]
        assert abs(a.slope - 72000) < 72000 * 0.1, a
        assert a.n >= 8 and 5 <= a.span_s <= 10 and abs(b.slope) < 1
        assert all(h > 72000 * 0.5 for h in a.halves), a  # sustained, as Rule 2 reads it (sustain_ratio 0.5)


def test_an_exporter_restart_with_new_labels_keeps_every_gpu_known(prom_server):
    """A dcgm-exporter restarted after a driver upgrade (or a pod restarted with a new ``pod``
    label) serves the same GPUs under new label sets: Prometheus marks the old series stale at the
    next scrape, and a poll right after reads each GPU from its new series alone — never two series
    for one GPU, never not known."""
    driver = {"version": "535"}

    def body():
        return exposition(
            [("ct1", 0, BASE), ("ct2", 0, BASE)], extra_labels=f',DCGM_FI_DRIVER_VERSION="{driver["version"]}"'
        )

    with Exporter(body) as ex:
        srv = prom_server({"dcgm": [ex.target]})
        srv.wait_samples("DCGM_FI_DEV_GPU_TEMP", 2, count=2)
        cfg = load_config_dict(_config(srv.url, ["ct1", "ct2"]))
        driver["version"] = "550"
        srv.wait_for('DCGM_FI_DEV_GPU_TEMP{DCGM_FI_DRIVER_VERSION="535"}', lambda r: r == [])
        srv.wait_for('DCGM_FI_DEV_GPU_TEMP{DCGM_FI_DRIVER_VERSION="550"}', lambda r: len(r) == 2)
        got = prometheus.read(cfg, time.time())
        assert got.ok and got.faults == [], got.faults
        assert all(got.values[a]["temp_c"] == 50 and got.values[a]["power_w"] == 210.5 for a in ("gpu-ct1", "gpu-ct2"))


def test_a_series_older_than_staleness_s_is_not_known(prom_server):
    """The exporter stamps ct2's samples 20 s in the past: Prometheus keeps them as the newest
    sample, and a 10 s ``staleness_s`` makes ct2 not known while ct1 reads normally."""

    def body():
        old_ms = int((time.time() - 20) * 1000)
        text = exposition([("ct1", 0, BASE)])
        stale = exposition([("ct2", 0, BASE)])
        lines = [ln + f" {old_ms}" if ln and not ln.startswith("#") else ln for ln in stale.split("\n")]
        fresh_lines = [ln for ln in text.split("\n") if ln]
        merged = []
        for metric_line in fresh_lines:
            merged.append(metric_line)
            if not metric_line.startswith("#"):
                name = metric_line.split("{")[0]
                merged.extend(ln for ln in lines if ln.startswith(name + "{"))
        return "\n".join(merged) + "\n"

    with Exporter(body) as ex:
        srv = prom_server({"dcgm": [ex.target]})
        srv.wait_samples('DCGM_FI_DEV_GPU_TEMP{Hostname="ct1"}', 2)
        srv.wait_for('DCGM_FI_DEV_GPU_TEMP{Hostname="ct2"}')
        cfg = load_config_dict(_config(srv.url, ["ct1", "ct2"], staleness_s=10))
        got = prometheus.read(cfg, time.time())
        assert got.values["gpu-ct1"]["temp_c"] == 50
        assert "temp_c" not in got.values["gpu-ct2"]


def test_garbage_series_values_from_a_real_scrape_are_not_known(prom_server):
    """NaN and +Inf are valid exposition values: Prometheus stores and answers them; gpuheal must
    not read them as temperatures."""

    def body():
        return exposition([("ct1", 0, {**BASE, "temp_c": "NaN"}), ("ct2", 0, {**BASE, "temp_c": "+Inf"})])

    with Exporter(body) as ex:
        srv = prom_server({"dcgm": [ex.target]})
        srv.wait_samples("DCGM_FI_DEV_FB_USED", 2, count=2)
        got = prometheus.read(load_config_dict(_config(srv.url, ["ct1", "ct2"])), time.time())
        assert "temp_c" not in got.values["gpu-ct1"] and "temp_c" not in got.values["gpu-ct2"]
        assert got.values["gpu-ct1"]["vram_used_mb"] == 8000
        assert any(f.source == "prometheus" and "is not a reading" in f.detail for f in got.faults)


def test_one_gpuheal_per_site_reads_only_its_site(prom_server, tmp_path):
    eu, us = Play(["eu-a", "eu-b"]), Play(["us-a"])
    us.values["us-a"]["temp_c"] = 95
    with Exporter(eu) as ex_eu, Exporter(us) as ex_us:
        srv = prom_server(
            {"dcgm-eu": {"targets": [ex_eu.target], "labels": {"site": "eu1"}},
             "dcgm-us": {"targets": [ex_us.target], "labels": {"site": "us1"}}}
        )
        srv.wait_samples("DCGM_FI_DEV_GPU_TEMP", 2, count=3)
        eu_cfg = load_config_dict(_config(srv.url, ["eu-a", "eu-b"], selector='{site="eu1"}'))
        got = prometheus.read(eu_cfg, time.time())
        assert got.ok and got.faults == [] and got.values["gpu-eu-a"]["temp_c"] == 50
        # the other site's GPU is invisible through this site's selector
        wrong = load_config_dict(_config(srv.url, ["us-a"], selector='{site="eu1"}'))
        assert prometheus.read(wrong, time.time()).values["gpu-us-a"] == {}


def _cli(config: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("GPUHEAL_NOW", None)
    return subprocess.run(
        [GPUHEAL, "--config", str(config), "--state-dir", str(state), *args],
        capture_output=True, text=True, timeout=60, env=env,
    )


def test_full_cycle_with_only_prometheus_and_gpus(prom_server, tmp_path):
    """``check``, ``heal`` and ``replay`` from a config with only ``prometheus:`` and ``gpus:``: a hot
    GPU fires thermal-critical at its 2nd poll and resolves once cool; no history is kept; the
    recorded trace replays to the same timeline."""
    play = Play(["ct1", "ct2"])
    with Exporter(play) as ex, Endpoints() as eps:
        srv = prom_server({"dcgm": [ex.target]})
        srv.wait_samples("DCGM_FI_DEV_GPU_TEMP", 3, count=2)
        raw = _config(srv.url, ["ct1", "ct2"], eps.url)
        config = tmp_path / "site.yaml"
        config.write_text(yaml.safe_dump({"prometheus": raw["prometheus"], "gpus": raw["gpus"]}))
        state, trace = tmp_path / "state", tmp_path / "trace.jsonl"

        def poll():
            time.sleep(1.05)  # the trace stamps whole seconds; replay needs each poll after the last
            proc = _cli(config, state, "check", "--json", "--record", str(trace))
            assert proc.returncode in (0, 1, 2) and "Traceback" not in proc.stderr, proc.stderr
            return json.loads(proc.stdout)

        doctor = _cli(config, state, "doctor", "--json")
        assert "Traceback" not in doctor.stderr, doctor.stderr
        rows = {r["check"]: r for r in json.loads(doctor.stdout)["checks"] if r["target"] == "prometheus"}
        assert rows["query temp_c"]["status"] == "ok" and rows["query vram.slope"]["status"] == "ok", rows
        assert not [r for r in json.loads(doctor.stdout)["checks"] if r["target"] == "monitor"]
        first = poll()
        assert first["status"] == "healthy" and first["issues"] == [], first
        assert first["gpus"]["gpu-ct1"]["temp_c"] == 50
        play.values["ct1"]["temp_c"] = 91
        srv.wait_for('DCGM_FI_DEV_GPU_TEMP{Hostname="ct1"} == 91')
        assert [(i["issue"], i["state"]) for i in poll()["issues"]] == [("thermal-critical", "pending")]
        hot = poll()
        assert [(i["gpu"], i["issue"], i["state"]) for i in hot["issues"]] == [("gpu-ct1", "thermal-critical", "firing")]
        heal = _cli(config, state, "heal", "--json")  # dry-run: plans, changes nothing
        assert heal.returncode == 2 and "Traceback" not in heal.stderr, heal.stderr
        assert any(a["gpu"] == "gpu-ct1" for a in json.loads(heal.stdout)["actions"])
        play.values["ct1"]["temp_c"] = 60
        srv.wait_for('DCGM_FI_DEV_GPU_TEMP{Hostname="ct1"} == 60')
        assert poll()["issues"] == []
        assert not (state / "history.json").exists()
        replay = subprocess.run(
            [GPUHEAL, "--config", str(config), "replay", str(trace), "--json"],
            capture_output=True, text=True, timeout=60,
        )
        assert replay.returncode == 1, replay.stderr  # 1: an issue fired during the trace
        events = [(e["gpu"], e["issue"], e["event"]) for e in json.loads(replay.stdout)["timeline"]]
        assert events == [("gpu-ct1", "thermal-critical", "pending"), ("gpu-ct1", "thermal-critical", "firing"),
                          ("gpu-ct1", "thermal-critical", "resolved")], events


def test_prometheus_down_is_rule7_through_the_cli(prom_server, tmp_path):
    play = Play(["ct1"])
    with Exporter(play) as ex, Endpoints() as eps:
        srv = prom_server({"dcgm": [ex.target]})
        srv.wait_samples("DCGM_FI_DEV_GPU_TEMP", 2)
        raw = _config(srv.url, ["ct1"], eps.url)
        config = tmp_path / "site.yaml"
        config.write_text(yaml.safe_dump({"prometheus": raw["prometheus"], "gpus": raw["gpus"]}))
        state = tmp_path / "state"
        assert _cli(config, state, "check", "--json").returncode in (0, 1)
        srv.stop()
        seen = []
        for _ in range(3):
            proc = _cli(config, state, "check", "--json")
            assert "Traceback" not in proc.stderr
            doc = json.loads(proc.stdout)
            seen.append([(i["issue"], i["state"]) for i in doc["issues"]])
            assert any(f["source"] == "prometheus" and f["fault"] == "refused" for f in doc["faults"])
        assert seen[0] == [("data-source-unreachable", "pending")]
        assert ("data-source-unreachable", "firing") in seen[2]
        assert seen[2] == [("data-source-unreachable", "firing")]


@pytest.mark.parametrize("trend_every_s", [300, 0], ids=["remembered", "asked"])
def test_trend_writes_the_promql_fit_as_check_does(prom_server, tmp_path, trend_every_s):
    """Issue 27 defect 4: ``gpuheal trend`` with Prometheus rewrote ``vram-trend.json`` with null rates
    (that mode keeps no local history). It asks the source as ``check`` does: the fit ``check`` remembered
    (``trend_every_s``), or PromQL's own ``deriv`` when nothing is remembered."""
    play = Play(["ct1", "ct2"])
    play.ramp("ct1", 20.0)  # 72,000 MB/h
    with Exporter(play) as ex, Endpoints() as eps:
        srv = prom_server({"dcgm": [ex.target]})
        srv.wait_samples("DCGM_FI_DEV_FB_USED", 8, count=2)
        raw = _config(srv.url, ["ct1", "ct2"], eps.url, trend_every_s=trend_every_s)
        config = tmp_path / "site.yaml"
        config.write_text(yaml.safe_dump(raw))
        state = tmp_path / "state"
        checked = _cli(config, state, "check", "--json")
        assert checked.returncode in (0, 1, 2) and "Traceback" not in checked.stderr, checked.stderr
        by_check = json.loads((state / "vram-trend.json").read_text())
        trend = _cli(config, state, "trend", "--json")
        assert trend.returncode in (0, 1) and "Traceback" not in trend.stderr, trend.stderr
    by_trend = json.loads((state / "vram-trend.json").read_text())
    shown = json.loads(trend.stdout)["vram_trend"]
    for doc in (by_check, by_trend, shown):
        rate = doc["gpu-ct1"]["rate_mb_per_hour"]
        assert rate is not None and abs(rate - 72000) < 72000 * 0.1, doc
        assert doc["gpu-ct1"]["samples"] >= 4 and abs(doc["gpu-ct2"]["rate_mb_per_hour"]) < 1, doc
    if trend_every_s:  # the very fit check remembered
        assert by_trend["gpu-ct1"]["rate_mb_per_hour"] == by_check["gpu-ct1"]["rate_mb_per_hour"]
    assert not (state / "history.json").exists()
