"""The simulated fleet (gpuheal.sim): scenario validation, documents, virtual clock, faults,
restarts through the control client, and fast shutdown. Real HTTP on 127.0.0.1, ephemeral ports.
"""

from __future__ import annotations

import copy
import http.client
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import requests
import yaml

from gpuheal.sim import Scenario, ScenarioError, SimError, SimFleet, run_sim

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "examples" / "scenarios"
KEY = {"Authorization": "Bearer not-needed"}

BASE = {
    "name": "t",
    "start": "2026-07-18T08:00:00Z",
    "reload_s": 0.3,
    "gpus": [
        {
            "alias": "gpu-dense",
            "host": "ct8",
            "name": "NVIDIA GeForce RTX 3090",
            "vendor": "nvidia",
            "vram_total_mb": 24576,
            "vram_used_mb": 21600,
            "temp_c": 64,
            "util_pct": 87,
            "power_w": 281.4,
            "power_limit_w": 350,
            "tok_s": 74.9,
            "baseline_tok_s": 74.8,
            "requests_60s": 14,
            "model": "ThinkingCap-Qwen3.6-27B-Q4_K_M.gguf",
        },
        {
            "alias": "gpu-light",
            "host": "ct110",
            "vendor": "nvidia",
            "vram_total_mb": 12288,
            "vram_used_mb": 10100,
            "baseline_tok_s": 165.2,
            "requests_60s": 6,
        },
        {
            "alias": "strix-moe",
            "host": "ct15",
            "vendor": "amd",
            "legacy_strix": True,
            "vram_total_mb": 65536,
            "vram_used_mb": 10240,
            "temp_c": 58,
            "baseline_tok_s": 70.5,
        },
    ],
}


def scenario(events=(), **top) -> Scenario:
    d = copy.deepcopy(BASE)
    d.update(top)
    d["events"] = list(events)
    return Scenario.from_dict(d)


@pytest.fixture
def make_fleet():
    fleets: list[SimFleet] = []

    def make(events=(), **top) -> SimFleet:
        f = SimFleet(scenario(events, **top), ports="ephemeral").start()
        fleets.append(f)
        return f

    yield make
    for f in fleets:
        f.stop()


def refused(url: str) -> bool:
    """True when a TCP connect to the URL's port is refused (nothing listening)."""
    hostport = url.removeprefix("http://").split("/")[0]
    host, port = hostport.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def sim_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


# --------------------------------------------------------------------------- scenario format


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda d: d["events"].extend(
                [
                    {"at": 0, "gpu": "gpu-dense", "set": {"temp_c": 70}},
                    {"at": 5, "gpu": "gpu-dense", "set": {"temp_c": 71}},
                    {"at": -1, "gpu": "gpu-dense", "set": {"temp_c": 72}},
                ]
            ),
            "events[2].at: must be >= 0",
        ),
        (lambda d: d["gpus"][0].pop("vram_total_mb"), "gpus[0].vram_total_mb: is required"),
        (lambda d: d["gpus"][1].update(tempc=3), "gpus[1].tempc: unknown key"),
        (lambda d: d["gpus"][0].update(temp_c="hot"), "gpus[0].temp_c: must be a number"),
        (lambda d: d["gpus"][0].update(vendor="intel"), "gpus[0].vendor: must be one of"),
        (lambda d: d["gpus"][1].update(alias="gpu-dense"), "gpus[1].alias: duplicate alias"),
        (lambda d: d["gpus"][1].update(host="ct8"), "gpus[1].host: duplicate host"),
        (lambda d: d["gpus"][0].update(legacy_strix=True), "gpus[2].legacy_strix: only one GPU"),
        (lambda d: d["gpus"][0].update(vram_used_mb=30000), "gpus[0].vram_used_mb: must be <="),
        (lambda d: d.update(start="2026-07-18T08:00:00"), "start: must include a zone"),
        (
            lambda d: d.update(ports={"monitor": 19100, "litellm": 19100}),
            "ports.litellm: port 19100 is also used by ports.monitor",
        ),
        (lambda d: d.update(gpus=[]), "gpus: must be a non-empty list"),
        (lambda d: d.update(colour="red"), "colour: unknown key"),
        (
            lambda d: d["events"].append({"at": 1, "gpu": "gpu-x", "fault": "dead"}),
            "events[0].gpu: unknown GPU 'gpu-x'",
        ),
        (
            lambda d: d["events"].append({"at": 1, "gpu": "gpu-dense", "fault": "melted"}),
            "events[0].fault: must be one of",
        ),
        (
            lambda d: d["events"].append(
                {"at": 1, "gpu": "gpu-dense", "set": {"temp_c": 90}, "max": {"temp_c": 95}}
            ),
            "events[0].max.temp_c: 'max' applies only to a field this event ramps",
        ),
        (
            lambda d: d["events"].append({"at": 1, "gpu": "gpu-dense", "ramp": {"name": 1}}),
            "events[0].ramp.name: cannot ramp",
        ),
        (
            lambda d: d["events"].append({"at": 1, "gpu": "fleet", "set": {"temp_c": 1}}),
            "events[0].set: only GPU events",
        ),
        (
            lambda d: d["events"].append({"at": 1, "gpu": "fleet", "monitor": "sideways"}),
            "events[0].monitor: must be one of",
        ),
        (
            lambda d: d["events"].append({"at": "soon", "gpu": "fleet", "monitor": "ok"}),
            "events[0].at: not a duration",
        ),
        (
            lambda d: d["events"].append({"gpu": "fleet", "monitor": "ok"}),
            "events[0].at: is required",
        ),
        (
            lambda d: d["events"].append({"at": 1, "gpu": "gpu-dense"}),
            "events[0]: a GPU event needs 'set', 'ramp' or 'fault'",
        ),
        (lambda d: d.update(litellm_admin_key=5), "litellm_admin_key: must be a non-empty string"),
        (lambda d: d.update(litellm_admin_key=" k "), "litellm_admin_key: must not start or end"),
        (lambda d: d["gpus"][0].update(litellm_rpm=0), "gpus[0].litellm_rpm: must be >= 1"),
        (lambda d: d["gpus"][0].update(litellm_rpm=7.5), "gpus[0].litellm_rpm: must be a whole"),
        (lambda d: d["gpus"][1].update(litellm_rpm="60"), "gpus[1].litellm_rpm: must be a number"),
        (lambda d: d["gpus"][1].update(litellm_rpms=60), "gpus[1].litellm_rpms: unknown key"),
        (
            lambda d: d["gpus"][0].update(cooling_c_per_min=-1),
            "gpus[0].cooling_c_per_min: must be >= 0",
        ),
        (
            lambda d: d["gpus"][2].update(idle_temp_c="cool"),
            "gpus[2].idle_temp_c: must be a number",
        ),
        (
            lambda d: d["gpus"][0].update(litellm_model_id=""),
            "gpus[0].litellm_model_id: must be a non-empty string",
        ),
        (
            lambda d: d["gpus"][0].update(litellm_model_id="gpu-light"),
            "gpus[1].litellm_model_id: duplicate LiteLLM model id 'gpu-light' (also gpus[0])",
        ),
    ],
)
def test_scenario_errors_name_the_key_path(mutate, expected):
    d = copy.deepcopy(BASE)
    d["events"] = []
    mutate(d)
    with pytest.raises(ScenarioError) as err:
        Scenario.from_dict(d)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_scenario_load_reports_yaml_errors_and_parses_durations(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [\n  - alias: x\n    host: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"invalid YAML at line \d+"):
        Scenario.load(bad)
    with pytest.raises(ScenarioError, match="cannot read"):
        Scenario.load(tmp_path / "missing.yaml")
    good = tmp_path / "good.yaml"
    d = copy.deepcopy(BASE)
    del d["name"]
    d["events"] = [
        {"at": "1h30m", "gpu": "fleet", "monitor": "ok"},
        {"at": "90s", "gpu": "fleet", "litellm": "ok"},
    ]
    good.write_text(yaml.safe_dump(d))
    scn = Scenario.load(good)
    assert scn.name == "good"
    assert [e.at for e in scn.events] == [90.0, 5400.0]  # sorted by time


def test_example_scenarios_load():
    names = {p.stem: Scenario.load(p) for p in sorted(SCENARIOS.glob("*.yaml"))}
    assert {"healthy", "demo"} <= set(names)
    healthy = names["healthy"]
    assert [g.alias for g in healthy.gpus] == ["gpu-dense", "gpu-light", "strix-moe"]
    assert [g.host for g in healthy.gpus] == ["ct8", "ct110", "ct15"]
    assert [g.values["baseline_tok_s"] for g in healthy.gpus] == [74.8, 165.2, 70.5]
    assert healthy.gpus[2].legacy_strix and not healthy.events
    assert healthy.ports == {
        "monitor": 19100,
        "litellm": 19400,
        "control": 19099,
        "gpus_from": 19081,
    }
    assert names["demo"].events


# --------------------------------------------------------------------------- documents


def test_gpu_data_matches_the_contract(make_fleet):
    fleet = make_fleet()
    r = requests.get(fleet.monitor_url, timeout=2)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
    doc = r.json()
    assert doc["generated_at"] == "2026-07-18T08:00:00Z"
    assert [g["hostname"] for g in doc["gpus"]] == ["ct8", "ct110"]  # strix-moe is legacy
    dense = doc["gpus"][0]
    assert dense == {
        "hostname": "ct8",
        "name": "NVIDIA GeForce RTX 3090",
        "vendor": "nvidia",
        "temp_c": 64,
        "vram_used_mb": 21600,
        "vram_total_mb": 24576,
        "util_pct": 87,
        "power_w": 281.4,
        "power_limit_w": 350,
    }
    assert "power_w" not in doc["gpus"][1]  # not known -> absent, never zero
    assert doc["benchmarks"]["ct8"] == {"current_tok_s": 74.9, "baseline_tok_s": 74.8}
    assert set(doc["benchmarks"]) == {"ct8", "ct110", "ct15"}
    models = doc["summary"]["available_models"]
    assert models[0] == {
        "name": "gpu-dense",
        "hostname": "ct8",
        "requests_60s": 14,
        "failures_60s": 0,
        "consecutive_timeouts": 0,
    }
    assert doc["summary"]["circuit_breakers_open"] == 0
    assert doc["summary"]["circuit_breakers"] == []
    assert doc["strix"] == {
        "running": True,
        "hostname": "ct15",
        "temp_c": 58,
        "vram_used_mb": 10240,
        "vram_total_mb": 65536,
    }


def test_llama_server_shapes(make_fleet):
    fleet = make_fleet()
    ep = fleet.endpoints["gpu-dense"]
    h = requests.get(ep + "/health", timeout=2)
    assert h.status_code == 200 and h.content == b'{"status":"ok"}'
    assert h.headers["Server"] == "llama.cpp"
    assert requests.get(ep + "/v1/health", timeout=2).status_code == 200
    models = requests.get(ep + "/v1/models", timeout=2).json()  # public
    assert models["data"][0]["id"] == "models/ThinkingCap-Qwen3.6-27B-Q4_K_M.gguf"
    props = requests.get(ep + "/props", headers={"X-Api-Key": "not-needed"}, timeout=2).json()
    assert props["default_generation_settings"]["n_ctx"] == 131072
    assert props["total_slots"] == 1 and props["model_path"].endswith(".gguf")
    slots = requests.get(ep + "/slots", headers=KEY, timeout=2).json()
    assert slots == [{"id": 0, "n_ctx": 131072, "speculative": False, "is_processing": False}]
    m = requests.get(ep + "/metrics", headers=KEY, timeout=2)
    assert m.headers["Content-Type"] == "text/plain; version=0.0.4"
    assert "llamacpp:tokens_predicted_total 0" in m.text
    assert requests.get(ep + "/metrics", timeout=2).status_code == 401
    nf = requests.get(ep + "/nope", headers=KEY, timeout=2)
    assert nf.status_code == 404
    assert nf.json() == {
        "error": {"message": "File Not Found", "type": "not_found_error", "code": 404}
    }

    c = requests.post(
        ep + "/completion", json={"prompt": "hello world", "n_predict": 32}, headers=KEY, timeout=2
    ).json()
    t = c["timings"]
    assert t["predicted_n"] == 32 and c["tokens_predicted"] == 32
    assert abs(t["predicted_per_second"] - 74.9) <= 74.9 * 0.0101
    assert t["predicted_ms"] == pytest.approx(32 / t["predicted_per_second"] * 1000, rel=1e-6)
    assert t["prompt_per_second"] > 0 and t["prompt_n"] > 0

    chat = requests.post(
        ep + "/v1/chat/completions",
        headers=KEY,
        timeout=2,
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    ).json()
    assert chat["object"] == "chat.completion"
    assert chat["usage"]["completion_tokens"] == 8 == chat["timings"]["predicted_n"]
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert (
        "llamacpp:tokens_predicted_total 40"
        in requests.get(ep + "/metrics", headers=KEY, timeout=2).text
    )

    bad = requests.post(ep + "/completion", data=b'{"prompt":', headers=KEY, timeout=2)
    assert bad.status_code == 500 and bad.json()["error"]["type"] == "server_error"

    live = requests.get(fleet.litellm_url + "/health/liveliness", timeout=2)
    assert live.status_code == 200 and live.json() == "I'm alive!"
    assert requests.get(fleet.litellm_url + "/health/readiness", timeout=2).json() == {
        "status": "healthy", "db": "connected"
    }


# --------------------------------------------------------------------------- virtual clock


def test_a_kept_alive_answer_is_not_held_back_by_nagle(make_fleet):
    """The real llama-server answers a second request on a kept-alive connection in < 1 ms; the
    sim wrote headers and body in two writes, and Nagle's algorithm held the body until the
    client's delayed ACK (~40 ms on every /metrics of a check). Every accepted socket has
    TCP_NODELAY, read from the server's own side of the connection."""
    fleet = make_fleet()
    conn = http.client.HTTPConnection(fleet.endpoints["gpu-dense"].removeprefix("http://"), timeout=2)
    try:
        for path in ("/health", "/metrics"):
            conn.request("GET", path, headers=KEY)
            assert conn.getresponse().read()
        server = fleet._listeners["gpu:gpu-dense"].server
        with server._conns_lock:
            accepted = list(server._conns)
        assert len(accepted) == 1  # both answers over the one kept-alive connection
        assert accepted[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        conn.close()


def test_advance_applies_events_and_ramps(make_fleet):
    fleet = make_fleet(
        [
            {"at": 0, "gpu": "gpu-light", "ramp": {"vram_used_mb": 5.0}},
            {"at": 0, "gpu": "gpu-dense", "ramp": {"temp_c": 3}, "max": {"temp_c": 80}},
            {"at": 150, "gpu": "gpu-light", "set": {"breaker_open": True}},
            {"at": "10m", "gpu": "gpu-light", "ramp": {"vram_used_mb": 0}},
        ]
    )
    assert fleet.now().isoformat() == "2026-07-18T08:00:00+00:00"
    assert fleet.now().tzinfo is not None
    fleet.advance(120)
    doc = requests.get(fleet.monitor_url, timeout=2).json()
    assert doc["generated_at"] == "2026-07-18T08:02:00Z"
    assert requests.get(fleet.monitor_url, timeout=2).headers["Date"] == (
        "Sat, 18 Jul 2026 08:02:00 GMT"
    )
    assert doc["gpus"][1]["vram_used_mb"] == 10110
    assert doc["gpus"][0]["temp_c"] == 70
    assert doc["summary"]["circuit_breakers_open"] == 0
    fleet.advance(60)
    doc = requests.get(fleet.monitor_url, timeout=2).json()
    assert doc["summary"]["circuit_breakers"] == [
        {
            "model": "gpu-light",
            "hostname": "ct110",
            "open": True,
            "opened_at": "2026-07-18T08:02:30Z",
        }
    ]
    # through the control endpoint; ramp clamped at max, leak stopped at 10 min
    r = requests.post(fleet.control_url + "/advance", json={"seconds": 1020}, timeout=2)
    assert r.json() == {"now": "2026-07-18T08:20:00Z", "t": 1200.0}
    assert requests.get(fleet.control_url + "/now", timeout=2).json()["now"] == (
        "2026-07-18T08:20:00Z"
    )
    st = requests.get(fleet.control_url + "/state", timeout=2).json()
    assert st["gpus"]["gpu-dense"]["temp_c"] == 80
    assert st["gpus"]["gpu-light"]["vram_used_mb"] == 10150
    assert (
        requests.post(fleet.control_url + "/advance", json={"seconds": -5}, timeout=2).status_code
        == 400
    )


def test_realtime_speed_moves_the_clock():
    with SimFleet(scenario(), ports="ephemeral", realtime_speed=600) as fleet:
        time.sleep(0.35)
        assert (fleet.now() - scenario().start).total_seconds() >= 120


# --------------------------------------------------------------------------- GPU faults


def test_dead_is_refused_and_restart_heals_unless_told_not_to(make_fleet):
    fleet = make_fleet(
        [
            {"at": 10, "gpu": "gpu-dense", "fault": "dead"},
            {"at": 10, "gpu": "strix-moe", "fault": "dead", "heals_on_restart": False},
        ]
    )
    ep, strix = fleet.endpoints["gpu-dense"], fleet.endpoints["strix-moe"]
    assert requests.get(ep + "/health", timeout=2).status_code == 200
    fleet.advance(10)
    assert refused(ep + "/health") and refused(strix + "/health")
    doc = requests.get(fleet.monitor_url, timeout=2).json()
    assert doc["strix"]["running"] is False
    assert doc["summary"]["available_models"][0]["failures_60s"] == 14
    fleet.restart("gpu-dense")
    fleet.restart("strix-moe")
    r = requests.get(ep + "/health", timeout=2)
    assert r.status_code == 503  # same port, loading
    assert refused(strix + "/health")  # a dead host does not come back
    assert fleet.restart_count("strix-moe") == 1


def test_hang_times_out_without_blocking_anything_else(make_fleet):
    fleet = make_fleet([{"at": 0, "gpu": "gpu-light", "fault": "hang"}])
    ep = fleet.endpoints["gpu-light"]
    t0 = time.monotonic()
    with pytest.raises(requests.Timeout):
        requests.get(ep + "/health", timeout=0.3)
    assert time.monotonic() - t0 < 1.5
    # a raw socket connects (TCP accepted) but gets nothing back
    host, port = ep.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=1) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(0.2)
        with pytest.raises(TimeoutError):
            s.recv(10)
    assert requests.get(fleet.endpoints["gpu-dense"] + "/health", timeout=1).status_code == 200
    assert requests.get(fleet.monitor_url, timeout=1).status_code == 200


def test_loading_answers_the_real_503_envelope(make_fleet):
    fleet = make_fleet([{"at": 0, "gpu": "gpu-dense", "fault": "loading"}])
    ep = fleet.endpoints["gpu-dense"]
    for path, headers in (("/health", {}), ("/props", {"Authorization": "Bearer wrong"})):
        r = requests.get(ep + path, headers=headers, timeout=2)
        assert r.status_code == 503
        assert (
            r.content
            == b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
        )


def test_wrong_key_is_401_on_completions_while_health_is_200(make_fleet):
    fleet = make_fleet(
        [{"at": 0, "gpu": "gpu-light", "fault": "wrong-key", "api_key": "sk-local-5678"}]
    )
    ep = fleet.endpoints["gpu-light"]
    assert requests.get(ep + "/health", headers=KEY, timeout=2).status_code == 200
    r = requests.post(
        ep + "/completion", json={"prompt": "x", "n_predict": 1}, headers=KEY, timeout=2
    )
    assert r.status_code == 401
    assert r.json() == {
        "error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}
    }
    ok = requests.post(
        ep + "/completion",
        json={"prompt": "x", "n_predict": 1},
        timeout=2,
        headers={"Authorization": "Bearer sk-local-5678"},
    )
    assert ok.status_code == 200


def test_failing_stuck_and_slow(make_fleet):
    fleet = make_fleet(
        [
            {"at": 0, "gpu": "gpu-dense", "fault": "failing"},
            {"at": 0, "gpu": "gpu-light", "fault": "stuck"},
            {"at": 0, "gpu": "strix-moe", "fault": "slow", "slow_s": 0.4},
        ]
    )
    body = {"prompt": "x", "n_predict": 4}
    dense, light, strix = (fleet.endpoints[a] for a in ("gpu-dense", "gpu-light", "strix-moe"))
    r = requests.post(dense + "/completion", json=body, headers=KEY, timeout=2)
    assert r.status_code == 500 and r.json()["error"]["code"] == 500
    # stuck: /health lies
    assert requests.get(light + "/health", timeout=2).status_code == 200
    with pytest.raises(requests.Timeout):
        requests.post(light + "/completion", json=body, headers=KEY, timeout=0.3)
    t0 = time.monotonic()
    assert requests.post(strix + "/completion", json=body, headers=KEY, timeout=3).ok
    assert time.monotonic() - t0 >= 0.35
    models = {
        m["name"]: m
        for m in requests.get(fleet.monitor_url, timeout=2).json()["summary"]["available_models"]
    }
    assert models["gpu-dense"]["failures_60s"] == models["gpu-dense"]["requests_60s"] == 14
    assert models["gpu-light"]["consecutive_timeouts"] >= 1
    assert models["strix-moe"]["failures_60s"] == 0


# --------------------------------------------------------------------------- monitor modes


def test_monitor_modes(make_fleet):
    fleet = make_fleet()
    url = fleet.monitor_url

    def mode(m):
        fleet.apply({"gpu": "fleet", "monitor": m})

    mode("oversized")
    r = requests.get(url, timeout=5)
    assert len(r.content) > 2 * 1024 * 1024 and r.json()["generated_at"]
    mode("garbage")
    with pytest.raises(ValueError):
        json.loads(requests.get(url, timeout=2).content)
    mode("invalid")
    doc = json.loads(requests.get(url, timeout=2).text)
    assert isinstance(doc["gpus"][0]["temp_c"], str)
    assert math.isnan(doc["gpus"][0]["vram_used_mb"])
    assert doc["gpus"][0]["util_pct"] < 0
    mode("http-500")
    assert requests.get(url, timeout=2).status_code == 500
    mode("hang")
    with pytest.raises(requests.Timeout):
        requests.get(url, timeout=0.3)
    mode("dribble")
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=2) as resp:
        assert int(resp.headers["Content-Length"]) > 100
        assert resp.read(3) == b'{"g'
    assert time.monotonic() - t0 >= 0.9  # one byte per 0.5 s
    mode("down")
    assert refused(url)
    fleet.restart("monitor")  # a restart brings it back
    assert requests.get(url, timeout=2).status_code == 200


def test_litellm_modes(make_fleet):
    fleet = make_fleet(
        [
            {"at": 0, "gpu": "fleet", "litellm": "http-503"},
            {"at": 60, "gpu": "fleet", "litellm": "down"},
        ]
    )
    live = fleet.litellm_url + "/health/liveliness"
    assert requests.get(live, timeout=2).status_code == 503
    fleet.advance(60)
    assert refused(live)
    assert fleet.restart("litellm") == 1
    assert requests.get(live, timeout=2).json() == "I'm alive!"


# --------------------------------------------------------------------------- load shedding


def model_update(fleet, model_id, rpm, key="default", *, path="/model/update", raw=None):
    """POST {litellm_url}/model/update as gpuheal's built-in load shedding sends it."""
    headers = {"Content-Type": "application/json"}
    key = fleet.litellm_admin_key if key == "default" else key
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = raw
    if body is None:
        body = json.dumps({"model_info": {"id": model_id}, "litellm_params": {"rpm": rpm}})
    return requests.post(fleet.litellm_url + path, data=body, headers=headers, timeout=2)


def gpu_state(fleet, alias):
    return requests.get(fleet.control_url + "/state", timeout=2).json()["gpus"][alias]


def test_model_update_sets_rpm_and_state(make_fleet):
    fleet = make_fleet()
    assert fleet.litellm_admin_key == "sk-sim-admin-0000"
    st = gpu_state(fleet, "gpu-dense")
    assert (st["litellm_model_id"], st["litellm_rpm"], st["litellm_rpm_normal"]) == (
        "gpu-dense",
        60,
        60,
    )
    assert st["litellm_updates"] == 0 and st["shed"] is False
    r = model_update(fleet, "gpu-dense", 6)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/json")
    # the stored row, as LiteLLM with a database answers (tests/reallitellm pins the shapes)
    assert r.json()["model_id"] == "gpu-dense" and r.json()["litellm_params"]["rpm"] == 6
    st = gpu_state(fleet, "gpu-dense")
    assert (st["litellm_rpm"], st["litellm_rpm_normal"], st["litellm_updates"]) == (6, 60, 1)
    assert st["shed"] is True
    assert gpu_state(fleet, "gpu-light")["litellm_updates"] == 0
    # trailing slash tolerated; restoring counts as an update too
    assert model_update(fleet, "gpu-dense", 60, path="/model/update/").status_code == 200
    st = gpu_state(fleet, "gpu-dense")
    assert (st["litellm_rpm"], st["litellm_updates"], st["shed"]) == (60, 2, False)


def test_model_update_scenario_keys(make_fleet):
    d = copy.deepcopy(BASE)
    d["litellm_admin_key"] = "sk-proxy-master-1234"
    d["gpus"][0].update(litellm_model_id="dense-deploy-1", litellm_rpm=120)
    fleet = SimFleet(Scenario.from_dict(d), ports="ephemeral").start()
    try:
        assert fleet.litellm_admin_key == "sk-proxy-master-1234"
        assert model_update(fleet, "dense-deploy-1", 1, key="sk-sim-admin-0000").status_code == 401
        r = model_update(fleet, "gpu-dense", 1)  # the alias is not the id any more
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "Authentication Error, model not found"
        r = model_update(fleet, "dense-deploy-1", 1)
        assert r.status_code == 200 and r.json()["model_id"] == "dense-deploy-1"
        st = gpu_state(fleet, "gpu-dense")
        assert (st["litellm_rpm"], st["litellm_rpm_normal"]) == (1, 120)
        health = requests.get(fleet.litellm_url + "/health", timeout=2).json()
        assert {"model": "openai/gpu-dense", "model_id": "dense-deploy-1"} in health[
            "healthy_endpoints"
        ]
    finally:
        fleet.stop()


def test_model_update_errors(make_fleet):
    fleet = make_fleet()
    for key, message in (
        ("sk-wrong-key-9999", "Authentication Error, Invalid proxy server token passed."),
        (None, "Authentication Error, No api key passed in."),
        ("", "Authentication Error, No api key passed in."),
    ):
        r = model_update(fleet, "gpu-dense", 1, key=key)
        assert r.status_code == 401, key
        err = r.json()["error"]
        assert err["message"].startswith(message)
        assert {k: err[k] for k in ("type", "param", "code")} == {
            "type": "auth_error",
            "param": "None",
            "code": "401",
        }
        assert "sk-wrong-key-9999" not in err["message"]  # masked, as LiteLLM does
    # a bare key (no Bearer) is no key
    r = requests.post(
        fleet.litellm_url + "/model/update",
        json={"model_info": {"id": "gpu-dense"}, "litellm_params": {"rpm": 1}},
        headers={"Authorization": fleet.litellm_admin_key},
        timeout=2,
    )
    assert r.status_code == 401
    r = model_update(fleet, "gpu-nope", 1)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "Authentication Error, model not found"
    bad_bodies = [
        "{not json",
        "",
        "[1, 2]",
        json.dumps({"litellm_params": {"rpm": 1}}),
        json.dumps({"model_info": {"id": ""}, "litellm_params": {"rpm": 1}}),
        json.dumps({"model_info": "gpu-dense", "litellm_params": {"rpm": 1}}),
        json.dumps({"model_info": {"id": "gpu-dense"}}),
        json.dumps({"model_info": {"id": "gpu-dense"}, "litellm_params": {"rpm": -1}}),
        json.dumps({"model_info": {"id": "gpu-dense"}, "litellm_params": {"rpm": "5"}}),
        json.dumps({"model_info": {"id": "gpu-dense"}, "litellm_params": {"rpm": 5.5}}),
        json.dumps({"model_info": {"id": "gpu-dense"}, "litellm_params": {"rpm": True}}),
    ]
    for body in bad_bodies:  # FastAPI's 422 or LiteLLM's 400 envelope, as the real proxy answers
        r = model_update(fleet, "gpu-dense", 1, raw=body)
        assert r.status_code in (400, 422), body
        assert r.json().get("detail") or r.json()["error"]["message"], body
    assert requests.get(fleet.litellm_url + "/model/update", timeout=2).status_code == 405
    st = gpu_state(fleet, "gpu-dense")
    assert (st["litellm_rpm"], st["litellm_updates"]) == (60, 0)  # nothing changed


def test_shedding_cools_a_hot_gpu_and_the_ramp_resumes(make_fleet):
    fleet = make_fleet(
        [{"at": 0, "gpu": "gpu-dense", "ramp": {"temp_c": 3}, "max": {"temp_c": 95}}]
    )

    def temp():
        return gpu_state(fleet, "gpu-dense")["temp_c"]

    fleet.advance(120)
    assert temp() == 70
    assert model_update(fleet, "gpu-dense", 1).status_code == 200
    st = gpu_state(fleet, "gpu-dense")
    assert st["ramps"] == {} and st["suspended_ramps"] == {"temp_c": 3}
    fleet.advance(60)
    assert temp() == 68  # 2 C per virtual minute, the default
    fleet.advance(600)  # one big step: 10 minutes = 20 C
    assert temp() == 48
    doc = requests.get(fleet.monitor_url, timeout=2).json()
    assert doc["gpus"][0]["temp_c"] == 48
    fleet.advance(600)
    assert temp() == 45  # clamped at idle_temp_c (default 45)
    # a GPU restart does not undo LiteLLM's setting
    fleet.restart("gpu-dense")
    fleet.advance(60)
    assert temp() == 45 and gpu_state(fleet, "gpu-dense")["shed"] is True
    # back to normal: the ramp resumes from the temperature reached
    assert model_update(fleet, "gpu-dense", 60).status_code == 200
    st = gpu_state(fleet, "gpu-dense")
    assert st["ramps"] == {"temp_c": 3} and st["suspended_ramps"] == {}
    fleet.advance(120)
    assert temp() == 51
    fleet.advance(3600)
    assert temp() == 95  # the ramp's max still applies


def test_shedding_cooling_keys_and_events_while_shed(make_fleet):
    d = copy.deepcopy(BASE)
    d["gpus"][1].update(temp_c=80, util_pct=90, cooling_c_per_min=5, idle_temp_c=50)
    d["events"] = [
        {"at": 300, "gpu": "gpu-light", "set": {"temp_c": 85}},  # a spike while shed
        {"at": 600, "gpu": "gpu-light", "ramp": {"temp_c": 4}},  # held while shed
    ]
    fleet = SimFleet(Scenario.from_dict(d), ports="ephemeral").start()
    try:
        assert model_update(fleet, "gpu-light", 0).status_code == 200
        fleet.advance(180)
        st = gpu_state(fleet, "gpu-light")
        assert st["temp_c"] == 65 and st["util_pct"] == 0 and st["requests_60s"] == 0
        assert (st["cooling_c_per_min"], st["idle_temp_c"]) == (5.0, 50.0)
        fleet.advance(180)  # t=360: set 85 at 300, then one minute of cooling
        assert gpu_state(fleet, "gpu-light")["temp_c"] == 80
        fleet.advance(600)  # t=960: the ramp started at 600 is suspended, cooling goes on
        st = gpu_state(fleet, "gpu-light")
        assert st["temp_c"] == 50 and st["suspended_ramps"] == {"temp_c": 4}
        assert model_update(fleet, "gpu-light", 60).status_code == 200
        fleet.advance(60)
        st = gpu_state(fleet, "gpu-light")
        assert st["temp_c"] == 54 and st["util_pct"] == 90 and st["requests_60s"] == 6
        # a GPU already below its idle temperature is not warmed up by shedding
        assert model_update(fleet, "gpu-dense", 1).status_code == 200
        fleet.advance(600)
        assert gpu_state(fleet, "gpu-dense")["temp_c"] == 45  # 64 - 20 = 44 -> floor 45
        assert model_update(fleet, "strix-moe", 1).status_code == 200
        fleet.advance(600)
        assert gpu_state(fleet, "strix-moe")["temp_c"] == 45  # 58 -> 45 (floor)
    finally:
        fleet.stop()


def test_shedding_scales_util_and_requests(make_fleet):
    fleet = make_fleet()
    doc = requests.get(fleet.monitor_url, timeout=2).json()
    assert doc["gpus"][0]["util_pct"] == 87
    assert doc["summary"]["available_models"][0]["requests_60s"] == 14
    assert model_update(fleet, "gpu-dense", 6).status_code == 200  # a tenth of normal
    doc = requests.get(fleet.monitor_url, timeout=2).json()
    assert doc["gpus"][0]["util_pct"] == 9  # 8.7
    assert doc["summary"]["available_models"][0]["requests_60s"] == 1  # 1.4
    assert doc["summary"]["available_models"][1]["requests_60s"] == 6  # others untouched
    st = gpu_state(fleet, "gpu-dense")
    assert st["util_pct"] == 8.7 and st["requests_60s"] == 1
    assert model_update(fleet, "gpu-dense", 30).status_code == 200
    doc = requests.get(fleet.monitor_url, timeout=2).json()
    assert doc["summary"]["available_models"][0]["requests_60s"] == 7
    # at or above normal: no scaling, no cooling
    assert model_update(fleet, "gpu-dense", 120).status_code == 200
    fleet.advance(600)
    doc = requests.get(fleet.monitor_url, timeout=2).json()
    assert doc["gpus"][0]["util_pct"] == 87 and doc["gpus"][0]["temp_c"] == 64
    assert doc["summary"]["available_models"][0]["requests_60s"] == 14
    assert gpu_state(fleet, "gpu-dense")["shed"] is False


def test_litellm_restart_keeps_rpm(make_fleet):
    fleet = make_fleet([{"at": 60, "gpu": "fleet", "litellm": "down"}])
    assert model_update(fleet, "gpu-dense", 1).status_code == 200
    fleet.advance(60)
    assert refused(fleet.litellm_url + "/health/liveliness")
    fleet.advance(60)
    assert gpu_state(fleet, "gpu-dense")["temp_c"] == 60  # 64 - 2 min x 2 C, LiteLLM down or not
    r = requests.post(fleet.control_url + "/restart", json={"gpu": "litellm"}, timeout=2)
    assert r.status_code == 200
    st = gpu_state(fleet, "gpu-dense")
    assert (st["litellm_rpm"], st["litellm_rpm_normal"], st["litellm_updates"]) == (1, 60, 1)
    assert st["shed"] is True
    fleet.advance(60)
    assert gpu_state(fleet, "gpu-dense")["temp_c"] == 58
    assert model_update(fleet, "gpu-dense", 60).status_code == 200


# --------------------------------------------------------------------------- restarts


def test_restart_via_control_client_subprocess(make_fleet):
    fleet = make_fleet(
        [
            {"at": 0, "gpu": "gpu-light", "ramp": {"vram_used_mb": 10}},
            {"at": 60, "gpu": "gpu-light", "fault": "stuck"},
        ]
    )
    fleet.advance(120)
    assert fleet.state()["gpus"]["gpu-light"]["vram_used_mb"] == 10120
    cmd = fleet.config_dict()["gpus"][1]["restart_command"]
    argv = [a.replace("{alias}", "gpu-light") for a in cmd]
    p = subprocess.run(argv, capture_output=True, text=True, env=sim_env(), timeout=10)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["restart_count"] == 1
    ep = fleet.endpoints["gpu-light"]
    assert requests.get(ep + "/health", timeout=2).status_code == 503
    deadline = time.monotonic() + 3
    while requests.get(ep + "/health", timeout=2).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = requests.post(
        ep + "/completion", json={"prompt": "x", "n_predict": 2}, headers=KEY, timeout=2
    )
    assert r.status_code == 200  # stuck healed
    st = requests.get(fleet.control_url + "/state", timeout=2).json()
    assert st["restarts"]["gpu-light"] == 1 and st["gpus"]["gpu-light"]["restart_count"] == 1
    assert st["gpus"]["gpu-light"]["vram_used_mb"] == 10100  # back to baseline, leak stopped
    assert st["gpus"]["gpu-light"]["fault"] == "none"

    bad = subprocess.run(
        argv[:-1] + ["gpu-nope"], capture_output=True, text=True, env=sim_env(), timeout=10
    )
    assert bad.returncode == 1
    assert len(bad.stderr.strip().splitlines()) == 1 and "gpu-nope" in bad.stderr
    gone = subprocess.run(
        [sys.executable, "-m", "gpuheal.sim.control", "http://127.0.0.1:9/_sim", "now"],
        capture_output=True,
        text=True,
        env=sim_env(),
        timeout=10,
    )
    assert gone.returncode == 1 and len(gone.stderr.strip().splitlines()) == 1


def test_leak_that_does_not_heal_restarts_from_baseline(make_fleet):
    fleet = make_fleet(
        [{"at": 0, "gpu": "gpu-light", "ramp": {"vram_used_mb": 10}, "heals_on_restart": False}]
    )
    fleet.advance(300)
    assert fleet.gpu_data()["gpus"][1]["vram_used_mb"] == 10150
    fleet.restart("gpu-light")
    assert fleet.gpu_data()["gpus"][1]["vram_used_mb"] == 10100
    fleet.advance(60)
    assert fleet.gpu_data()["gpus"][1]["vram_used_mb"] == 10110


def test_control_set_and_errors(make_fleet):
    fleet = make_fleet()
    c = fleet.control_url
    r = requests.post(c + "/set", json={"gpu": "gpu-dense", "set": {"temp_c": 91}}, timeout=2)
    assert r.status_code == 200
    assert requests.get(fleet.monitor_url, timeout=2).json()["gpus"][0]["temp_c"] == 91
    r = requests.post(c + "/set", json={"gpu": "gpu-dense", "set": {"temp_c": "x"}}, timeout=2)
    assert r.status_code == 400 and r.json()["error"] == "body.set.temp_c: must be a number"
    r = requests.post(c + "/restart", json={"gpu": "nope"}, timeout=2)
    assert r.status_code == 404
    assert requests.get(c + "/whatever", timeout=2).status_code == 404
    fleet.set("gpu-dense", {"tok_s": 50})
    t = requests.post(
        fleet.endpoints["gpu-dense"] + "/completion",
        headers=KEY,
        timeout=2,
        json={"prompt": "x", "n_predict": 8},
    ).json()["timings"]
    assert 49.4 <= t["predicted_per_second"] <= 50.6


# --------------------------------------------------------------------------- lifecycle


def test_stop_is_fast_with_hanging_clients():
    fleet = SimFleet(
        scenario(
            [
                {"at": 0, "gpu": "gpu-dense", "fault": "hang"},
                {"at": 0, "gpu": "fleet", "monitor": "dribble"},
            ]
        ),
        ports="ephemeral",
    ).start()
    errors: list[BaseException] = []

    def client(url):
        try:
            requests.get(url, timeout=30)
        except BaseException as exc:  # noqa: BLE001 - any ending is fine, we time it
            errors.append(exc)

    threads = [
        threading.Thread(target=client, args=(u,), daemon=True)
        for u in (fleet.endpoints["gpu-dense"] + "/health", fleet.monitor_url)
    ]
    for t in threads:
        t.start()
    idle = socket.create_connection(("127.0.0.1", fleet.ports["gpu-light"]), timeout=2)
    time.sleep(0.3)
    t0 = time.monotonic()
    fleet.stop()
    assert time.monotonic() - t0 < 1.0
    for t in threads:
        t.join(2)
        assert not t.is_alive()
    idle.close()
    assert refused(fleet.monitor_url)


def test_config_dict_and_write_config(make_fleet, tmp_path):
    fleet = make_fleet()
    cfg = fleet.config_dict(api_key="not-needed")
    assert cfg["monitor"] == {
        "url": fleet.monitor_url,
        "timeout_s": 2,
        "max_response_bytes": 1048576,
    }
    assert cfg["litellm"] == {"url": fleet.litellm_url, "api_key": "not-needed"}
    g = cfg["gpus"][0]
    assert g["alias"] == "gpu-dense" and g["host"] == "ct8"
    assert g["endpoint"] == fleet.endpoints["gpu-dense"]
    assert g["vram_total_mb"] == 24576 and g["baseline_tok_s"] == 74.8
    assert g["transport"] == "local" and g["vendor"] == "nvidia"
    assert g["restart_command"] == [
        sys.executable,
        "-m",
        "gpuheal.sim.control",
        fleet.control_url,
        "restart",
        "{alias}",
    ]
    path = fleet.write_config(tmp_path / "sim.yaml")
    assert yaml.safe_load(path.read_text()) == cfg


def test_run_sim_prints_urls_and_stops(tmp_path):
    import io

    scn_path = tmp_path / "s.yaml"
    scn_path.write_text(yaml.safe_dump({**copy.deepcopy(BASE), "events": []}))
    out, stop = io.StringIO(), threading.Event()
    cfg = tmp_path / "cfg.yaml"
    th = threading.Thread(
        target=run_sim,
        args=(scn_path, "127.0.0.1", "ephemeral", cfg, None),
        kwargs={"out": out, "stop_event": stop},
        daemon=True,
    )
    th.start()
    deadline = time.monotonic() + 5
    while "config" not in out.getvalue():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    lines = out.getvalue().splitlines()
    assert [ln.split()[0] for ln in lines] == [
        "monitor",
        "litellm",
        "control",
        "gpu-dense",
        "gpu-light",
        "strix-moe",
        "config",
    ]
    monitor = lines[0].split()[1]
    assert requests.get(monitor, timeout=2).status_code == 200
    assert yaml.safe_load(cfg.read_text())["monitor"]["url"] == monitor
    stop.set()
    th.join(3)
    assert not th.is_alive()


def test_fixed_port_conflict_and_non_loopback_are_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        scn = scenario(ports={"monitor": port, "litellm": 0, "control": 0, "gpus_from": 0})
        with pytest.raises(SimError, match=f"cannot listen on 127.0.0.1:{port} for monitor"):
            SimFleet(scn).start()
    with pytest.raises(SimError, match="loopback"):
        SimFleet(scenario(), host="0.0.0.0")


def test_http_client_sees_connection_close_on_errors(make_fleet):
    fleet = make_fleet()
    host, port = fleet.endpoints["gpu-dense"].removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=2)
    conn.request("GET", "/props")
    resp = conn.getresponse()
    assert resp.status == 401 and resp.getheader("Connection") == "close"
    resp.read()
    conn.close()
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(fleet.endpoints["gpu-dense"] + "/slots", timeout=2)
