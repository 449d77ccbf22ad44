"""gpuheal's one HTTP client: every request, one or many at a time, runs through one selector loop
with a hard total deadline, a byte cap and one fault classifier (issue 19, item 5).

Why not ``requests`` or ``http.client``: their timeouts bound each socket operation, not the whole
exchange, so a server that dribbles one byte a second holds a probe for ever (Lesson L5 is the same
failure at a larger scale); ``requests`` also costs ~80 ms of import on every cron start. Here the
deadline covers resolve + connect (+ TLS handshake) + request + headers + body, and the body is
counted against ``max_bytes`` as it arrives.

Why one loop for everything (issue 12 benchmark): a busy llama-server costs three requests a poll
(``/health``, ``/metrics``, ``/slots``). Through ``http.client`` on a thread each, 1000 servers cost
~2.5 s of CPU on 2 cores, most of it threads handing the GIL to each other around every socket
call, a new TCP connection per request and ``http.client``'s header parsing (the ``email``
package). Here one thread drives every connection with ``selectors``; each endpoint's requests go
one after another over one connection (llama-server's cpp-httplib keeps HTTP/1.1 connections
alive), and a connection the server closes is simply opened again. A single :func:`request` is the
same loop with one exchange; https runs in the loop too (a non-blocking ``ssl`` socket).

What is asked of an endpoint is a generator (an *exchange*): it yields :class:`Ask` and is sent
each answer (:class:`HttpResult` or :class:`HttpFault`, never an exception), and its return value
is the endpoint's result. Deciding the next request from the previous answer (ask ``/slots`` only
of a busy server) stays in the caller's plain code. Each exchange has one deadline (``deadline_s``
from its start); at most ``max_open`` exchanges run at once (``probe.max_workers``), so a sweep of
N dead hosts costs about one deadline while N <= ``max_open``.

Why the HTTP/1.1 framing is hand-written (:class:`_Response`) and not h11, as issue 19 proposed: the
issue's rule is "if h11 costs more than 10 % on the 1000-GPU and 10,000-GPU benchmarks, keep a
hand-written framing". Measured there, not in a micro-benchmark: ``benchmarks/h11_framing.py`` puts
h11 in this loop's two framing points (the request's bytes and the answer fed as it comes; one
``h11.Connection`` per TCP connection, ``start_next_cycle`` between kept-alive requests), and
``--framing hand,h11`` runs both, alternating, median of 5 each (4 Dec 2026, 2-core VM, load ~1.8):

* 1000-GPU check (``benchmarks/run.py --only check-1000``; ~3000 small answers a poll): 1.25 s
  wall and 1.17 s CPU by hand, 1.51 s and 1.39 s through h11 (+21 % wall, +19 % CPU; an earlier run
  at load ~1.9: 1.49 / 1.42 s against 1.88 / 1.69 s, +26 % / +19 %; a third, in slower minutes:
  +2 % wall, +15 % CPU). Over the 10 %: kept by hand.
* 10,000 GPUs behind Prometheus (``benchmarks/prometheus.py``; ~12 large answers a poll): 1.48 s
  and 1.26 s CPU by hand, 1.54 s and 1.27 s through h11 (+4 % wall, +1 % CPU): within it, since
  there the framing handles a few answers of megabytes, not thousands of small ones.

The cost is h11's per-answer work (its event objects, state machine and header validation: ~45 us
an answer against ~7 us here, ``benchmarks/framing.py``), plus ~10-20 ms to import it. h11 serves
instead as the test oracle: ``tests/test_http_framing.py`` generates responses with hypothesis and
requires this framing to agree with h11 on every one it accepts.

Every failure is returned as a :class:`HttpFault`, never raised: "a source that fails is a data
fault in the observation, not an exception" (issue 2).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import queue
import re
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from gpuheal.memo import remembered

if TYPE_CHECKING:  # ssl loads only in a loop with an https URL (_Loop._wrap)
    import ssl

USER_AGENT = "gpuheal"
MAX_HEAD_BYTES = 65536  # status line + headers (http.client: 64 KiB lines, 100 headers)
_RECV = 65536
_NO_BODY = frozenset({204, 304})
_DEFAULT_HEADERS = (("User-Agent", USER_AGENT), ("Accept", "application/json"))  # a caller's own replace them


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


def announced_length_fault(declared: str | None, max_bytes: int) -> tuple[str, str] | None:
    """``(kind, detail)`` when the announced Content-Length refuses the body before it is read: not
    ASCII digits (``'²'``, ``'-5'``, ``'2, 2'``; ``str.isdigit`` accepts the first) is ``invalid``,
    more than ``max_bytes`` (or digits past ``int()``'s limit) ``oversized`` (issue 9). The framing
    refuses by it."""
    length = (declared or "").strip(" \t")
    if not length:
        return None
    if not (length.isascii() and length.isdigit()):
        return "invalid", f"Content-Length {length[:40]!r} is not a byte count"
    if len(length) > 18 or int(length) > max_bytes:  # 18 digits: never near int()'s limit
        shown = length if len(length) <= 18 else length[:18] + "…"
        return "oversized", f"Content-Length {shown} exceeds max_response_bytes {max_bytes}"
    return None


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

    Framing as ``http.client`` does it: no body for 1xx/204/304 or an answer to HEAD,
    ``Transfer-Encoding: chunked``, else ``Content-Length``, else until the peer closes. 1xx
    interim answers are skipped. Every cap holds while the bytes come: the head at
    ``MAX_HEAD_BYTES``, a chunk-size line at 1024 bytes, the body at ``max_bytes`` (an announced
    length or chunk size past it is refused before its bytes are read)."""

    max_bytes: int
    head_only: bool = False  # the answer to a HEAD request: headers, never a body
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

    def cut_short(self) -> str:
        """Why the bytes so far, ended by the peer's close, are not a response (an invalid fault)."""
        if self.headers is None:
            return printable(f"not an HTTP response: {bytes(self.buf[:80])!r}")
        if self.length is not None:
            return f"truncated body: {self.length - len(self.buf)} of the announced bytes never came"
        return "truncated chunked body"

    def _head(self, raw: bytes) -> None:
        head = _parse_head(raw, self.max_bytes, self.head_only)
        if head is not None:  # else an interim answer (100 Continue): the real one follows
            self.status, self.headers, self.chunked, self.length, self.keep_alive = head

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


#: What a response's head says: status, headers (names lower-case), chunked, the body's announced length
#: (None: chunked or until close), whether the connection may be used again.
_Head = tuple[int, dict[str, str], bool, "int | None", bool]


def _parse_head(raw: bytes, max_bytes: int, head_only: bool) -> _Head | None:
    """A response's status line and headers (``raw``: the bytes before the blank line); None for an
    interim answer (1xx). Raises _Invalid / _Oversized (an announced length past ``max_bytes``)."""
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
    if 100 <= status < 200:
        return None
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length: int | None = None
    declared = headers.get("content-length")
    if status in _NO_BODY or head_only:
        chunked, length = False, 0
    elif not chunked and declared:
        refused = announced_length_fault(declared, max_bytes)
        if refused is not None:
            kind, detail = refused
            raise _Oversized(detail, status) if kind == "oversized" else _Invalid(detail)
        length = int(declared)
    framed = chunked or length is not None
    keep_alive = framed and parts[0] == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    return status, headers, chunked, length, keep_alive


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
    addr: tuple[Any, ...] | None = None  # the socket address; () for a URL that never connects
    family: int = socket.AF_INET
    sock: socket.socket | None = None
    tls_sock: ssl.SSLSocket | None = None  # ``sock`` once TLS is put on it (``wrapped``)
    ask: Ask | None = None
    out: bytes = b""
    resp: _Response | None = None
    asked_at: float = 0.0
    reused: bool = False  # the request in flight went over a connection an earlier one used
    got_bytes: bool = False
    done: bool = False
    tls: bool = False  # https: the socket is wrapped once connected, then the handshake runs
    connecting: bool = False  # resolve + connect + handshake under way (``connect_timeout_s``)
    wrapped: bool = False  # the socket is the TLS one: its handshake runs until ``connecting`` ends
    resolving: bool = False  # waiting in ``_Resolver.waiting`` for its host's address

    # What the loop's order of events guarantees, said once: the selector reports only a job whose
    # socket is registered, and a job is registered only while a request (its ask and response) is out.
    def conn(self) -> socket.socket:
        if self.sock is None:
            raise RuntimeError(f"{self.host}:{self.port}: no connection (the loop's order of events broke)")
        return self.sock

    def asked(self) -> Ask:
        if self.ask is None:
            raise RuntimeError(f"{self.host}:{self.port}: no request (the loop's order of events broke)")
        return self.ask

    def response(self) -> _Response:
        if self.resp is None:
            raise RuntimeError(f"{self.host}:{self.port}: no response (the loop's order of events broke)")
        return self.resp


_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")  # a space or a control character in a request target
_BAD_HEADER = re.compile(r"[\r\n\x00]")  # what would end a header line early: header injection


def _request_bytes(job: _Job, ask: Ask) -> bytes:
    """The request's bytes (:func:`_request_head` of the job's endpoint)."""
    return _request_head(job.host, job.port, job.tls, job.path, job.query, ask)


# the default headers' lines, and their names as a caller's own would replace them
_DEFAULT_LINES = tuple((name.lower(), f"{name}: {value}") for name, value in _DEFAULT_HEADERS)
_DEFAULT_FIELDS = "".join(f"{line}\r\n" for _, line in _DEFAULT_LINES)


def _request_head(host: str, port: int, tls: bool, path: str, query: str, ask: Ask) -> bytes:
    """The bytes of ``ask`` to an endpoint (its ``path`` and ``query``: ``"?..."`` or ``""``). Raises ValueError for
    a target or header that would break the framing (a control character or space in the target, CR/LF/NUL in a
    header: header injection) or that is not latin-1, as ``http.client`` refuses them. An ask without headers of
    its own (``/health``) sends the default ones, joined once (issue 29: a poll of the chaos fleet makes ~300)."""
    target = (path.rstrip("/") + ask.path if ask.path else path or "/") + query
    if ask.headers:
        asked = {name.lower() for name, _ in ask.headers}
        lines = [line for name, line in _DEFAULT_LINES if name not in asked]
        lines += [f"{name}: {value}" for name, value in ask.headers]
        fields = "\r\n".join(lines) + "\r\n"
    else:
        fields = _DEFAULT_FIELDS
    if ask.body is not None:
        fields += f"Content-Length: {len(ask.body)}\r\n"
    if _BAD_TARGET.search(target):
        raise ValueError("the request target holds a space or a control character")
    for name, value in ask.headers:
        if _BAD_HEADER.search(name) or _BAD_HEADER.search(value):
            raise ValueError("a request header holds CR, LF or NUL")
    shown = f"[{host}]" if ":" in host else host
    if port != (443 if tls else 80):  # as http.client: the default port goes unsaid
        shown = f"{shown}:{port}"
    try:
        head = f"{ask.method} {target} HTTP/1.1\r\nHost: {shown}\r\n{fields}\r\n".encode("latin-1")
    except UnicodeEncodeError:  # its message would quote a character of the header (a secret, maybe)
        raise ValueError("a request header or target is not latin-1 text") from None
    return head + ask.body if ask.body else head


def _os_fault(exc: OSError, elapsed: float, reused_quietly: bool) -> HttpFault | None:
    """A socket error as ``request`` reports it; None: retry on a fresh connection (a reused
    keep-alive connection the server had closed before this request got a byte)."""
    if reused_quietly and exc.errno in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED):
        return None
    return _refused(exc, elapsed)


def _refused(exc: OSError, elapsed: float) -> HttpFault:
    """A socket error on a connection that is no quiet retry, as ``request`` reports it."""
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
        self._todo: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
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
        out: list[tuple[str, Any]] = []
        while True:
            try:
                host, outcome = self._done.get_nowait()
            except queue.Empty:
                return out
            self.answers[host] = outcome
            out.append((host, outcome))


def _address(outcome: Any, port: int, elapsed: float) -> tuple[int, tuple[Any, ...]] | HttpFault:
    if isinstance(outcome, socket.gaierror):
        return HttpFault("refused", f"cannot resolve host: {outcome.strerror or outcome}", elapsed)
    if isinstance(outcome, BaseException):
        return HttpFault("invalid", printable(f"cannot resolve host: {type(outcome).__name__}: {outcome}"), elapsed)
    family, sockaddr = outcome
    return family, (sockaddr[0], port, *sockaddr[2:])


class _Loop:
    """The selector loop behind :func:`run_exchanges` (one per call, in the calling thread)."""

    def __init__(self, deadline_s: float, max_open: int, connect_timeout_s: float | None = None) -> None:
        self.deadline_s = deadline_s
        self.connect_timeout_s = connect_timeout_s
        self.tls_context: Any = None  # made once per loop, by the first https connection
        self.wait_errors: tuple[type[OSError], ...] = (BlockingIOError,)  # + ssl's "want read/write"
        self.max_open = max(1, max_open)
        self.sel = selectors.DefaultSelector()
        self.results: dict[Any, Any] = {}
        self.heap: list[tuple[float, int, _Job]] = []  # deadlines: each job's, and connect timeouts
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
            at, _, job = heapq.heappop(self.heap)
            if not job.done and (at >= job.stop_at or job.connecting):
                self._fail(job, self._timeout(job))

    def _start(self, key: Any, parts: Any, factory: Callable[[], Exchange]) -> None:
        now = time.monotonic()
        tls = parts is not None and parts.scheme == "https"
        host, port = (parts.hostname, parts.port or (443 if tls else 80)) if parts is not None else ("", 0)
        path = parts.path if parts is not None else ""
        query = f"?{parts.query}" if parts is not None and parts.query else ""
        job = _Job(key, factory(), host, port, path, query, self.deadline_s, now + self.deadline_s, tls=tls)
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
                ask = next(job.gen) if result is None else job.gen.send(result)
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
        try:
            job.ask, job.asked_at, job.out = ask, now, _request_bytes(job, ask)
        except ValueError as exc:
            return HttpFault("invalid", printable(f"cannot send this request: {exc}"))
        job.resp, job.got_bytes = _Response(ask.max_bytes, ask.method == "HEAD"), False
        if job.sock is not None:
            job.reused = True
            return self._send(job)
        job.reused = False
        return self._connect(job)

    def _connect(self, job: _Job) -> HttpFault | None:
        if not job.connecting and self.connect_timeout_s:
            connect_by = time.monotonic() + self.connect_timeout_s
            if connect_by < job.stop_at:
                heapq.heappush(self.heap, (connect_by, next(self.seq), job))
        job.connecting = True
        if job.addr is None:
            resolver = self.resolver  # a loop with a host name to resolve has one (run)
            outcome = resolver.answers.get(job.host) if resolver else None
            if outcome is None:
                if not job.resolving and resolver is not None:
                    job.resolving = True
                    resolver.waiting.setdefault(job.host, []).append(job)
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
        wake_r, resolver = self.wake_r, self.resolver
        if wake_r is None or resolver is None:  # registered only together, in run()
            return
        try:
            while wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        for host, _outcome in resolver.answered():
            for job in resolver.waiting.pop(host, []):
                job.resolving = False
                if not job.done and job.connecting and job.sock is None:
                    fault = self._connect(job)
                    if fault is not None:
                        self._advance(job, fault)

    def _ready(self, job: _Job, mask: int) -> None:
        if job.connecting:
            self._connected(job)
        elif job.out:
            fault = self._send(job)
            if fault is not None:
                self._fail(job, fault)
        else:
            self._receive(job)

    def _connected(self, job: _Job) -> None:
        """The connecting socket is ready: the connect failed, or it is made (then, for https, one
        more step of the TLS handshake), and the request goes out."""
        elapsed = time.monotonic() - job.asked_at
        if not job.wrapped:
            err = job.conn().getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._fail(job, _refused(OSError(err, "connect failed"), elapsed))
                return
            if job.tls:
                self._wrap(job)
        if job.tls_sock is not None:
            try:
                job.tls_sock.do_handshake()
            except self.wait_errors as exc:
                want_read = type(exc).__name__ == "SSLWantReadError"
                self.sel.modify(job.tls_sock, selectors.EVENT_READ if want_read else selectors.EVENT_WRITE, job)
                return
            except OSError as exc:  # ssl.SSLError (a bad certificate, not TLS at all) is an OSError
                self._fail(job, _refused(exc, elapsed))
                return
        job.connecting = False
        fault = self._send(job)
        if fault is not None:
            self._fail(job, fault)

    def _wrap(self, job: _Job) -> None:
        """Put TLS on the connected socket (``ssl`` is imported only by a loop with an https URL)."""
        if self.tls_context is None:
            import ssl

            self.tls_context = ssl.create_default_context()
            self.wait_errors = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
        plain = job.conn()
        self.sel.unregister(plain)
        job.sock = job.tls_sock = self.tls_context.wrap_socket(plain, server_hostname=job.host,
                                                               do_handshake_on_connect=False)
        self.sel.register(job.sock, selectors.EVENT_WRITE, job)
        job.wrapped = True

    def _receive(self, job: _Job) -> None:
        """Read what is there and feed it to the framing; a TLS socket may hold decrypted bytes
        that ``select`` cannot see (``pending``), so those are read on at once."""
        while True:
            try:
                data = job.conn().recv(_RECV)
            except self.wait_errors:
                return
            except OSError as exc:
                self._error(job, exc)
                return
            if not data:
                self._eof(job)
                return
            job.got_bytes = True
            try:
                complete = job.response().feed(data)
            except _Invalid as exc:
                self._fail(job, HttpFault("invalid", printable(str(exc)), time.monotonic() - job.asked_at))
                return
            except _Oversized as exc:
                self._fail(job, HttpFault("oversized", str(exc), time.monotonic() - job.asked_at, status=exc.status))
                return
            if complete:
                self._complete(job)
                return
            if not (job.tls_sock is not None and job.tls_sock.pending()):
                return

    def _send(self, job: _Job) -> HttpFault | None:
        try:
            sent = job.conn().send(job.out)
        except self.wait_errors:
            sent = 0
        except OSError as exc:
            fault = _os_fault(exc, time.monotonic() - job.asked_at, job.reused)
            if fault is None:
                self._close(job)
                return self._reconnect(job)
            return fault
        job.out = job.out[sent:]
        self.sel.modify(job.conn(), selectors.EVENT_WRITE if job.out else selectors.EVENT_READ, job)
        return None

    def _reconnect(self, job: _Job) -> HttpFault | None:
        """The kept connection was closed under us before any answer: once more on a new one."""
        ask = job.asked()
        job.reused, job.out = False, _request_bytes(job, ask)
        job.resp = _Response(ask.max_bytes, ask.method == "HEAD")
        return self._connect(job)

    def _error(self, job: _Job, exc: OSError) -> None:
        fault = _os_fault(exc, time.monotonic() - job.asked_at, job.reused and not job.got_bytes)
        self._close(job)
        if fault is None:
            fault = self._reconnect(job)
        if fault is not None:
            self._advance(job, fault)

    def _eof(self, job: _Job) -> None:
        resp, elapsed = job.response(), time.monotonic() - job.asked_at
        if resp.eof():
            self._complete(job)
            return
        self._close(job)
        if not job.got_bytes and job.reused:
            fault = self._reconnect(job)
        elif not job.got_bytes:
            fault = HttpFault("refused", "connection reset: Remote end closed connection without response", elapsed)
        else:
            fault = HttpFault("invalid", resp.cut_short(), elapsed, status=resp.status or None)
        if fault is not None:
            self._advance(job, fault)

    def _complete(self, job: _Job) -> None:
        resp = job.response()
        result = HttpResult(status=resp.status, body=bytes(resp.body), elapsed_s=time.monotonic() - job.asked_at,
                            headers=resp.headers or {})
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
        job.connecting = job.wrapped = False
        if job.sock is not None:
            self.sel.unregister(job.sock)
            job.sock.close()
            job.sock = job.tls_sock = None

    def _finish(self, job: _Job, value: Any) -> None:
        self._close(job)
        job.done = True
        self.open_jobs -= 1
        self.results[job.key] = value


def run_exchanges(
    items: Iterable[tuple[Any, str, Callable[[], Exchange]]], *, deadline_s: float, max_open: int,
    connect_timeout_s: float | None = None,
) -> dict[Any, Any]:
    """Run every ``(key, base_url, exchange_factory)`` → ``{key: the exchange's return value}``.

    Each exchange is started (its factory called) when it gets one of the ``max_open`` places and
    has ``deadline_s`` from then for everything it asks; ``connect_timeout_s`` (if given) bounds
    each resolve + connect + TLS handshake within it. Only what the exchange code itself raises
    propagates; the network's failures are the :class:`HttpFault` answers it is sent."""
    plan = [(key, _http_parts(url), factory) for key, url, factory in items]
    if _network is not None:
        return {key: _on_network(_network, parts, factory(), deadline_s) for key, parts, factory in plan}
    return _Loop(deadline_s, max_open, connect_timeout_s).run(plan)


class Network(Protocol):
    """An in-process network, for tests and ``benchmarks/chaos.py`` (issue 29), installed with
    :func:`use_network`: it is handed the bytes this module would send and answers the bytes a
    server would, which go through this module's own framing. ``(None, s)``: no answer at all (a
    stopped server); an ``OSError``: the connection failed (refused). ``s``: the seconds the answer
    took, counted against the exchange's deadline. Production never installs one."""

    def answer(self, host: str, port: int, request: bytes) -> tuple[bytes | None, float] | OSError: ...


_network: Network | None = None


@contextlib.contextmanager
def use_network(network: Network) -> Iterator[None]:
    """Every request of this process goes to ``network`` instead of a socket while the block runs."""
    global _network
    previous, _network = _network, network
    try:
        yield
    finally:
        _network = previous


def workers(max_workers: int, name: str) -> Any:
    """A pool (``concurrent.futures.Executor``) for calls that wait on the network at once: the poll's GPU
    source and LiteLLM beside its llama-server probes, on threads. On an installed :class:`Network` nothing
    waits — every answer is made in the calling thread — so they run there, each when submitted: the same
    calls with the same answers, without threads that only contend for the GIL (the chaos week's every poll
    ran four, issue 29)."""
    if _network is not None:
        return _InThisThread()
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)


class _InThisThread:
    """:func:`workers` on an in-process network: ``submit`` runs the call at once; its future holds the outcome."""

    def __enter__(self) -> _InThisThread:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        from concurrent.futures import Future

        done: Future[Any] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - raised again by result(), as a thread's would be
            done.set_exception(exc)
        return done

    def map(self, fn: Callable[..., Any], *iterables: Any) -> Iterator[Any]:
        return (self.submit(fn, *args).result() for args in zip(*iterables, strict=False))


def _on_network(network: Network, parts: Any, gen: Exchange, deadline_s: float) -> Any:
    """One exchange on :class:`Network`: the loop's request bytes and framing, the answer's seconds summed
    against ``deadline_s`` as the loop's clock would count them."""
    tls, host, port, path, query = _endpoint(parts) if parts else (False, "", 0, "", "")
    spent = 0.0
    answer: HttpResult | HttpFault | None = None
    while True:
        try:
            ask = next(gen) if answer is None else gen.send(answer)
        except StopIteration as stop:
            return stop.value
        if parts is None:
            answer = HttpFault("invalid", "not an http(s) URL with a host and a valid port")
            continue
        try:
            got = network.answer(host, port, _request_head(host, port, tls, path, query, ask))
        except ValueError as exc:
            answer = HttpFault("invalid", printable(f"cannot send this request: {exc}"))
            continue
        if isinstance(got, OSError):
            answer = _os_fault(got, 0.0, False) or HttpFault("refused", "connection refused")
            continue
        raw, took_s = got
        spent += took_s
        if raw is None or spent >= deadline_s:
            answer = HttpFault("timeout", f"no complete answer within {deadline_s:g} s", deadline_s)
            continue
        answer = _framed(raw, ask, took_s)


_ENDPOINTS: dict[Any, tuple[bool, str, int, str, str]] = {}
_HEADS: dict[tuple[bytes, int, bool], _Head | None] = {}
_MAX_REMEMBERED = 4096
_UNPARSED: Any = object()  # not in _HEADS (a parsed head may be None)
_MAX_REMEMBERED_BYTES = 4096  # a longer head is not remembered (the memo's memory stays small)


def _endpoint(parts: Any) -> tuple[bool, str, int, str, str]:
    """``(tls, host, port, path, query)`` of a URL's ``urlsplit`` parts, remembered (``hostname`` and ``port``
    parse the netloc again at each reading)."""
    got: tuple[bool, str, int, str, str] = remembered(_ENDPOINTS, parts, _endpoint_new, _MAX_REMEMBERED)
    return got


def _endpoint_new(parts: Any) -> tuple[bool, str, int, str, str]:
    """What :func:`_endpoint` remembers: an https URL's default port is 443, an http one's 80."""
    tls = parts.scheme == "https"
    return tls, parts.hostname, parts.port or (443 if tls else 80), parts.path, f"?{parts.query}" if parts.query else ""


def _framed(raw: bytes, ask: Ask, elapsed_s: float) -> HttpResult | HttpFault:
    """A whole answer (the peer then closed) through :class:`_Response`, as :meth:`_Loop._receive`
    and :meth:`_Loop._eof` take it. An answer whose head announces a length its body fills is cut
    out at once, its head's parse remembered (:func:`_parse_head` is pure; the same few heads come
    from every server of a poll): what :class:`_Response` makes of it (tests/test_http_framing.py)."""
    end = raw.find(b"\r\n\r\n", 0, _MAX_REMEMBERED_BYTES + 4)
    if end >= 0:
        key = (raw[:end], ask.max_bytes, ask.method == "HEAD")
        head = _HEADS.get(key, _UNPARSED)  # None: an interim answer's head (1xx)
        if head is _UNPARSED:
            try:
                head = _parse_head(*key)
            except (_Invalid, _Oversized):
                head = None  # what _Response says of it, below
            else:
                if len(_HEADS) >= _MAX_REMEMBERED:
                    _HEADS.clear()
                _HEADS[key] = head
        if head is not None and head[3] is not None and not head[2] and len(raw) >= end + 4 + head[3]:
            body = raw[end + 4 : end + 4 + head[3]]
            return HttpResult(status=head[0], body=body, elapsed_s=elapsed_s, headers=dict(head[1]))
    return _framed_by_response(raw, ask, elapsed_s)


def _framed_by_response(raw: bytes, ask: Ask, elapsed_s: float) -> HttpResult | HttpFault:
    """What :class:`_Response` alone makes of a whole answer the peer then closed: the general path, which
    :func:`_framed`'s shortcut must equal (tests/test_http_inprocess_memo.py)."""
    resp = _Response(ask.max_bytes, ask.method == "HEAD")
    try:
        complete = resp.feed(raw) if raw else False
    except _Invalid as exc:
        return HttpFault("invalid", printable(str(exc)), elapsed_s)
    except _Oversized as exc:
        return HttpFault("oversized", str(exc), elapsed_s, status=exc.status)
    if complete or resp.eof():
        return HttpResult(status=resp.status, body=bytes(resp.body), elapsed_s=elapsed_s, headers=resp.headers or {})
    if not raw:
        return HttpFault("refused", "connection reset: Remote end closed connection without response", elapsed_s)
    return HttpFault("invalid", resp.cut_short(), elapsed_s, status=resp.status or None)


_PARTS: dict[str, Any] = {}


def forget_remembered() -> None:
    """Empty this module's memos (:func:`_endpoint`, :func:`_framed`'s heads,
    :func:`_http_parts`), as a new process starts empty. Cron starts a new process for every run, so a
    benchmark that runs many runs in one process (``benchmarks/chaos.py``) calls this between them, to pay
    what cron pays rather than reuse the minute before's work (issue 29)."""
    for memo in (_ENDPOINTS, _HEADS, _PARTS):
        memo.clear()


def _http_parts(url: str) -> Any:
    """:func:`_http_parts_new`, remembered by the URL (a poll sends to the same endpoints every minute: a
    100-GPU chaos week checked its URLs ~1.5 million times, issue 29)."""
    return remembered(_PARTS, url, _http_parts_new, _MAX_REMEMBERED)


def _http_parts_new(url: str) -> Any:
    """``urlsplit`` of an http(s) URL with a host and a valid port; None otherwise."""
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return None
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return None
    return parts


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
    transport failures, bad framing and the size cap become :class:`HttpFault`."""

    def one() -> Exchange:
        return (yield Ask("", tuple((headers or {}).items()), max_bytes, method, body))

    got: HttpResult | HttpFault = run_exchanges([(0, url, one)], deadline_s=deadline_s, max_open=1,
                                                connect_timeout_s=connect_timeout_s)[0]
    return got
