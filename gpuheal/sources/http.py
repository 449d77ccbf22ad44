"""A small HTTP client with a hard total deadline and a byte cap.

Why not ``requests`` here: its timeouts bound each socket operation, not the whole exchange, so a
server that dribbles one byte a second holds a probe for ever (Lesson L5 is the same failure at a
larger scale), and it costs ~80 ms of import on every cron start. ``http.client`` plus a watchdog
that shuts the socket at the deadline bounds connect + headers + body together.

Every failure is returned as a :class:`HttpFault`, never raised: "a source that fails is a data
fault in the observation, not an exception" (issue 2).
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

USER_AGENT = "gpuheal"
_CHUNK = 16384


@dataclass(frozen=True)
class HttpResult:
    status: int
    body: bytes
    elapsed_s: float
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HttpFault:
    """``kind``: timeout | refused | oversized | invalid | http-NNN (contract: faults)."""

    kind: str
    detail: str
    elapsed_s: float = 0.0
    status: int | None = None
    body: bytes = b""


class _Deadline(Exception):
    pass


class _Watchdog:
    """One daemon thread that fires every pending request's deadline.

    A ``threading.Timer`` per request costs a thread start each (~0.1 ms, far more while 256
    probe threads hold the GIL): a sweep of 1000 endpoints paid it 1000 times (issue 2 benchmark).
    Entries are ``[at, seq, callback]``; cancelling clears the callback and the thread drops it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[list] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, at: float, callback: Callable[[], None]) -> list:
        entry = [at, next(self._seq), callback]
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="http-watchdog", daemon=True)
                self._thread.start()
            elif self._heap[0] is entry:
                self._cond.notify()
        return entry

    def cancel(self, entry: list) -> None:
        entry[2] = None

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2] is None:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                callback = heapq.heappop(self._heap)[2]
                self._cond.release()
                try:
                    if callback is not None:
                        callback()
                except Exception:  # noqa: BLE001 - a failed shutdown must not stop the watchdog
                    pass
                finally:
                    self._cond.acquire()


_WATCHDOG = _Watchdog()


def is_ip_literal(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def printable(text: str, limit: int = 200) -> str:
    """The peer's bytes never reach a terminal raw: non-printable characters become spaces."""
    return "".join(ch if ch.isprintable() else " " for ch in text).strip()[:limit]


def _resolve(host: str, port: int, wait_s: float) -> tuple:
    """``getaddrinfo`` bounded by ``wait_s``: the resolver cannot be interrupted, so it runs in a
    daemon thread that is abandoned at the deadline (a sick DNS server must not hold a probe past
    its deadline any more than a dribbling HTTP server may). Raises ``_Deadline`` or
    ``socket.gaierror``."""
    done = threading.Event()
    box: list = []

    def work() -> None:
        try:
            box.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box.append(exc)
        done.set()

    threading.Thread(target=work, name="resolve", daemon=True).start()
    if not done.wait(max(0.0, wait_s)):
        raise _Deadline
    outcome = box[0]
    if isinstance(outcome, BaseException):
        raise outcome
    if not outcome:
        raise socket.gaierror(f"no address for {host}")
    return outcome[0][4][:2]


def request(
    method: str,
    url: str,
    *,
    deadline_s: float,
    connect_timeout_s: float | None = None,
    max_bytes: int = 1 << 20,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> HttpResult | HttpFault:
    """Perform one request; the whole exchange ends within ``deadline_s`` seconds.

    Non-2xx answers are returned as :class:`HttpResult` (callers decide what a 503 means); only
    transport failures and the size cap become :class:`HttpFault`. (Many llama-servers at once:
    :mod:`gpuheal.sources.http_loop`, one thread and a kept-alive connection each.)
    """
    started = time.monotonic()
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return HttpFault("invalid", f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return HttpFault("invalid", f"bad URL: {exc}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connect_s = min(connect_timeout_s or deadline_s, deadline_s)
    conn = _connection(parts.scheme, parts.hostname, port, connect_s)
    exchange = _Exchange(conn, started + deadline_s)
    watchdog = _WATCHDOG.schedule(exchange.stop_at, exchange.expire)
    try:
        send_headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        send_headers.update(headers or {})
        if not is_ip_literal(parts.hostname):
            address = _resolve(parts.hostname, port, min(connect_s, exchange.stop_at - time.monotonic()))
            create = conn._create_connection  # connect to the resolved address; Host/SNI unchanged
            conn._create_connection = lambda _addr, *args: create(address, *args)
        return exchange.run(method, path, send_headers, body, max_bytes, started)
    except Exception as exc:  # noqa: BLE001 - every failure of the exchange is a fault (issue 2)
        return _fault(exc, deadline_s, time.monotonic() - started, exchange.fired.is_set())
    finally:
        _WATCHDOG.cancel(watchdog)
        conn.close()


def _connection(scheme: str, host: str, port: int, connect_s: float) -> http.client.HTTPConnection:
    if scheme != "https":
        return http.client.HTTPConnection(host, port, timeout=connect_s)
    import ssl  # only https pays for it

    return http.client.HTTPSConnection(host, port, timeout=connect_s, context=ssl.create_default_context())


def announced_length_fault(declared: str | None, max_bytes: int) -> tuple[str, str] | None:
    """``(kind, detail)`` when the announced Content-Length refuses the body before it is read: not
    ASCII digits (``'²'``, ``'-5'``, ``'2, 2'``; ``str.isdigit`` accepts the first) is ``invalid``,
    more than ``max_bytes`` (or digits past ``int()``'s limit) ``oversized`` (issue 9). Both clients
    (this module and :mod:`~gpuheal.sources.http_loop`) refuse by it."""
    length = (declared or "").strip(" \t")
    if not length:
        return None
    if not (length.isascii() and length.isdigit()):
        return "invalid", f"Content-Length {length[:40]!r} is not a byte count"
    if len(length) > 18 or int(length) > max_bytes:  # 18 digits: never near int()'s limit
        shown = length if len(length) <= 18 else length[:18] + "…"
        return "oversized", f"Content-Length {shown} exceeds max_response_bytes {max_bytes}"
    return None


class _Exchange:
    """One request on ``conn`` whose socket the watchdog shuts at ``stop_at``.

    http.client drops ``conn.sock`` once a ``Connection: close`` response is read (the response
    owns the socket then), so the socket is kept here for the watchdog and the read timeouts."""

    def __init__(self, conn: http.client.HTTPConnection, stop_at: float) -> None:
        self.conn = conn
        self.stop_at = stop_at
        self.fired = threading.Event()
        self.held: list[socket.socket] = []

    def expire(self) -> None:
        self.fired.set()
        for sock in self.held:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def run(self, method: str, path: str, headers: dict, body: bytes | None, max_bytes: int,
            started: float) -> HttpResult | HttpFault:
        self.conn.connect()
        sock = self.conn.sock
        self.held.append(sock)
        if self.fired.is_set():
            raise _Deadline
        sock.settimeout(max(0.01, self.stop_at - time.monotonic()))
        self.conn.request(method, path, body=body, headers=headers)
        resp = self.conn.getresponse()
        refused = announced_length_fault(resp.getheader("Content-Length"), max_bytes)
        if refused is not None:
            kind, detail = refused
            return HttpFault(kind, detail, time.monotonic() - started, status=resp.status)
        chunks = self._read(resp, sock, max_bytes)
        if chunks is None:
            return HttpFault("oversized", f"body exceeds max_response_bytes {max_bytes}",
                             time.monotonic() - started, status=resp.status)
        if self.fired.is_set():
            raise _Deadline
        if resp.length:  # the peer closed before the Content-Length it announced
            return HttpFault("invalid", f"truncated body: {resp.length} of the announced bytes never came",
                             time.monotonic() - started, status=resp.status)
        return HttpResult(status=resp.status, body=b"".join(chunks), elapsed_s=time.monotonic() - started,
                          headers={k.lower(): v for k, v in resp.getheaders()})

    def _read(self, resp: http.client.HTTPResponse, sock: socket.socket, max_bytes: int) -> list[bytes] | None:
        """The body, read in chunks under what is left of the deadline; None past ``max_bytes``."""
        chunks: list[bytes] = []
        size = 0
        while True:
            remaining = self.stop_at - time.monotonic()
            if remaining <= 0:
                raise _Deadline
            sock.settimeout(remaining)
            chunk = resp.read1(_CHUNK)
            if not chunk:
                return chunks
            size += len(chunk)
            if size > max_bytes:
                return None
            chunks.append(chunk)


def _fault(exc: Exception, deadline_s: float, elapsed: float, fired: bool) -> HttpFault:
    """A failed exchange as the contract's fault kinds: refused | timeout | invalid."""
    timeout = HttpFault("timeout", f"no complete answer within {deadline_s:g} s", elapsed)
    if isinstance(exc, ConnectionRefusedError):
        return HttpFault("refused", "connection refused", elapsed)
    if isinstance(exc, TimeoutError | _Deadline):
        return timeout
    if isinstance(exc, socket.gaierror):
        return HttpFault("refused", f"cannot resolve host: {exc.strerror or exc}", elapsed)
    if not isinstance(exc, OSError | http.client.HTTPException | ValueError):
        raise exc
    if fired or elapsed >= deadline_s:
        return timeout
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return HttpFault("refused", f"connection reset: {exc}", elapsed)
    if isinstance(exc, OSError) and exc.errno in (101, 113, 111):  # unreachable / refused
        return HttpFault("refused", str(exc), elapsed)
    return HttpFault("invalid", printable(f"{type(exc).__name__}: {exc}"), elapsed)
