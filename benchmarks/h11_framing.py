"""h11 as the HTTP/1.1 framing of gpuheal's one client, for the measurement issue 19 item 5 asks
for ("Use h11 ... Measure before and after with the 1000-GPU and 10,000-GPU benchmarks. If h11
costs more than 10 % there, keep a hand-written framing"). Benchmark code, not gpuheal's.

:func:`install` swaps the two framing points of ``gpuheal/sources/http.py``'s selector loop for
h11: ``_request_bytes`` (the request's bytes: here ``h11.Connection.send`` of a ``Request``, its
body and ``EndOfMessage``) and ``_Response`` (the answer, fed as it comes: here
``receive_data`` / ``next_event``). Everything else — the loop, the deadline, the byte caps, the
fault classifier, keep-alive and the reconnect of a connection the server closed — is the same
code, so a check run with and without it differs only in the framing. As an h11 client would,
one ``h11.Connection`` serves each TCP connection (``start_next_cycle`` between the requests of a
kept-alive one).

    from h11_framing import install; install()    # before gpuheal sends anything
"""

from __future__ import annotations

import threading
from typing import Any

import h11

from gpuheal.sources import http

_made = threading.local()  # the Connection _request_bytes made, for the _Response made right after it


def _request_bytes(job: Any, ask: http.Ask) -> bytes:
    """The request through h11 (which also refuses CR/LF in a header or a space in the target)."""
    host = f"[{job.host}]" if ":" in job.host else job.host
    if job.port != (443 if job.tls else 80):
        host = f"{host}:{job.port}"
    target = (job.path.rstrip("/") + ask.path if ask.path else job.path or "/") + job.query
    asked = {name.lower() for name, _ in ask.headers}
    headers = [("Host", host)]
    headers += [(name, value) for name, value in http._DEFAULT_HEADERS if name.lower() not in asked]
    headers += list(ask.headers)
    if ask.body is not None:
        headers.append(("Content-Length", str(len(ask.body))))
    conn = getattr(job, "h11", None)
    if job.sock is not None and conn is not None and conn.our_state is h11.DONE and conn.their_state is h11.DONE:
        conn.start_next_cycle()  # the next request on the kept-alive connection
    else:
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=http.MAX_HEAD_BYTES)
    try:
        wire = conn.send(h11.Request(method=ask.method, target=target, headers=headers))
        if ask.body:
            wire += conn.send(h11.Data(data=ask.body))
        wire += conn.send(h11.EndOfMessage())
    except (h11.LocalProtocolError, UnicodeEncodeError) as exc:
        raise ValueError(f"h11 refused the request: {type(exc).__name__}") from None
    job.h11 = _made.conn = conn
    return wire


class _Response:
    """``http._Response``'s interface (``feed``, ``eof``, ``cut_short``, ``status``, ``headers``,
    ``body``, ``keep_alive``) over the h11 Connection that sent the request."""

    def __init__(self, max_bytes: int, head_only: bool = False) -> None:
        self.conn: h11.Connection = _made.conn
        self.max_bytes = max_bytes
        self.status = 0
        self.headers: dict[str, str] | None = None
        self.body = bytearray()
        self.keep_alive = False
        self.problem = ""

    def feed(self, data: bytes) -> bool:
        self.conn.receive_data(data)
        return self._events()

    def eof(self) -> bool:
        self.conn.receive_data(b"")
        try:
            return self._events()
        except http._Invalid as exc:
            self.problem = str(exc)
            return False

    def cut_short(self) -> str:
        return self.problem or ("not an HTTP response" if self.headers is None else "truncated body")

    def _events(self) -> bool:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise http._Invalid(http.printable(f"h11: {exc}")) from None
            kind = type(event)
            if kind is h11.Data:
                self.body += event.data
                if len(self.body) > self.max_bytes:
                    raise http._Oversized(f"body exceeds max_response_bytes {self.max_bytes}", self.status)
            elif kind is h11.Response:
                self._head(event)
            elif kind is h11.EndOfMessage:
                self.keep_alive = self.conn.their_state is h11.DONE and self.conn.our_state is h11.DONE \
                    and not self.conn.trailing_data[0]
                return True
            elif event is h11.NEED_DATA or kind is h11.ConnectionClosed:
                return False
            # h11.InformationalResponse (100 Continue): the real answer follows

    def _head(self, event: h11.Response) -> None:
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers}
        refused = http.announced_length_fault(headers.get("content-length"), self.max_bytes)
        if refused is not None:
            kind, detail = refused
            raise http._Oversized(detail, event.status_code) if kind == "oversized" else http._Invalid(detail)
        self.status, self.headers = event.status_code, headers


def install() -> None:
    """From now on this process's gpuheal frames every request and answer with h11."""
    http._request_bytes = _request_bytes
    http._Response = _Response  # type: ignore[misc]
