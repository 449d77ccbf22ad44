"""The sim's answers are written in one piece (issue 29: a 100-GPU chaos week answers ~3 million
requests in process): byte for byte what ``BaseHTTPRequestHandler``'s ``send_response`` /
``send_header`` / ``end_headers`` write, with the same ``close_connection``."""

from __future__ import annotations

import itertools

import pytest

from gpuheal.sim.inprocess import StandIn
from gpuheal.sim.servers import LlamaHandler


class _Out:
    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, data: bytes) -> int:
        self.out += data
        return len(data)


class _Fixed(LlamaHandler):
    def date_time_string(self, timestamp: float | None = None) -> str:
        return "Sun, 06 Dec 2026 03:00:00 GMT"


def _handler(command: str, version: str = "HTTP/1.1") -> _Fixed:
    h = _Fixed.__new__(_Fixed)
    h.server = StandIn(verbose=False)  # type: ignore[assignment]
    h.client_address = ("127.0.0.1", 40000)
    h.command, h.request_version, h.requestline = command, version, f"{command} / {version}"
    h.wfile = _Out()  # type: ignore[assignment]
    h.close_connection = False
    return h


HEADERS = [None, {}, {"Process-Start-Time-Unix": "1765000000000000"}, {"Connection": "close"},
           {"Connection": "keep-alive", "X-A": "b"}, {"connection": "Close"}, {"Retry-After": "5"}]


@pytest.mark.parametrize(("status", "headers", "close", "command"), list(itertools.product(
    [200, 201, 204, 400, 401, 404, 418, 429, 500, 501, 503, 599], HEADERS, [False, True], ["GET", "HEAD", "POST"])))
def test_one_piece_is_what_the_header_calls_write(status, headers, close, command):
    body = b'{"status":"ok"}'
    fast, slow = _handler(command), _handler(command)
    fast.send(status, body, "application/json; charset=utf-8", headers=headers, close=close)
    slow._send_by_header(status, body, "application/json; charset=utf-8", headers=headers, close=close)
    assert bytes(fast.wfile.out) == bytes(slow.wfile.out)  # type: ignore[attr-defined]
    assert fast.close_connection == slow.close_connection


def test_a_non_latin1_header_fails_as_send_header_does():
    fast, slow = _handler("GET"), _handler("GET")
    with pytest.raises(UnicodeEncodeError):
        slow._send_by_header(200, b"", "text/plain", headers={"X": "\u2603"}, close=False)
    with pytest.raises(UnicodeEncodeError):
        fast.send(200, b"", "text/plain", headers={"X": "\u2603"})
    assert bytes(fast.wfile.out) == b""  # type: ignore[attr-defined]
