"""llama-server's own telemetry in the poll (issue 12): ``/metrics``, ``/props`` and ``/slots`` read
with the api key, inside the probe deadline, over real loopback sockets (the bodies are a real
b11312 server's, tests/data/llama/)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from servers import HEALTH_OK, Hang, LoopbackServer, Oversized, Reply, fleet_config, json_reply

from gpuheal.config import load_config_dict
from gpuheal.sources.sense import sense

NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
DATA = Path(__file__).parent / "data" / "llama"
METRICS = (DATA / "metrics-busy-deferred.txt").read_text()
SLOTS = (DATA / "slots-busy.json").read_text()
PROPS_AWAKE = {"total_slots": 2, "is_sleeping": False, "build_info": "b11312-0c1e57098"}
NOT_SUPPORTED = (DATA / "metrics-501.json").read_text()


def server(routes=None, key="test-key"):
    """A llama-server look-alike answering the real bodies; every keyed path checks the key."""
    routes = {"/metrics": Reply(200, METRICS, headers={"Content-Type": "text/plain; version=0.0.4"}),
              "/props": json_reply(PROPS_AWAKE), "/slots": Reply(200, SLOTS), **(routes or {})}

    def guarded(path):
        def pick(req):
            if path != "/health" and req.headers.get("authorization") != f"Bearer {key}":
                return json_reply({"error": {"code": 401, "message": "Invalid API Key"}}, status=401)
            return routes[path]
        return pick

    return LoopbackServer({"/health": HEALTH_OK, **{p: guarded(p) for p in routes}})


def poll(url, timeout_s=1.0, key="test-key"):
    cfg = load_config_dict(fleet_config("http://127.0.0.1:9/gpu-data", [("g", "h", url)], timeout_s=timeout_s,
                                        litellm={"api_key": key}))
    return sense(cfg, NOW)


def test_metrics_slots_and_props_of_a_busy_server():
    with server() as srv:
        obs = poll(srv.url)
        assert srv.hits("/props") == 1  # every poll: Rule 9's running context (n_ctx), never waking it
        assert srv.hits("/slots") == 1  # requests processing: awake, /slots is safe to ask
    g = obs.gpus["g"]
    assert (g.endpoint, g.metrics, g.slots) == ("ok", "ok", "ok")
    assert (g.n_decode_total, g.requests_processing, g.requests_deferred) == (383, 2, 1)
    assert g.tokens_predicted_total == 4
    assert (g.slots_total, g.slots_busy) == (2, 2)
    assert [f for f in obs.faults if f.source == "g"] == []
    assert obs.to_dict()["gpus"]["g"]["n_decode_total"] == 383  # recorded for replay


def test_not_enabled_is_not_known_and_not_a_fault():
    routes = {"/metrics": Reply(501, NOT_SUPPORTED), "/slots": Reply(501, (DATA / "slots-501.json").read_text())}
    with server(routes) as srv:
        obs = poll(srv.url)
    g = obs.gpus["g"]
    assert (g.metrics, g.slots) == ("disabled", "disabled")
    assert g.n_decode_total is None and g.requests_processing is None and g.slots_busy is None
    assert [f for f in obs.faults if f.source == "g"] == []


def test_wrong_key_is_a_fault_never_zero():
    with server(key="the-servers-key") as srv:
        obs = poll(srv.url, key="test-key")
    g = obs.gpus["g"]
    assert (g.endpoint, g.metrics, g.slots) == ("ok", "unauthorized", "unauthorized")
    assert g.requests_processing is None and g.n_decode_total is None
    assert {(f.source, f.fault) for f in obs.faults} >= {("g", "http-401")}
    assert srv.hits("/slots") == 0  # /props already said 401: no second rejected request


def test_an_idle_server_is_not_asked_for_slots_it_may_be_sleeping():
    sleeping = (DATA / "metrics-sleeping.txt").read_text()
    with server({"/metrics": Reply(200, sleeping), "/props": json_reply({**PROPS_AWAKE, "is_sleeping": True})}) as srv:
        obs = poll(srv.url)
        assert srv.hits("/slots") == 0 and srv.hits("/props") == 1
    g = obs.gpus["g"]
    assert (g.metrics, g.slots, g.requests_processing, g.slots_busy) == ("ok", "idle", 0, 0)
    assert g.is_sleeping is True
    assert g.slots_total is None and [f for f in obs.faults if f.source == "g"] == []


def test_without_metrics_a_sleeping_server_is_not_woken_by_slots():
    routes = {"/metrics": Reply(501, NOT_SUPPORTED), "/props": json_reply({**PROPS_AWAKE, "is_sleeping": True})}
    with server(routes) as srv:
        obs = poll(srv.url)
        assert srv.hits("/slots") == 0 and srv.hits("/props") == 1
    g = obs.gpus["g"]
    assert g.is_sleeping is True and g.slots == "sleeping" and g.slots_busy is None


def test_the_running_context_is_read_from_props_every_poll():
    """Rule 9 (rules/context_window/change): the real b11312 /props of a sleeping server still says n_ctx."""
    props = (DATA / "props-sleeping.json").read_text()
    with server({"/props": Reply(200, props)}) as srv:
        obs = poll(srv.url)
    assert obs.gpus["g"].n_ctx == 2048
    assert obs.to_dict()["gpus"]["g"]["n_ctx"] == 2048  # recorded for replay


def test_bad_n_ctx_in_props_is_not_known_and_not_a_fault():
    for bad in ({"n_ctx": 0}, {"n_ctx": -1}, {"n_ctx": "4096"}, {"n_ctx": 1e30}, {"n_ctx": None}, "x", {}):
        with server({"/props": json_reply({**PROPS_AWAKE, "default_generation_settings": bad})}) as srv:
            obs = poll(srv.url)
        assert obs.gpus["g"].n_ctx is None, bad
        assert [f for f in obs.faults if f.source == "g"] == []
    with server({"/props": Reply(200, "garbage{")}) as srv:
        obs = poll(srv.url)
    assert obs.gpus["g"].n_ctx is None and obs.gpus["g"].metrics == "ok"
    with server({"/props": Hang()}) as srv:
        obs = poll(srv.url, timeout_s=0.6)
    assert obs.gpus["g"].n_ctx is None and obs.gpus["g"].endpoint == "ok"


def test_garbage_is_a_data_fault():
    routes = {"/metrics": Reply(200, '"# HELP llamacpp:x y\\n"'), "/slots": json_reply({"slots": []})}
    with server(routes) as srv:
        obs = poll(srv.url)
    g = obs.gpus["g"]
    assert (g.metrics, g.slots) == ("invalid", "invalid")
    assert g.n_decode_total is None and g.slots_busy is None
    details = {f.detail for f in obs.faults if f.source == "g"}
    assert any("JSON-quoted" in d for d in details) and any("got an object" in d for d in details)


def test_bad_series_are_reported_and_not_known():
    text = METRICS.replace("llamacpp:requests_processing 2", "llamacpp:requests_processing NaN")
    with server({"/metrics": Reply(200, text)}) as srv:
        obs = poll(srv.url)
    g = obs.gpus["g"]
    assert g.metrics == "ok" and g.requests_processing is None and g.n_decode_total == 383
    assert any("requests_processing" in f.detail for f in obs.faults)


def test_twenty_megabytes_of_metrics_hit_the_byte_cap():
    with server({"/metrics": Oversized(20 * 1024 * 1024)}) as srv:
        obs = poll(srv.url)
    g = obs.gpus["g"]
    assert g.metrics == "invalid" and g.n_decode_total is None
    assert any("max_response_bytes" in f.detail for f in obs.faults)


def test_a_hung_metrics_endpoint_stays_inside_the_probe_deadline():
    with server({"/metrics": Hang(), "/slots": Hang()}) as srv:
        started = time.monotonic()
        obs = poll(srv.url, timeout_s=0.6)
        took = time.monotonic() - started
    g = obs.gpus["g"]
    assert g.endpoint == "ok" and g.metrics == "timeout" and g.requests_processing is None
    assert took < 0.6 + 0.8  # /health, /metrics, /props and /slots share one deadline


def test_a_dead_server_costs_one_request():
    with LoopbackServer({"/health": Hang()}) as srv:
        obs = poll(srv.url, timeout_s=0.4)
        assert srv.hits("/metrics") == 0
    g = obs.gpus["g"]
    assert g.endpoint == "timeout" and g.metrics is None and g.requests_processing is None
