"""The simulated fleet's servers without sockets: a request's bytes in, the answer's bytes out.

A week of a 100-GPU fleet is 10,080 cron cycles of ~400 requests each; through loopback sockets and
a thread per connection that alone is ~0.4 s a cycle (issue 29). Here the *same handler classes*
(:mod:`gpuheal.sim.servers`, the Zulip look-alike) answer in the calling thread: each request is
parsed by ``BaseHTTPRequestHandler`` from the client's own bytes and its answer is the bytes the
handler writes, so a client that frames them itself (``gpuheal.sources.http.use_network``) sees
what it would see on a socket. ``tests/test_chaos_network.py`` proves it, answer for answer.

What a socket would take real time for is counted in seconds instead: a ``hang`` never answers
(``None``), a ``slow`` answer says how long it took, and a dribbled body is as late as its bytes.
A closed port (``dead`` GPU, ``down`` monitor or LiteLLM) is ``ConnectionRefusedError``.
Stdlib only, like the rest of the sim.
"""

from __future__ import annotations

import errno
import io
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from gpuheal.memo import remembered

#: A wait longer than this is no answer at all: no client of the fleet waits ten minutes.
PATIENCE_S = 600.0
_CLIENT = ("127.0.0.1", 40000)


class NoAnswer(TimeoutError):
    """Raised inside a handler whose wait never ends (``hang``): the request gets no answer. A
    ``TimeoutError``, so the handlers' own ``except OSError`` drops the connection as on a socket."""


@dataclass(slots=True)  # one is made per request
class StandIn:
    """What a handler reads from its ``server`` (the sim's ``SimHTTPServer`` attributes), plus
    :meth:`virtual_wait`, which ``servers._Base.wait`` calls instead of sleeping."""

    world: Any = None
    alias: str | None = None
    verbose: bool = False
    closing: threading.Event = field(default_factory=threading.Event)
    waited_s: float = 0.0
    hung: bool = False

    def virtual_wait(self, seconds: float) -> bool:
        """Count ``seconds`` as spent; never cut short. An endless (or absurd) wait is no answer."""
        self.waited_s += seconds
        if math.isinf(seconds) or self.waited_s > PATIENCE_S:
            self.hung = True
            raise NoAnswer("no answer")
        return False


class Headers:
    """The request's headers as the handlers read them (``email.message.Message``'s ``get`` and
    ``items``: case-insensitive, the first of a repeated name)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._pairs = pairs
        self._first: dict[str, str] = {}
        for name, value in pairs:
            self._first.setdefault(name.lower(), value)

    def get(self, name: str, default: Any = None) -> Any:
        return self._first.get(name.lower(), default)

    def __getitem__(self, name: str) -> str | None:
        return self._first.get(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._first

    def items(self) -> list[tuple[str, str]]:
        return list(self._pairs)


_Parsed = tuple[str, str, str, Headers, bytes] | None
_PARSED: dict[bytes, _Parsed] = {}
_MAX_PARSED = 4096


def parse_request(request: bytes) -> _Parsed:
    """:func:`_parse_new`, remembered by the request's bytes: a client asks the same few requests of
    every server every minute (a 100-GPU week parses ~3 million, of perhaps a thousand distinct). The
    handlers only read what it gives (``Headers`` is read-only), so one answer can serve them all."""
    parsed: _Parsed = remembered(_PARSED, request, _parse_new, _MAX_PARSED)
    return parsed


def _parse_new(request: bytes) -> _Parsed:
    """``(method, target, version, headers, body)`` of a well-formed HTTP/1.x request, else None. What
    ``BaseHTTPRequestHandler.parse_request`` reads of a client's request, without the ``email``
    package (~0.3 ms a request: a third of a simulated cycle)."""
    head, sep, body = request.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    words = lines[0].split()
    if len(words) != 3 or not words[2].startswith("HTTP/1."):
        return None
    pairs = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            return None
        pairs.append((name.strip(), value.strip()))
    return words[0], words[1], words[2], Headers(pairs), body


def _serve(handler_cls: type[BaseHTTPRequestHandler], server: Any, request: bytes) -> bytes:
    """One request through ``handler_cls``'s ``do_*`` method, as ``handle_one_request`` runs it. The
    handler writes into an ``io.BytesIO`` (its ``write`` is C: a poll answers ~400 requests, issue 29)."""
    parsed = parse_request(request)
    handler = handler_cls.__new__(handler_cls)
    handler.server, handler.client_address, handler.request = server, _CLIENT, None  # type: ignore[assignment]
    handler.wfile = writer = io.BytesIO()  # type: ignore[assignment]
    handler.close_connection = True
    if parsed is None:
        handler.request_version, handler.requestline, handler.command = "HTTP/1.1", "", ""
        handler.send_error(400, "Bad request")
        return writer.getvalue()
    command, handler.path, handler.request_version, handler.headers, body = parsed  # type: ignore[assignment]
    handler.command = command
    handler.requestline = f"{command} {handler.path} {handler.request_version}"
    handler.rfile = io.BytesIO(body)  # type: ignore[assignment]
    method = getattr(handler, _DO.get(command) or f"do_{command}", None)
    if method is None:
        handler.send_error(501, f"Unsupported method ({command!r})")
    else:
        method()
    return writer.getvalue()


_DO = {m: f"do_{m}" for m in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")}


@dataclass
class Site:
    """One address of the in-process network: its handler class, the ``server`` it reads (a
    :class:`StandIn` is made per request from ``template``), whether its port is open now, and a shortcut
    that answers its commonest requests as the handler would, byte for byte (issue 29)."""

    handler: type[BaseHTTPRequestHandler]
    template: StandIn | Any
    is_open: Callable[[], bool] = lambda: True
    #: the handler's answer without a handler object, for the requests it knows (None: serve the rest)
    fast: Callable[[bytes], bytes | None] | None = None


class InProcessNetwork:
    """``(host, port) -> Site``; :meth:`answer` serves one request (``gpuheal.sources.http.Network``)."""

    def __init__(self) -> None:
        self.sites: dict[tuple[str, int], Site] = {}
        self.requests = 0

    def add(self, host: str, port: int, site: Site) -> None:
        self.sites[(host, port)] = site

    def answer(self, host: str, port: int, request: bytes) -> tuple[bytes | None, float] | OSError:
        site = self.sites.get((host, port))
        if site is None or not site.is_open():
            return ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        self.requests += 1
        if site.fast is not None:
            fast = site.fast(request)
            if fast is not None:
                return fast, 0.0
        template = site.template
        server = (
            StandIn(template.world, template.alias, template.verbose, template.closing)
            if isinstance(template, StandIn)
            else template
        )
        try:
            out = _serve(site.handler, server, request)
        except NoAnswer:  # a handler that does not catch OSError itself
            return None, server.waited_s
        if getattr(server, "hung", False):
            return None, server.waited_s
        return out, getattr(server, "waited_s", 0.0)
