"""A small HTTP client with a hard total deadline and a byte cap.

Why not ``requests`` here: its timeouts bound each socket operation, not the whole exchange, so a
server that dribbles one byte a second holds a probe for ever (Lesson L5 is the same failure at a
larger scale), and it costs ~80 ms of import on every cron start. ``http.client`` plus a watchdog
that shuts the socket at the deadline bounds connect + headers + body together.

Every failure is returned as a :class:`HttpFault`, never raised: "a source that fails is a data
fault in the observation, not an exception" (issue 2).
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
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
    transport failures and the size cap become :class:`HttpFault`.
    """
    started = time.monotonic()
    stop_at = started + deadline_s
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return HttpFault("invalid", f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return HttpFault("invalid", f"bad URL: {exc}")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    connect_s = min(connect_timeout_s or deadline_s, deadline_s)
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    kwargs = {"context": ssl.create_default_context()} if parts.scheme == "https" else {}
    conn = conn_cls(parts.hostname, port, timeout=connect_s, **kwargs)
    fired = threading.Event()

    def _expire() -> None:
        fired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(deadline_s, _expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        send_headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        send_headers.update(headers or {})
        conn.connect()
        conn.sock.settimeout(max(0.01, stop_at - time.monotonic()))
        conn.request(method, path, body=body, headers=send_headers)
        resp = conn.getresponse()
        length = resp.getheader("Content-Length")
        if length and length.isdigit() and int(length) > max_bytes:
            return HttpFault(
                "oversized",
                f"Content-Length {int(length)} exceeds max_response_bytes {max_bytes}",
                time.monotonic() - started,
                status=resp.status,
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            remaining = stop_at - time.monotonic()
            if remaining <= 0:
                raise _Deadline
            conn.sock.settimeout(remaining)
            chunk = resp.read1(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                return HttpFault(
                    "oversized",
                    f"body exceeds max_response_bytes {max_bytes}",
                    time.monotonic() - started,
                    status=resp.status,
                )
            chunks.append(chunk)
        if fired.is_set():
            raise _Deadline
        return HttpResult(
            status=resp.status,
            body=b"".join(chunks),
            elapsed_s=time.monotonic() - started,
            headers={k.lower(): v for k, v in resp.getheaders()},
        )
    except ConnectionRefusedError:
        return HttpFault("refused", "connection refused", time.monotonic() - started)
    except (TimeoutError, _Deadline):
        return HttpFault("timeout", f"no complete answer within {deadline_s:g} s", time.monotonic() - started)
    except socket.gaierror as exc:
        return HttpFault("refused", f"cannot resolve host: {exc.strerror or exc}", time.monotonic() - started)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        elapsed = time.monotonic() - started
        if fired.is_set() or elapsed >= deadline_s:
            return HttpFault("timeout", f"no complete answer within {deadline_s:g} s", elapsed)
        if isinstance(exc, ConnectionResetError | BrokenPipeError):
            return HttpFault("refused", f"connection reset: {exc}", elapsed)
        if isinstance(exc, OSError) and exc.errno in (101, 113, 111):  # unreachable / refused
            return HttpFault("refused", str(exc), elapsed)
        return HttpFault("invalid", f"{type(exc).__name__}: {exc}"[:200], elapsed)
    finally:
        watchdog.cancel()
        conn.close()
