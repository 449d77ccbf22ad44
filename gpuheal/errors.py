"""One exception type reaches the CLI boundary; it is printed as one line, exit 3.

Like httpie's ``core.raw_main``: every expected failure (bad config, locked state, unreadable
trace) becomes a :class:`GpuhealError` naming what to fix, caught once in ``cli.main``.
"""

from __future__ import annotations


class GpuhealError(Exception):
    """A failure the user can fix; ``key_path`` points into the config when relevant."""

    def __init__(self, message: str, key_path: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key_path = key_path

    def __str__(self) -> str:
        return f"{self.key_path}: {self.message}" if self.key_path else self.message


class ConfigError(GpuhealError):
    """The configuration file is missing, unparsable or fails validation."""


class StateLockedError(GpuhealError):
    """Another gpuheal run holds the state directory (contract: "two runs never act at once")."""
