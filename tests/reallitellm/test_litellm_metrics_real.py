"""LiteLLM's own ``/metrics`` on the real 1.108.7 proxy (issue 20): with the ``prometheus`` callback on,
the names and labels gpuheal reads (``litellm_deployment_total_requests_total``,
``litellm_deployment_failure_responses_total``, ``model_id``, ``api_base``) are what the proxy writes,
and ``check`` turns them into each GPU's counters — Rule 3's failure ratio with no gpu-monitor."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest
import requests
from litellm_proxy import MASTER_KEY, deployment, start_proxy

from gpuheal.config import load_config_dict
from gpuheal.model import DataFault
from gpuheal.sim import Scenario, SimFleet
from gpuheal.sources.litellm_metrics import fetch_requests
from gpuheal.sources.sense import sense

pytestmark = pytest.mark.reallitellm

http = requests.Session()
http.trust_env = False


@pytest.fixture(scope="module")
def counted(litellm_bin, tmp_path_factory):
    from lab import BASE_GPU

    fleet = SimFleet(Scenario.from_dict(copy.deepcopy({
        "name": "litellm-metrics", "start": "2026-07-18T08:00:00Z", "reload_s": 0.3,
        "gpus": [{**BASE_GPU, "alias": "gpu-a", "host": "ct1"}], "litellm_admin_key": MASTER_KEY,
        "litellm_store": "config-no-db"})), ports="ephemeral").start()
    models = [deployment("qwen", "gpu-a", fleet.endpoints["gpu-a"] + "/v1"),
              deployment("dead", "gpu-dead", "http://127.0.0.1:9/v1")]
    proxy = start_proxy(litellm_bin, tmp_path_factory.mktemp("litellm-metrics"), models,
                        router_settings={"num_retries": 0}, litellm_settings={"callbacks": ["prometheus"]})
    try:
        for model in ["qwen"] * 3 + ["dead"] * 2:
            r = http.post(proxy.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {MASTER_KEY}"},
                          json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                          timeout=60)
            assert r.status_code == (200 if model == "qwen" else 500), r.text[:200]
        yield proxy, fleet
    finally:
        proxy.stop()
        fleet.stop()


def test_the_real_proxy_writes_the_names_and_labels_gpuheal_reads(counted):
    proxy, fleet = counted
    text = http.get(proxy.url + "/metrics", headers={"Authorization": f"Bearer {MASTER_KEY}"}, timeout=10).text
    assert "# TYPE litellm_deployment_total_requests_total counter" in text
    assert "# TYPE litellm_deployment_failure_responses_total counter" in text
    got = fetch_requests(proxy.url, MASTER_KEY, 10.0)
    assert not isinstance(got, DataFault), got
    a, dead = got.deployments["gpu-a"], got.deployments["gpu-dead"]
    assert (a.total, a.failures, a.model_group) == (3.0, 0.0, "qwen")
    assert (dead.total, dead.failures, dead.api_base) == (2.0, 2.0, "http://127.0.0.1:9/v1")
    assert got.problems == ()


def test_check_reads_each_gpus_counters_with_no_gpu_monitor(counted):
    proxy, fleet = counted
    cfg = load_config_dict({
        "litellm": {"url": proxy.url, "api_key": MASTER_KEY, "read_metrics": True},
        "gpus": [{"alias": "gpu-a", "host": "127.0.0.1", "endpoint": fleet.endpoints["gpu-a"], "transport": "local"},
                 {"alias": "gpu-dead", "host": "127.0.0.2", "endpoint": "http://127.0.0.1:9", "transport": "local"}],
    })
    obs = sense(cfg, datetime(2026, 7, 18, 8, 0, 1, tzinfo=UTC))
    a, dead = obs.gpus["gpu-a"], obs.gpus["gpu-dead"]
    assert (a.litellm_requests_total, a.litellm_failures_total) == (3.0, 0.0)
    assert (dead.litellm_requests_total, dead.litellm_failures_total) == (2.0, 2.0)


def test_doctor_says_which_gpus_have_request_counts_and_how_to_turn_them_on(counted, litellm_bin):
    from gpuheal.doctor.checks import litellm_requests_checks

    proxy, fleet = counted
    gpus = [{"alias": "gpu-a", "host": "127.0.0.1", "endpoint": fleet.endpoints["gpu-a"], "transport": "local"},
            {"alias": "gpu-new", "host": "127.0.0.2", "endpoint": "http://127.0.0.1:10", "transport": "local"}]
    cfg = load_config_dict({"litellm": {"url": proxy.url, "api_key": MASTER_KEY, "read_metrics": True}, "gpus": gpus})
    rows = {r.check + "/" + r.target: r for r in litellm_requests_checks(cfg, 10.0)}
    assert rows["request counts/gpu-a"].status == "ok" and "3 requests, 0 failed" in rows["request counts/gpu-a"].detail
    assert rows["request counts/gpu-new"].status == "warn"
    off = load_config_dict({"litellm": {"url": proxy.url}, "gpus": gpus})
    (row,) = litellm_requests_checks(off, 10.0)
    assert row.status == "warn" and 'callbacks: ["prometheus"]' in row.fix
