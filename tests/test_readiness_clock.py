"""A restart's readiness wait (Rule 3's verify, ``actions/execute.wait_ready_then_complete``) counts on the run's
clock (``gpuheal.clock.Clock``): real seconds under cron, the chaos week's simulated seconds there — where the
wait moved no simulated time before, the model never loaded, and each restart waited 15 real seconds (issue 29).
The server is a real HTTP server on loopback whose ``/health`` answers 503 (loading) until the clock says the
model is up."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from gpuheal.actions import execute
from gpuheal.clock import Clock


class Loading:
    """A llama-server loading its model until ``ready_at_s`` on a clock that moves only when slept on (jittered)."""

    def __init__(self, ready_at_s: float, jitter_s: float) -> None:
        self.t, self.ready_at_s, self.jitter_s, self.slept = 0.0, ready_at_s, jitter_s, []

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s + self.jitter_s

    def clock(self) -> Clock:
        return Clock(now=lambda: self.t, sleep=self.sleep)


@pytest.fixture
def server():
    state = SimpleNamespace(loading=None)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            up = state.loading is None or state.loading.t >= state.loading.ready_at_s
            body = b'{"status":"ok"}' if up else b'{"error":{"code":503,"message":"Loading model"}}'
            self.send_response(200 if up else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def completion(monkeypatch):
    from gpuheal.sources import llama_server

    done = SimpleNamespace(ok=True, elapsed_s=0.3, gen_tok_s=42.0, error=None)
    monkeypatch.setattr(llama_server, "benchmark_inference", lambda *a, **k: done)


@pytest.mark.parametrize("jitter_s", [0.0, 0.13])
def test_the_wait_is_the_given_clock_s_seconds_not_real_ones(server, completion, jitter_s):
    state, url = server
    state.loading = Loading(ready_at_s=6.0, jitter_s=jitter_s)
    started = time.monotonic()
    verdict = execute.wait_ready_then_complete(url, "", 15.0, 5.0, clock=state.loading.clock())
    assert time.monotonic() - started < 5.0  # 12 waits of 0.5 s counted, none slept
    assert verdict["ok"] and verdict["health"] == "ok"
    assert 6.0 <= verdict["ready_after_s"] <= 6.0 + 0.5 + jitter_s
    assert all(s <= 0.5 for s in state.loading.slept)


def test_a_model_slower_than_the_reload_wait_fails_at_the_clock_s_deadline(server, completion):
    state, url = server
    state.loading = Loading(ready_at_s=100.0, jitter_s=0.07)
    verdict = execute.wait_ready_then_complete(url, "", 15.0, 5.0, clock=state.loading.clock())
    assert not verdict["ok"] and verdict["health"] == "loading" and verdict["error"] == "not ready within 15 s"
    assert 15.0 <= state.loading.t <= 15.0 + 0.5 + 0.07


def test_without_a_clock_the_wait_is_real_seconds(server, completion):
    state, url = server
    state.loading = SimpleNamespace(t=0.0, ready_at_s=1.0)  # moved on by real time below
    started = time.monotonic()

    def tick():
        while state.loading.t < 1.0:
            time.sleep(0.05)
            state.loading.t = time.monotonic() - started

    threading.Thread(target=tick, daemon=True).start()
    verdict = execute.wait_ready_then_complete(url, "", 15.0, 5.0)
    assert verdict["ok"] and 0.9 <= time.monotonic() - started < 10


def test_heal_command_hands_its_clock_to_the_readiness_wait(monkeypatch):
    """``heal.command(..., clock=)`` (the chaos week's): its clock for the confirmation and the readiness wait;
    ``Heal`` built with only ``clock`` (the confirmation's tests) leaves the wait on real seconds."""
    from gpuheal.steps import heal

    made = {}

    class Probe(heal.Heal):
        def __init__(self, *a, **k):
            made.update(k)
            raise RuntimeError("stop here")

    monkeypatch.setattr(heal, "Heal", Probe)
    clock = Clock(now=lambda: 0.0, sleep=lambda s: None)
    rt = SimpleNamespace(cfg=None, now=None)
    with pytest.raises(RuntimeError):
        heal.command(rt, None, apply=True, clock=clock)
    assert made["clock"] is clock and made["wait_clock"] is clock
