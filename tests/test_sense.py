"""One poll of a loopback fleet: gpu-monitor + llama-server look-alikes + LiteLLM, all real
sockets on 127.0.0.1. A source that fails is a fault in the observation, never an exception."""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime

import pytest
from servers import (
    HEALTH_LOADING,
    HEALTH_OK,
    Dribble,
    Garbage,
    Hang,
    LoopbackServer,
    Oversized,
    Reply,
    closed_url,
    contract_document,
    fleet_config,
    gpu_entry,
    json_reply,
    monitor_document,
)

from gpuheal.config import load_config_dict
from gpuheal.sources.sense import probe_health, sense

NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)


def make_cfg(monitor_url, gpus, litellm_url=None, timeout_s=1.0, **sections):
    return load_config_dict(fleet_config(monitor_url, gpus, litellm_url=litellm_url, timeout_s=timeout_s, **sections))


def faults_of(obs, source=None):
    return {(f.source, f.fault) for f in obs.faults if source is None or f.source == source}


# --------------------------------------------------------------------------- endpoint states


@pytest.mark.parametrize(
    ("behaviour", "state"),
    [
        (HEALTH_OK, "ok"),
        (HEALTH_LOADING, "loading"),
        (Reply(500, "internal"), "http-500"),
        (Reply(401, {"error": {"message": "Invalid API Key"}}), "unauthorized"),
        (Reply(404, "nope"), "http-404"),
        (Hang(), "timeout"),
        (Garbage(), "refused"),
    ],
)
def test_probe_health_states(behaviour, state):
    with LoopbackServer({"/health": behaviour}) as srv:
        got, latency, detail = probe_health(srv.url, 0.5)
    assert got == state
    if state in ("ok", "loading"):
        assert latency is not None and latency >= 0
    if state in ("timeout", "refused"):
        assert latency is None
    assert detail.isprintable()  # the peer's bytes never reach a terminal raw


def test_probe_health_refused():
    state, latency, _ = probe_health(closed_url(), 0.5)
    assert (state, latency) == ("refused", None)


def test_fleet_with_every_endpoint_state():
    doc = monitor_document(["h-ok", "h-load", "h-ref", "h-hang", "h-500", "h-401"])
    with (
        LoopbackServer({"/gpu-data": json_reply(doc)}) as monitor,
        LoopbackServer({"/health/liveliness": Reply(200, '"I\'m alive!"')}) as litellm,
        LoopbackServer({"/health": HEALTH_OK}) as ok,
        LoopbackServer({"/health": HEALTH_LOADING}) as loading,
        LoopbackServer({"/health": Hang()}) as hang,
        LoopbackServer({"/health": Reply(500, "boom")}) as err,
        LoopbackServer({"/health": Reply(401, "no")}) as unauth,
    ):
        cfg = make_cfg(
            monitor.url + "/gpu-data",
            [
                ("g-ok", "h-ok", ok.url),
                ("g-load", "h-load", loading.url),
                ("g-ref", "h-ref", closed_url()),
                ("g-hang", "h-hang", hang.url),
                ("g-500", "h-500", err.url),
                ("g-401", "h-401", unauth.url),
            ],
            litellm_url=litellm.url,
            timeout_s=0.8,
        )
        started = time.monotonic()
        obs = sense(cfg, NOW)
        took = time.monotonic() - started
    states = {alias: s.endpoint for alias, s in obs.gpus.items()}
    assert states == {
        "g-ok": "ok",
        "g-load": "loading",
        "g-ref": "refused",
        "g-hang": "timeout",
        "g-500": "http-500",
        "g-401": "unauthorized",
    }
    assert obs.at == NOW
    assert obs.monitor_ok is True and obs.litellm_ok is True
    assert faults_of(obs) == {
        ("g-ref", "refused"),
        ("g-hang", "timeout"),
        ("g-500", "http-500"),
        ("g-401", "http-401"),
    }
    assert obs.gpus["g-ok"].temp_c == 60 and obs.gpus["g-ok"].vram_used_mb == 12000
    assert took < 0.8 + 1.0  # concurrent: one deadline, not four


@pytest.mark.parametrize("with_length", [True, False], ids=["content-length", "streamed"])
def test_oversized_health_reply_is_an_oversized_fault_not_http_200(with_length):
    """Issue 9 point 8: a /health reply over 64 KB was labelled ``http-200``, as if its status were
    the problem. It is an ``oversized`` fault; the endpoint state stays the status it answered."""
    doc = monitor_document(["h1"])
    with (
        LoopbackServer({"/gpu-data": json_reply(doc)}) as monitor,
        LoopbackServer({"/health": Oversized(size=2_000_000, content_length=with_length)}) as gpu,
    ):
        obs = sense(make_cfg(monitor.url + "/gpu-data", [("g1", "h1", gpu.url)]), NOW)
        state, latency, detail = probe_health(gpu.url, 1.0)
    assert faults_of(obs) == {("g1", "oversized")}
    assert obs.gpus["g1"].endpoint == "http-200" and state == "http-200" and latency is None
    assert detail and detail.isprintable()


def test_litellm_faults():
    doc = monitor_document(["h1"])
    with (
        LoopbackServer({"/gpu-data": json_reply(doc)}) as monitor,
        LoopbackServer({"/health": HEALTH_OK}) as gpu,
        LoopbackServer({"/health/liveliness": Reply(500, "down")}) as litellm,
    ):
        obs = sense(make_cfg(monitor.url + "/gpu-data", [("g1", "h1", gpu.url)], litellm_url=litellm.url), NOW)
        assert obs.litellm_ok is False
        assert faults_of(obs) == {("litellm", "http-500")}
        obs = sense(make_cfg(monitor.url + "/gpu-data", [("g1", "h1", gpu.url)], litellm_url=closed_url()), NOW)
        assert faults_of(obs) == {("litellm", "refused")}
        obs = sense(make_cfg(monitor.url + "/gpu-data", [("g1", "h1", gpu.url)]), NOW)
        assert obs.litellm_ok is None and obs.faults == ()  # not configured: not checked


# --------------------------------------------------------------------------- monitor faults


@pytest.fixture
def one_gpu():
    with LoopbackServer({"/health": HEALTH_OK}) as gpu:
        yield gpu


def sense_with_monitor(behaviour, gpu_server, timeout_s=0.8, **monitor):
    with LoopbackServer({"/gpu-data": behaviour}) as mon:
        cfg = make_cfg(mon.url + "/gpu-data", [("g1", "ct8", gpu_server.url)], timeout_s=timeout_s, monitor=monitor)
        started = time.monotonic()
        obs = sense(cfg, NOW)
        return obs, time.monotonic() - started


def test_monitor_timeout_is_a_fault_and_probes_still_run(one_gpu):
    obs, took = sense_with_monitor(Hang(), one_gpu)
    assert obs.monitor_ok is False
    assert faults_of(obs) == {("monitor", "timeout")}
    assert obs.gpus["g1"].endpoint == "ok"
    assert obs.gpus["g1"].temp_c is None  # not known, never zero
    assert took < 0.8 + 0.7


def test_monitor_dribbling_is_cut_at_its_deadline(one_gpu):
    obs, took = sense_with_monitor(Dribble(json.dumps(contract_document()), interval_s=0.2), one_gpu)
    assert faults_of(obs, "monitor") == {("monitor", "timeout")}
    assert took < 0.8 + 0.7


def test_monitor_refused(one_gpu):
    cfg = make_cfg(closed_url() + "/gpu-data", [("g1", "ct8", one_gpu.url)])
    obs = sense(cfg, NOW)
    assert faults_of(obs) == {("monitor", "refused")}
    assert obs.gpus["g1"].endpoint == "ok"


@pytest.mark.parametrize("with_length", [True, False], ids=["content-length", "streamed"])
def test_monitor_oversized_warns_l5_and_skips_the_monitor(one_gpu, with_length):
    obs, _ = sense_with_monitor(
        Oversized(size=200_000, content_length=with_length), one_gpu, max_response_bytes=65536
    )
    assert obs.monitor_ok is False
    assert faults_of(obs) == {("monitor", "oversized")}
    l5 = [w for w in obs.warnings if "L5" in w]
    assert len(l5) == 1 and "65536" in l5[0]
    # no nvidia-smi here: the Rule 7.3 fallback says so in one line, not as a fault per GPU
    assert [w for w in obs.warnings if w not in l5] == [] or "Rule 7.3 fallback" in obs.warnings[-1]
    assert obs.gpus["g1"].temp_c is None


@pytest.mark.parametrize(
    "body",
    [
        Garbage(),
        Reply(200, b"\x00\xff\xfe garbage"),
        Reply(200, b"<html>502 Bad Gateway</html>"),
        Reply(200, b'{"gpus": [ {"hostname": "ct8", '),
        Reply(200, b"[1, 2, 3]"),
        Reply(200, b'"just a string"'),
        Reply(200, b"null"),
        Reply(200, b"{}"),
        Reply(200, b'{"gpus": {"ct8": {}}}'),
        Reply(200, b"[" * 100_000 + b"]" * 100_000),
    ],
    ids=["not-http", "binary", "html", "truncated-json", "list", "string", "null", "empty", "gpus-not-list", "deep"],
)
def test_monitor_garbage_is_invalid_or_refused(one_gpu, body):
    obs, _ = sense_with_monitor(body, one_gpu, max_response_bytes=1 << 20)
    assert obs.monitor_ok is False
    kinds = {f.fault for f in obs.faults if f.source == "monitor"}
    assert kinds <= {"invalid", "refused"} and kinds
    assert obs.gpus["g1"].endpoint == "ok"


def test_monitor_http_error_is_a_fault(one_gpu):
    obs, _ = sense_with_monitor(Reply(502, "bad gateway"), one_gpu)
    assert faults_of(obs) == {("monitor", "http-502")}


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("temp_c", float("nan")),
        ("temp_c", float("inf")),
        ("temp_c", -5),
        ("temp_c", "hot"),
        ("temp_c", True),
        ("temp_c", 1e300),
        ("vram_used_mb", -1),
        ("vram_used_mb", [1, 2]),
        ("util_pct", 250),
        ("power_w", {"w": 1}),
    ],
)
def test_monitor_invalid_values_become_none_with_an_invalid_fault(one_gpu, field, bad):
    doc = {"gpus": [gpu_entry("ct8", **{field: bad})]}
    body = json.dumps(doc, allow_nan=True).encode()  # NaN/Infinity as real monitors emit them
    obs, _ = sense_with_monitor(Reply(200, body), one_gpu)
    sample = obs.gpus["g1"]
    assert getattr(sample, field) is None
    assert obs.monitor_ok is True  # the rest of the document is still used
    assert sample.vram_total_mb == 24576 or field == "vram_total_mb"
    invalid = [f for f in obs.faults if f.source == "monitor"]
    assert [f.fault for f in invalid] == ["invalid"]
    assert field in invalid[0].detail


def test_numeric_strings_are_a_fault_not_a_reading(one_gpu):
    """Issue 9 point 2: ``"temp_c": "99"`` is the wrong JSON type — not known plus a fault naming
    the field, never 99 °C (two such polls used to raise thermal-critical)."""
    obs, _ = sense_with_monitor(json_reply({"gpus": [gpu_entry("ct8", temp_c="99")]}), one_gpu)
    assert obs.gpus["g1"].temp_c is None
    assert obs.gpus["g1"].vram_used_mb == 12000  # the rest of the entry is still read
    (fault,) = [f for f in obs.faults if f.source == "monitor"]
    assert fault.fault == "invalid" and "gpus[0].temp_c: '99' is not a number" in fault.detail


def test_missing_optional_fields_are_not_known_never_zero(one_gpu):
    obs, _ = sense_with_monitor(json_reply({"gpus": [{"hostname": "ct8"}]}), one_gpu)
    sample = obs.gpus["g1"]
    assert (sample.temp_c, sample.vram_used_mb, sample.util_pct, sample.power_w) == (None, None, None, None)
    assert obs.faults == ()


def test_contract_document_and_legacy_strix_block(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi for the Rule 7.3 fallback to find
    with (
        LoopbackServer({"/gpu-data": json_reply(contract_document())}) as mon,
        LoopbackServer({"/health": HEALTH_OK}) as gpu,
    ):
        cfg = make_cfg(
            mon.url + "/gpu-data",
            [("gpu-dense", "ct8", gpu.url), ("gpu-light", "ct110", gpu.url), ("strix-moe", "ct15", gpu.url)],
        )
        obs = sense(cfg, NOW)
    dense, light, strix = obs.gpus["gpu-dense"], obs.gpus["gpu-light"], obs.gpus["strix-moe"]
    assert (dense.temp_c, dense.vram_used_mb, dense.util_pct, dense.power_w) == (64, 21600, 87, 281.4)
    assert dense.name == "NVIDIA GeForce RTX 3090"
    assert (dense.requests_60s, dense.failures_60s, dense.consecutive_timeouts) == (14, 0, 0)
    assert dense.bench_tok_s == 74.9
    assert (strix.temp_c, strix.vram_used_mb, strix.vram_total_mb, strix.running) == (58, 10240, 65536, True)
    assert light.breaker is not None and light.breaker.open is True
    assert light.breaker.opened_at == datetime(2026, 7, 18, 7, 48, tzinfo=UTC)
    # ct110 is configured but has no gpus[] entry in the sample: gpu-monitor's answer lacks it (contract
    # "Rule timing", issue 27 defect 1): one gpu-monitor fault naming it; it is read through the fallback
    assert faults_of(obs) == {("monitor", "invalid")} and obs.lacking == ("gpu-light",) and obs.monitor_ok
    assert "gpu-light: reports no GPU with hostname 'ct110'" in obs.faults[0].detail
    assert light.temp_c is None  # no nvidia-smi on this PATH: not known


def test_host_in_both_gpus_and_strix_gpus_wins(one_gpu):
    doc = {
        "gpus": [gpu_entry("ct8", temp_c=61, vram_used_mb=1000)],
        "strix": {"running": True, "hostname": "ct8", "temp_c": 99, "vram_used_mb": 9999},
    }
    obs, _ = sense_with_monitor(json_reply(doc), one_gpu)
    sample = obs.gpus["g1"]
    assert (sample.temp_c, sample.vram_used_mb) == (61, 1000)
    assert sample.running is True  # only what gpus[] did not say is taken from strix


def test_configured_gpu_missing_from_the_document(one_gpu):
    """An answer that lists none of the fleet is unusable, as a refused monitor (contract "Rule timing",
    issue 27 defect 1): the fallback reads the GPUs, and the fault names what is missing."""
    obs, _ = sense_with_monitor(json_reply(monitor_document(["other-host"])), one_gpu)
    assert obs.monitor_ok is False and obs.source == "smi-fallback" and obs.lacking == ("g1",)
    assert faults_of(obs, "monitor") == {("monitor", "invalid")}
    assert "ct8" in obs.faults[0].detail
    assert obs.unmatched_hosts == ("other-host",)


def test_hostile_strings_in_the_document_stay_data(one_gpu):
    doc = {"gpus": [gpu_entry("ct8", name="[bold red]x[/] \x1b[31mred\x1b[0m" + "A" * 5000)]}
    obs, _ = sense_with_monitor(json_reply(doc), one_gpu)
    assert obs.gpus["g1"].name.startswith("[bold red]x[/]")
    assert len(obs.gpus["g1"].name) <= 200


# --------------------------------------------------------------------------- concurrency bound


def test_sweep_of_50_dead_endpoints_takes_about_one_deadline():
    """Issue 2: "a sweep of N dead hosts takes about one deadline, not N". A behaviour bound
    (generous), not a micro-benchmark."""
    deadline = 1.0
    with (
        LoopbackServer(default=Hang(), ports=50, record=False) as dead,
        LoopbackServer({"/gpu-data": Hang()}) as mon,
        LoopbackServer({"/health/liveliness": Hang()}) as litellm,
    ):
        gpus = [(f"g{i:02d}", f"h{i:02d}", url) for i, url in enumerate(dead.urls)]
        cfg = make_cfg(mon.url + "/gpu-data", gpus, litellm_url=litellm.url, timeout_s=deadline)
        started = time.monotonic()
        obs = sense(cfg, NOW)
        took = time.monotonic() - started
    assert took < deadline + 1.5, took
    assert {s.endpoint for s in obs.gpus.values()} == {"timeout"}
    assert len(obs.faults) == 52  # 50 endpoints + monitor + litellm
    assert obs.monitor_ok is False and obs.litellm_ok is False


def test_observation_round_trips_through_json():
    from gpuheal.model import Observation

    with (
        LoopbackServer({"/gpu-data": json_reply(contract_document())}) as mon,
        LoopbackServer({"/health": HEALTH_OK}) as gpu,
    ):
        cfg = make_cfg(mon.url + "/gpu-data", [("gpu-dense", "ct8", gpu.url), ("gpu-light", "ct110", closed_url())])
        obs = sense(cfg, NOW)
    text = json.dumps(obs.to_dict(), allow_nan=False)
    back = Observation.from_dict(json.loads(text))
    assert back.to_dict() == obs.to_dict()
    assert not any(isinstance(v, float) and math.isnan(v) for v in obs.gpus["gpu-dense"].to_dict().values())
