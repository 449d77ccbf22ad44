"""``doctor`` with Prometheus as the source: each query must return a series for each GPU (issue 13)."""

from __future__ import annotations

import json

from gpuheal.doctor import FAIL, OK, WARN
from gpuheal.doctor.prometheus import query_checks
from tests.test_prometheus_source import Canned, _cfg, _ok, healthy


def _rows(cfg):
    return {r.check: r for r in query_checks(cfg)}


def _rows_answering(answer, **prom):
    """doctor's rows against a canned Prometheus answering ``answer(query)``."""
    srv = Canned(answer)
    try:
        return _rows(_cfg(srv.url, **prom))
    finally:
        srv.close()


def test_every_query_answers_for_every_gpu():
    rows = _rows_answering(healthy)
    assert rows["query temp_c"].status == OK and "each of 2 GPUs" in rows["query temp_c"].detail
    assert rows["query vram.slope"].status == OK
    # nothing scrapes llama-server in this Prometheus: a warning naming the fix, not a failure
    assert rows["query requests_processing"].status == WARN
    assert "--metrics" in rows["query requests_processing"].fix


def test_a_gpu_without_series_fails_the_core_reading_and_names_it():
    def answer(q):
        status, body = healthy(q)
        doc = json.loads(body)
        doc["data"]["result"] = [r for r in doc["data"]["result"] if r["metric"].get("Hostname") != "h2"]
        return status, json.dumps(doc).encode()

    rows = _rows_answering(answer)
    assert rows["query temp_c"].status == FAIL and "b" in rows["query temp_c"].detail
    assert "Hostname=gpus[].host" in rows["query temp_c"].fix
    assert rows["query vram.slope"].status == WARN


def test_prometheus_down_fails_with_the_fix():
    rows = _rows(_cfg("http://127.0.0.1:9"))
    assert rows["query temp_c"].status == FAIL and "refused" in rows["query temp_c"].detail
    assert rows["query temp_c"].fix == "is Prometheus running at prometheus.url?"


def test_doctor_registers_the_prometheus_probe_and_skips_gpu_monitor():
    from gpuheal.doctor import (
        Context,
        checks,  # noqa: F401  (registers the built-in probes)
        providers,
    )

    cfg = _cfg("http://127.0.0.1:9")
    probes = [p for provider in providers("network") for p in provider(Context(cfg, None))]
    targets = {p.target for p in probes}
    assert "prometheus" in targets and "monitor" not in targets


def test_liveness_from_up_is_matched_by_the_endpoint_not_the_host():
    """``probe_endpoints: false``: ``endpoint_up`` answers per instance (host:port), as the poll
    reads it; doctor once looked its series up by (host, gpu) and warned for every GPU."""
    up_query = 'up{job="llama"}'

    def answer(q):
        if q == up_query:
            return 200, _ok([{"metric": {"__name__": "up", "instance": "127.0.0.1:9", "job": "llama"},
                              "value": [1700000000.5, "1"]}])
        return healthy(q)

    rows = _rows_answering(answer, probe_endpoints=False, queries={"endpoint_up": up_query})
    assert rows["query endpoint_up"].status == OK, rows["query endpoint_up"].detail


def test_gpus_whose_samples_are_too_old_fail_the_stale_row_by_name():
    """The reading rows count a series whatever its age; the poll reads a GPU whose newest
    temperature sample is older than ``staleness_s`` as not known, so doctor says which."""

    def answer(q):
        if q.startswith("DCGM_FI_DEV_GPU_TEMP unless last_over_time("):
            return 200, _ok([{"metric": {"Hostname": "h2", "gpu": "0"}, "value": [1700000000.5, "61"]}])
        return healthy(q)

    rows = _rows_answering(answer)
    assert rows["query temp_c"].status == OK
    stale = rows["query stale"]
    assert stale.status == FAIL and stale.detail == "newest sample older than staleness_s (120 s): b", stale.detail
    assert "staleness_s" in stale.fix


def test_the_stale_row_passes_when_no_gpu_is_listed():
    rows = _rows_answering(healthy)
    assert rows["query stale"].status == OK
