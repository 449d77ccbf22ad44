"""Many HTTP exchanges at once, in one thread: non-blocking sockets, one keep-alive connection per
endpoint, the same hard deadline and byte cap as :func:`gpuheal.sources.http.request`.

Why (issue 12 benchmark): a busy llama-server costs three requests a poll (``/health``,
``/metrics``, ``/slots``). Through ``http.client`` on a thread each, 1000 servers cost ~2.5 s of
CPU on 2 cores, most of it threads handing the GIL to each other around every socket call, a new
TCP connection per request and ``http.client``'s header parsing (the ``email`` package). Here one
thread drives every connection with ``selectors``; each endpoint's requests go one after another
over one connection (llama-server's cpp-httplib keeps HTTP/1.1 connections alive), and a
connection the server closes is simply opened again.

What is asked of an endpoint is a generator (an *exchange*): it yields :class:`Ask` and is sent
each answer (:class:`HttpResult` or :class:`HttpFault`, never an exception), and its return value
is the endpoint's result. Deciding the next request from the previous answer (ask ``/slots`` only
of a busy server) stays in the caller's plain code.

Each exchange has one deadline (``deadline_s`` from its start: resolve + connect + every request);
at most ``max_open`` exchanges run at once (``probe.max_workers``), so a sweep of N dead hosts
costs about one deadline while N ≤ ``max_open``. https endpoints run their exchange on threads
through :func:`~gpuheal.sources.http.request` (no TLS in this loop; llama-servers are rarely https).
"""

from __future__ import annotations

import errno
import heapq
import itertools
import queue
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gpuheal.sources.http import (
    USER_AGENT,
    HttpFault,
    HttpResult,
    announced_length_fault,
    is_ip_literal,
    printable,
    request,
)

MAX_HEAD_BYTES = 65536  # status line + headers (http.client: 64 KiB lines, 100 headers)
_RECV = 65536
_NO_BODY = frozenset({204, 304})


@dataclass(frozen=True)
class Ask:
    """One request of an exchange; ``path`` is appended to the endpoint's own path."""

    path: str
    headers: tuple[tuple[str, str], ...] = ()
    max_bytes: int = 1 << 20
    method: str = "GET"
    body: bytes | None = None


Exchange = Generator[Ask, "HttpResult | HttpFault", Any]


class _Invalid(Exception):
    """The peer's bytes are not an HTTP/1.x response (→ an ``invalid`` fault)."""


class _Oversized(Exception):
    def __init__(self, detail: str, status: int) -> None:
        super().__init__(detail)
        self.status = status


@dataclass
class _Response:
    """An HTTP/1.x response parsed incrementally from the bytes as they come.

    Framing as ``http.client`` does it: no body for 1xx/204/304, ``Transfer-Encoding: chunked``,
    else ``Content-Length``, else until the peer closes. 1xx interim answers are skipped."""

    max_bytes: int
    buf: bytearray = field(default_factory=bytearray)
    status: int = 0
    headers: dict[str, str] | None = None
    length: int | None = None  # the body's announced length; None: chunked or until close
    chunked: bool = False
    keep_alive: bool = False
    body: bytearray = field(default_factory=bytearray)
    pos: int = 0  # chunked: where the next chunk's size line starts in buf

    def feed(self, data: bytes) -> bool:
        """Take more bytes; True once the response is complete. Raises _Invalid / _Oversized."""
        self.buf += data
        while self.headers is None:
            end = self.buf.find(b"\r\n\r\n")
            if end > MAX_HEAD_BYTES or (end < 0 and len(self.buf) > MAX_HEAD_BYTES):
                raise _Invalid(f"response headers longer than {MAX_HEAD_BYTES} bytes")
            if end < 0:
                return False
            self._head(bytes(self.buf[:end]))
            del self.buf[: end + 4]
        if self.chunked:
            return self._chunks()
        if self.length is not None:
            if len(self.buf) < self.length:
                return False  # the body is cut out once, when it is all here
            if len(self.buf) > self.length:
                self.keep_alive = False  # bytes beyond the body: do not trust this connection again
            self.body = self.buf[: self.length]
            return True
        if len(self.buf) > self.max_bytes:
            raise _Oversized(f"body exceeds max_response_bytes {self.max_bytes}", self.status)
        self.body = self.buf
        return False

    def eof(self) -> bool:
        """The peer closed: True when that completes the response (a body read until close)."""
        return self.headers is not None and not self.chunked and self.length is None

    def _head(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or parts[0] not in ("HTTP/1.0", "HTTP/1.1"):
            raise _Invalid(f"not an HTTP response: {lines[0][:80]!r}")
        if not (len(parts[1]) == 3 and parts[1].isdigit() and parts[1].isascii()):
            raise _Invalid(f"bad status line: {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            return
        self.status, self.headers = status, headers
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        declared = headers.get("content-length")
        if status in _NO_BODY:
            self.length = 0
        elif not self.chunked and declared:
            refused = announced_length_fault(declared, self.max_bytes)
            if refused is not None:
                kind, detail = refused
                raise _Oversized(detail, status) if kind == "oversized" else _Invalid(detail)
            self.length = int(declared)
        framed = self.chunked or self.length is not None
        self.keep_alive = framed and parts[0] == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()

    def _chunks(self) -> bool:
        while True:
            line_end = self.buf.find(b"\r\n", self.pos)
            if line_end < 0:
                if len(self.buf) - self.pos > 1024:
                    raise _Invalid("chunk size line longer than 1024 bytes")
                return False
            size_text = bytes(self.buf[self.pos : line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise _Invalid(f"bad chunk size {size_text[:20]!r}") from None
            if size < 0:
                raise _Invalid("negative chunk size")
            if size == 0:  # the last chunk: optional trailers, then an empty line
                rest = self.buf[line_end + 2 :]
                return rest.startswith(b"\r\n") or b"\r\n\r\n" in rest
            if len(self.body) + size > self.max_bytes:
                raise _Oversized(f"body exceeds max_response_bytes {self.max_bytes}", self.status)
            start = line_end + 2
            if len(self.buf) < start + size + 2:
                return False
            if self.buf[start + size : start + size + 2] != b"\r\n":
                raise _Invalid("chunk not followed by CRLF")
            self.body += self.buf[start : start + size]
            self.pos = start + size + 2


@dataclass(eq=False)
class _Job:
    """One endpoint's exchange: its connection, the request in flight, its deadline."""

    key: Any
    gen: Exchange
    host: str
    port: int
    path: str  # the endpoint's own path (an ask's path is appended) and query ("?..." or "")
    query: str
    deadline_s: float
    stop_at: float
    addr: tuple | None = None
    family: int = socket.AF_INET
    sock: socket.socket | None = None
    ask: Ask | None = None
    out: bytes = b""
    resp: _Response | None = None
    asked_at: float = 0.0
    reused: bool = False  # the request in flight went over a connection an earlier one used
    got_bytes: bool = False
    done: bool = False


def _request_bytes(job: _Job, ask: Ask) -> bytes:
    host = f"[{job.host}]" if ":" in job.host else job.host
    target = (job.path.rstrip("/") + ask.path if ask.path else job.path or "/") + job.query
    lines = [f"{ask.method} {target} HTTP/1.1", f"Host: {host}:{job.port}",
             f"User-Agent: {USER_AGENT}", "Accept: application/json"]
    lines += [f"{name}: {value}" for name, value in ask.headers]
    if ask.body is not None:
        lines.append(f"Content-Length: {len(ask.body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (ask.body or b"")


def _os_fault(exc: OSError, elapsed: float, reused_quietly: bool) -> HttpFault | None:
    """A socket error as ``request`` reports it; None: retry on a fresh connection (a reused
    keep-alive connection the server had closed before this request got a byte)."""
    if reused_quietly and exc.errno in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
        return None
    if exc.errno == errno.ECONNREFUSED:
        return HttpFault("refused", "connection refused", elapsed)
    if exc.errno in (errno.ECONNRESET, errno.EPIPE):
        return HttpFault("refused", f"connection reset: {exc}", elapsed)
    if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return HttpFault("refused", str(exc), elapsed)
    return HttpFault("invalid", printable(f"{type(exc).__name__}: {exc}"), elapsed)


class _Resolver:
    """Host names resolved on daemon threads, each once per run (a host's GPUs share it): the
    resolver cannot be interrupted, so a stuck one is abandoned at the deadline, as in ``request``."""

    def __init__(self, hosts: set[str], wake: socket.socket) -> None:
        self.answers: dict[str, Any] = {}
        self.waiting: dict[str, list[_Job]] = {}
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = wake
        for host in hosts:
            self._todo.put(host)
        for _ in range(min(len(hosts), 16)):
            threading.Thread(target=self._work, name="resolve", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                host = self._todo.get_nowait()
            except queue.Empty:
                return
            try:
                infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
                outcome: Any = (infos[0][0], infos[0][4]) if infos else socket.gaierror(f"no address for {host}")
            except Exception as exc:  # noqa: BLE001 - handed to the loop as this host's fault
                outcome = exc
            self._done.put((host, outcome))
            try:
                self._wake.send(b"x")
            except OSError:  # the loop has finished (its deadline passed): nobody waits
                pass

    def answered(self) -> list[tuple[str, Any]]:
        out = []
        while True:
            try:
                host, outcome = self._done.get_nowait()
            except queue.Empty:
                return out
            self.answers[host] = outcome
            out.append((host, outcome))


def _address(outcome: Any, port: int, elapsed: float) -> tuple[int, tuple] | HttpFault:
    if isinstance(outcome, socket.gaierror):
        return HttpFault("refused", f"cannot resolve host: {outcome.strerror or outcome}", elapsed)
    if isinstance(outcome, BaseException):
        return HttpFault("invalid", printable(f"cannot resolve host: {type(outcome).__name__}: {outcome}"), elapsed)
    family, sockaddr = outcome
    return family, (sockaddr[0], port, *sockaddr[2:])


class _Loop:
    """The selector loop behind :func:`run_exchanges` (one per call, in the calling thread)."""

    def __init__(self, deadline_s: float, max_open: int) -> None:
        self.deadline_s = deadline_s
        self.max_open = max(1, max_open)
        self.sel = selectors.DefaultSelector()
        self.results: dict[Any, Any] = {}
        self.heap: list[tuple[float, int, _Job]] = []
        self.seq = itertools.count()
        self.open_jobs = 0
        self.resolver: _Resolver | None = None
        self.wake_r: socket.socket | None = None

    def run(self, items: list[tuple[Any, Any, Callable[[], Exchange]]]) -> dict[Any, Any]:
        hosts = {p.hostname for _, p, _ in items if p is not None and not is_ip_literal(p.hostname)}
        wake_w = None
        if hosts:
            self.wake_r, wake_w = socket.socketpair()
            self.wake_r.setblocking(False)
            self.sel.register(self.wake_r, selectors.EVENT_READ, None)
            self.resolver = _Resolver(hosts, wake_w)
        todo = deque(items)
        try:
            while todo or self.open_jobs:
                while todo and self.open_jobs < self.max_open:
                    self._start(*todo.popleft())
                self._step()
        finally:
            for job in [key.data for key in self.sel.get_map().values() if key.data is not None]:
                self._close(job)
            self.sel.close()
            for sock in (self.wake_r, wake_w):
                if sock is not None:
                    sock.close()
        return self.results

    def _step(self) -> None:
        while self.heap and self.heap[0][2].done:
            heapq.heappop(self.heap)
        if not self.heap:
            return
        timeout = max(0.0, self.heap[0][0] - time.monotonic())
        for key, mask in self.sel.select(timeout):
            if key.data is None:
                self._resolved()
            elif not key.data.done and key.data.sock is key.fileobj:
                self._ready(key.data, mask)
        now = time.monotonic()
        while self.heap and self.heap[0][0] <= now:
            job = heapq.heappop(self.heap)[2]
            if not job.done:
                self._fail(job, self._timeout(job))

    def _start(self, key: Any, parts: Any, factory: Callable[[], Exchange]) -> None:
        now = time.monotonic()
        host, port = (parts.hostname, parts.port or 80) if parts is not None else ("", 0)
        path = parts.path if parts is not None else ""
        query = f"?{parts.query}" if parts is not None and parts.query else ""
        job = _Job(key, factory(), host, port, path, query, self.deadline_s, now + self.deadline_s)
        self.open_jobs += 1
        heapq.heappush(self.heap, (job.stop_at, next(self.seq), job))
        if parts is None:
            job.addr = ()  # never connects: every ask is answered "invalid" below
        elif is_ip_literal(host):
            job.family = socket.AF_INET6 if ":" in host else socket.AF_INET
            job.addr = (host, port)
        self._advance(job, None)

    def _advance(self, job: _Job, result: HttpResult | HttpFault | None) -> None:
        """Send ``result`` into the exchange and start what it asks next, until a request is in
        flight or the exchange returns."""
        while True:
            try:
                ask = job.gen.send(result)
            except StopIteration as stop:
                self._finish(job, stop.value)
                return
            result = self._issue(job, ask)
            if result is None:
                return

    def _issue(self, job: _Job, ask: Ask) -> HttpResult | HttpFault | None:
        now = time.monotonic()
        if job.addr == ():
            return HttpFault("invalid", "not an http(s) URL with a host and a valid port")
        if now >= job.stop_at:
            return self._timeout(job)
        job.ask, job.asked_at, job.out = ask, now, _request_bytes(job, ask)
        job.resp, job.got_bytes = _Response(ask.max_bytes), False
        if job.sock is not None:
            job.reused = True
            return self._send(job)
        job.reused = False
        return self._connect(job)

    def _connect(self, job: _Job) -> HttpFault | None:
        if job.addr is None:
            outcome = self.resolver.answers.get(job.host) if self.resolver else None
            if outcome is None:
                self.resolver.waiting.setdefault(job.host, []).append(job)
                return None
            address = _address(outcome, job.port, time.monotonic() - job.asked_at)
            if isinstance(address, HttpFault):
                return address
            job.family, job.addr = address
        try:
            sock = socket.socket(job.family, socket.SOCK_STREAM)
        except OSError as exc:  # out of file descriptors, no IPv6
            return _os_fault(exc, 0.0, False)
        sock.setblocking(False)
        err = sock.connect_ex(job.addr)
        if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
            sock.close()
            return _os_fault(OSError(err, errno.errorcode.get(err, str(err))), time.monotonic() - job.asked_at, False)
        job.sock = sock
        self.sel.register(sock, selectors.EVENT_WRITE, job)
        return None

    def _resolved(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        for host, _outcome in self.resolver.answered():
            for job in self.resolver.waiting.pop(host, []):
                if not job.done:
                    fault = self._connect(job)
                    if fault is not None:
                        self._advance(job, fault)

    def _ready(self, job: _Job, mask: int) -> None:
        if job.out:
            if job.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                fault = self._send(job)
            else:
                err = job.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) or errno.ECONNREFUSED
                fault = _os_fault(OSError(err, "connect failed"), time.monotonic() - job.asked_at, False)
            if fault is not None:
                self._fail(job, fault)
            return
        try:
            data = job.sock.recv(_RECV)
        except BlockingIOError:
            return
        except OSError as exc:
            self._error(job, exc)
            return
        if not data:
            self._eof(job)
            return
        job.got_bytes = True
        try:
            complete = job.resp.feed(data)
        except _Invalid as exc:
            self._fail(job, HttpFault("invalid", printable(str(exc)), time.monotonic() - job.asked_at))
            return
        except _Oversized as exc:
            self._fail(job, HttpFault("oversized", str(exc), time.monotonic() - job.asked_at, status=exc.status))
            return
        if complete:
            self._complete(job)

    def _send(self, job: _Job) -> HttpFault | None:
        try:
            sent = job.sock.send(job.out)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            fault = _os_fault(exc, time.monotonic() - job.asked_at, job.reused)
            if fault is None:
                self._close(job)
                return self._reconnect(job)
            return fault
        job.out = job.out[sent:]
        self.sel.modify(job.sock, selectors.EVENT_WRITE if job.out else selectors.EVENT_READ, job)
        return None

    def _reconnect(self, job: _Job) -> HttpFault | None:
        """The kept connection was closed under us before any answer: once more on a new one."""
        job.reused, job.out, job.resp = False, _request_bytes(job, job.ask), _Response(job.ask.max_bytes)
        return self._connect(job)

    def _error(self, job: _Job, exc: OSError) -> None:
        fault = _os_fault(exc, time.monotonic() - job.asked_at, job.reused and not job.got_bytes)
        self._close(job)
        if fault is None:
            fault = self._reconnect(job)
        if fault is not None:
            self._advance(job, fault)

    def _eof(self, job: _Job) -> None:
        resp, elapsed = job.resp, time.monotonic() - job.asked_at
        if resp.eof():
            self._complete(job)
            return
        self._close(job)
        if not job.got_bytes and job.reused:
            fault = self._reconnect(job)
        elif not job.got_bytes:
            fault = HttpFault("refused", "connection reset: Remote end closed connection without response", elapsed)
        elif resp.headers is None:
            fault = HttpFault("invalid", printable(f"not an HTTP response: {bytes(resp.buf[:80])!r}"), elapsed)
        elif resp.length is not None:
            missing = resp.length - len(resp.buf)
            fault = HttpFault("invalid", f"truncated body: {missing} of the announced bytes never came", elapsed,
                              status=resp.status)
        else:
            fault = HttpFault("invalid", "truncated chunked body", elapsed, status=resp.status)
        if fault is not None:
            self._advance(job, fault)

    def _complete(self, job: _Job) -> None:
        resp = job.resp
        result = HttpResult(status=resp.status, body=bytes(resp.body), elapsed_s=time.monotonic() - job.asked_at,
                            headers=resp.headers)
        if not resp.keep_alive:
            self._close(job)
        self._advance(job, result)

    def _fail(self, job: _Job, fault: HttpFault) -> None:
        self._close(job)
        self._advance(job, fault)

    def _timeout(self, job: _Job) -> HttpFault:
        elapsed = time.monotonic() - (job.stop_at - job.deadline_s)
        return HttpFault("timeout", f"no complete answer within {job.deadline_s:g} s", elapsed)

    def _close(self, job: _Job) -> None:
        if job.sock is not None:
            self.sel.unregister(job.sock)
            job.sock.close()
            job.sock = None

    def _finish(self, job: _Job, value: Any) -> None:
        self._close(job)
        job.done = True
        self.open_jobs -= 1
        self.results[job.key] = value


def run_exchanges(
    items: Iterable[tuple[Any, str, Callable[[], Exchange]]], *, deadline_s: float, max_open: int
) -> dict[Any, Any]:
    """Run every ``(key, base_url, exchange_factory)`` → ``{key: the exchange's return value}``.

    Each exchange is started (its factory called) when it gets one of the ``max_open`` places and
    has ``deadline_s`` from then for everything it asks. Only what the exchange code itself
    raises propagates; the network's failures are the :class:`HttpFault` answers it is sent."""
    plain: list[tuple[Any, Any, Callable[[], Exchange]]] = []
    tls: list[tuple[Any, str, Callable[[], Exchange]]] = []
    for key, url, factory in items:
        parts = _http_parts(url)
        if parts is not None and parts.scheme == "https":
            tls.append((key, url, factory))
        else:
            plain.append((key, parts, factory))
    if not tls:
        return _Loop(deadline_s, max_open).run(plain)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(tls), max(1, max_open)), thread_name_prefix="https") as pool:
        futures = {key: pool.submit(_blocking, url, factory, deadline_s) for key, url, factory in tls}
        results = _Loop(deadline_s, max_open).run(plain)
        results.update({key: future.result() for key, future in futures.items()})
    return results


def _http_parts(url: str) -> Any:
    """``urlsplit`` of an http(s) URL with a host and a valid port; None otherwise."""
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return None
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return None
    return parts


def _blocking(url: str, factory: Callable[[], Exchange], deadline_s: float) -> Any:
    """One exchange through :func:`request` (https): a request each, within one deadline."""
    started = time.monotonic()
    gen = factory()
    result: HttpResult | HttpFault | None = None
    while True:
        try:
            ask = gen.send(result)
        except StopIteration as stop:
            return stop.value
        remaining = deadline_s - (time.monotonic() - started)
        if remaining <= 0:
            result = HttpFault("timeout", f"no complete answer within {deadline_s:g} s", time.monotonic() - started)
            continue
        result = request(ask.method, url.rstrip("/") + ask.path, deadline_s=remaining, max_bytes=ask.max_bytes,
                         headers=dict(ask.headers), body=ask.body)


def fetch_one(
    method: str, url: str, *, deadline_s: float, max_bytes: int = 1 << 20,
    headers: dict[str, str] | None = None, body: bytes | None = None,
) -> HttpResult | HttpFault:
    """One request through the loop (the same answers as :func:`request` for http URLs)."""

    def one() -> Exchange:
        return (yield Ask("", tuple((headers or {}).items()), max_bytes, method, body))

    return run_exchanges([(0, url, one)], deadline_s=deadline_s, max_open=1)[0]
