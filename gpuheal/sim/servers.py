"""Loopback HTTP servers of the simulated fleet: gpu-monitor, LiteLLM, llama-servers, control.

Each is a ``ThreadingHTTPServer`` with daemon handler threads that tracks its client sockets, so
``close()`` returns at once even while clients hang on a ``hang``/``stuck``/``dribble`` fault:
every wait in a handler wakes on the fleet's stop flag or on its server closing, and the
tracked sockets are shut down. Request logs are off unless ``verbose``.
"""

from __future__ import annotations

import functools
import json
import math
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from gpuheal.memo import remembered

from . import llama
from .inprocess import parse_request
from .scenario import ScenarioError, iso
from .world import World

JSON = "application/json; charset=utf-8"
MAX_BODY = 16 * 1024 * 1024
DRIBBLE_INTERVAL_S = 0.5
OVERSIZED_BYTES = 2 * 1024 * 1024 + 4096  # "~2 MB": above 2 MiB, far above a 1 MiB cap
GARBAGE = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR<html><body><h1>502 Bad Gateway</h1>"
    b'\xff\xfe\x00 upstream sent too big header {"gpus": [\x00\x01\x02'
)


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        world: World,
        alias: str | None = None,
        verbose: bool = False,
    ):
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.world = world
        self.alias = alias
        self.verbose = verbose
        self.closing = threading.Event()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup: skip it.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = port

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
            self._conns.clear()
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        if self.verbose:
            super().handle_error(request, client_address)


class Listener:
    """One port that can be opened and closed again (``dead``/``down`` = connection refused)."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        handler: type[BaseHTTPRequestHandler],
        world: World,
        *,
        alias: str | None = None,
        verbose: bool = False,
    ):
        self.name = name
        self.host = host
        self.port = port
        self.handler = handler
        self.world = world
        self.alias = alias
        self.verbose = verbose
        self.server: SimHTTPServer | None = None
        self.thread: threading.Thread | None = None

    @property
    def is_open(self) -> bool:
        return self.server is not None

    def open(self) -> None:
        if self.server is not None:
            return
        srv = SimHTTPServer(
            (self.host, self.port),
            self.handler,
            world=self.world,
            alias=self.alias,
            verbose=self.verbose,
        )
        self.port = srv.server_address[1]
        self.server = srv
        self.thread = threading.Thread(
            target=srv.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"gpuheal-sim-{self.name}",
            daemon=True,
        )
        self.thread.start()

    def close(self) -> None:
        srv, self.server = self.server, None
        if srv is None:
            return
        srv.closing.set()
        srv.shutdown()
        srv.server_close()
        srv.close_connections()


# --------------------------------------------------------------------------- handler base


def answer_head(
    server: str, date: str, status: int, ctype: str, length: int, extra: str, close: bool, protocol: str = "HTTP/1.1"
) -> bytes:
    """The status line and headers :meth:`_Base.send` writes in one piece (``extra``: the caller's own
    header lines), shared with :func:`llama_answer`, so the two cannot drift apart."""
    message = _RESPONSES[status][0] if status in _RESPONSES else ""
    return (f"{protocol} {status:d} {message}\r\nServer: {server}\r\n"
            f"Date: {date}\r\nAccess-Control-Allow-Origin: \r\n{extra}"
            f"Content-Type: {ctype}\r\nContent-Length: {length}\r\n"
            f"{'Connection: close' if close else 'Keep-Alive: timeout=5, max=100'}\r\n\r\n").encode("latin-1", "strict")


_RESPONSES = BaseHTTPRequestHandler.responses


class _Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30  # an idle keep-alive connection gives its thread back after this
    # TCP_NODELAY, so the body goes out behind the headers at once: the real llama-server answers a
    # second request on a kept-alive connection in < 1 ms, where Nagle's algorithm here held the body
    # until the client's delayed ACK, ~40 ms (every /metrics of a check; tests/test_sim.py)
    disable_nagle_algorithm = True
    server_header = "gpuheal-sim"
    server: SimHTTPServer

    def version_string(self) -> str:
        return self.server_header

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.verbose:
            sys.stderr.write(
                f"[sim {self.server_header}] {self.address_string()} {format % args}\n"
            )

    @property
    def world(self) -> World:
        return self.server.world

    def date_time_string(self, timestamp: float | None = None) -> str:
        # The Date header follows the virtual clock too: nothing the sim sends is wall time.
        return self.world.http_date()

    def _run(self) -> None:
        try:
            self.dispatch()
        except (ConnectionError, TimeoutError, OSError):
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _run

    def dispatch(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def route(self) -> str:
        return urlsplit(self.path).path

    def read_body(self) -> bytes:
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = 0
        if n <= 0:
            return b""
        return self.rfile.read(min(n, MAX_BODY))

    def send(
        self,
        status: int,
        body: bytes,
        ctype: str = JSON,
        *,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        if self.request_version == "HTTP/0.9" or getattr(self, "_headers_buffer", None):
            return self._send_by_header(status, body, ctype, headers=headers, close=close)
        # What send_response, send_header and end_headers write, in one piece (issue 29: the chaos week
        # answers ~3 million requests; byte for byte the same, tests/test_sim_inprocess.py)
        if self.server.verbose:  # log_message writes only then: log_request's formatting spared
            self.log_request(status)
        extra = ""
        for k, v in (headers or {}).items():
            extra += f"{k}: {v}\r\n"
            if k.lower() == "connection" and v.lower() in ("close", "keep-alive"):
                self.close_connection = v.lower() == "close"
        if close:
            self.close_connection = True
        self.wfile.write(answer_head(self.version_string(), self.date_time_string(), status, ctype, len(body),
                                     extra, close, self.protocol_version))
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_by_header(
        self, status: int, body: bytes, ctype: str, *, headers: dict[str, str] | None, close: bool
    ) -> None:
        """:meth:`send` through ``BaseHTTPRequestHandler``'s own header calls (an HTTP/0.9 request, or
        headers already buffered): what :meth:`send`'s one piece is measured against."""
        self.send_response(status)
        self.send_header("Access-Control-Allow-Origin", "")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Keep-Alive", "timeout=5, max=100")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, obj: Any, **kw: Any) -> None:
        self.send(status, json.dumps(obj).encode("utf-8"), **kw)

    def aborted(self) -> bool:
        return self.server.closing.is_set() or self.world.stopped.is_set()

    def wait(self, seconds: float, until: Callable[[], bool] | None = None) -> bool:
        """Sleep up to ``seconds`` real seconds; True if cut short by stop/close/``until``. Served in
        process (:mod:`gpuheal.sim.inprocess`), the seconds are counted, not slept."""
        virtual = getattr(self.server, "virtual_wait", None)
        if virtual is not None:
            return bool(virtual(seconds))
        deadline = time.monotonic() + seconds
        while True:
            if self.aborted() or (until is not None and until()):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.world.stopped.wait(min(0.05, left))

    def hang(self, until: Callable[[], bool]) -> None:
        """Never answer: hold the connection until stop, close, or ``until()``; then drop it."""
        self.wait(math.inf, until)
        self.close_connection = True


# --------------------------------------------------------------------------- llama-server


_PUBLIC = {"/health", "/v1/health", "/models", "/v1/models"}
_COMPLETION = {"/completion", "/completions", "/v1/completions"}
_CHAT = {"/v1/chat/completions", "/chat/completions"}


@functools.lru_cache(maxsize=64)
def _api_keys(accepted: str) -> frozenset[str]:
    """The keys of a server's ``--api-key`` list (comma-separated), remembered: every request asks."""
    return frozenset(k.strip() for k in accepted.split(",") if k.strip())


class LlamaHandler(_Base):
    """A llama-server look-alike. Order of checks as in the real server: loading, key, route."""

    server_header = "llama.cpp"

    def dispatch(self) -> None:
        world, alias = self.world, self.server.alias
        with world.lock:
            g = world.gpus[alias]
            fault, gen = g.fault, g.generation
            loading = g.is_loading()
            key = g.accepted_key()
        changed = lambda: g.generation != gen  # noqa: E731

        if fault in ("hang", "unreachable"):  # stopped, or its host is off the network: no answer at all
            return self.hang(changed)
        body = self.read_body()
        if loading:
            return self.send(503, llama.LOADING_BODY, close=True)
        if self.command == "OPTIONS":  # CORS preflight bypasses the key check
            return self.send(
                200,
                b"",
                "text/plain",
                headers={
                    "Access-Control-Allow-Methods": "GET, POST",
                    "Access-Control-Allow-Headers": "*",
                },
            )
        path = self.route.rstrip("/") or "/"
        if path not in _PUBLIC and key is not None and not self._authorized(key):
            return self.send(401, llama.UNAUTHORIZED_BODY, close=True)

        get = self.command in ("GET", "HEAD")
        if get and path in ("/health", "/v1/health"):
            return self.send(200, llama.HEALTH_OK_BODY)
        if get and path in ("/models", "/v1/models"):
            with world.lock:
                doc = llama.models(
                    model_path=g.model_path,
                    n_ctx=int(g.values["n_ctx"]),
                    parallel=g.spec.parallel,
                    created=int(world.now().timestamp()),
                )
            return self.send(200, llama.dumps(doc))
        if get and path == "/props":
            with world.lock:
                body = llama.props_body(g.model_path, int(g.values["n_ctx"]), g.spec.parallel, g.metrics)
            return self.send(200, body)
        if get and path == "/slots":
            if fault in ("stuck", "decode-hang", "taskloop-hang"):  # served by the (wedged) task loop: hangs too
                return self.hang(changed)
            with world.lock:
                busy = min(g.inflight + int(g.values.get("busy_slots") or 0), g.spec.parallel)
                body = llama.slots_body(int(g.values["n_ctx"]), g.spec.parallel, busy)
            q = parse_qs(urlsplit(self.path).query)
            if q.get("fail_on_no_slot") and busy >= g.spec.parallel:
                return self.send(503, llama.NO_SLOT_BODY, close=True)
            return self.send(200, body)
        if get and path == "/metrics":
            if fault == "taskloop-hang" and g.metrics:  # 501 comes from the HTTP thread; the rest from the loop
                return self.hang(changed)
            return self._metrics(g, wedged=fault == "decode-hang")
        if self.command == "POST" and (path in _COMPLETION or path in _CHAT):
            return self._complete(g, body, chat=path in _CHAT, changed=changed, fault=fault)
        return self.send(404, llama.NOT_FOUND_BODY, close=True)

    def _authorized(self, accepted: str) -> bool:
        keys = _api_keys(accepted)
        auth = (self.headers.get("Authorization") or "").strip()
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else auth
        if given and given in keys:
            return True
        xkey = (self.headers.get("X-Api-Key") or "").strip()
        return bool(xkey) and xkey in keys

    def _metrics(self, g: Any, wedged: bool = False) -> None:
        with self.world.lock:
            scraped = metrics_scrape(self.world, g, wedged)
        if scraped is None:
            return self.send(501, llama.METRICS_DISABLED_BODY, close=True)
        body, start_us = scraped
        self.send(200, body, _METRICS_CTYPE, headers={"Process-Start-Time-Unix": str(start_us)})

    def _complete(
        self, g: Any, body: bytes, *, chat: bool, changed: Callable[[], bool], fault: str
    ) -> None:
        try:
            req = json.loads(body.decode("utf-8") if body else "{}")
        except (ValueError, UnicodeDecodeError) as exc:
            msg = f"[json.exception.parse_error.101] parse error: syntax error while parsing value - {exc}"
            return self.send(500, llama.server_error_body(msg), close=True)
        if not isinstance(req, dict):
            return self.send(
                400,
                llama.error_body(
                    400, "request body must be a JSON object", "invalid_request_error"
                ),
                close=True,
            )
        if fault in ("stuck", "taskloop-hang"):  # /health says ok, inference never returns (the lying /health)
            return self.hang(changed)
        if fault == "decode-hang":  # queued behind the wedged slot: never decoded, never answered
            with self.world.lock:
                g.hung_requests += 1
            try:
                return self.hang(changed)
            finally:
                with self.world.lock:
                    g.hung_requests = max(0, g.hung_requests - 1)
        if fault == "failing":
            return self.send(
                500,
                llama.server_error_body(
                    "CUDA error: an illegal memory access was encountered"
                    if g.spec.vendor == "nvidia"
                    else "ROCm error: HIP out of memory"
                ),
                close=True,
            )
        if chat:
            n = req.get("max_tokens", req.get("max_completion_tokens", req.get("n_predict")))
            messages = req.get("messages")
            if not isinstance(messages, list) or not messages:
                return self.send(
                    400,
                    llama.error_body(400, "'messages' is required", "invalid_request_error"),
                    close=True,
                )
            text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            prompt_n = llama.count_tokens(text) + 4 * len(messages)
            prompt = text
        else:
            n = req.get("n_predict", req.get("max_tokens"))
            p = req.get("prompt", "")
            prompt = (
                p
                if isinstance(p, str)
                else " ".join(str(x) for x in p)
                if isinstance(p, list)
                else str(p)
            )
            prompt_n = llama.count_tokens(prompt)
        if n is None:
            n = 64
        if isinstance(n, bool) or not isinstance(n, int):
            return self.send(
                400,
                llama.error_body(
                    400, "n_predict / max_tokens must be an integer", "invalid_request_error"
                ),
                close=True,
            )
        n_predict = 64 if n < 0 else n

        with self.world.lock:
            g.inflight += 1
        try:
            if fault == "slow" and self.wait(g.slow_s, changed):
                self.close_connection = True
                return None
        finally:
            with self.world.lock:
                g.inflight = max(0, g.inflight - 1)

        with self.world.lock:
            t = self.world.t
            seq = g.requests_served
            g.requests_served += 1
            timing = llama.timings(
                tok_s=g.gen_tok_s(t),
                prompt_tok_s=float(g.value("prompt_tok_s", t) or 0.0),
                prompt_n=prompt_n,
                predicted_n=n_predict,
                seq=seq,
            )
            c = g.counters
            c["prompt_tokens_total"] += prompt_n
            c["prompt_seconds_total"] += timing["prompt_ms"] / 1000.0
            c["tokens_predicted_total"] += n_predict
            c["tokens_predicted_seconds_total"] += timing["predicted_ms"] / 1000.0
            c["n_decode_total"] += n_predict
            c["n_tokens_max"] = max(c["n_tokens_max"], prompt_n + n_predict)
            g.window_tokens += n_predict
            g.window_seconds += timing["predicted_ms"] / 1000.0
            g.window_prompt_tokens += prompt_n
            g.window_prompt_seconds += timing["prompt_ms"] / 1000.0
            model_path = g.model_path
            created = int(self.world.now().timestamp())
        cid = llama.completion_id(g.alias, seq)
        stream = bool(req.get("stream"))
        if chat:
            if stream:
                opts = req.get("stream_options")
                include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
                chunks = llama.chat_stream_chunks(
                    model_path=model_path,
                    n_predict=n_predict,
                    prompt_n=prompt_n,
                    timing=timing,
                    created=created,
                    cid=cid,
                    include_usage=include_usage,
                )
                return self._stream(chunks)
            doc = llama.chat_completion(
                model_path=model_path,
                n_predict=n_predict,
                prompt_n=prompt_n,
                timing=timing,
                created=created,
                cid=cid,
            )
            return self.send(200, llama.dumps(doc))
        if stream:
            return self._stream(
                llama.completion_stream_chunks(
                    model_path=model_path,
                    prompt=prompt,
                    n_predict=n_predict,
                    prompt_n=prompt_n,
                    timing=timing,
                    request=req,
                )
            )
        doc = llama.completion(
            model_path=model_path,
            prompt=prompt,
            n_predict=n_predict,
            prompt_n=prompt_n,
            timing=timing,
            request=req,
        )
        return self.send(200, llama.dumps(doc))

    def _stream(self, chunks: list[bytes]) -> None:
        self.send_response(200)
        self.send_header("Access-Control-Allow-Origin", "")
        self.send_header("X-Accel-Buffering", "no")
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Keep-Alive", "timeout=5, max=100")
        self.end_headers()
        for c in chunks:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(c), c))
        self.wfile.write(b"0\r\n\r\n")


_METRICS_CTYPE = "text/plain; version=0.0.4"


def metrics_scrape(world: World, g: Any, wedged: bool) -> tuple[bytes, int] | None:
    """``GET /metrics`` of ``g`` under ``world.lock`` (the caller holds it): the body and the process's
    start (its ``Process-Start-Time-Unix`` header), None if the server runs without ``--metrics``.
    Each scrape resets the throughput gauges' window."""
    if not g.metrics:
        return None
    values: dict[str, float] = dict(g.counters)
    values["n_decode_total"] = int(g.decoded(world.t))
    values["prompt_tokens_seconds"] = g.window_prompt_tokens / g.window_prompt_seconds if g.window_prompt_seconds else 0
    values["predicted_tokens_seconds"] = g.window_tokens / g.window_seconds if g.window_seconds else 0
    g.window_tokens = g.window_seconds = 0.0
    g.window_prompt_tokens = g.window_prompt_seconds = 0.0
    values["requests_processing"] = min(g.inflight + int(g.values.get("busy_slots") or 0), g.spec.parallel)
    values["requests_deferred"] = int(g.values.get("queued") or 0)
    if wedged:  # a request sits in its slot and n_decode_total no longer moves
        values["requests_processing"] = max(1, g.inflight)
        values["requests_deferred"] = int(g.values.get("queued") or 0) + g.hung_requests
    values["n_busy_slots_per_decode"] = 1 if g.counters["n_decode_total"] else 0
    return llama.metrics_text(values), g.process_start_us


class LlamaGet(NamedTuple):
    """What :meth:`LlamaHandler.dispatch` reads of a ``GET`` of ``/health``, ``/props`` or ``/metrics``:
    the route and the two ways a key is given (``_authorized``'s reading of the headers)."""

    path: str
    bearer: str
    xkey: str


_FAST_PATHS = {"/health", "/v1/health", "/props", "/metrics"}
_LLAMA_GETS: dict[bytes, LlamaGet | None] = {}
_MAX_LLAMA_GETS = 4096
_HANDLER_ONLY = ("hang", "unreachable", "taskloop-hang")  # faults whose answers may never come


def _llama_get(request: bytes) -> LlamaGet | None:
    """:class:`LlamaGet` of a request's bytes, remembered (a poll asks every server the same three), or
    None for any other request (another method or route, a malformed one): the handler answers those."""
    got: LlamaGet | None = remembered(_LLAMA_GETS, request, _llama_get_new, _MAX_LLAMA_GETS)
    return got


def _llama_get_new(request: bytes) -> LlamaGet | None:
    parsed = parse_request(request)
    if parsed is None or parsed[0] != "GET":
        return None
    try:
        path = urlsplit(parsed[1]).path.rstrip("/") or "/"
    except ValueError:  # the handler raises it (after the loading check): leave it to the handler
        return None
    if path not in _FAST_PATHS:
        return None
    headers = parsed[3]
    auth = (headers.get("Authorization") or "").strip()
    bearer = auth[7:].strip() if auth[:7].lower() == "bearer " else auth
    return LlamaGet(path, bearer, (headers.get("X-Api-Key") or "").strip())


def llama_answer(world: World, alias: str, request: bytes) -> bytes | None:
    """:class:`LlamaHandler`'s answer to a ``GET`` of ``/health``, ``/props`` or ``/metrics`` without a
    handler object (issue 29: three of every GPU's requests each poll, ~300 a minute of the chaos week):
    the same checks in the same order, the same bytes (``tests/test_sim_fast_answer.py`` compares them over
    generated requests and worlds). None, having changed nothing, for everything else and for a server
    whose fault may leave a request unanswered: the handler serves those."""
    facts = _llama_get(request)
    if facts is None:
        return None
    with world.lock:
        g = world.gpus[alias]
        fault = g.fault
        if fault in _HANDLER_ONLY:
            return None
        loading = g.is_loading()
        key = g.accepted_key()
    server = LlamaHandler.server_header
    if loading:
        return _llama_send(world, 503, llama.LOADING_BODY, True)
    path = facts.path
    if path not in _PUBLIC and key is not None:
        keys = _api_keys(key)
        if not ((facts.bearer and facts.bearer in keys) or (facts.xkey and facts.xkey in keys)):
            return _llama_send(world, 401, llama.UNAUTHORIZED_BODY, True)
    if path == "/props":
        with world.lock:
            body = llama.props_body(g.model_path, int(g.values["n_ctx"]), g.spec.parallel, g.metrics)
        return _llama_send(world, 200, body, False)
    if path == "/metrics":
        with world.lock:
            scraped = metrics_scrape(world, g, fault == "decode-hang")
            if scraped is None:
                return _llama_send(world, 501, llama.METRICS_DISABLED_BODY, True)
        body, start_us = scraped
        head = answer_head(server, world.http_date(), 200, _METRICS_CTYPE, len(body),
                           f"Process-Start-Time-Unix: {start_us}\r\n", False)
        return head + body
    return _llama_send(world, 200, llama.HEALTH_OK_BODY, False)


_SENT: dict[tuple[str, int, bytes, bool], bytes] = {}
_MAX_SENT = 64


def _llama_send(world: World, status: int, body: bytes, close: bool) -> bytes:
    """:meth:`_Base.send`'s bytes of a JSON answer of LlamaHandler, remembered for the instant (its ``Date``):
    a poll asks every server for ``/health`` and ``/props`` at one virtual second, and they answer a few
    bodies (``llama.props_body`` gives the same object for the same shape, whose hash is kept). Only the
    last instant's few are kept (a ``/props`` answer is ~2 KB)."""
    date = world.http_date()
    key = (date, status, body, close)
    sent = _SENT.get(key)
    if sent is None:
        if len(_SENT) >= _MAX_SENT or (_SENT and next(iter(_SENT))[0] != date):
            _SENT.clear()
        sent = _SENT[key] = answer_head(LlamaHandler.server_header, date, status, JSON, len(body), "", close) + body
    return sent


# --------------------------------------------------------------------------- gpu-monitor


def _corrupt(doc: dict[str, Any]) -> dict[str, Any]:
    """``invalid`` mode: well-formed JSON, wrong types: strings for numbers, NaN, negatives."""
    for i, g in enumerate(doc.get("gpus", [])):
        if "temp_c" in g:
            g["temp_c"] = str(g["temp_c"])
        if "vram_used_mb" in g:
            g["vram_used_mb"] = math.nan
        if "util_pct" in g:
            g["util_pct"] = -1 - i
        if "power_w" in g:
            g["power_w"] = "[N/A]"
        if "vram_total_mb" in g:
            g["vram_total_mb"] = -abs(g["vram_total_mb"])
    for b in doc.get("benchmarks", {}).values():
        b["current_tok_s"] = math.nan
        b["baseline_tok_s"] = str(b.get("baseline_tok_s"))
    summary = doc.get("summary", {})
    for m in summary.get("available_models", []):
        m["requests_60s"] = str(m["requests_60s"])
        m["failures_60s"] = -1
        m["consecutive_timeouts"] = math.nan
    summary["circuit_breakers_open"] = str(summary.get("circuit_breakers_open"))
    if "strix" in doc:
        s = doc["strix"]
        s["running"] = "yes"
        s["temp_c"] = str(s.get("temp_c"))
        s["vram_used_mb"] = -abs(s.get("vram_used_mb") or 1)
    return doc


def _oversize(body: bytes) -> bytes:
    """Append a router-style request log (unknown field, L5) until the body is ~2 MB."""
    entry = (
        b'{"t":"2026-07-18T07:59:59Z","model":"gpu-dense","route":"/v1/chat/completions",'
        b'"status":200,"latency_ms":812,"prompt_tokens":1210,"completion_tokens":256}'
    )
    n = (OVERSIZED_BYTES - len(body)) // (len(entry) + 1) + 1
    pad = b',"router_request_log":[' + b",".join([entry] * max(n, 1)) + b"]}"
    return body.rstrip()[:-1] + pad


class MonitorHandler(_Base):
    """gpu-monitor v2.1: ``GET /gpu-data``, with the scenario's monitor mode applied."""

    server_header = "gpu-monitor/2.1"

    def dispatch(self) -> None:
        world = self.world
        with world.lock:
            mode, gen = world.monitor_mode, world.monitor_generation
        changed = lambda: world.monitor_generation != gen  # noqa: E731
        if mode == "hang":
            return self.hang(changed)
        self.read_body()
        path = self.route.rstrip("/") or "/"
        if path in ("/", "/health"):
            return self.send_json(200, {"status": "ok" if mode == "ok" else mode})
        if path != "/gpu-data":
            return self.send_json(404, {"error": "not found"}, close=True)
        if mode == "http-500":
            return self.send(
                500, b"Internal Server Error\n", "text/plain; charset=utf-8", close=True
            )
        if mode == "garbage":
            return self.send(200, GARBAGE)
        doc = world.gpu_data()
        if mode == "empty":  # its collector lost every GPU; LiteLLM's summary still comes
            doc["gpus"], doc["benchmarks"] = [], {}
            doc.pop("strix", None)
        if mode == "invalid":
            doc = _corrupt(doc)
        body = json.dumps(doc, allow_nan=True).encode("utf-8")
        if mode == "oversized":
            body = _oversize(body)
        if mode == "dribble":
            return self._dribble(body, changed)
        return self.send(200, body)

    def _dribble(self, body: bytes, changed: Callable[[], bool]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", JSON)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for i in range(len(body)):
            self.wfile.write(body[i : i + 1])
            if self.wait(DRIBBLE_INTERVAL_S, changed):
                return


# --------------------------------------------------------------------------- LiteLLM


def _mask_key(key: str) -> str:
    return f"{key[:3]}...{key[-4:]}" if len(key) > 8 else "***"


class LitellmHandler(_Base):
    """LiteLLM proxy under ``/litellm`` (also served without the prefix): the health endpoints,
    ``GET /v1/model/info`` and the admin ``POST /model/update`` that load shedding uses.

    Every answer copies the real proxy (``litellm[proxy]`` 1.108.7) in the setup the scenario's
    ``litellm_store`` names (``db``, ``config-no-db``, ``config-with-db``, ``db-store-off``);
    ``tests/reallitellm/test_lookalike_matches.py`` compares them with the real proxy's answers.
    Only ``rpm`` and ``weight`` of ``litellm_params`` have an effect.
    """

    server_header = "uvicorn"

    def dispatch(self) -> None:
        world = self.world
        with world.lock:
            mode, gen = world.litellm_mode, world.litellm_generation
        if mode == "hang":
            return self.hang(lambda: world.litellm_generation != gen)
        body = self.read_body()
        path = self.route.rstrip("/")
        if path.startswith("/litellm"):
            path = path[len("/litellm") :]
        if mode == "http-503":
            return self.send_json(
                503, {"detail": "Service Unhealthy (litellm is in http-503 mode)"}, close=True
            )
        if path in ("/health/liveliness", "/health/liveness"):
            return self.send_json(200, "I'm alive!")
        if path == "/health/readiness":
            db = "Not connected" if self._store == "config-no-db" else "connected"
            return self.send_json(200, {"status": "healthy", "db": db})
        if path == "/health":
            return self.send_json(200, self._health())
        if path in ("/model/update", "/v1/model/info", "/model/info"):
            if self.command != ("POST" if path == "/model/update" else "GET"):  # routing first
                return self.send_json(405, {"detail": "Method Not Allowed"}, close=True)
            if not self._authorised():
                return None
            return self._model_update(body) if path == "/model/update" else self._model_info()
        if path in ("/spend/logs", "/spend/logs/v2") and self.command == "GET":
            return self._spend_logs(path) if self._authorised() else None
        return self.send_json(404, {"detail": "Not Found"}, close=True)

    def _spend_logs(self, path: str) -> None:
        """Rule 10's spend logs (issue 22): without a database the real proxy refuses both routes; with
        one, nothing was routed through this look-alike (it proxies no completions): no rows."""
        if self._store == "config-no-db":
            if path.endswith("/v2"):
                return self._proxy_error(401, "Prisma Client is not initialized", "internal_error")
            return self._proxy_error(500, "/spend/logs ErrorDatabase not connected. Connect a database to your proxy "
                                     "- https://docs.litellm.ai/docs/simple_proxy#managing-auth---virtual-keys",
                                     "internal_error")
        if path.endswith("/v2"):
            return self.send_json(200, {"data": [], "total": 0, "page": 1, "page_size": 50, "total_pages": 0,
                                        "total_is_capped": False})
        return self.send_json(200, [])

    @property
    def _store(self) -> str:
        return self.world.scenario.litellm_store

    def _proxy_error(self, status: int, message: str, kind: str = "auth_error", param: Any = "None") -> None:
        # LiteLLM's ProxyException envelope (FastAPI), code as a string
        return self.send_json(
            status,
            {"error": {"message": message, "type": kind, "param": param, "code": str(status)}},
            close=True,
        )

    def _authorised(self) -> bool:
        """The admin key, answered as 1.108.7 answers it: without a database a missing key is a
        plain-text 500 (the proxy fails importing prisma) and a wrong one 400 ``No connected db.``
        (no database to look virtual keys up in); with one, 401 ``Authentication Error``."""
        auth = (self.headers.get("Authorization") or "").strip()
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if given == self.world.scenario.litellm_admin_key:
            return True
        if self._store == "config-no-db":
            if not given:
                self.send(500, b"Internal Server Error", "text/plain; charset=utf-8", close=True)
            else:
                self._proxy_error(400, "No connected db.", "no_db_connection", None)
            return False
        if not given:
            self._proxy_error(401, "Authentication Error, No api key passed in.")
        else:
            self._proxy_error(
                401,
                "Authentication Error, Invalid proxy server token passed. "
                f"Received API Key = {_mask_key(given)}",
            )
        return False

    def _deployment(self, alias: str, g: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"api_base": self.world.api_bases.get(alias), "rpm": g.rpm}
        params.update(
            allow_client_keepalive_override=False, use_in_pass_through=False, use_litellm_proxy=False,
            use_xai_oauth=False, merge_reasoning_content_in_choices=False, model=f"openai/{alias}",
        )
        if g.weight is not None:
            params["weight"] = g.weight
        return {
            "model_name": g.group,
            "litellm_params": params,
            "model_info": {
                "id": g.model_id,
                "db_model": self._store in ("db", "db-store-off"),
                "member_auto_router": False,
                "pricing_overrides": [],
                "key": g.model_id,
                "litellm_provider": "openai",
                "mode": None,
            },
        }

    def _from_config(self, entry: dict[str, Any], n: int) -> dict[str, Any]:
        """A deployment of LiteLLM's config file as the real proxy lists it (its key never shown)."""
        params = entry.get("litellm_params")
        params = {k: v for k, v in params.items() if k != "api_key"} if isinstance(params, dict) else {}
        info = entry.get("model_info")
        mid = info.get("id") if isinstance(info, dict) and info.get("id") else f"config-{n}"
        return {"model_name": entry.get("model_name"), "litellm_params": params,
                "model_info": {"id": mid, "db_model": False, "key": mid, "litellm_provider": "openai", "mode": None}}

    def _model_info(self) -> None:
        wanted = parse_qs(urlsplit(self.path).query).get("litellm_model_id", [None])[0]
        with self.world.lock:
            listed = self.world.litellm_model_list
            rows = [
                self._deployment(a, g)
                for a, g in self.world.gpus.items()
                if wanted is None or g.model_id == wanted
            ] if listed is None else [
                r for r in (self._from_config(e, n) for n, e in enumerate(listed))
                if wanted is None or r["model_info"]["id"] == wanted
            ]
        if wanted is not None and not rows:
            return self.send_json(
                400, {"detail": {"error": f"Model id = {wanted} not found on litellm proxy"}}, close=True
            )
        return self.send_json(200, {"data": rows})

    def _model_update(self, body: bytes) -> None:
        """``POST /model/update`` after the key: the body, the store, then the deployment id."""
        try:
            data = json.loads(body.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            at = exc.pos if isinstance(exc, json.JSONDecodeError) else 0
            return self.send_json(
                422, {"detail": [{"type": "json_invalid", "loc": ["body", at], "msg": "JSON decode error"}]},
                close=True,
            )
        info = data.get("model_info") if isinstance(data, dict) else None
        model_id = info.get("id") if isinstance(info, dict) else None
        if not isinstance(data, dict) or not isinstance(info, dict | None) or not isinstance(model_id, str | None):
            return self.send_json(  # FastAPI's validation of the updateDeployment body
                422, {"detail": [{"type": "model_attributes_type", "loc": ["body"],
                                  "msg": "Input should be a valid dictionary or object to extract fields from"}]},
                close=True,
            )
        store = self._store
        if store == "config-no-db":
            detail = {"error": "No DB Connected. Here's how to do it - https://docs.litellm.ai/docs/proxy/virtual_keys"}
            return self._proxy_error(500, str(detail))
        if info is None:
            return self._proxy_error(400, "Authentication Error, model_info not provided")
        if model_id is None:
            return self._proxy_error(400, "Authentication Error, model_info.id not provided")
        g = self.world.gpu_by_model_id(model_id)
        if g is None:
            return self._proxy_error(400, "Authentication Error, model not found")
        if store == "config-with-db":
            detail = {"error": "Can't edit model. Model in config. Store model in db via `/model/new`. to edit."}
            return self._proxy_error(400, str(detail))
        if store == "db-store-off":
            return self.send_json(200, None)
        params = data.get("litellm_params")
        if not isinstance(params, dict):
            return self._proxy_error(400, "Authentication Error, litellm_params not provided")
        update: dict[str, float] = {}
        for field, kind in (("rpm", int), ("weight", float)):
            v = params.get(field)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or (kind is int and v != int(v)):
                return self.send_json(
                    422, {"detail": [{"type": f"{kind.__name__}_parsing", "loc": ["body", "litellm_params", field],
                                      "msg": f"Input should be a valid {kind.__name__}"}]}, close=True
                )
            update[field] = kind(v)
        self.world.update_deployment(model_id, update)
        with self.world.lock:
            row = self._deployment(g.alias, g)
        return self.send_json(
            200,
            {"model_id": model_id, "model_name": row["model_name"], "litellm_params": row["litellm_params"],
             "model_info": row["model_info"], "updated_by": "default_user_id"},
        )

    def _health(self) -> dict[str, Any]:
        healthy, unhealthy = [], []
        with self.world.lock:
            for a, g in self.world.gpus.items():
                entry = {"model": f"openai/{a}", "model_id": g.model_id}
                state = g.endpoint_state()
                if state in ("ok", "slow"):
                    healthy.append(entry)
                else:
                    unhealthy.append({**entry, "error": f"llama-server {state}"})
        return {
            "healthy_endpoints": healthy,
            "unhealthy_endpoints": unhealthy,
            "healthy_count": len(healthy),
            "unhealthy_count": len(unhealthy),
        }


# --------------------------------------------------------------------------- control


class ControlHandler(_Base):
    """The sim's control endpoint, under ``/_sim`` on its own port (see the package docs)."""

    server_header = "gpuheal-sim"

    def dispatch(self) -> None:
        path = self.route.rstrip("/")
        body = self.read_body()
        world = self.world
        method = self.command
        try:
            data = json.loads(body.decode("utf-8")) if body.strip() else {}
        except (ValueError, UnicodeDecodeError):
            return self.send_json(400, {"error": "body: not valid JSON"}, close=True)
        if method == "POST" and not isinstance(data, dict):
            return self.send_json(400, {"error": "body: must be a JSON object"}, close=True)
        try:
            if path == "/_sim/now" and method == "GET":
                return self.send_json(200, self._now())
            if path == "/_sim/state" and method == "GET":
                return self.send_json(200, world.state())
            if path == "/_sim/gpu-data" and method == "GET":
                return self.send_json(200, world.gpu_data())
            if path == "/_sim/smi" and method == "GET":  # Rule 2: the per-process VRAM query's output
                alias = parse_qs(urlsplit(self.path).query).get("gpu", [""])[0]
                if alias not in world.gpus:
                    return self.send_json(404, {"error": f"gpu: unknown {alias!r} (known: {', '.join(world.gpus)})"})
                return self.send_json(200, {"gpu": alias, "text": world.smi_processes(alias)})
            if path == "/_sim/advance" and method == "POST":
                if "seconds" not in data:
                    return self.send_json(400, {"error": "body.seconds: is required"})
                try:
                    world.advance(data["seconds"])
                except ValueError as exc:
                    return self.send_json(400, {"error": f"body.seconds: {exc}"})
                return self.send_json(200, self._now())
            if path == "/_sim/restart" and method == "POST":
                target = data.get("gpu", data.get("service"))
                if not isinstance(target, str) or not target:
                    return self.send_json(
                        400, {"error": "body.gpu: is required (an alias, 'monitor' or 'litellm')"}
                    )
                try:
                    count = world.restart(target)
                except KeyError:
                    known = ", ".join([*world.gpus, "monitor", "litellm"])
                    return self.send_json(
                        404, {"error": f"body.gpu: unknown {target!r} (known: {known})"}
                    )
                return self.send_json(
                    200,
                    {
                        "restarted": target,
                        "restart_count": count,
                        "reload_s": world.reload_s,
                        **self._now(),
                    },
                )
            if path in ("/_sim/set", "/_sim/event") and method == "POST":
                try:
                    world.apply_now(data)
                except ScenarioError as exc:
                    return self.send_json(400, {"error": str(exc)})
                return self.send_json(200, {"applied": data, **self._now()})
            if path in (
                "/_sim/now",
                "/_sim/state",
                "/_sim/gpu-data",
                "/_sim/smi",
                "/_sim/advance",
                "/_sim/restart",
                "/_sim/set",
                "/_sim/event",
            ):
                return self.send_json(405, {"error": f"method {method} not allowed on {path}"})
            return self.send_json(404, {"error": f"unknown path {path}"})
        except (ConnectionError, OSError):
            raise
        except Exception as exc:  # never let a control bug kill the thread silently
            return self.send_json(500, {"error": f"{type(exc).__name__}: {exc}"})

    def _now(self) -> dict[str, Any]:
        with self.world.lock:
            return {"now": iso(self.world.now()), "t": round(self.world.t, 3)}
