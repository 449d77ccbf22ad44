"""A strict, pure reading of the URLs gpuheal meets in other systems' answers: LiteLLM's ``api_base``
(``/model/info``, its alert text) and the ``endpoint`` of a configured GPU.

Why not :func:`urllib.parse.urlsplit`: the pure layers import no ``urllib``
(``tests/test_import_graph.py``), and these strings come from the network, where a lenient reader
is the wrong one — a space, a control character, a port that is not a number or an empty host
makes the whole URL "not readable" here, never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]{0,15})://(?P<authority>[^/?#]*)(?P<path>[^?#]*)"
                  r"(?:\?(?P<query>[^#]*))?(?:#.*)?", re.S)  # fmt: skip
_HOST = re.compile(r"[A-Za-z0-9._~-]{1,253}")
_IPV6 = re.compile(r"\[([0-9A-Fa-f:.]{2,45})\]")
DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Url:
    """An absolute URL's parts. ``host`` is lower-case, an IPv6 address without its brackets;
    ``port`` is ``None`` when the URL gives none. Userinfo and query are dropped: they may hold a
    key (``had_secret_parts`` says they were there)."""

    scheme: str
    host: str
    port: int | None
    path: str
    had_secret_parts: bool = False

    @property
    def host_port(self) -> tuple[str, int | None]:
        """What two URLs of one server share: host and port (the scheme's default port if none)."""
        return self.host, self.port if self.port is not None else DEFAULT_PORTS.get(self.scheme)

    @property
    def origin(self) -> str:
        """``scheme://host[:port]``, the host bracketed when it is an IPv6 address."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}" + (f":{self.port}" if self.port is not None else "")

    @property
    def clean(self) -> str:
        """The URL without userinfo, query or fragment."""
        return self.origin + self.path


def split_url(text: object, schemes: tuple[str, ...] = ("http", "https")) -> Url | None:
    """``text`` read as an absolute URL of one of ``schemes``, or ``None`` when it is not one: no
    whitespace or control characters anywhere, a host, a port (if any) from 1 to 65535."""
    if not isinstance(text, str) or len(text) > 2048 or not text.isprintable() or any(c.isspace() for c in text):
        return None
    m = _URL.fullmatch(text)
    if m is None or m["scheme"].lower() not in schemes:
        return None
    _userinfo, at, hostport = m["authority"].rpartition("@")
    v6 = _IPV6.match(hostport)
    if v6 is not None:
        host, rest = v6.group(1), hostport[v6.end():]
    else:
        host, colon, port_text = hostport.partition(":")
        rest = colon + port_text
        if _HOST.fullmatch(host) is None:
            return None
    port: int | None = None
    if rest:
        if not rest.startswith(":") or not rest[1:].isdigit() or not rest[1:].isascii() or len(rest) > 6:
            return None
        port = int(rest[1:])
        if not 0 < port < 65536:
            return None
    return Url(m["scheme"].lower(), host.lower(), port, m["path"], bool(at) or m["query"] is not None)
