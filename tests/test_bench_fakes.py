"""Loopback look-alikes of llama-server for the bench tests (helpers; the tests live elsewhere).

``FakeLlama`` is a real threaded HTTP server on 127.0.0.1 (ephemeral port) whose answers per path
are set by the test: a :class:`Reply`, or one of the behaviours ``HANG`` (read the request, never
answer), ``DROP`` (close the connection without a status line) and ``KILL`` (drop the connection and
shut the whole server down: a llama-server killed mid-benchmark). Every request is recorded (method,
path, headers, JSON body, start/end time) so tests can count them and check they never overlapped.
The default bodies are shaped like the captures in docs/llama-server.md §7 (build b11312).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HANG = "hang"
DROP = "drop"
KILL = "kill"

UNAUTHORIZED = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}
LOADING = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
NOT_FOUND = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}


@dataclass
class Reply:
    status: int = 200
    body: Any = None                      # dict/list → JSON; bytes/str as is
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    chunked: bool = False                 # send the body without Content-Length, in pieces

    def payload(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        if self.body is None:
            return b""
        return json.dumps(self.body).encode()


def timings(predicted_n: int = 32, gen: float | None = 74.9, prompt: float | None = 812.5, prompt_n: int = 22) -> dict:
    """A ``timings`` object; ``None`` rates serialise as null (predicted_n == 0 in real builds)."""
    return {
        "cache_n": 0,
        "prompt_n": prompt_n,
        "prompt_ms": (prompt_n / prompt * 1000) if prompt else None,
        "prompt_per_token_ms": (1000 / prompt) if prompt else None,
        "prompt_per_second": prompt,
        "predicted_n": predicted_n,
        "predicted_ms": (predicted_n / gen * 1000) if gen else None,
        "predicted_per_token_ms": (1000 / gen) if gen else None,
        "predicted_per_second": gen,
    }


def completion_body(n: int = 32, t: dict | None | str = "default", content: str = " like orG from if") -> dict:
    body = {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": 1,
        "stop": True,
        "model": "models/tiny.gguf",
        "tokens_predicted": n,
        "tokens_evaluated": 22,
        "prompt": "<s> hello",
        "has_new_line": False,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": 53,
    }
    if t == "default":
        body["timings"] = timings(n)
    elif t != "absent":
        body["timings"] = t
    return body


def chat_body(n: int = 32, t: dict | None | str = "default", content: str = " as on up", reasoning: str | None = None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    body = {
        "choices": [{"finish_reason": "length", "index": 0, "message": message}],
        "created": 1796028473,
        "model": "gpt-3.5-turbo",
        "system_fingerprint": "b11312-0c1e57098",
        "object": "chat.completion",
        "usage": {"completion_tokens": n, "prompt_tokens": 53, "total_tokens": n + 53},
        "id": "chatcmpl-x",
    }
    if t == "default":
        body["timings"] = timings(n, gen=70.1)
    elif t != "absent":
        body["timings"] = t
    return body


def props_body(n_ctx: int = 131072, model: str = "models/ThinkingCap-Qwen3.6-27B-Q4_K_M.gguf", slots: int = 1) -> dict:
    return {
        "default_generation_settings": {"params": {"n_predict": -1, "temperature": 0.800000011920929}, "n_ctx": n_ctx},
        "total_slots": slots,
        "model_alias": model,
        "model_path": model,
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "build_info": "b11312-0c1e57098",
        "is_sleeping": False,
        "chat_template": "{% for message in messages %}...{% endfor %}",
    }


def default_routes() -> dict[str, Any]:
    return {
        "GET /health": Reply(200, {"status": "ok"}),
        "GET /props": Reply(200, props_body()),
        "POST /completion": Reply(200, completion_body()),
        "POST /v1/chat/completions": Reply(200, chat_body()),
    }


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    started: float
    ended: float = 0.0


class FakeLlama:
    """A threaded loopback server; ``routes`` maps ``"METHOD /path"`` to a Reply or a behaviour.

    A route value may also be a list: one entry per successive request (the last one repeats).
    ``require_key``: every path but /health answers 401 unless ``Authorization: Bearer KEY``.
    """

    def __init__(self, routes: dict[str, Any] | None = None, *, require_key: str | None = None) -> None:
        self.routes = default_routes()
        self.routes.update(routes or {})
        self.require_key = require_key
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._counts: dict[str, int] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _handle(self) -> None:
                fake._serve(self)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self._stopped = False

    # -- inspection ------------------------------------------------------------------
    def requests(self, path: str | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if path is None or s.path == path]

    # -- lifecycle -------------------------------------------------------------------
    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._release.set()
        threading.Thread(target=self.server.shutdown, daemon=True).start()
        self.server.server_close()

    def __enter__(self) -> FakeLlama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving ---------------------------------------------------------------------
    def _pick(self, key: str) -> Any:
        value = self.routes.get(key)
        if isinstance(value, list):
            with self._lock:
                i = self._counts.get(key, 0)
                self._counts[key] = i + 1
            return value[min(i, len(value) - 1)]
        return value

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        started = time.monotonic()
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        path = h.path.split("?")[0]
        seen = Seen(h.command, path, {k.lower(): v for k, v in h.headers.items()}, body, started)
        with self._lock:
            self.seen.append(seen)
        key = f"{h.command} {path}"
        reply = self._pick(key)
        if (
            self.require_key is not None
            and path not in ("/health", "/v1/health")
            and h.headers.get("Authorization") != f"Bearer {self.require_key}"
        ):
            reply = Reply(401, UNAUTHORIZED, {"Connection": "close"})
        if reply is None:
            reply = Reply(404, NOT_FOUND)
        try:
            if reply == HANG:
                self._release.wait(30)
                h.close_connection = True
                return
            if reply in (DROP, KILL):
                h.close_connection = True
                try:
                    h.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                if reply == KILL:
                    self.stop()
                return
            if reply.delay_s:
                self._release.wait(reply.delay_s)
            payload = reply.payload()
            h.send_response(reply.status)
            h.send_header("Server", "llama.cpp")
            content_type = "application/json; charset=utf-8" if not isinstance(reply.body, str) else "text/plain"
            h.send_header("Content-Type", content_type)
            for k, v in reply.headers.items():
                h.send_header(k, v)
            if reply.chunked:
                h.send_header("Connection", "close")
                h.end_headers()
                seen.ended = time.monotonic()  # before the client can hold the whole answer (see `finally`)
                for i in range(0, len(payload), 65536):
                    h.wfile.write(payload[i : i + 65536])
                h.close_connection = True
            else:
                h.send_header("Content-Length", str(len(payload)))
                h.end_headers()
                seen.ended = time.monotonic()  # before the client can hold the whole answer (see `finally`)
                h.wfile.write(payload)
                if reply.headers.get("Connection") == "close":
                    h.close_connection = True
        except OSError:
            h.close_connection = True
        finally:
            # stamped before the answer's bytes go out: stamped after, a client that read the answer and
            # sent its next request to another server could start it before this thread ran (flaky on a busy
            # machine: test_bench_step's "never concurrently" saw 134 us of such overlap)
            seen.ended = seen.ended or time.monotonic()


def dead_endpoint() -> str:
    """An address on the loopback where nothing listens (connection refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
