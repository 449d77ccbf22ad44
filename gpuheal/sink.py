"""The alert sink seam (issue 19 item 3): where gpuheal's messages to humans go.

``escalate`` and ``report --send`` deliver through an :class:`AlertSink` — send one message, get a
typed :class:`SendOutcome` — and never name the service or read its config section;
:func:`gpuheal.sinks.open_sink` picks the configured one, and :func:`gpuheal.sinks.destination` says
where it delivers and how content is fitted to it without credentials (``--dry-run``). What to send
and how often (reminders, grouping, the per-run budget) is sink-neutral: ``alerts:``
(:class:`gpuheal.config.model.AlertsConfig`). Zulip (:mod:`gpuheal.zulip`) is the one implementation;
the files a second sink takes, and how it declares its secrets, are listed in :mod:`gpuheal.sinks`.
(The types live here, the choice in ``sinks``: a sink module imports this one, so this one imports no
sink.)

Outcomes are values, never exceptions: a cron run records "not before" on a rate limit and leaves
the alert queued; it must not sleep or crash inside the call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class SendStatus(StrEnum):
    """What one send came to (the values are those written to ``alerts.json`` and ``--json``). Not the
    queued alert's bookkeeping of its tries: that is :class:`gpuheal.core.alert.Tries`."""

    SENT = "sent"  # delivered; ``message_id`` names it
    RATE_LIMITED = "rate-limited"  # try again after ``retry_after_s``
    UNAUTHORIZED = "unauthorized"  # the credentials were refused
    REJECTED = "rejected"  # the service refused this message (4xx): a bad stream, too long
    SERVER_ERROR = "server-error"  # 5xx
    TIMEOUT = "timeout"  # no whole answer within the deadline
    UNREACHABLE = "unreachable"  # connection refused
    INVALID = "invalid"  # an answer that is not the service's


@dataclass(frozen=True)
class SendOutcome:
    kind: SendStatus
    detail: str = ""
    message_id: int | None = None
    status: int | None = None
    code: str | None = None
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.kind == SendStatus.SENT


@dataclass(frozen=True)
class Destination:
    """Where the configured sink delivers, from the config alone (no credentials): what ``escalate``
    and ``report`` show and record (``stream`` / ``topic`` in their ``--json``); ``max_chars``, the
    longest message the service takes whole — the one limit the renderers fit a message to (a group
    alert's table, the weekly report) — and ``fit``, that limit applied visibly before it is sent."""

    sink: str  # "Zulip": for log lines
    channel: str  # the stream (or a channel, a room)
    topic: str  # the default topic, already within the service's limit
    fit: Callable[[str], str]
    max_chars: int

    @property
    def where(self) -> str:
        return f"#{self.channel} > {self.topic}"


class SinkUnavailable(Exception):
    """Nothing can be sent: ``kind`` is ``not-configured`` or ``no-credentials``; ``detail`` names
    the setting or the environment variable, never a secret's value."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind, self.detail = kind, detail


class AlertSink(Protocol):
    """One destination for messages to humans."""

    name: str  # "Zulip": for log lines
    max_chars: int  # the longest message the service takes whole (its Destination's)
    where: str  # the default destination, for humans ("#agent-hub > alerts-gpu")
    credential_hint: str  # what to check when credentials are refused (variable names only)

    def send(self, content: str, topic: str | None = None) -> SendOutcome:
        """Post one message (to ``topic`` or the default one); never raises for delivery trouble."""
        ...
