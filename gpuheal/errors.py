"""One exception type reaches the CLI boundary; it is printed as one line, exit 3.

Like httpie's ``core.raw_main``: every expected failure (bad config, locked state, unreadable
trace) becomes a :class:`GpuhealError` naming what to fix, caught once in ``cli.main``.
"""

from __future__ import annotations


class GpuhealError(Exception):
    """A failure the user can fix; ``key_path`` points into the config when relevant."""

    def __init__(self, message: str, key_path: str | None = None) -> None:
        message = one_line(message)
        super().__init__(message)
        self.message = message
        self.key_path = None if key_path is None else one_line(key_path)

    def __str__(self) -> str:
        return f"{self.key_path}: {self.message}" if self.key_path else self.message


def one_line(text: str) -> str:
    """``text`` as one printable line of valid UTF-8: a config key or value may hold a newline, an
    escape sequence or a byte that is not UTF-8 (issue 9: "one clear line naming what to fix"), so
    every character that is not printable is written as its escape (``\\n``, ``\\x1b``; a byte kept
    by ``surrogateescape`` as ``\\xNN``, another lone surrogate as ``\\uXXXX``)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the undecodable byte itself
        return f"\\x{code - 0xDC00:02x}"
    return repr(ch)[1:-1] if code < 0x10000 else f"\\U{code:08x}"


class ConfigError(GpuhealError):
    """The configuration file is missing, unparsable or fails validation."""


class StateLockedError(GpuhealError):
    """Another gpuheal run holds the state directory (contract: "two runs never act at once")."""
