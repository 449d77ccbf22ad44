"""The alert queue as its file format (``alerts.json``, a dict), for callers of the first release;
the logic lives in :mod:`gpuheal.core.alerts` (pure, typed) and is orchestrated by
:mod:`gpuheal.steps.escalate`."""

from __future__ import annotations

from typing import Any

from gpuheal.core.alert import Alert
from gpuheal.core.alerts import FILE, AlertQueue, fingerprint, normalise

__all__ = ["FILE", "empty", "enqueue", "fingerprint", "normalise"]


def empty() -> dict[str, Any]:
    return AlertQueue().to_json()


def enqueue(data: dict[str, Any], alert: dict[str, Any] | Alert) -> bool:
    """:meth:`AlertQueue.enqueue` on the document ``data`` (updated in place). True if queued."""
    queue = AlertQueue.from_json(data)
    typed = alert if isinstance(alert, Alert) else Alert.from_json(alert)
    if typed is None:
        raise ValueError("an alert needs a fingerprint")
    queued = queue.enqueue(typed)
    data.update(queue.to_json())
    return queued
