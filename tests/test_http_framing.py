"""The one HTTP client's HTTP/1.1 framing (issue 19, item 5): chunked bodies, read-until-close, a
slowloris peer, a lying Content-Length, a huge chunk size, garbage status lines, and https in the
same loop.

The framing is hand-written (``sources/http.py`` says why: h11 costs more than the issue's 10 %
on the 1000-GPU check), so h11 is its oracle here: hypothesis builds valid responses, cuts them at
random points, and the framing must give exactly h11's status and body. Mutated and random bytes
must give a result, "need more", or one typed fault; never another exception and never a body past
its cap.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import Garbage, LoopbackServer

from gpuheal.sources.http import HttpFault, HttpResult, _Invalid, _Oversized, _Response, request

TOKEN = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).filter(
    lambda t: t.lower() not in ("content-length", "transfer-encoding", "connection"))
VALUE = st.text("abcdefghijklmnopqrstuvwxyz0123456789 ;=/,.", max_size=20).map(str.strip)


@st.composite
def responses(draw) -> tuple[bytes, int, bytes, str]:
    """A valid HTTP/1.1 response as a peer may frame it: ``(wire, status, body, framing)``."""
    status = draw(st.sampled_from([200, 201, 301, 404, 500, 503]))
    body = draw(st.binary(max_size=3000))
    headers = draw(st.lists(st.tuples(TOKEN, VALUE), max_size=6))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    if framing == "length":
        headers.append(("Content-Length", str(len(body))))
        payload = body
    elif framing == "chunked":
        headers.append(("Transfer-Encoding", "chunked"))
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=5)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) if b > a]
        ext = draw(st.sampled_from(["", ";name=value", ";x"]))
        payload = b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext.encode(), p) for p in pieces)
        trailer = draw(st.sampled_from([b"", b"X-Trailer: 1\r\n"]))
        payload += b"0\r\n" + trailer + b"\r\n"
    else:
        headers.append(("Connection", "close"))
        payload = body
    head = f"HTTP/1.1 {status} Reason\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers) + "\r\n"
    return head.encode("latin-1") + payload, status, body, framing


def feed_in_pieces(resp: _Response, wire: bytes, cuts: list[int]) -> bool:
    complete = False
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        if b > a and not complete:
            complete = resp.feed(wire[a:b])
    return complete


def h11_answer(wire: bytes) -> tuple[int, bytes]:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "127.0.0.1")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(wire)
    conn.receive_data(b"")  # the peer closes after its answer (read-until-close ends here)
    status, body = 0, b""
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return status, body


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses(), st.lists(st.integers(0, 4000), max_size=6))
def test_the_framing_agrees_with_h11_on_every_valid_response_however_it_is_cut(case, cuts):
    wire, status, body, framing = case
    assert h11_answer(wire) == (status, body)
    resp = _Response(1 << 20)
    complete = feed_in_pieces(resp, wire, sorted(c for c in cuts if c < len(wire)))
    if framing == "close":
        assert not complete and resp.eof(), "a body read until close ends only when the peer closes"
    else:
        assert complete
    assert (resp.status, bytes(resp.body)) == (status, body)


@settings(max_examples=300, deadline=None)
@given(responses(), st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(0, 3000))
def test_mutated_responses_end_in_a_result_or_a_typed_fault_never_past_the_cap(case, flips, cap):
    wire = bytearray(case[0])
    for at, value in flips:
        if at < len(wire):
            wire[at] = value
    resp = _Response(cap)
    try:
        complete = resp.feed(bytes(wire))
    except (_Invalid, _Oversized) as exc:
        assert str(exc).isprintable()
        return
    if complete or resp.eof():
        assert len(resp.body) <= cap
    else:
        assert resp.cut_short().isprintable()


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_status_lines_are_invalid(line):
    resp = _Response(1 << 20)
    wire = line.replace(b"\r\n", b"") + b"\r\nContent-Length: 0\r\n\r\n"
    try:
        complete = resp.feed(wire)
    except _Invalid as exc:
        assert str(exc).isprintable()
        return
    # what is accepted is a real status line: HTTP/1.x, three digits (1xx waits for the real answer)
    version, code = wire.split(b" ")[:2]
    assert version in (b"HTTP/1.0", b"HTTP/1.1") and len(code) == 3 and code.isdigit()
    assert complete == (not 100 <= int(code) < 200)


def test_a_huge_chunk_size_is_refused_before_its_bytes_are_read():
    resp = _Response(1 << 20)
    with pytest.raises(_Oversized):
        resp.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\nxx")
    assert len(resp.body) == 0


def test_a_chunk_size_line_that_never_ends_is_invalid():
    with pytest.raises(_Invalid):
        _Response(1 << 20).feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 2000)


# --------------------------------------------------------------------------- over real sockets


def test_read_until_close_over_a_socket():
    body = b"x" * 100_000
    with LoopbackServer(default=Garbage(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)) as srv:
        result = request("GET", srv.url, deadline_s=3)
    assert isinstance(result, HttpResult) and result.body == body


def test_a_chunked_body_in_many_chunks_over_a_socket():
    chunks = [bytes([65 + i % 26]) * (i * 37 % 500 + 1) for i in range(200)]
    wire = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    with LoopbackServer(default=Garbage(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + wire)) as srv:
        result = request("GET", srv.url, deadline_s=3)
    assert isinstance(result, HttpResult) and result.body == b"".join(chunks)


def test_a_content_length_shorter_than_the_body_gives_the_announced_bytes_only():
    with LoopbackServer(default=Garbage(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello, and more")) as srv:
        result = request("GET", srv.url, deadline_s=2)
    assert isinstance(result, HttpResult) and result.body == b"hello"


def test_a_content_length_longer_than_the_body_is_a_truncated_fault():
    with LoopbackServer(default=Garbage(b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\nhello")) as srv:
        result = request("GET", srv.url, deadline_s=2)
    assert isinstance(result, HttpFault) and result.kind == "invalid"
    assert result.detail == "truncated body: 495 of the announced bytes never came" and result.status == 200


class _Slowloris:
    """A peer that keeps the connection alive forever with one more header line every 50 ms."""

    def __init__(self) -> None:
        self.port = 0
        self.stop = threading.Event()

    def __enter__(self) -> _Slowloris:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        n = 0
        while not self.stop.wait(0.05):
            n += 1
            try:
                conn.sendall(b"X-Still-Here-%d: yes\r\n" % n)
            except OSError:
                break
        conn.close()

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.listener.close()


def test_a_slowloris_peer_is_cut_at_the_deadline():
    with _Slowloris() as peer:
        started = time.monotonic()
        result = request("GET", f"http://127.0.0.1:{peer.port}/health", deadline_s=0.6)
        took = time.monotonic() - started
    assert isinstance(result, HttpFault) and result.kind == "timeout"
    assert 0.55 <= took < 1.2, took


# --------------------------------------------------------------------------- https in the loop


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    where = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(where / "key.pem"),
                    "-out", str(where / "cert.pem")], check=True, capture_output=True)
    return where / "cert.pem", where / "key.pem"


class _TlsServer:
    """A real TLS server on 127.0.0.1 (Python's ``ssl``) answering every connection with ``answer``."""

    def __init__(self, cert, key, answer: bytes) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.listener.getsockname()[1]}/health"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            try:
                with self.context.wrap_socket(raw, server_side=True) as conn:
                    conn.recv(65536)
                    conn.sendall(self.answer)
            except (OSError, ssl.SSLError):
                continue


def test_https_runs_in_the_loop_against_a_real_tls_server(tls_files, monkeypatch):
    cert, key = tls_files
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trust this test's own certificate
    body = b'{"status": "ok"}' * 3000  # several TLS records: read on while ``pending`` holds bytes
    server = _TlsServer(cert, key, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    try:
        result = request("GET", server.url, deadline_s=3)
    finally:
        server.listener.close()
    assert isinstance(result, HttpResult) and result.status == 200 and result.body == body


def test_https_with_an_untrusted_certificate_is_an_invalid_fault(tls_files):
    cert, key = tls_files
    server = _TlsServer(cert, key, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    try:
        result = request("GET", server.url, deadline_s=3)
    finally:
        server.listener.close()
    assert isinstance(result, HttpFault) and result.kind == "invalid", result
    assert "CERTIFICATE_VERIFY_FAILED" in result.detail and result.detail.isprintable()


def test_https_to_a_plain_http_peer_is_an_invalid_fault_not_a_hang():
    """The peer answers plain HTTP to the ClientHello at once, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        started = time.monotonic()
        result = request("GET", f"https://127.0.0.1:{listener.getsockname()[1]}/health", deadline_s=2)
    finally:
        listener.close()
    assert isinstance(result, HttpFault) and result.kind in ("invalid", "refused"), result
    assert time.monotonic() - started < 1.0 and result.detail.isprintable()


@pytest.mark.parametrize(
    ("url", "headers"),
    [
        ("http://127.0.0.1:9/a b", {}),
        ("http://127.0.0.1:9/health", {"X-Evil": "1\r\nInjected: yes"}),
        ("http://127.0.0.1:9/health", {"Authorization": "Bearer \u2603"}),
    ],
    ids=["space-in-target", "crlf-in-header", "not-latin-1"],
)
def test_a_request_that_would_break_the_framing_is_refused_unsent(url, headers):
    result = request("GET", url, deadline_s=1, headers=headers)
    assert isinstance(result, HttpFault) and result.kind == "invalid", result
    assert result.detail.startswith("cannot send this request") and "2603" not in result.detail
