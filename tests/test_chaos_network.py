"""The chaos benchmark measures the real code (issue 29): gpuheal polling the simulated fleet in process
(``gpuheal.sources.http.use_network`` onto ``SimFleet.network()``) gets byte for byte what it gets
from the same fleet over loopback sockets, and the simulated hosts (``gpuheal.sim.hosts``, behind
``gpuheal.transport.use_transports``) print what the sim's nvidia-smi look-alike prints.

Only the wall-clock seconds an answer took (``elapsed_s``, ``endpoint_latency_s``) may differ."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from gpuheal.config import load_config_dict
from gpuheal.sim import Scenario, SimFleet
from gpuheal.sim.hosts import run_on_host
from gpuheal.sources import http
from gpuheal.sources.sense import sense

GPU = {"vendor": "nvidia", "vram_total_mb": 24576, "vram_used_mb": 12000, "temp_c": 55, "util_pct": 50,
       "power_w": 200, "power_limit_w": 300, "power_default_limit_w": 350, "power_max_limit_w": 400,
       "baseline_tok_s": 60.0, "requests_60s": 20, "parallel": 2}
FAULTS = ["none", "dead", "hang", "loading", "failing", "slow", "stuck", "wrong-key", "decode-hang", "taskloop-hang",
          "unreachable"]
MONITOR_MODES = ["ok", "empty", "garbage", "invalid", "http-500", "down", "oversized", "hang"]
DEADLINE_S = 0.6  # a server that never answers costs this long per poll on sockets


@pytest.fixture(scope="module")
def fleet():
    gpus = [{**GPU, "alias": f"g-{f}", "host": f"h{i}", "fault": f, "slow_s": 0.2 if f == "slow" else 5.0}
            for i, f in enumerate(FAULTS)]
    gpus[0].update(busy_slots=2, queued=3, competing_pid=4242, competing_vram_mb=900)
    scn = Scenario.from_dict({"name": "equivalence", "reload_s": 0, "gpus": gpus,
                              "ports": {"monitor": 0, "litellm": 0, "control": 0, "gpus_from": 0}})
    with SimFleet(scn, ports="ephemeral") as f:
        f.advance(300)
        yield f


def _cfg(fleet):
    raw = fleet.config_dict()
    raw["monitor"].update(timeout_s=DEADLINE_S, fallback_smi=False)
    raw["probe"] = {"timeout_s": DEADLINE_S}
    raw["litellm"]["timeout_s"] = DEADLINE_S
    return load_config_dict(raw, path="equivalence.yaml")


SPENT_ON_SOCKETS = "no time left in the probe deadline"
SPENT_IN_PROCESS = f"no complete answer within {DEADLINE_S:g} s"


def _strip(value):
    """The observation without the seconds the network took. One text differs, not its meaning: a
    request after a hung one has spent the probe deadline is a ``timeout`` either way, but on sockets
    gpuheal's exchange sees (on the wall clock) that no time is left and does not send it, while in
    process the deadline was spent in virtual seconds and the request is answered "no complete
    answer" at once."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if "latency" not in k and "elapsed" not in k}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    if isinstance(value, str):
        return value.replace(SPENT_IN_PROCESS, SPENT_ON_SOCKETS)
    return value


def _both(fleet, poll):
    real = poll()
    with http.use_network(fleet.network()):
        inproc = poll()
    return real, inproc


@pytest.mark.parametrize("mode", MONITOR_MODES)
def test_a_poll_of_every_fault_is_the_same_in_process_as_on_sockets(fleet, mode):
    cfg = _cfg(fleet)
    fleet.apply({"gpu": "fleet", "monitor": mode})
    now = datetime(2026, 7, 18, 8, 5, tzinfo=UTC)
    try:
        real, inproc = _both(fleet, lambda: _strip(sense(cfg, now).to_dict()))
    finally:
        fleet.apply({"gpu": "fleet", "monitor": "ok"})
    assert real == inproc
    endpoints = {a: g["endpoint"] for a, g in real["gpus"].items()}
    assert endpoints["g-none"] == "ok" and endpoints["g-dead"] == "refused"
    assert endpoints["g-hang"] == "timeout" and endpoints["g-unreachable"] == "timeout"  # a real exchange each


REQUESTS = [
    ("GET", "/health", None, {}),
    ("GET", "/metrics", None, {"Authorization": "Bearer not-needed"}),
    ("GET", "/slots", None, {"Authorization": "Bearer not-needed"}),
    ("GET", "/props", None, {"Authorization": "Bearer wrong"}),
    ("POST", "/completion", b'{"prompt": "hi", "n_predict": 4}', {"Authorization": "Bearer not-needed"}),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "stream": true}',
     {"Authorization": "Bearer not-needed"}),
    ("POST", "/completion", b"{not json", {}),
    ("GET", "/nope", None, {}),
]


@pytest.mark.parametrize("alias", ["g-none", "g-loading", "g-failing", "g-slow", "g-wrong-key", "g-stuck"])
def test_each_request_answers_the_same_bytes(fleet, alias):
    url = fleet.endpoints[alias]

    def ask():
        out = []
        for method, path, body, headers in REQUESTS:
            got = http.request(method, url + path, deadline_s=DEADLINE_S, headers=headers, body=body)
            out.append((type(got).__name__, got.status, got.body, getattr(got, "headers", None),
                        getattr(got, "kind", None), getattr(got, "detail", None)))
        return out

    before = copy.deepcopy(fleet.world.gpus[alias])  # the requests change counters: both start from here
    real = ask()
    fleet.world.gpus[alias] = before
    with http.use_network(fleet.network()):
        inproc = ask()
    assert real == inproc


def test_litellm_admin_and_zulip_answer_the_same(fleet):
    from gpuheal.sim.inprocess import Site
    from gpuheal.sim.zulip import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike

    admin = {"Authorization": f"Bearer {fleet.litellm_admin_key}", "Content-Type": "application/json"}
    zulip = ZulipLookalike().start()
    auth = {"Authorization": "Basic " + __import__("base64").b64encode(f"{DEFAULT_EMAIL}:{DEFAULT_KEY}".encode()).decode(),
            "Content-Type": "application/x-www-form-urlencoded"}
    try:
        net = fleet.network()
        net.add("127.0.0.1", zulip.port, Site(zulip.handler_class, zulip))

        def ask():
            lite = fleet.litellm_url
            got = [http.request("GET", lite + "/v1/model/info?litellm_model_id=g-none", deadline_s=1, headers=admin),
                   http.request("POST", lite + "/model/update", deadline_s=1, headers=admin,
                                body=b'{"model_info": {"id": "g-none"}, "litellm_params": {"rpm": 60}}'),
                   http.request("GET", lite + "/health/liveliness", deadline_s=1),
                   http.request("POST", zulip.url + "/api/v1/messages", deadline_s=1, headers=auth,
                                body=b"type=stream&to=s&topic=t&content=hello")]
            sent = json.loads(got[-1].body)
            sent.pop("id")  # the look-alike numbers its messages; the wall-clock headers differ too
            return [(g.status, sent if g is got[-1] else g.body,
                     {k: v for k, v in g.headers.items() if k not in ("date", "x-ratelimit-reset")}) for g in got]

        real = ask()
        with http.use_network(net):
            inproc = ask()
    finally:
        zulip.stop()
    assert real == inproc
    assert len(zulip.messages) == 2


SMI = [
    ["--query-gpu=index,name,temperature.gpu,memory.used,memory.total,utilization.gpu,power.draw,power.limit,"
     "power.default_limit,power.max_limit", "--format=csv,noheader,nounits"],
    ["--query-gpu=temperature.gpu,power.limit", "--format=csv"],
    ["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"],
    ["--query-gpu=bogus", "--format=csv"],
    ["-pl", "9999"],
]


@pytest.mark.parametrize("args", SMI)
def test_a_simulated_host_prints_what_the_smi_look_alike_prints(fleet, args):
    proc = subprocess.run([sys.executable, "-m", "gpuheal.sim.smi", fleet.control_url, "-i", "0", *args],
                          capture_output=True, text=True, timeout=30)
    answer = run_on_host(fleet.world, "h0", ["nvidia-smi", *args])
    assert (answer.rc, answer.stdout, answer.stderr) == (proc.returncode, proc.stdout, proc.stderr)


def test_a_host_off_the_network_runs_nothing_and_a_restart_reaches_only_its_own_gpu(fleet):
    assert run_on_host(fleet.world, "h10", ["systemctl", "restart", "llama-server"]) is None  # g-unreachable
    before = fleet.restart_count("g-none")
    assert run_on_host(fleet.world, "h0", ["systemctl", "restart", "llama-server"]).rc == 0
    assert fleet.restart_count("g-none") == before + 1
    assert run_on_host(fleet.world, "h0", ["systemctl", "restart", "llama-server@g-dead"]).rc == 5
    assert run_on_host(fleet.world, "h0", ["reboot"]).rc == 127
    assert run_on_host(fleet.world, "h0", ["kill", "-TERM", "4242"]).rc == 0  # the competing process goes
    assert fleet.world.gpu_entry("g-none")["competing_pid"] == 0
