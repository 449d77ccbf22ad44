"""Smoke tests pinning the llama-server facts gpuheal relies on (real binary, tiny model).

See conftest.py for how the binary and the model are obtained. Everything here uses plain
``requests`` against 127.0.0.1. Assertions are on shapes and exact token counts, never on absolute
throughput (shared CI hosts stall).
"""

from __future__ import annotations

import re
import time

import pytest
import requests

pytestmark = pytest.mark.realserver

AUTH_ERROR = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}
LOADING_ERROR = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}

# never route 127.0.0.1 through a proxy from the environment
http = requests.Session()
http.trust_env = False


def metric(text: str, name: str) -> float:
    m = re.search(rf"^llamacpp:{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"llamacpp:{name} not in /metrics"
    return float(m.group(1))


def test_health_is_public_and_ok(llama_server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, llama_server.auth):
        r = http.get(llama_server.url + "/health", headers=headers, timeout=5)
        assert r.status_code == 200
        assert r.json() == {"status": "ok"}
        assert r.headers.get("Server") == "llama.cpp"
    r = http.get(llama_server.url + "/v1/health", timeout=5)
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_props_n_ctx_and_build_info(llama_server):
    r = http.get(llama_server.url + "/props", headers=llama_server.auth, timeout=5)
    assert r.status_code == 200
    props = r.json()
    # per-slot context: -c 2048 split over -np 2
    assert props["default_generation_settings"]["n_ctx"] == 1024
    assert props["total_slots"] == 2
    assert props["endpoint_metrics"] is True
    assert props["endpoint_slots"] is True
    assert props["is_sleeping"] is False
    assert props["model_path"] == str(llama_server.model)
    m = re.fullmatch(r"b(\d+)-([0-9a-f]{7,})", props["build_info"])
    assert m, props["build_info"]
    assert int(m.group(1)) > 1, "built without -DLLAMA_BUILD_NUMBER (shallow git in the sdist)"
    # X-Api-Key is accepted as well as Bearer
    r2 = http.get(
        llama_server.url + "/props", headers={"X-Api-Key": llama_server.api_key}, timeout=5
    )
    assert r2.status_code == 200


def test_completion_timings(llama_server):
    r = http.post(
        llama_server.url + "/completion",
        headers=llama_server.auth,
        json={"prompt": "hello world, the GPU", "n_predict": 16, "temperature": 0},
        timeout=30,
    )
    assert r.status_code == 200
    body = r.json()
    t = body["timings"]
    assert t["predicted_n"] == 16  # the tiny model never emits EOS
    assert t["predicted_per_second"] > 0
    assert t["predicted_ms"] > 0
    assert t["prompt_n"] >= 1
    assert body["tokens_predicted"] == 16
    assert body["stop_type"] == "limit"
    assert body["truncated"] is False
    assert isinstance(body["content"], str) and body["content"]
    # greedy decoding is deterministic
    again = http.post(
        llama_server.url + "/completion",
        headers=llama_server.auth,
        json={"prompt": "hello world, the GPU", "n_predict": 16, "temperature": 0},
        timeout=30,
    ).json()
    assert again["content"] == body["content"]


def test_chat_completions(llama_server):
    r = http.post(
        llama_server.url + "/v1/chat/completions",
        headers=llama_server.auth,
        json={
            "model": "tiny",
            "messages": [
                {"role": "system", "content": "you are a GPU"},
                {"role": "user", "content": "hello"},
            ],
            "max_tokens": 8,
            "temperature": 0,
        },
        timeout=30,
    )
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 8
    assert body["timings"]["predicted_n"] == 8  # top-level, next to usage
    assert body["timings"]["predicted_per_second"] > 0
    assert re.fullmatch(r"b\d+-[0-9a-f]+", body["system_fingerprint"])


def test_wrong_or_missing_key_is_401(llama_server):
    url = llama_server.url
    cases = [
        ("POST", "/completion", {"Authorization": "Bearer wrong"}),
        ("POST", "/v1/chat/completions", {"Authorization": "Bearer wrong"}),
        ("GET", "/metrics", {}),
        ("GET", "/slots", {"Authorization": "Bearer wrong"}),
        ("GET", "/props", {}),
    ]
    for method, path, headers in cases:
        r = http.request(
            method, url + path, headers=headers, json={"prompt": "x", "n_predict": 1}, timeout=5
        )
        assert r.status_code == 401, (method, path)
        assert r.json() == AUTH_ERROR, (method, path)


def test_metrics_and_slots(llama_server):
    r = http.get(llama_server.url + "/metrics", headers=llama_server.auth, timeout=5)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    before = metric(r.text, "tokens_predicted_total")
    for name in (
        "prompt_tokens_total",
        "tokens_predicted_seconds_total",
        "requests_processing",
        "requests_deferred",
        "n_decode_total",
    ):
        metric(r.text, name)

    http.post(
        llama_server.url + "/completion",
        headers=llama_server.auth,
        json={"prompt": "gpu", "n_predict": 5},
        timeout=30,
    ).raise_for_status()
    r = http.get(llama_server.url + "/metrics", headers=llama_server.auth, timeout=5)
    assert metric(r.text, "tokens_predicted_total") == before + 5
    assert metric(r.text, "requests_processing") == 0

    r = http.get(llama_server.url + "/slots", headers=llama_server.auth, timeout=5)
    assert r.status_code == 200
    slots = r.json()
    assert [s["id"] for s in slots] == [0, 1]
    assert all(s["n_ctx"] == 1024 and s["is_processing"] is False for s in slots)


def test_metrics_disabled_is_501(real_llama_server):
    srv = real_llama_server(metrics=False, api_key=None)
    r = http.get(srv.url + "/metrics", timeout=5)
    assert r.status_code == 501
    assert r.json()["error"]["type"] == "not_supported_error"
    # without --api-key everything is public
    assert http.get(srv.url + "/props", timeout=5).status_code == 200


def test_stopped_server_refuses_connections(real_llama_server):
    srv = real_llama_server()
    assert http.get(srv.url + "/health", timeout=5).status_code == 200
    srv.stop()
    assert not srv.alive()
    with pytest.raises(requests.ConnectionError):
        http.get(srv.url + "/health", timeout=5)


def test_loading_window_answers_503(real_llama_server, slow_model):
    """Every path, even /health and even with a wrong key, is 503 'Loading model' while loading."""
    srv = real_llama_server(
        slow_model, wait=False, n_parallel=1, extra_args=["--load-mode", "none"]
    )
    seen: list[tuple[str, int, dict]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert srv.alive(), srv.log_text()[-2000:]
        try:
            r = http.get(srv.url + "/health", timeout=5)
        except requests.ConnectionError:
            time.sleep(0.002)
            continue
        if r.status_code == 200:
            break
        seen.append(("/health", r.status_code, r.json()))
        r = http.get(srv.url + "/props", headers={"Authorization": "Bearer wrong"}, timeout=5)
        if r.status_code == 503:
            seen.append(("/props", r.status_code, r.json()))
    else:
        pytest.fail("slow model never became ready")
    assert seen, "no 503 observed: the model loaded before the port answered"
    assert all(code == 503 and body == LOADING_ERROR for _, code, body in seen), seen
    assert srv.wait_ready() > 0
