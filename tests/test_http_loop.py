"""The one-thread loop that polls every llama-server (issue 12 benchmark): one kept-alive connection
per endpoint, one deadline per endpoint's whole exchange, ``max_open`` connections at a time.
The single-request promises (deadlines, byte caps, garbage) are in test_http.py, run against both
clients; these are what only the loop does. Real sockets on 127.0.0.1 throughout."""

from __future__ import annotations

import socket
import time

import pytest
from servers import HEALTH_OK, Garbage, Hang, LoopbackServer, Reply, closed_url

from gpuheal.sources.http import Ask, HttpFault, HttpResult, run_exchanges
from gpuheal.sources.http import request as fetch_one


def asking(*paths):
    """An exchange that asks ``paths`` one after another and returns every answer."""

    def exchange():
        answers = []
        for path in paths:
            answers.append((yield Ask(path)))
        return answers

    return exchange


def count_sockets(monkeypatch) -> list:
    """From now on, the client sockets the loop opens (one the server accepts is made with ``fileno=``)."""
    opened = []
    real = socket.socket

    def counting(*args, **kwargs):
        sock = real(*args, **kwargs)
        if kwargs.get("fileno") is None and len(args) < 4:
            opened.append(sock)
        return sock

    monkeypatch.setattr(socket, "socket", counting)
    return opened


ROUTES = {"/health": HEALTH_OK, "/metrics": Reply(200, "llamacpp:n_decode_total 5\n"), "/slots": Reply(200, "[]")}


def test_a_kept_alive_connection_serves_every_request_of_an_exchange(monkeypatch):
    with LoopbackServer(ROUTES, keep_alive=True) as srv:
        sockets_opened = count_sockets(monkeypatch)
        answers = run_exchanges([("g", srv.url, asking("/health", "/metrics", "/slots"))],
                                deadline_s=2, max_open=4)["g"]
        seen = [r.path for r in srv.requests]
    assert [a.status for a in answers] == [200, 200, 200]
    assert answers[1].body == b"llamacpp:n_decode_total 5\n"
    assert seen == ["/health", "/metrics", "/slots"]
    assert len(sockets_opened) == 1


def test_a_server_that_closes_after_each_answer_gets_a_new_connection_each_time(monkeypatch):
    with LoopbackServer(ROUTES) as srv:  # Connection: close on every answer
        sockets_opened = count_sockets(monkeypatch)
        answers = run_exchanges([("g", srv.url, asking("/health", "/metrics", "/slots"))],
                                deadline_s=2, max_open=4)["g"]
    assert [a.status for a in answers] == [200, 200, 200]
    assert len(sockets_opened) == 3


class _KeepAliveThenClose:
    """Says nothing of closing (HTTP/1.1, a Content-Length: the connection may be reused), then
    closes: the race every keep-alive client meets when a server's idle timeout strikes."""

    async def run(self, reader, writer, req):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5, max=100\r\n\r\nok")
        await writer.drain()


def test_a_kept_connection_the_server_closed_is_retried_once_on_a_new_one():
    with LoopbackServer(default=_KeepAliveThenClose()) as srv:
        answers = run_exchanges([("g", srv.url, asking("/health", "/metrics", "/slots"))],
                                deadline_s=2, max_open=1)["g"]
        assert srv.hits("/metrics") == 1 and srv.hits("/slots") == 1
    assert [(a.status, a.body) for a in answers] == [(200, b"ok")] * 3


def test_one_deadline_covers_the_whole_exchange():
    with LoopbackServer({"/health": HEALTH_OK, "/metrics": Hang()}, keep_alive=True) as srv:
        started = time.monotonic()
        answers = run_exchanges([("g", srv.url, asking("/health", "/metrics", "/slots"))],
                                deadline_s=0.5, max_open=1)["g"]
        took = time.monotonic() - started
    assert isinstance(answers[0], HttpResult)
    assert [a.kind for a in answers[1:]] == ["timeout", "timeout"]  # /slots: no time left, not asked
    assert 0.45 <= took < 0.9, took


def sweep_dead(ports: int, deadline_s: float, max_open: int) -> tuple[dict, float]:
    """``ports`` endpoints that accept and never answer, polled at once → (answers, seconds)."""
    with LoopbackServer(default=Hang(), ports=ports, record=False) as dead:
        started = time.monotonic()
        got = run_exchanges([(i, url, asking("/health")) for i, url in enumerate(dead.urls)],
                            deadline_s=deadline_s, max_open=max_open)
        took = time.monotonic() - started
    assert sorted(got) == list(range(ports))
    assert all(answers[0].kind == "timeout" for answers in got.values())
    return got, took


def test_dead_endpoints_within_max_open_cost_one_deadline():
    _, took = sweep_dead(60, deadline_s=0.5, max_open=256)
    assert took < 0.5 + 0.5, took


def test_max_open_bounds_the_connections_at_once():
    """9 dead endpoints, 3 at a time: three waves of one deadline each."""
    _, took = sweep_dead(9, deadline_s=0.3, max_open=3)
    assert 0.85 <= took < 1.5, took


def test_healthy_dead_and_refused_endpoints_in_one_poll():
    with LoopbackServer(ROUTES, keep_alive=True) as ok, LoopbackServer(default=Hang()) as dead:
        got = run_exchanges([("ok", ok.url, asking("/health")), ("dead", dead.url, asking("/health")),
                             ("refused", closed_url(), asking("/health")), ("bad", "ftp://x", asking("/health"))],
                            deadline_s=0.5, max_open=8)
    assert got["ok"][0].status == 200
    assert (got["dead"][0].kind, got["refused"][0].kind, got["bad"][0].kind) == ("timeout", "refused", "invalid")


def test_host_names_are_resolved_once_per_host(monkeypatch):
    calls = []

    def fake_getaddrinfo(host, port, *args, **kwargs):  # no real resolver: only 127.0.0.1 is contacted
        calls.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]

    with LoopbackServer(ROUTES, keep_alive=True) as srv:
        monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
        url = f"http://gpu-host.test:{srv.port}"
        got = run_exchanges([(i, url, asking("/health")) for i in range(4)], deadline_s=2, max_open=4)
    assert [got[i][0].status for i in range(4)] == [200] * 4
    assert calls == ["gpu-host.test"]


def test_https_endpoints_run_in_the_same_loop():
    got = run_exchanges([("tls", closed_url().replace("http:", "https:"), asking("/health"))],
                        deadline_s=1, max_open=2)
    assert isinstance(got["tls"][0], HttpFault) and got["tls"][0].kind == "refused"


@pytest.mark.parametrize(
    ("data", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWiki\r\n5;x=1\r\npedia\r\n0\r\n\r\n", b"Wikipedia"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Trailer: 1\r\n\r\n", b"ok"),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok"),
        (b"HTTP/1.0 200 OK\r\n\r\nuntil close", b"until close"),
    ],
    ids=["chunked", "chunked-trailer", "100-continue", "until-close"],
)
def test_framings(data, body):
    with LoopbackServer(default=Garbage(data)) as srv:
        result = fetch_one("GET", srv.url + "/health", deadline_s=2)
    assert isinstance(result, HttpResult) and (result.status, result.body) == (200, body)


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X-Junk: " + b"a" * 70000 + b"\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
    ],
    ids=["bad-size", "cut-chunk", "no-crlf", "huge-headers", "4-digit-status"],
)
def test_broken_framing_is_invalid_never_a_partial_body(data):
    with LoopbackServer(default=Garbage(data)) as srv:
        result = fetch_one("GET", srv.url, deadline_s=2)
    assert isinstance(result, HttpFault) and result.kind == "invalid", result
    assert result.detail.isprintable()


def test_a_chunked_body_over_the_cap_is_oversized():
    chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 8 + b"0\r\n\r\n"
    with LoopbackServer(default=Garbage(data)) as srv:
        result = fetch_one("GET", srv.url, deadline_s=2, max_bytes=50_000)
    assert isinstance(result, HttpFault) and result.kind == "oversized"


def test_an_exchange_that_asks_nothing_returns_at_once():
    def nothing():
        return "done"
        yield  # pragma: no cover - makes this a generator

    assert run_exchanges([("x", "http://127.0.0.1:9", nothing)], deadline_s=1, max_open=1) == {"x": "done"}
