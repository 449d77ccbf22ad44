"""One queued alert as a typed record (:class:`Alert`, with ``escalate``'s :class:`Tries`), read tolerantly.

Below the queue's logic (:mod:`gpuheal.core.alerts`) so that what only carries alerts — a re-benchmark's
verdict (:class:`gpuheal.core.rebench.Told`) — needs the record and not the queue, which reads the rules'
alert policies (issue 26: no import circle). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuheal.core.heal_state import num as as_time  # an epoch time as stored; None for junk

# Alert.to_json's keys; any other key of a queued document (a renderer's "severity",
# "verification") is kept in Alert.extra and written back as it came.
_KEYS = ("fingerprint", "gpu", "issue", "kind", "state_key", "created_at", "run_id", "detected", "tried",
         "attempts", "since", "summary", "title", "content", "topic", "reminder", "unfolded", "delivery")  # fmt: skip


def as_int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def text_of(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Tries:
    """``escalate``'s bookkeeping of one queued alert: failed tries, and the sink's "not before" (what a
    delivery answered is :class:`gpuheal.sink.SendStatus`; this is what the queue remembers of the tries)."""

    tries: int = 0
    last_try_at: float | None = None
    last_error: str | None = None
    not_before: float | None = None

    @classmethod
    def from_json(cls, value: Any) -> Tries | None:
        if not isinstance(value, dict):
            return None
        error = value.get("last_error")
        return cls(as_int(value.get("tries")), as_time(value.get("last_try_at")),
                   None if error is None else str(error), as_time(value.get("not_before")))  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tries": self.tries} if self.tries else {}
        for key in ("last_try_at", "last_error", "not_before"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True)
class Alert:
    """One queued alert: what ``heal`` (or ``report``) queued, and ``escalate``'s bookkeeping.

    ``fingerprint`` is the dedup key — ``gpu/issue``, or a report's own (``fleet/weekly-report``);
    ``state_key`` changes when the (gpu, issue) state changes."""

    fingerprint: str
    gpu: str | None
    issue: str | None
    kind: str | None  # escalated | resolved | all-clear | report
    state_key: str | None
    created_at: float | None
    summary: str
    run_id: str | None = None
    detected: dict[str, Any] = field(default_factory=dict)
    tried: tuple[Any, ...] = ()  # action names, or {"action", "result"} records
    attempts: int | None = 0
    since: str | None = None
    title: str | None = None  # a queued report's own title and content (kind "report")
    content: str | None = None
    topic: str | None = None  # a Zulip topic other than zulip.topic
    reminder: int = 0  # the nth reminder of an escalation still open
    unfolded: bool = False  # re-sent on its own once the host it was folded into came back
    delivery: Tries | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, value: Any) -> Alert | None:
        """A queued document as a record; ``None`` when it has no fingerprint (not an alert)."""
        if not isinstance(value, dict) or "fingerprint" not in value:
            return None
        v = value.get
        attempts, tried, detected = v("attempts"), v("tried"), v("detected")
        return cls(
            fingerprint=str(v("fingerprint")), gpu=text_of(v("gpu")), issue=text_of(v("issue")),
            kind=text_of(v("kind")), state_key=text_of(v("state_key")), created_at=as_time(v("created_at")),
            summary=str(v("summary") or ""), run_id=text_of(v("run_id") or None),
            detected=detected if isinstance(detected, dict) else {},
            tried=tuple(tried) if isinstance(tried, list | tuple) else (),
            attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else None,
            since=v("since") if isinstance(v("since"), str) else None, title=text_of(v("title")),
            content=text_of(v("content")), topic=text_of(v("topic") or None), reminder=as_int(v("reminder")),
            unfolded=v("unfolded") is True, delivery=Tries.from_json(v("delivery")),
            extra={k: x for k, x in value.items() if k not in _KEYS},
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        out = {
            **self.extra,
            "fingerprint": self.fingerprint,
            "gpu": self.gpu,
            "issue": self.issue,
            "kind": self.kind,
            "state_key": self.state_key,
            "created_at": self.created_at,
            "run_id": self.run_id,
            "detected": self.detected,
            "tried": list(self.tried),
            "attempts": self.attempts,
            "since": self.since,
            "summary": self.summary,
        }
        for key in ("title", "content", "topic"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.reminder:
            out["reminder"] = self.reminder
        if self.unfolded:
            out["unfolded"] = True
        if self.delivery is not None:
            out["delivery"] = self.delivery.to_json()
        return out

    def mapped(self, fn: Callable[[dict[str, Any]], dict[str, Any]]) -> Alert:
        """The alert with ``fn`` applied to its document (redaction: every string, same keys)."""
        out = Alert.from_json(fn(self.to_json()))
        if out is None:
            raise ValueError("the mapped alert lost its fingerprint")
        return out

    def stored(self) -> Alert:
        """The alert as the dedup memory keeps it: without ``escalate``'s bookkeeping."""
        return replace(self, reminder=0, unfolded=False, delivery=None)

    @property
    def not_before(self) -> float:
        """Not to be sent before this epoch time (0: any time)."""
        return (self.delivery.not_before if self.delivery else None) or 0.0

    def failed(self, now_s: float, detail: str) -> Alert:
        d = self.delivery or Tries()
        return replace(self, delivery=replace(d, tries=d.tries + 1, last_try_at=now_s, last_error=detail))

    def held_until(self, until_s: float) -> Alert:
        d = self.delivery or Tries()
        return replace(self, delivery=replace(d, not_before=max(until_s, self.not_before)))
