"""gpuheal's own sensing of a real llama-server (issue 12): ``/metrics``, ``/slots`` and ``/props``
read by :func:`gpuheal.sources.sense.sense` from a genuine b11312 server, with and without
``--metrics`` / ``--slots``, with the wrong key, while it generates, stopped with SIGSTOP, and
restarted between two polls. The rules run on these real polls with a clock stepped 60 s per poll
(the real seconds between polls are shorter; only the counters matter to Rule 3).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from gpuheal import benchdata
from gpuheal.config import load_config_dict
from gpuheal.core.engine import new_book
from gpuheal.sources import llama_telemetry as lt
from gpuheal.sources.sense import sense

pytestmark = pytest.mark.realserver

http = requests.Session()
http.trust_env = False
T0 = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)


def config(url: str, key: str | None, timeout_s: float = 5.0):
    return load_config_dict({
        "litellm": {"api_key": key or ""},
        "probe": {"timeout_s": timeout_s},
        "gpus": [{"alias": "real", "host": "127.0.0.1", "endpoint": url, "transport": "local"}],
    })


def poll(url: str, key: str | None, at: datetime = T0, timeout_s: float = 5.0):
    """One real poll of the server, without smi (no GPU here): only the server's telemetry."""
    cfg = config(url, key, timeout_s)
    obs = sense(cfg, at)
    return cfg, obs, obs.gpus["real"]


def smi_faults_removed(obs):
    return [f for f in obs.faults if "smi" not in f.detail]


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """~100 MB (n_embd 512, 6 layers): with -t 1 a 3,000-token answer lasts tens of seconds."""
    from make_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("long-model") / "long.gguf", n_embd=512, n_layer=6, n_ff=2048)


def test_metrics_slots_and_props_of_a_real_idle_server(llama_server):
    _, obs, g = poll(llama_server.url, llama_server.api_key)
    # idle: /slots is not asked (it would wake a sleeping server); 0 busy slots from /metrics
    assert (g.endpoint, g.metrics, g.slots) == ("ok", "ok", "idle")
    assert g.requests_processing == 0 and g.requests_deferred == 0 and g.slots_busy == 0
    assert g.n_decode_total is not None and g.n_decode_total >= 0
    slots = lt.fetch_slots(llama_server.url, llama_server.api_key, 5.0)
    assert (slots.state, slots.slots.total, slots.slots.busy) == ("ok", 2, 0)
    props = lt.fetch_sleeping(llama_server.url, llama_server.api_key, 5.0)
    assert (props.state, props.is_sleeping) == ("ok", False)
    assert smi_faults_removed(obs) == []
    assert lt.metrics_enabled(llama_server.url, llama_server.api_key, 5.0) == (True, "")


def test_without_metrics_and_slots_is_not_known_and_says_how_to_enable(real_llama_server):
    srv = real_llama_server(metrics=False, extra_args=["--no-slots"])
    _, obs, g = poll(srv.url, srv.api_key)
    assert (g.endpoint, g.metrics, g.slots) == ("ok", "disabled", "disabled")
    assert g.requests_processing is None and g.n_decode_total is None and g.slots_busy is None
    assert smi_faults_removed(obs) == []  # not enabled is not a fault
    enabled, how = lt.metrics_enabled(srv.url, srv.api_key, 5.0)
    assert enabled is False and "--metrics" in how


def test_the_wrong_key_is_a_fault_and_nothing_is_zero(llama_server):
    _, obs, g = poll(llama_server.url, "not-the-key")
    assert (g.endpoint, g.metrics, g.slots) == ("ok", "unauthorized", "unauthorized")
    assert g.requests_processing is None and g.n_decode_total is None and g.slots_total is None
    assert ("real", "http-401") in {(f.source, f.fault) for f in obs.faults}
    assert all("not-the-key" not in f.detail for f in obs.faults)


def _generate(url: str, key: str, n_predict: int, out: list) -> None:
    try:
        r = http.post(url + "/completion", json={"prompt": "hello world", "n_predict": n_predict,
                                                  "cache_prompt": False},
                      headers={"Authorization": f"Bearer {key}"}, timeout=600)
        out.append(r.status_code)
    except requests.RequestException as exc:  # the server was stopped under it
        out.append(type(exc).__name__)


def _wait_busy(url: str, key: str, want_deferred: int = 0, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = lt.fetch_metrics(url, key, 5.0).metrics
        if m and m.requests_processing == 1 and (m.requests_deferred or 0) >= want_deferred and m.n_decode_total:
            return m
        time.sleep(0.2)
    raise AssertionError("the server never showed the request in flight")


def test_a_long_generation_is_busy_and_decoding_never_stuck(real_llama_server, long_model):
    """One slot, a long answer in it, a second request deferred: requests_processing 1,
    n_decode_total rising poll over poll while tokens_predicted_total stays flat — and Rule 3
    never fires (the detector that watched tokens_predicted_total would have)."""
    from gpuheal.state.history import History
    from gpuheal.steps.evaluate import evaluate_poll

    srv = real_llama_server(long_model, n_parallel=1, threads=1, ctx_size=4096)
    results: list = []
    first = threading.Thread(target=_generate, args=(srv.url, srv.api_key, 3000, results), daemon=True)
    first.start()
    _wait_busy(srv.url, srv.api_key)
    second = threading.Thread(target=_generate, args=(srv.url, srv.api_key, 8, results), daemon=True)
    second.start()
    _wait_busy(srv.url, srv.api_key, want_deferred=1)

    cfg = config(srv.url, srv.api_key)
    book, history = new_book(), History()
    samples = []
    for i in range(4):
        obs = sense(cfg, T0 + timedelta(seconds=60 * i))
        history.add(obs, cfg.aliases)
        ev, _, _ = evaluate_poll(cfg, obs, history, book, benchdata.empty(), _no_restarts(), obs.at.timestamp())
        samples.append(obs.gpus["real"])
        assert [i for i in ev.issues if i.issue == "model-stuck"] == []
        time.sleep(1.0)
    assert all(s.requests_processing == 1 for s in samples)
    assert all(s.requests_deferred == 1 for s in samples)
    assert all(s.slots_busy == 1 and s.slots_total == 1 for s in samples)
    decodes = [s.n_decode_total for s in samples]
    assert decodes == sorted(decodes) and decodes[-1] > decodes[0]  # rising
    assert len({s.tokens_predicted_total for s in samples}) == 1  # flat: counted when a request ends
    srv.stop()
    first.join(timeout=30)
    second.join(timeout=30)


def _stop_and_wait(pid: int, timeout_s: float = 10.0) -> None:
    """SIGSTOP is delivered asynchronously: under load, kill() returns while a thread is still running
    and can answer one more /health (seen once at a load average of 9). Wait until every thread of the
    process shows state T in /proc, so the test starts from a server that is really stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                continue  # a thread that exited meanwhile
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} did not stop within {timeout_s} s")


def test_a_stopped_server_is_a_probe_timeout_not_stuck(real_llama_server, long_model):
    """SIGSTOP with a request in flight: /health, /metrics, everything times out. That is Rule 6's
    (host-unreachable) business; Rule 3 sees no counters and must not fire."""
    from gpuheal.state.history import History
    from gpuheal.steps.evaluate import evaluate_poll

    srv = real_llama_server(long_model, n_parallel=1, threads=1, ctx_size=4096)
    results: list = []
    threading.Thread(target=_generate, args=(srv.url, srv.api_key, 3000, results), daemon=True).start()
    _wait_busy(srv.url, srv.api_key)
    cfg = config(srv.url, srv.api_key, timeout_s=1.0)
    book, history = new_book(), History()
    _stop_and_wait(srv.proc.pid)
    try:
        for i in range(4):
            obs = sense(cfg, T0 + timedelta(seconds=60 * i))
            history.add(obs, cfg.aliases)
            ev, _, _ = evaluate_poll(cfg, obs, history, book, benchdata.empty(), _no_restarts(), obs.at.timestamp())
            g = obs.gpus["real"]
            assert g.endpoint == "timeout" and g.requests_processing is None and g.n_decode_total is None
        issues = {i.issue for i in ev.issues}
        assert "model-stuck" not in issues and "host-unreachable" in issues
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)


def test_a_restart_between_two_polls_resets_counters_without_firing(real_llama_server, long_model):
    """Poll a server mid-answer, restart it on the same port, poll the new one mid-answer: its
    counters went down (a reset, never progress, never a stall) and nothing fires."""
    from gpuheal.rules.model_stuck.memory import decode_state
    from gpuheal.state.history import History
    from gpuheal.steps.evaluate import evaluate_poll

    first = real_llama_server(long_model, n_parallel=1, threads=1, ctx_size=4096)
    cfg = config(first.url, first.api_key)
    book, history = new_book(), History()
    results: list = []

    def real_poll(i: int):
        obs = sense(cfg, T0 + timedelta(seconds=60 * i))
        history.add(obs, cfg.aliases)
        ev, _, _ = evaluate_poll(cfg, obs, history, book, benchdata.empty(), _no_restarts(), obs.at.timestamp())
        assert [x for x in ev.issues if x.issue == "model-stuck"] == []
        return obs.gpus["real"]

    threading.Thread(target=_generate, args=(first.url, first.api_key, 3000, results), daemon=True).start()
    _wait_busy(first.url, first.api_key)
    time.sleep(2.0)  # let it decode a good many tokens
    before = real_poll(0)
    port, binary, LlamaServer = first.port, first.binary, type(first)
    first.stop()
    second = LlamaServer(binary, long_model, port=port, api_key=first.api_key,
                         args=["-c", "4096", "-np", "1", "-t", "1", "--metrics"],
                         log_path=first.log_path.with_suffix(".2.log"))
    real_llama_server.servers.append(second)
    second.wait_ready()
    threading.Thread(target=_generate, args=(second.url, second.api_key, 3000, results), daemon=True).start()
    _wait_busy(second.url, second.api_key)
    after = real_poll(1)
    assert before.requests_processing == after.requests_processing == 1
    assert after.n_decode_total < before.n_decode_total
    state = decode_state(book.memory, "real", (T0 + timedelta(seconds=60)).timestamp())
    assert state.reset_s == state.at_s and state.polls == 1
    time.sleep(1.0)
    third = real_poll(2)
    assert third.n_decode_total > after.n_decode_total
    second.stop()


def _no_restarts():
    from gpuheal.core.view import NO_RESTARTS

    return NO_RESTARTS


def test_check_without_gpu_monitor_on_real_servers_reports_health_slots_and_requests(
    real_llama_server, long_model, tmp_path
):
    """The issue's first done-when: ``gpuheal check`` (the CLI, as cron runs it) with no
    ``monitor:`` on two real llama-servers of one host — one busy with a long answer, one idle and
    started without --metrics — reports each one's health, requests and slots; GPU readings come
    from a stand-in nvidia-smi printing real captured rows (no GPU on this machine)."""
    import json
    import subprocess
    import sys

    from smi_captures import NVIDIA_CAPTURES, multi_gpu_csv

    busy = real_llama_server(long_model, n_parallel=1, threads=1, ctx_size=4096)
    plain = real_llama_server(metrics=False)
    results: list = []
    threading.Thread(target=_generate, args=(busy.url, busy.api_key, 3000, results), daemon=True).start()
    _wait_busy(busy.url, busy.api_key)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rows = tmp_path / "rows.csv"
    rows.write_text(multi_gpu_csv(NVIDIA_CAPTURES[:2]))
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat {rows}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    config = tmp_path / "gpuheal.yaml"
    config.write_text(json.dumps({
        "litellm": {"api_key": busy.api_key},
        "gpus": [
            {"alias": "box-0", "host": "box", "gpu_index": 0, "endpoint": busy.url, "transport": "local"},
            {"alias": "box-1", "host": "box", "gpu_index": 1, "endpoint": plain.url, "transport": "local"},
        ],
    }))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "gpuheal", "--config", str(config), "--state-dir",
                           str(tmp_path / "state"), "check", "--json"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    b0, b1 = doc["gpus"]["box-0"], doc["gpus"]["box-1"]
    assert (b0["endpoint"], b0["metrics"], b0["requests_processing"], b0["slots_busy"], b0["slots_total"]) == (
        "ok", "ok", 1, 1, 1)
    assert b0["temp_c"] == 45 and b1["temp_c"] == 38  # each GPU its own smi row
    assert (b1["endpoint"], b1["metrics"], b1["requests_processing"]) == ("ok", "disabled", None)
    assert {o["rule"] for o in doc["rules_off"]} >= {"circuit-breaker-stuck", "model-stuck"}
    assert [i for i in doc["issues"] if i["issue"] == "model-stuck"] == []
    busy.stop()


def test_one_kept_alive_connection_serves_a_whole_poll_of_the_real_server(llama_server, monkeypatch):
    """The poll's /health, /metrics and /slots go over one connection: the real server (cpp-httplib)
    keeps HTTP/1.1 connections alive (issue 12 benchmark: a new connection per request cost CPU on
    both sides). Counted at the client: the sockets gpuheal's loop opens."""
    import socket

    from gpuheal.sources.http_loop import Ask, run_exchanges

    opened = []
    real_socket = socket.socket

    def counting(*args, **kwargs):
        sock = real_socket(*args, **kwargs)
        opened.append(sock)
        return sock

    auth = (("Authorization", f"Bearer {llama_server.api_key}"),) if llama_server.api_key else ()

    def three():
        answers = []
        for path in ("/health", "/metrics", "/slots"):
            answers.append((yield Ask(path, auth)))
        return answers

    monkeypatch.setattr(socket, "socket", counting)
    answers = run_exchanges([("real", llama_server.url, three)], deadline_s=5.0, max_open=1)["real"]
    monkeypatch.undo()
    assert [a.status for a in answers] == [200, 200, 200], answers
    assert answers[0].headers.get("connection", "keep-alive").lower() != "close", answers[0].headers
    assert len(opened) == 1
