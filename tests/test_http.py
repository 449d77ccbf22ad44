"""The hard-deadline HTTP client against real loopback servers (issue 2: "a server that dribbles
one byte a second must not hold a probe past its deadline"; Lesson L5: a capped, streamed read)."""

from __future__ import annotations

import socket
import time

import pytest
from servers import (
    HEALTH_LOADING,
    HEALTH_OK,
    CloseNow,
    Dribble,
    Garbage,
    Hang,
    LoopbackServer,
    Oversized,
    Reply,
    Slow,
    closed_url,
)

from gpuheal.sources.http import Ask, HttpFault, HttpResult, request, run_exchanges


def _as_exchange(method, url, *, deadline_s, max_bytes=1 << 20, headers=None, body=None, connect_timeout_s=None):
    """The same request as one exchange among a poll's (issue 12), with a neighbour that only
    waits: the loop must give each its own answer and deadline."""

    def one():
        return (yield Ask("", tuple((headers or {}).items()), max_bytes, method, body))

    def idle():
        return "idle"
        yield  # pragma: no cover - makes this a generator

    got = run_exchanges([("it", url, one), ("other", "http://127.0.0.1:9", idle)], deadline_s=deadline_s,
                        max_open=4, connect_timeout_s=connect_timeout_s)
    assert got["other"] == "idle"
    return got["it"]


@pytest.fixture(params=[request, _as_exchange], ids=["request", "exchange"])
def client(request):
    """Every promise here holds for one client reached both ways (issue 19: one HTTP client):
    ``request`` (one call, one answer) and an exchange of the loop that probes every llama-server."""
    return request.param


def timed(client, *args, **kwargs):
    started = time.monotonic()
    result = client(*args, **kwargs)
    return result, time.monotonic() - started


def test_200_returns_body_status_and_headers(client):
    with LoopbackServer({"/health": HEALTH_OK}) as srv:
        result = client("GET", srv.url + "/health", deadline_s=2)
    assert isinstance(result, HttpResult)
    assert result.status == 200
    assert result.body == b'{"status": "ok"}'
    assert result.headers["content-type"] == "application/json"
    assert 0 <= result.elapsed_s < 2


def test_request_sends_method_path_query_headers_and_body(client):
    with LoopbackServer({("POST", "/completion"): Reply(200, {"ok": True})}) as srv:
        result = client(
            "POST",
            srv.url + "/completion?x=1",
            deadline_s=2,
            headers={"Authorization": "Bearer k"},
            body=b'{"n_predict": 1}',
        )
        seen = srv.requests[0]
    assert isinstance(result, HttpResult) and result.status == 200
    assert (seen.method, seen.path, seen.query) == ("POST", "/completion", "x=1")
    assert seen.headers["authorization"] == "Bearer k"
    assert seen.headers["user-agent"] == "gpuheal"
    assert seen.headers["host"] == srv.url.removeprefix("http://")  # 127.0.0.1:PORT: not the default port
    assert seen.json() == {"n_predict": 1}


def test_non_2xx_passes_through_as_a_result_not_a_fault(client):
    with LoopbackServer({"/health": HEALTH_LOADING, "/boom": Reply(500, "oops")}) as srv:
        loading = client("GET", srv.url + "/health", deadline_s=2)
        boom = client("GET", srv.url + "/boom", deadline_s=2)
    assert isinstance(loading, HttpResult) and loading.status == 503
    assert b"Loading model" in loading.body
    assert isinstance(boom, HttpResult) and boom.status == 500 and boom.body == b"oops"


def test_refused(client):
    result, took = timed(client, "GET", closed_url() + "/health", deadline_s=2)
    assert isinstance(result, HttpFault)
    assert result.kind == "refused"
    assert took < 1


@pytest.mark.parametrize("read_request", [True, False], ids=["reads-request", "never-reads"])
def test_accept_but_never_answer_times_out_within_the_deadline(client, read_request):
    with LoopbackServer(default=Hang(read_request=read_request)) as srv:
        result, took = timed(client, "GET", srv.url + "/health", deadline_s=0.6)
    assert isinstance(result, HttpFault) and result.kind == "timeout"
    assert 0.5 <= took < 0.6 + 0.5
    assert "0.6" in result.detail


def test_dribbling_body_is_cut_at_the_total_deadline(client):
    """One byte every 0.2 s, each read well inside any per-read timeout: only a total deadline
    stops it. The key requirement of the client."""
    body = b'{"status": "ok"' + b" " * 200 + b"}"
    with LoopbackServer(default=Dribble(body, chunk=1, interval_s=0.2)) as srv:
        result, took = timed(client, "GET", srv.url + "/gpu-data", deadline_s=1.0, connect_timeout_s=0.5)
    assert isinstance(result, HttpFault) and result.kind == "timeout"
    assert 0.9 <= took < 1.3, took


def test_dribbling_endless_body_without_length_is_cut_at_the_deadline(client):
    with LoopbackServer(default=Dribble(None, chunk=1, interval_s=0.2, content_length=False)) as srv:
        result, took = timed(client, "GET", srv.url, deadline_s=1.0)
    assert isinstance(result, HttpFault) and result.kind == "timeout"
    assert 0.9 <= took < 1.3, took


def test_dribbling_status_line_and_headers_is_cut_at_the_deadline(client):
    with LoopbackServer(default=Dribble(b"{}", chunk=1, interval_s=0.2, headers_too=True)) as srv:
        result, took = timed(client, "GET", srv.url, deadline_s=1.0)
    assert isinstance(result, HttpFault) and result.kind == "timeout"
    assert 0.9 <= took < 1.3, took


def test_slow_but_in_time_answer_succeeds(client):
    with LoopbackServer(default=Slow(0.3)) as srv:
        result = client("GET", srv.url, deadline_s=2)
    assert isinstance(result, HttpResult) and result.status == 200
    assert result.elapsed_s >= 0.3


def test_slow_answer_after_the_deadline_is_a_timeout(client):
    with LoopbackServer(default=Slow(2.0)) as srv:
        result, took = timed(client, "GET", srv.url, deadline_s=0.5)
    assert isinstance(result, HttpFault) and result.kind == "timeout"
    assert took < 1.0


def test_oversized_by_content_length_is_refused_before_reading(client):
    with LoopbackServer(default=Oversized(size=5_000_000, content_length=True)) as srv:
        result, took = timed(client, "GET", srv.url, deadline_s=5, max_bytes=1_048_576)
    assert isinstance(result, HttpFault) and result.kind == "oversized"
    assert "Content-Length 5000000" in result.detail
    assert result.status == 200
    assert took < 1


def test_oversized_streamed_body_without_length_is_cut_at_the_cap(client):
    with LoopbackServer(default=Oversized(size=5_000_000, content_length=False)) as srv:
        result, took = timed(client, "GET", srv.url, deadline_s=5, max_bytes=1_048_576)
    assert isinstance(result, HttpFault) and result.kind == "oversized"
    assert "1048576" in result.detail
    assert took < 2


def test_lying_content_length_still_capped_by_the_streamed_count(client):
    """Content-Length says small, the body is large: the count of bytes read decides."""
    with LoopbackServer(default=Oversized(size=3_000_000, declared=100)) as srv:
        result = client("GET", srv.url, deadline_s=5, max_bytes=50)
    # http.client honours the declared length: it reads 100 bytes (> cap 50) -> oversized.
    assert isinstance(result, HttpFault) and result.kind == "oversized"


def test_body_exactly_at_the_cap_is_accepted(client):
    with LoopbackServer(default=Reply(200, b"x" * 2048)) as srv:
        result = client("GET", srv.url, deadline_s=2, max_bytes=2048)
    assert isinstance(result, HttpResult) and len(result.body) == 2048


@pytest.mark.parametrize(
    "data",
    [
        b"\x00\xff\xfeSSH-2.0-OpenSSH_9.2\r\n",
        b"HELLO THERE\r\n\r\n",
        b"HTTP/1.1 abc Nope\r\n\r\n",
        b"\x1b[31m" * 50,
    ],
    ids=["binary", "words", "bad-status", "ansi"],
)
def test_garbage_non_http_bytes_are_a_fault(client, data):
    with LoopbackServer(default=Garbage(data)) as srv:
        result, took = timed(client, "GET", srv.url, deadline_s=2)
    assert isinstance(result, HttpFault)
    assert result.kind in ("invalid", "refused")
    assert result.detail.isprintable()  # the peer's bytes never reach a terminal raw
    assert took < 1.5


def test_connection_closed_without_a_word_is_a_fault(client):
    with LoopbackServer(default=CloseNow()) as srv:
        result = client("GET", srv.url, deadline_s=2)
    assert isinstance(result, HttpFault) and result.kind in ("refused", "invalid")


def test_truncated_body_is_a_fault_not_a_partial_result(client):
    """Content-Length 1000, 10 bytes, close: never hand a half document to the parser."""
    with LoopbackServer(default=Reply(200, b"0123456789", headers={"Content-Length": "1000"}, content_length=False)) as srv:
        result = client("GET", srv.url, deadline_s=2)
    assert isinstance(result, HttpFault)


@pytest.mark.parametrize(
    "url",
    ["ftp://127.0.0.1/x", "not a url", "http://", "http://127.0.0.1:99999/x", "", "http://[::1/x"],
)
def test_bad_url_is_a_fault_not_an_exception(client, url):
    result = client("GET", url, deadline_s=1)
    assert isinstance(result, HttpFault)
    assert result.kind in ("invalid", "refused")


def test_unresolvable_host_is_refused(client, monkeypatch):
    def no_such_host(*args, **kwargs):  # no real resolver: tests contact only 127.0.0.1
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    result = client("GET", "http://no-such-host.invalid/health", deadline_s=3)
    assert isinstance(result, HttpFault) and result.kind == "refused"
    assert "cannot resolve host" in result.detail


def test_slow_name_resolution_is_bounded_by_the_deadline(client, monkeypatch):
    """A stuck resolver must not hold a probe past its deadline either (a cron run of a fleet
    named by hostnames, with a sick DNS server)."""
    def slow_getaddrinfo(*args, **kwargs):
        time.sleep(3)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", slow_getaddrinfo)
    result, took = timed(client, "GET", "http://localhost:9/health", deadline_s=0.5)
    assert isinstance(result, HttpFault) and result.kind == "timeout"
    assert took < 1.0, took


def test_many_sequential_requests_leak_no_threads(client):
    import threading

    with LoopbackServer({"/health": HEALTH_OK}) as srv:
        before = threading.active_count()
        for _ in range(30):
            assert isinstance(client("GET", srv.url + "/health", deadline_s=2), HttpResult)
        time.sleep(0.05)
        assert threading.active_count() <= before + 1


def test_concurrent_requests_each_end_at_their_own_deadline(client):
    """One shared watchdog serves every request: a later-scheduled shorter deadline must still
    fire first."""
    from concurrent.futures import ThreadPoolExecutor

    deadlines = [1.2, 0.3, 0.9, 0.5, 0.7, 0.4, 1.0, 0.6]
    with LoopbackServer(default=Hang(), record=False) as srv, ThreadPoolExecutor(len(deadlines)) as pool:
        futures = [pool.submit(timed, client, "GET", srv.url, deadline_s=d) for d in deadlines]
        outcomes = [f.result() for f in futures]
    for deadline, (result, took) in zip(deadlines, outcomes, strict=True):
        assert isinstance(result, HttpFault) and result.kind == "timeout"
        assert deadline - 0.05 <= took < deadline + 0.4, (deadline, took)


def test_a_finished_request_is_not_cut_later_by_its_watchdog(client):
    with LoopbackServer({"/a": HEALTH_OK, "/b": Slow(0.4)}) as srv:
        first = client("GET", srv.url + "/a", deadline_s=0.2)
        second = client("GET", srv.url + "/b", deadline_s=2)  # outlives the first's deadline
    assert isinstance(first, HttpResult) and isinstance(second, HttpResult)


@pytest.mark.parametrize("declared", ["²", "1²", "³0", "-5", "12abc", "2, 2"])
def test_a_content_length_that_is_not_a_byte_count_is_invalid(client, declared):
    """Digits that ``str.isdigit`` accepts but HTTP does not ('²', '³'), signs, lists: an
    explicit "invalid" fault naming the header (issue 9), never a ValueError caught by luck."""
    with LoopbackServer(default=Reply(200, b"{}", headers={"Content-Length": declared}, content_length=False)) as srv:
        result = client("GET", srv.url, deadline_s=2, max_bytes=1000)
    assert isinstance(result, HttpFault) and result.kind == "invalid", result
    assert result.detail.startswith("Content-Length ") and "not a byte count" in result.detail


def test_a_content_length_of_5000_digits_is_oversized_not_an_int_error(client):
    with LoopbackServer(default=Reply(200, b"{}", headers={"Content-Length": "1" * 5000}, content_length=False)) as srv:
        result = client("GET", srv.url, deadline_s=2, max_bytes=1000)
    assert isinstance(result, HttpFault) and result.kind == "oversized", result
    assert len(result.detail) < 100
