"""The only module that reads wall time (design: "time is a parameter").

``GPUHEAL_NOW`` (ISO 8601 with zone) pins the clock; the simulated fleet's demo and the tests use it
to run one cron process per simulated minute without waiting a minute.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True)
class Clock:
    """Seconds since an arbitrary start, and a way to wait: what a run's in-run waits count on — the in-run
    confirmation's re-probes (``steps/confirm``) and a restart's readiness wait (Rule 3's verify,
    ``actions/execute``). Real seconds by default; tests give both, jittered, and the chaos week gives its
    simulated world's, whose ``sleep`` moves the week on (issue 29)."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def parse_iso(text: str) -> datetime:
    """Parse an ISO 8601 timestamp; a naive one is taken as UTC. Raises ValueError."""
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def format_iso(value: datetime) -> str:
    """``2026-07-18T08:00:00Z`` — the audit trail's timestamp format."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_iso_exact(value: datetime) -> str:
    """:func:`format_iso` with the microseconds kept when there are any (``…T08:01:00.412345Z``):
    a ``check --record`` trace stores each time as the run had it, as the history does, so that
    ``replay`` of the trace gives what the live run gave under a real, jittered clock (issue 9)."""
    value = value.astimezone(UTC)
    return format_iso(value) if not value.microsecond else value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_epoch(epoch_s: float) -> str:
    """:func:`format_iso` of an epoch time (UTC) — the one epoch → ISO conversion."""
    return format_iso(datetime.fromtimestamp(epoch_s, UTC))


def now() -> datetime:
    pinned = os.environ.get("GPUHEAL_NOW")
    if pinned:
        try:
            return parse_iso(pinned)
        except ValueError as exc:
            from gpuheal.errors import GpuhealError

            raise GpuhealError(f"GPUHEAL_NOW: not an ISO 8601 time: {pinned!r}") from exc
    return datetime.now(UTC)


def to_datetime(value: Any) -> datetime | None:
    """A stored time (ISO 8601, epoch seconds, a datetime) as an aware datetime; ``None`` for anything
    else (``True``, a number out of range, a malformed string): state files may be damaged."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(float(value), UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str):
        try:
            return parse_iso(value)
        except ValueError:
            return None
    return None
