"""The look-alike LiteLLM in ``gpuheal sim`` answers as the real proxy does (issue 11).

The same requests go to the real proxy (config.yaml, no database) and to the simulator in its
``config-no-db`` mode, both with the same deployments; status, content type and body must match.
For ``/v1/model/info`` the body is compared on what a client reads (group, id, db_model, the
routing values, api_base): the real one also lists ~100 pricing keys, all null here.
"""

from __future__ import annotations

import json

import pytest
import requests

from .conftest import WEIGHTS

pytestmark = pytest.mark.reallitellm

WRONG = "sk-wrong-key-00001234"


def ask(base: str, method: str, path: str, key: str | None, body: bytes | None = None):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    r = requests.request(method, base + path, data=body, headers=headers, timeout=20)
    ctype = r.headers.get("content-type", "").split(";")[0]
    try:
        payload = r.json()
    except ValueError:
        payload = r.text
    return r.status_code, ctype, payload


def model_view(payload):
    """What gpuheal (or anyone) reads from /v1/model/info."""
    if not isinstance(payload, dict) or "data" not in payload:
        return payload
    return sorted(
        (
            d["model_name"],
            d["model_info"]["id"],
            d["model_info"]["db_model"],
            d["litellm_params"].get("weight"),
            d["litellm_params"].get("rpm"),
            d["litellm_params"]["model"],
            d["litellm_params"]["api_base"],
        )
        for d in payload["data"]
    )


UPDATE = json.dumps({"model_info": {"id": "gpu-dense"}, "litellm_params": {"weight": 0.2}}).encode()
MISSING = json.dumps({"model_info": {"id": "gpu-nope"}, "litellm_params": {"rpm": 1}}).encode()

CASES = {
    "liveliness": ("GET", "/health/liveliness", None, None),
    "model info": ("GET", "/v1/model/info", "master", None),
    "model info one id": ("GET", "/v1/model/info?litellm_model_id=gpu-light", "master", None),
    "model info missing id": ("GET", "/v1/model/info?litellm_model_id=gpu-nope", "master", None),
    "model info wrong key": ("GET", "/v1/model/info", WRONG, None),
    "model info no key": ("GET", "/v1/model/info", None, None),
    "update config model": ("POST", "/model/update", "master", UPDATE),
    "update missing id": ("POST", "/model/update", "master", MISSING),
    "update wrong key": ("POST", "/model/update", WRONG, UPDATE),
    "update garbage json": ("POST", "/model/update", "master", b'{"model_info":'),
    "update with GET": ("GET", "/model/update", "master", None),
    # Rule 10's spend logs (issue 22): refused without a database, whatever the key
    "spend logs v2": ("GET", "/spend/logs/v2?start_date=2026-07-18%2007:00:00&end_date=2026-07-18%2008:00:00"
                      "&page=1&page_size=1000", "master", None),
    "spend logs": ("GET", "/spend/logs", "master", None),
    "spend logs wrong key": ("GET", "/spend/logs/v2", WRONG, None),
    "spend logs no key": ("GET", "/spend/logs/v2", None, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_lookalike_answers_as_the_real_proxy(case, real_litellm, sim_backends):
    method, path, key, body = CASES[case]
    key = real_litellm.master_key if key == "master" else key
    real = ask(real_litellm.url, method, path, key, body)
    sim = ask(sim_backends.litellm_url, method, path, key, body)
    assert real[:2] == sim[:2], (case, real, sim)
    assert model_view(real[2]) == model_view(sim[2]), case


def test_readiness_reports_no_database_on_both(real_litellm, sim_backends):
    for base in (real_litellm.url, sim_backends.litellm_url):
        doc = requests.get(base + "/health/readiness", timeout=20).json()
        assert (doc["status"], doc["db"]) == ("healthy", "Not connected")


def test_the_comparison_can_fail(real_litellm, sim_backends):
    """Guard: the views differ when the deployments differ (the comparison is not vacuous)."""
    real = model_view(ask(real_litellm.url, "GET", "/v1/model/info", real_litellm.master_key)[2])
    assert len(real) == len(WEIGHTS) + 1
    assert real != [(*row[:3], 0.99, *row[4:]) for row in real]
