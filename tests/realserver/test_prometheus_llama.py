"""llama.cpp's own series through a real Prometheus (issue 13): Prometheus scrapes a real
llama-server's ``/metrics`` (with the api key, as a production scrape config must); gpuheal reads
``llamacpp:*`` by the target's ``instance`` label = the GPU's endpoint ``host:port``."""

from __future__ import annotations

import time

import pytest

from gpuheal.config import load_config_dict
from gpuheal.sim.dcgm import Exporter
from gpuheal.sources import prometheus
from tests.prom import prom_server, prometheus_bin  # noqa: F401, F811 - fixtures

pytestmark = [pytest.mark.realserver, pytest.mark.prometheus]


def test_llamacpp_series_match_the_gpu_by_instance(real_llama_server, prom_server):  # noqa: F811
    srv = real_llama_server()
    target = f"127.0.0.1:{srv.port}"
    exporter = Exporter(lambda: [("ct1", 0, {"temp_c": 50, "vram_used_mb": 800, "vram_total_mb": 24576})]).start()
    try:
        prom = prom_server(
            {"dcgm": [exporter.target], "llama": {"targets": [target], "authorization": {"credentials": srv.api_key}}}
        )
        prom.wait_for('up{job="llama"} == 1', timeout_s=30)
        prom.wait_for("llamacpp:n_decode_total", timeout_s=30)
        prom.wait_samples("DCGM_FI_DEV_GPU_TEMP", 2)
        cfg = load_config_dict(
            {"prometheus": {"url": prom.url}, "gpus": [{"alias": "gpu-a", "host": "ct1", "endpoint": srv.url}]}
        )
        got = prometheus.read(cfg, time.time())
        a = got.values["gpu-a"]
        assert a["requests_processing"] == 0 and a["requests_deferred"] == 0
        assert a["n_decode_total"] >= 0 and a["temp_c"] == 50
    finally:
        exporter.stop()
