"""Several GPUs on one host with gpu-monitor (issue 12): its ``gpus`` entries matched by
(hostname, ``index``), model counts by ``name`` and breakers by ``model`` (= the alias); a host
whose entries carry no index is never guessed at — not known, and a fault that says why."""

from __future__ import annotations

from datetime import UTC, datetime

from servers import HEALTH_OK, LoopbackServer, fleet_config, gpu_entry, json_reply

from gpuheal.config import load_config_dict
from gpuheal.sources.sense import sense

NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)


def two_gpu_host(monitor_url, gpu_url):
    data = fleet_config(monitor_url, [("box-0", "ct9", gpu_url), ("box-1", "ct9", gpu_url), ("solo", "ct8", gpu_url)])
    data["gpus"][0]["gpu_index"] = 0
    data["gpus"][1]["gpu_index"] = 1
    return load_config_dict(data)


def document(with_index=True):
    def entry(host, index, **values):
        e = gpu_entry(host, **values)
        if with_index and index is not None:
            e["index"] = index
        return e

    return {
        "generated_at": "2026-07-18T08:00:00Z",
        "gpus": [entry("ct9", 1, temp_c=81, vram_used_mb=20000), entry("ct9", 0, temp_c=52),
                 entry("ct8", None, temp_c=60)],
        "benchmarks": {"ct9": {"current_tok_s": 50.0, "measured_at": "2026-07-18T07:59:00Z"}},
        "summary": {
            "available_models": [
                {"name": "box-0", "hostname": "ct9", "requests_60s": 10, "failures_60s": 0},
                {"name": "box-1", "hostname": "ct9", "requests_60s": 8, "failures_60s": 8},
                {"name": "solo", "hostname": "ct8", "requests_60s": 3, "failures_60s": 0},
            ],
            "circuit_breakers": [{"model": "box-1", "hostname": "ct9", "open": True,
                                  "opened_at": "2026-07-18T07:40:00Z"}],
        },
    }


def test_entries_counts_and_breakers_by_index_and_alias():
    with LoopbackServer({"/gpu-data": json_reply(document())}) as mon, LoopbackServer({"/health": HEALTH_OK}) as gpu:
        obs = sense(two_gpu_host(mon.url + "/gpu-data", gpu.url), NOW)
    b0, b1, solo = obs.gpus["box-0"], obs.gpus["box-1"], obs.gpus["solo"]
    assert (b0.temp_c, b1.temp_c, b1.vram_used_mb, solo.temp_c) == (52, 81, 20000, 60)
    assert (b0.requests_60s, b0.failures_60s, b1.failures_60s, solo.requests_60s) == (10, 0, 8, 3)
    assert b1.breaker is not None and b1.breaker.open and b0.breaker is None
    # one benchmark for a host of two GPUs cannot be told apart: not known
    assert b0.bench_tok_s is None and b1.bench_tok_s is None
    assert [f for f in obs.faults if f.source.startswith("box")] == []


def test_entries_without_index_on_a_shared_host_are_not_guessed():
    with LoopbackServer({"/gpu-data": json_reply(document(with_index=False))}) as mon, \
            LoopbackServer({"/health": HEALTH_OK}) as gpu:
        obs = sense(two_gpu_host(mon.url + "/gpu-data", gpu.url), NOW)
    assert obs.gpus["box-0"].temp_c is None and obs.gpus["box-1"].temp_c is None
    assert obs.gpus["solo"].temp_c == 60
    faults = {f.source: f.detail for f in obs.faults}
    assert "cannot tell which is this GPU" in faults["box-0"]
    # counts by name still match: the alias is unambiguous
    assert obs.gpus["box-1"].failures_60s == 8


def test_a_missing_index_is_a_fault_not_another_gpus_reading(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi for the Rule 7.3 fallback to find
    doc = document()
    doc["gpus"] = [g for g in doc["gpus"] if g.get("index") != 1]
    with LoopbackServer({"/gpu-data": json_reply(doc)}) as mon, LoopbackServer({"/health": HEALTH_OK}) as gpu:
        obs = sense(two_gpu_host(mon.url + "/gpu-data", gpu.url), NOW)
    assert obs.gpus["box-1"].temp_c is None and obs.gpus["box-0"].temp_c == 52
    # the answer lacks box-1 (issue 27 defect 1): gpu-monitor's fault names it, the fallback reads it
    assert "box-1: reports no GPU with index 1" in {f.source: f.detail for f in obs.faults}["monitor"]
    assert obs.lacking == ("box-1",) and obs.monitor_ok


def test_a_bad_index_is_a_problem_naming_the_field():
    doc = document()
    doc["gpus"][0]["index"] = "1"
    with LoopbackServer({"/gpu-data": json_reply(doc)}) as mon, LoopbackServer({"/health": HEALTH_OK}) as gpu:
        obs = sense(two_gpu_host(mon.url + "/gpu-data", gpu.url), NOW)
    assert any("gpus[0].index" in f.detail for f in obs.faults if f.source == "monitor")
    assert obs.gpus["box-1"].temp_c is None
