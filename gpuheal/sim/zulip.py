"""A loopback Zulip look-alike: ``POST /api/v1/messages`` as formats.md §5 describes it.

Part of the simulated world (``make demo`` sends its alerts here; the tests script its failures).
Speaks the real contract — HTTP basic auth (bot email + API key), a form-encoded body with
``type``/``to``/``topic``/``content``, ``{"result": "success", "msg": "", "id": N}`` — and can be
told to misbehave, per request: ``"ok"``, ``("429", seconds)``, ``"401"``, ``"500"``, ``"hang"``,
``"400-stream"``. ``server.script`` is a list of modes used one per request; when it is empty
``server.mode`` applies. ``server.messages`` holds every accepted message.

By hand: ``python -m gpuheal.sim.zulip --port 9925 [--out FILE]`` prints each accepted message.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

DEFAULT_EMAIL = "gpuheal-bot@zulip.example.org"
DEFAULT_KEY = "zulip-test-key-9f8e7d6c5b4a"
MAX_MESSAGE_LENGTH = 10_000
MAX_TOPIC_LENGTH = 60


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


SERVER_VERSION = "10.4"  # what the look-alike says it is; feature level of Zulip 10
SERVER_FEATURE_LEVEL = 359


def server_settings(url: str) -> dict[str, Any]:
    """``GET /api/v1/server_settings`` as Zulip answers it (api/get-server-settings): no
    authentication, the version and feature level the official client reads, a password login."""
    return {
        "result": "success", "msg": "",
        "authentication_methods": {"password": True, "dev": False, "email": True, "ldap": False,
                                   "remoteuser": False, "github": False, "azuread": False, "gitlab": False,
                                   "apple": False, "google": False, "saml": False, "openid connect": False},
        "external_authentication_methods": [],
        "zulip_feature_level": SERVER_FEATURE_LEVEL, "zulip_version": SERVER_VERSION,
        "zulip_merge_base": SERVER_VERSION, "push_notifications_enabled": False, "is_incompatible": False,
        "email_auth_enabled": True, "require_email_format_usernames": True,
        "realm_url": url, "realm_uri": url, "realm_name": "gpuheal look-alike",
        "realm_icon": url + "/static/images/logo/zulip-icon-128x128.png",
        "realm_description": "", "realm_web_public_access_enabled": False,
    }


class ZulipLookalike:
    def __init__(
        self,
        email: str = DEFAULT_EMAIL,
        api_key: str = DEFAULT_KEY,
        port: int = 0,
        streams: tuple[str, ...] | None = None,
        on_message=None,
    ) -> None:
        self.email = email
        self.api_key = api_key
        self.streams = streams  # None: every stream exists
        self.mode: Any = "ok"
        self.script: list[Any] = []
        self.messages: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self.on_message = on_message
        self._next_id = 100
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = _Server(("127.0.0.1", port), self._handler())
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        """Its request handler: served by its own thread (``start``), or in process
        (:mod:`gpuheal.sim.inprocess`, the chaos benchmark) at :attr:`url`."""
        return self._server.RequestHandlerClass  # type: ignore[no-any-return]

    def close_socket(self) -> None:
        """Release the port of a look-alike that was never started (served in process)."""
        self._server.server_close()

    def start(self) -> ZulipLookalike:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ZulipLookalike:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _take_mode(self) -> Any:
        with self._lock:
            return self.script.pop(0) if self.script else self.mode

    # ------------------------------------------------------------------ handler
    def _handler(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(
                self, status: int, doc: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-RateLimit-Limit", "200")
                self.send_header("X-RateLimit-Remaining", "199")
                self.send_header("X-RateLimit-Reset", str(int(time.time()) + 60))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                """``/api/v1/users/me`` and ``/api/v1/get_stream_id`` (what ``gpuheal doctor``
                reads: the bot's credentials and the stream, without posting); ``/api/v1/server_settings``
                (what the official ``zulip`` client asks before its first request)."""
                from urllib.parse import urlsplit

                parts = urlsplit(self.path)
                if parts.path == "/api/v1/server_settings":  # unauthenticated, as on Zulip
                    return self._json(200, server_settings(outer.url))
                if parts.path not in ("/api/v1/users/me", "/api/v1/get_stream_id"):
                    return self._json(
                        405, {"result": "error", "msg": "Method Not Allowed", "code": "BAD_REQUEST"}
                    )
                auth = self.headers.get("Authorization") or ""
                try:
                    user, _, key = base64.b64decode(auth[6:]).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    user, key = "", ""
                if not auth.startswith("Basic ") or user != outer.email or key != outer.api_key:
                    return self._json(
                        401, {"result": "error", "msg": "Invalid API key", "code": "INVALID_API_KEY"}
                    )
                if parts.path == "/api/v1/users/me":
                    return self._json(200, {"result": "success", "msg": "", "email": outer.email,
                                            "user_id": 8, "full_name": "gpuheal", "is_bot": True})
                stream = parse_qs(parts.query).get("stream", [""])[-1]
                if not stream or (outer.streams is not None and stream not in outer.streams):
                    return self._json(400, {"result": "error", "msg": f"Invalid channel name '{stream}'",
                                            "code": "BAD_REQUEST"})
                return self._json(200, {"result": "success", "msg": "", "stream_id": 15})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                form = {
                    k: v[-1]
                    for k, v in parse_qs(
                        raw.decode("utf-8", "replace"), keep_blank_values=True
                    ).items()
                }
                auth = self.headers.get("Authorization") or ""
                record = {
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "form": form,
                    "auth": auth,
                    "raw": raw,
                }
                with outer._lock:
                    outer.requests.append(record)
                mode = outer._take_mode()
                if mode == "hang":
                    outer._stop.wait(60)
                    self.close_connection = True
                    return
                if mode == "500":
                    body = b"<html><body><h1>500 Internal Server Error</h1></body></html>"
                    self.send_response(500)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if isinstance(mode, tuple) and mode[0] == "429":
                    retry = float(mode[1])
                    self._json(
                        429,
                        {
                            "code": "RATE_LIMIT_HIT",
                            "msg": "API usage exceeded rate limit",
                            "result": "error",
                            "retry-after": retry,
                        },
                        {"Retry-After": str(int(retry + 0.999))},
                    )
                    return
                if self.path != "/api/v1/messages":
                    self._json(404, {"result": "error", "msg": "Not Found", "code": "BAD_REQUEST"})
                    return
                if not auth.startswith("Basic "):
                    self._json(
                        401,
                        {
                            "result": "error",
                            "msg": "Not logged in: API authentication or user session required",
                            "code": "UNAUTHORIZED",
                        },
                        {"WWW-Authenticate": 'Basic realm="zulip"'},
                    )
                    return
                try:
                    user, _, key = base64.b64decode(auth[6:]).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    user, key = "", ""
                if mode == "401" or user != outer.email or key != outer.api_key:
                    self._json(
                        401,
                        {"result": "error", "msg": "Invalid API key", "code": "INVALID_API_KEY"},
                    )
                    return
                if "application/x-www-form-urlencoded" not in (
                    self.headers.get("Content-Type") or ""
                ):
                    self._json(
                        400,
                        {
                            "result": "error",
                            "msg": "Missing 'type' argument",
                            "code": "REQUEST_VARIABLE_MISSING",
                            "var_name": "type",
                        },
                    )
                    return
                for var in ("type", "to", "content"):
                    if var not in form:
                        self._json(
                            400,
                            {
                                "result": "error",
                                "msg": f"Missing '{var}' argument",
                                "code": "REQUEST_VARIABLE_MISSING",
                                "var_name": var,
                            },
                        )
                        return
                stream = form["to"]
                if mode == "400-stream" or (
                    outer.streams is not None and stream not in outer.streams
                ):
                    self._json(
                        400,
                        {
                            "result": "error",
                            "msg": f"Channel '{stream}' does not exist",
                            "code": "STREAM_DOES_NOT_EXIST",
                            "stream": stream,
                        },
                    )
                    return
                topic = form.get("topic", form.get("subject"))
                if form["type"] in ("stream", "channel") and not topic:
                    self._json(
                        400,
                        {
                            "result": "error",
                            "msg": "Missing topic",
                            "code": "REQUEST_VARIABLE_MISSING",
                            "var_name": "topic",
                        },
                    )
                    return
                content = form["content"].lstrip("\n").rstrip()
                if not content:
                    self._json(
                        400,
                        {
                            "result": "error",
                            "msg": "Message must not be empty",
                            "code": "BAD_REQUEST",
                        },
                    )
                    return
                if "\x00" in content:
                    self._json(
                        400,
                        {
                            "result": "error",
                            "msg": "Message must not contain null bytes",
                            "code": "BAD_REQUEST",
                        },
                    )
                    return
                truncated = False
                if len(content) > MAX_MESSAGE_LENGTH:  # Zulip's normalize_body
                    content = (
                        content[: MAX_MESSAGE_LENGTH - len("\n[message truncated]")]
                        + "\n[message truncated]"
                    )
                    truncated = True
                if len(topic) > MAX_TOPIC_LENGTH:  # truncate_topic
                    topic = topic[: MAX_TOPIC_LENGTH - 3] + "..."
                    truncated = True
                with outer._lock:
                    outer._next_id += 1
                    mid = outer._next_id
                    message = {
                        "id": mid,
                        "type": form["type"],
                        "to": stream,
                        "topic": topic,
                        "content": content,
                        "sender_email": user,
                        "server_truncated": truncated,
                        "raw_form": form,
                    }
                    outer.messages.append(message)
                if outer.on_message is not None:
                    outer.on_message(message)
                self._json(200, {"id": mid, "msg": "", "result": "success"})

        return Handler


# --------------------------------------------------------------------------- helpers for gpuheal's tests
# (shared by tests/test_zulip*.py, test_escalate*.py, test_report*.py, test_kg*.py, test_metrics*.py,
# test_secrets.py; no conftest.py so as not to collide with other test modules)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    import argparse
    import sys

    p = argparse.ArgumentParser(
        description="A loopback Zulip look-alike for gpuheal demos and tests."
    )
    p.add_argument("--port", type=int, default=9925)
    p.add_argument("--email", default=DEFAULT_EMAIL)
    p.add_argument("--key", default=DEFAULT_KEY)
    p.add_argument("--out", help="append each accepted message as a JSON line here")
    args = p.parse_args(argv)

    def show(message: dict[str, Any]) -> None:
        sys.stdout.write(
            f"── #{message['to']} > {message['topic']} (message {message['id']}) ──\n{message['content']}\n\n"
        )
        sys.stdout.flush()
        if args.out:
            with open(args.out, "a", encoding="utf-8") as fh:
                fh.write(
                    json.dumps(
                        {k: v for k, v in message.items() if k != "raw_form"}, ensure_ascii=False
                    )
                    + "\n"
                )

    server = ZulipLookalike(args.email, args.key, port=args.port, on_message=show).start()
    sys.stderr.write(f"zulip look-alike on {server.url} (email {args.email})\n")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
