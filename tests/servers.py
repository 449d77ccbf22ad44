"""Small loopback HTTP servers for tests and benchmarks: real sockets on 127.0.0.1, scripted.

One asyncio loop in a daemon thread serves any number of listening ports, so a test can stand up
one well-behaved server or a thousand ports that accept and never answer at the same cost. Every
reply is a *behaviour* object; routes map a path (or ``(METHOD, path)``) to a behaviour or to a
callable ``Request -> behaviour``::

    with LoopbackServer({"/health": Reply(200, {"status": "ok"})}) as srv:
        srv.url                       # http://127.0.0.1:PORT
        srv.set("/health", Reply(503, {"error": {"message": "Loading model"}}))
        srv.requests                  # every Request seen, in order

    with LoopbackServer(default=Hang(), ports=50) as dead:
        dead.urls                     # 50 ports that accept, read the request and never answer

Behaviours: :class:`Reply` (status, body, headers; optionally no Content-Length), :class:`Dribble`
(headers at once, then ``chunk`` bytes every ``interval_s``), :class:`Hang` (accept and never
answer; ``read_request=False`` never even reads), :class:`Garbage` (non-HTTP bytes, then close),
:class:`Oversized` (a large body, with or without Content-Length), :class:`Slow` (wait, then
another behaviour), :class:`CloseNow` (close without a word). :func:`closed_port` gives a port on
which nothing listens. Only 127.0.0.1 is ever bound (contract: "Network").

Helpers for building the inputs gpuheal reads: :func:`contract_document` (the contract's sample
gpu-monitor document), :func:`fleet_config` / :func:`write_config` (a config dict / YAML file
pointing at loopback URLs).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"

_REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


# --------------------------------------------------------------------------- requests


@dataclass
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    port: int

    def json(self) -> Any:
        return json.loads(self.body)


# --------------------------------------------------------------------------- behaviours


def _as_bytes(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body).encode()


def _head(status: int, headers: dict[str, str], reason: str | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason or _REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass
class Reply:
    """A complete answer. ``body`` may be bytes, str or a JSON-able object."""

    status: int = 200
    body: Any = b""
    headers: dict[str, str] | None = None
    content_length: bool = True  # False: no Content-Length, the body ends when the socket closes
    reason: str | None = None

    async def run(self, reader, writer, req: Request | None, keep_alive: bool = False) -> None:
        """``keep_alive``: announced as llama-server b11312 (cpp-httplib) does, and the connection
        stays open for the next request (only with a Content-Length)."""
        body = _as_bytes(self.body)
        headers = {"Content-Type": "application/json" if not isinstance(self.body, bytes | str) else "text/plain"}
        headers.update(self.headers or {})
        if self.content_length:
            headers["Content-Length"] = str(len(body))
        if keep_alive:
            headers["Keep-Alive"] = "timeout=5, max=100"
        else:
            headers["Connection"] = "close"
        writer.write(_head(self.status, headers, self.reason) + body)
        await writer.drain()


def json_reply(obj: Any, status: int = 200, **kwargs: Any) -> Reply:
    return Reply(status, json.dumps(obj).encode(), {"Content-Type": "application/json"}, **kwargs)


@dataclass
class Dribble:
    """Headers at once, then ``chunk`` bytes of ``body`` every ``interval_s`` (slow-loris server).

    ``body`` defaults to an endless stream of spaces (valid JSON whitespace that never ends);
    ``headers_too`` dribbles the status line and headers as well.
    """

    body: Any = None
    chunk: int = 1
    interval_s: float = 0.2
    status: int = 200
    content_length: bool = True
    headers_too: bool = False

    async def run(self, reader, writer, req: Request | None) -> None:
        body = _as_bytes(self.body) if self.body is not None else None
        headers = {"Content-Type": "application/json", "Connection": "close"}
        if body is not None and self.content_length:
            headers["Content-Length"] = str(len(body))
        head = _head(self.status, headers)
        if self.headers_too:
            stream = head + (body or b"")
        else:
            writer.write(head)
            await writer.drain()
            stream = body or b""
        offset = 0
        while True:
            if offset < len(stream):
                piece = stream[offset : offset + self.chunk]
            elif body is None:
                piece = b" " * self.chunk  # endless whitespace
            else:
                return
            writer.write(piece)
            await writer.drain()
            offset += len(piece)
            await asyncio.sleep(self.interval_s)


@dataclass
class Hang:
    """Accept the connection and never answer (held open until the server stops)."""

    read_request: bool = True

    async def run(self, reader, writer, req: Request | None) -> None:
        await asyncio.Event().wait()


@dataclass
class Garbage:
    """Bytes that are not HTTP at all, then close."""

    data: bytes = b"\x00\xff\xfeSSH-2.0-OpenSSH_9.2\r\n\x1b[31mnot http\x00\x00"

    async def run(self, reader, writer, req: Request | None) -> None:
        writer.write(self.data)
        await writer.drain()


@dataclass
class Oversized:
    """A ``size``-byte body (a JSON string), with or without a Content-Length header.

    ``declared`` overrides the Content-Length sent (e.g. announce 10 MB, send little).
    """

    size: int = 4 * 1024 * 1024
    content_length: bool = True
    declared: int | None = None
    chunk: int = 64 * 1024

    async def run(self, reader, writer, req: Request | None) -> None:
        headers = {"Content-Type": "application/json", "Connection": "close"}
        if self.content_length:
            headers["Content-Length"] = str(self.declared if self.declared is not None else self.size)
        writer.write(_head(200, headers))
        sent = 0
        block = b"[" + b"1," * (self.chunk // 2)
        while sent < self.size:
            piece = block[: min(self.chunk, self.size - sent)]
            writer.write(piece)
            sent += len(piece)
            try:
                await writer.drain()
            except ConnectionError:
                return


@dataclass
class Slow:
    """Wait ``delay_s`` after reading the request, then behave like ``then``."""

    delay_s: float
    then: Any = field(default_factory=lambda: Reply(200, {"status": "ok"}))

    async def run(self, reader, writer, req: Request | None) -> None:
        await asyncio.sleep(self.delay_s)
        await self.then.run(reader, writer, req)


@dataclass
class CloseNow:
    """Close the connection without sending anything."""

    read_request: bool = True

    async def run(self, reader, writer, req: Request | None) -> None:
        return


NOT_FOUND = Reply(404, {"error": "not found"})
HEALTH_OK = Reply(200, {"status": "ok"})
HEALTH_LOADING = Reply(503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})


# --------------------------------------------------------------------------- the server


class LoopbackServer:
    """A scripted HTTP server on one or more loopback ports (see the module docstring)."""

    def __init__(
        self,
        routes: dict[Any, Any] | None = None,
        *,
        default: Any = NOT_FOUND,
        ports: int = 1,
        backlog: int = 1024,
        record: bool = True,
        keep_alive: bool = False,
    ) -> None:
        self.routes: dict[Any, Any] = dict(routes or {})
        self.default = default
        self.n_ports = ports
        self.backlog = backlog
        self.record = record
        self.keep_alive = keep_alive  # HTTP/1.1 keep-alive after a Reply, as a real llama-server
        self.requests: list[Request] = []
        self.ports: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._tasks: set[asyncio.Task] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> LoopbackServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LoopbackServer:
        ready = threading.Event()
        error: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._bind())
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                error.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=main, name="loopback-server", daemon=True)
        self._thread.start()
        ready.wait(30)
        if error:
            raise error[0]
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._thread = None

    async def _bind(self) -> None:
        for _ in range(self.n_ports):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, 0))
            port = sock.getsockname()[1]
            server = await asyncio.start_server(
                lambda r, w, p=port: self._spawn(r, w, p), sock=sock, backlog=self.backlog
            )
            self._servers.append(server)
            self.ports.append(port)

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1)

    def _spawn(self, reader, writer, port: int) -> None:
        task = asyncio.ensure_future(self._handle(reader, writer, port))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ routing
    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def urls(self) -> list[str]:
        return [f"http://{HOST}:{p}" for p in self.ports]

    def set(self, route: Any, behaviour: Any) -> None:
        """Change (or add) a route while the server runs."""
        with self._lock:
            self.routes[route] = behaviour

    def hits(self, path: str) -> int:
        return sum(1 for r in self.requests if r.path == path)

    def _pick(self, req: Request | None) -> Any:
        with self._lock:
            if req is None:
                behaviour = self.default
            else:
                behaviour = self.routes.get((req.method, req.path), self.routes.get(req.path, self.default))
        if callable(behaviour) and not hasattr(behaviour, "run"):
            behaviour = behaviour(req)
        return behaviour

    async def _handle(self, reader, writer, port: int) -> None:
        try:
            pre = self.default if not self.routes else None  # may answer before any request
            if pre is not None and getattr(pre, "read_request", True) is False:
                await pre.run(reader, writer, None)
                return
            while await self._answer(reader, writer, port):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


    async def _answer(self, reader, writer, port: int) -> bool:
        """One request and its answer; True when the connection stays open for another."""
        req = await _read_request(reader, port)
        if req is None:
            return False
        if self.record:
            with self._lock:
                self.requests.append(req)
        try:
            behaviour = self._pick(req)
        except Exception as exc:  # a bug in a test's handler: answer 500 and say which
            behaviour = Reply(500, f"test handler failed: {type(exc).__name__}: {exc}")
        keep = (self.keep_alive and isinstance(behaviour, Reply) and behaviour.content_length
                and req.headers.get("connection", "").lower() != "close")
        if keep:
            await behaviour.run(reader, writer, req, keep_alive=True)
        else:
            await behaviour.run(reader, writer, req)
        return bool(keep)


async def _read_request(reader, port: int) -> Request | None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) < 3:
        return None
    method, target = parts[0], parts[1]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    body = await reader.readexactly(length) if length else b""
    path, _, query = target.partition("?")
    return Request(method, path, query, headers, body, port)


def closed_port() -> int:
    """A loopback port on which nothing listens (connecting is refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def closed_url() -> str:
    return f"http://{HOST}:{closed_port()}"


# --------------------------------------------------------------------------- documents and configs

_CONTRACT_DOCUMENT: dict[str, Any] = {
    "generated_at": "2026-07-18T08:00:00Z",
    "gpus": [
        {
            "hostname": "ct8",
            "name": "NVIDIA GeForce RTX 3090",
            "vendor": "nvidia",
            "temp_c": 64,
            "vram_used_mb": 21600,
            "vram_total_mb": 24576,
            "util_pct": 87,
            "power_w": 281.4,
            "power_limit_w": 350,
        }
    ],
    "benchmarks": {"ct8": {"current_tok_s": 74.9, "baseline_tok_s": 74.8}},
    "summary": {
        "available_models": [
            {"name": "gpu-dense", "hostname": "ct8", "requests_60s": 14, "failures_60s": 0, "consecutive_timeouts": 0}
        ],
        "circuit_breakers_open": 1,
        "circuit_breakers": [
            {"model": "gpu-light", "hostname": "ct110", "open": True, "opened_at": "2026-07-18T07:48:00Z"}
        ],
    },
    "strix": {"running": True, "hostname": "ct15", "temp_c": 58, "vram_used_mb": 10240, "vram_total_mb": 65536},
}


def contract_document() -> dict[str, Any]:
    """The contract's sample ``/gpu-data`` document (a fresh copy)."""
    return copy.deepcopy(_CONTRACT_DOCUMENT)


def gpu_entry(hostname: str, **values: Any) -> dict[str, Any]:
    """One ``gpus[]`` entry with plausible readings; ``values`` override."""
    entry = {
        "hostname": hostname,
        "name": "NVIDIA GeForce RTX 3090",
        "vendor": "nvidia",
        "temp_c": 60,
        "vram_used_mb": 12000,
        "vram_total_mb": 24576,
        "util_pct": 40,
        "power_w": 200.5,
        "power_limit_w": 350,
    }
    entry.update(values)
    return entry


def monitor_document(hosts: Iterable[str], **values: Any) -> dict[str, Any]:
    return {"generated_at": "2026-07-18T08:00:00Z", "gpus": [gpu_entry(h, **values) for h in hosts]}


def fleet_config(
    monitor_url: str,
    gpus: Iterable[tuple[str, str, str]],
    *,
    litellm_url: str | None = None,
    timeout_s: float = 2.0,
    lock_wait_s: float | None = None,
    **sections: Any,
) -> dict[str, Any]:
    """A config dict: ``gpus`` as (alias, host, endpoint) triples, all timeouts ``timeout_s``."""
    cfg: dict[str, Any] = {
        "monitor": {"url": monitor_url, "timeout_s": timeout_s, "connect_timeout_s": min(timeout_s, 1.0)},
        "litellm": {"url": litellm_url, "api_key": "test-key", "timeout_s": timeout_s},
        "probe": {"timeout_s": timeout_s},
        "gpus": [
            {"alias": alias, "host": host, "endpoint": endpoint, "vendor": "nvidia", "vram_total_mb": 24576, "transport": "local"}
            for alias, host, endpoint in gpus
        ],
    }
    if lock_wait_s is not None:
        cfg["state"] = {"lock_wait_s": lock_wait_s}
    for key, value in sections.items():
        cfg.setdefault(key, {})
        if isinstance(value, dict) and isinstance(cfg[key], dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return cfg


def write_config(path: Path, cfg: dict[str, Any]) -> Path:
    """Write ``cfg`` as YAML (JSON is YAML; no yaml dependency needed in the writer)."""
    path = Path(path)
    path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    return path


Handler = Callable[[Request], Any]


# --------------------------------------------------------------------------- running the CLI


def gpuheal_argv() -> list[str]:
    """The installed console script next to this interpreter (``.venv/bin/gpuheal``), else
    ``python -m gpuheal``."""
    import sys

    script = Path(sys.executable).with_name("gpuheal")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuheal"]


def run_gpuheal(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 60,
    input: str | None = None,
):
    """Run gpuheal in a subprocess with a clean environment (no inherited ``GPUHEAL_*``,
    ``NO_COLOR``, ``TERM=dumb``); returns the ``CompletedProcess`` (text mode)."""
    import os
    import subprocess

    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_") and k not in ("NO_COLOR", "FORCE_COLOR")}
    full_env["TERM"] = "dumb"
    full_env.update(env or {})
    return subprocess.run(
        [*gpuheal_argv(), *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=timeout, input=input
    )
