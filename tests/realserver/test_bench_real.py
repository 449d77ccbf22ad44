"""``gpuheal bench`` and the benchmark inference test against a real llama.cpp ``llama-server``.

Fixtures from ``conftest.py`` (binary built from source once per machine, tiny random-weight model
written by the suite). Assertions are on shapes and exact token counts, never on absolute tok/s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests
import yaml

from gpuheal.sources.llama_server import benchmark_inference, read_props
from gpuheal.sources.sense import probe_health

pytestmark = pytest.mark.realserver

http = requests.Session()
http.trust_env = False



def unauthorized_lines(srv) -> int:
    return sum("unauthorized" in line for line in srv.log_text().splitlines())


def test_bench_figures_parse(llama_server):
    out = benchmark_inference(llama_server.url, llama_server.api_key, n_predict=16, deadline_s=30, warmup=True)
    assert out.ok, out
    assert out.error is None and out.status == 200
    assert out.api == "completion" and out.rate_source == "timings"
    assert out.tokens == 16  # the tiny model never emits EOS
    assert out.gen_tok_s > 0 and out.prompt_tok_s > 0  # prompt cache off: prefill is measured
    assert out.model == str(llama_server.model)
    assert out.n_ctx == 1024 and out.slots == 2  # -c 2048 -np 2: per-slot context (L3)
    assert out.requests == 3
    assert out.elapsed_s < 30


def test_read_props_real(llama_server):
    info = read_props(llama_server.url, llama_server.api_key, 5)
    assert info.ok and info.n_ctx == 1024 and info.total_slots == 2
    assert info.build_info and info.build_info.startswith("b") and info.is_sleeping is False


def test_api_key_mismatch_is_detected_with_one_request(real_llama_server):
    srv = real_llama_server(api_key="sk-loc-real-5678")
    before = unauthorized_lines(srv)
    out = benchmark_inference(srv.url, "not-needed", n_predict=16, deadline_s=30, warmup=True)
    assert not out.ok and out.error == "unauthorized" and out.status == 401
    assert out.key_sent == "not-needed"
    assert out.requests == 1
    time.sleep(0.2)  # let the server flush its log line
    assert unauthorized_lines(srv) - before == 1, srv.log_text()[-2000:]  # L2: never retried
    assert "Invalid API Key" in out.detail


def test_bench_cli_against_the_real_server(real_llama_server, tmp_path):
    good = real_llama_server()
    strict = real_llama_server(api_key="sk-loc-real-5678")
    cfg = {
        "litellm": {"api_key": good.api_key},
        "bench": {"n_predict": 16, "timeout_s": 30},
        "gpus": [
            {"alias": "gpu-dense", "host": "ct8", "endpoint": good.url, "baseline_tok_s": 74.8},
            {"alias": "gpu-light", "host": "ct110", "endpoint": strict.url, "baseline_tok_s": 165.2},
        ],
    }
    (tmp_path / "gpuheal.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")}
    proc = subprocess.run(
        [sys.executable, "-m", "gpuheal", "--config", str(tmp_path / "gpuheal.yaml"),
         "--state-dir", str(tmp_path / "state"), "bench", "--json"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 1, proc.stderr  # a rejected key needs attention
    doc = json.loads(proc.stdout)
    by = {r["gpu"]: r for r in doc["results"]}
    assert by["gpu-dense"]["ok"] and by["gpu-dense"]["tokens"] == 16 and by["gpu-dense"]["n_ctx"] == 1024
    assert by["gpu-light"]["error"] == "unauthorized"
    assert by["gpu-light"]["key_sent"] == "gpu…(16 chars)"  # the configured key, described only
    assert good.api_key not in proc.stdout and good.api_key not in proc.stderr
    assert [i["issue"] for i in doc["issues"] if i["gpu"] == "gpu-light"] == ["api-key-mismatch"]
    assert unauthorized_lines(strict) == 1
    state = json.loads((tmp_path / "state" / "benchmark-regression.json").read_text())
    assert state["gpu-dense"]["current_tok_sec"] == by["gpu-dense"]["gen_tok_s"]


def test_server_killed_mid_benchmark_is_a_clean_failure(real_llama_server, slow_model):
    srv = real_llama_server(slow_model, n_parallel=1, extra_args=["--load-mode", "none"])
    box: dict = {}

    def run() -> None:
        box["out"] = benchmark_inference(srv.url, srv.api_key, n_predict=400, deadline_s=60, warmup=False)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    busy = False
    while time.monotonic() < deadline and not busy:  # wait until the measured request is generating
        try:
            slots = http.get(srv.url + "/slots", headers=srv.auth, timeout=5).json()
            busy = any(s.get("is_processing") for s in slots)
        except (requests.RequestException, ValueError):
            pass
        if not busy:
            time.sleep(0.01)
    assert busy, "the benchmark request never reached a slot"
    killed_at = time.monotonic()
    srv.proc.send_signal(signal.SIGKILL)
    worker.join(30)
    assert not worker.is_alive(), "benchmark_inference did not return after the server died"
    out = box["out"]
    assert not out.ok and out.error in ("refused", "invalid"), out
    assert time.monotonic() - killed_at < 10  # noticed at once, not at the 60 s deadline
    again = benchmark_inference(srv.url, srv.api_key, n_predict=8, deadline_s=5)
    assert again.error == "refused" and again.requests == 1


def test_health_503_during_model_load_is_understood(real_llama_server, slow_model):
    srv = real_llama_server(slow_model, wait=False, n_parallel=1, extra_args=["--load-mode", "none"])
    health_loading = bench_loading = wrong_key_loading = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert srv.alive(), srv.log_text()[-2000:]
        state, _, _ = probe_health(srv.url, 5)
        if state == "ok":
            break
        if state == "refused":
            time.sleep(0.002)
            continue
        assert state == "loading", state
        health_loading = True
        out = benchmark_inference(srv.url, "wrong-key", n_predict=8, deadline_s=5, warmup=False)
        if out.error == "loading":  # the load check runs before the key check: not a key mismatch
            wrong_key_loading = True
            assert out.requests == 1 and out.key_sent is None
        out = benchmark_inference(srv.url, srv.api_key, n_predict=8, deadline_s=5, warmup=False)
        if out.error == "loading":
            bench_loading = True
            assert not out.ok and out.status == 503 and "Loading model" in out.detail
            assert out.requests == 1
    else:
        pytest.fail("slow model never became ready")
    assert health_loading, "no 503 observed: the model loaded before the port answered"
    assert bench_loading or wrong_key_loading, "the load finished between /health and the benchmark"
    srv.wait_ready()
    out = benchmark_inference(srv.url, srv.api_key, n_predict=8, deadline_s=60, warmup=True)
    assert out.ok and out.tokens == 8
    wrong = benchmark_inference(srv.url, "wrong-key", n_predict=8, deadline_s=10)
    assert wrong.error == "unauthorized"
