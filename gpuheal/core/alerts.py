"""The alert queue's logic (issue 10, item 1). Pure: values in, values out; ``now_s`` a parameter.

Contract ("Alerts"): alerts are queued by ``heal`` and sent only by ``escalate``; one per
(gpu, issue) fingerprint until its state changes; unsent alerts survive to the next run; the All
Clear on every Nth clean cycle. Stored as ``alerts.json`` (internal)::

    {"queue": [ALERT, ...],               # not yet delivered, oldest first
     "sent":  {FINGERPRINT: {"kind", "sent_at": epoch_s, "state_key", "message_id",
                             "first_sent_at", "reminders": n, "alert": ALERT,
                             "folded_into": FINGERPRINT (absorbed into a host-unreachable alert)}},
     "clean_cycles": int}                 # consecutive clean heal cycles

    ALERT = Alert.to_json() + optional {"delivery": {"tries", "last_try_at", "last_error",
            "not_before"}, "reminder": n, "unfolded": true}

Here: fingerprinting and dedup (:func:`enqueue`), All Clear counting (:func:`count_clean_cycle`),
reminders (:func:`due_reminders`), folding a host's escalations into its ``host-unreachable``
alert (:func:`fold`, :func:`unfold`) and the dedup memory (:func:`record_sent`,
:func:`prune_sent`). Queued documents are read tolerantly: a junk field is shown as junk, never a
crash. :mod:`gpuheal.steps.escalate` loads, calls these, sends, and saves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuheal.core import timing

FILE = "alerts.json"
HOST_UNREACHABLE = "host-unreachable"
SENT_KEEP_S = 30 * 86400  # settled entries of the dedup memory are forgotten after this
OPEN_STATES = ("firing", "pending", "verifying")


@dataclass(frozen=True)
class Alert:
    """One alert as ``heal`` queues it."""

    gpu: str
    issue: str | None
    kind: str  # escalated | resolved | all-clear
    state_key: str  # changes when the (gpu, issue) state changes: the dedup key
    created_at: float
    summary: str
    run_id: str | None = None
    detected: dict[str, Any] = field(default_factory=dict)
    tried: tuple[str, ...] = ()
    attempts: int = 0
    since: str | None = None

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.gpu, self.issue)

    def to_json(self) -> dict[str, Any]:
        return {
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


def fingerprint(gpu: str, issue: str | None) -> str:
    return f"{gpu}/{issue or 'all-clear'}"


def issue_alert(
    gpu: str,
    issue: str,
    kind: str,
    since: str | None,
    now_s: float,
    summary: str,
    *,
    run_id: str | None,
    detected: dict[str, Any],
    tried: list[str],
    attempts: int,
) -> Alert:
    """An escalation or a resolution of one occurrence (``since``) of (gpu, issue)."""
    return Alert(gpu, issue, kind, f"{kind}:{since}", now_s, summary, run_id, detected, tuple(tried), attempts, since)


def all_clear(now_s: float, every: int) -> Alert:
    return Alert("fleet", None, "all-clear", f"all-clear:{now_s:.0f}", now_s, f"{every} clean cycles in a row",
                 detected={"clean_cycles": every})  # fmt: skip


# --------------------------------------------------------------------------- the queue document


def empty() -> dict[str, Any]:
    return {"queue": [], "sent": {}, "clean_cycles": 0}


def normalise(data: Any) -> dict[str, Any]:
    out = empty()
    if not isinstance(data, dict):
        return out
    if isinstance(data.get("queue"), list):
        out["queue"] = [a for a in data["queue"] if isinstance(a, dict) and "fingerprint" in a]
    if isinstance(data.get("sent"), dict):
        out["sent"] = {k: v for k, v in data["sent"].items() if isinstance(v, dict)}
    if isinstance(data.get("clean_cycles"), int) and not isinstance(data["clean_cycles"], bool):
        out["clean_cycles"] = max(0, min(data["clean_cycles"], 1 << 31))
    return out


def enqueue(data: dict[str, Any], alert: dict[str, Any] | Alert) -> bool:
    """Queue ``alert`` unless the same fingerprint in the same state is queued or was sent.

    A newer alert for a fingerprint replaces a queued older one (the state changed before the
    old one could be delivered: only the current truth is worth sending). Returns True if queued.
    """
    if isinstance(alert, Alert):
        alert = alert.to_json()
    fp, key = alert["fingerprint"], alert["state_key"]
    sent = data["sent"].get(fp)
    if sent is not None and sent.get("state_key") == key:
        return False
    for i, queued in enumerate(data["queue"]):
        if queued["fingerprint"] == fp:
            if queued.get("state_key") == key:
                return False
            data["queue"][i] = alert
            return True
    data["queue"].append(alert)
    return True


def count_clean_cycle(data: dict[str, Any], clean: bool, every: int, now_s: float) -> None:
    """Contract: the All Clear on every Nth clean cycle (no open issue, no action); any other
    cycle, and each All Clear, starts the count over."""
    if not clean:
        data["clean_cycles"] = 0
        return
    data["clean_cycles"] += 1
    if data["clean_cycles"] >= every:
        data["clean_cycles"] = 0
        enqueue(data, all_clear(now_s, every))


# --------------------------------------------------------------------------- what escalate sends


@dataclass
class Message:
    alert: dict[str, Any]
    folded: list[dict[str, Any]] = field(default_factory=list)  # queued alerts sent inside this one
    mentioned: list[dict[str, Any]] = field(default_factory=list)  # already-absorbed, still open

    @property
    def members(self) -> list[dict[str, Any]]:
        return [self.alert, *self.folded]


def open_issue_keys(health: Any) -> set[tuple[str, str]] | None:
    """(gpu, issue) pairs open in ``gpu-health.json``; ``None`` when that is unknown."""
    if not isinstance(health, dict) or not isinstance(health.get("issues"), list):
        return None
    return {
        (str(i.get("gpu")), str(i.get("issue")))
        for i in health["issues"]
        if isinstance(i, dict) and i.get("state", "firing") in OPEN_STATES
    }


def _is_open(keys: set[tuple[str, str]] | None, gpu: Any, issue: Any) -> bool:
    return keys is None or (str(gpu), str(issue)) in keys


def as_int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def as_time(value: Any) -> float | None:
    """An epoch time as stored; ``None`` for a wrong type, NaN, infinity or an int beyond a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if out == out and abs(out) != float("inf") else None


def _sent_at(sent: dict[str, Any]) -> float | None:
    """When a dedup entry was sent: a missing one is "long ago" (0), junk is ``None``."""
    try:
        return float(sent.get("sent_at") or 0)
    except (TypeError, ValueError, OverflowError):
        return None


def due_reminders(
    data: dict[str, Any],
    open_keys: set[tuple[str, str]] | None,
    now_s: float,
    interval_s: float,
    tol: float = timing.TOLERANCE_S,
) -> list[dict[str, Any]]:
    """Reminders for sent escalations still open after ``interval_s``. Needs a health document:
    without one nothing is known to be still broken, so nothing is repeated. The interval is
    counted in polls (core/timing, issue 9): a run a second early sends the reminder it stands for."""
    if open_keys is None:
        return []
    queued = {a["fingerprint"] for a in data["queue"]}
    out = []
    for fp, sent in data["sent"].items():
        alert = sent.get("alert")
        if sent.get("kind") != "escalated" or fp in queued or sent.get("folded_into") or not isinstance(alert, dict):
            continue
        if (str(alert.get("gpu")), str(alert.get("issue"))) not in open_keys:
            continue
        if timing.less_than(now_s - (_sent_at(sent) or 0.0), interval_s, tol):
            continue
        reminder = {k: v for k, v in alert.items() if k != "delivery"}
        reminder["reminder"] = as_int(sent.get("reminders")) + 1
        reminder["fingerprint"] = fp
        out.append(reminder)
    return out


def fold(
    data: dict[str, Any], open_keys: set[tuple[str, str]] | None
) -> tuple[list[Message], list[tuple[dict[str, Any], str]], list[dict[str, Any]]]:
    """(messages, absorbed (alert, into-fingerprint), duplicates) for the current queue.

    A host's other escalations go out inside its ``host-unreachable`` alert (one message that
    lists them); while an escalated ``host-unreachable`` of that host stays open, later
    escalations of the same host are absorbed without a message of their own. An alert whose
    state was already sent is a duplicate."""
    duplicates = [a for a in data["queue"] if _is_duplicate(data, a)]
    live = [a for a in data["queue"] if not _is_duplicate(data, a)]
    hu_resolving = {a.get("gpu") for a in live if a.get("issue") == HOST_UNREACHABLE and a.get("kind") == "resolved"}

    def hu_sent_open(gpu: Any) -> bool:
        sent = data["sent"].get(fingerprint(str(gpu), HOST_UNREACHABLE))
        return bool(
            sent
            and sent.get("kind") == "escalated"
            and gpu not in hu_resolving
            and _is_open(open_keys, gpu, HOST_UNREACHABLE)
        )

    hosts = {id(a): Message(a) for a in live if a.get("kind") == "escalated" and a.get("issue") == HOST_UNREACHABLE}
    by_gpu = {m.alert.get("gpu"): m for m in hosts.values()}  # the host's (last) host-unreachable alert
    ordered: list[Message] = []
    absorbed: list[tuple[dict[str, Any], str]] = []
    for alert in live:
        if id(alert) in hosts:
            ordered.append(hosts[id(alert)])
            continue
        gpu = alert.get("gpu")
        if alert.get("kind") == "escalated" and gpu != "fleet":
            if gpu in by_gpu:
                by_gpu[gpu].folded.append(alert)
                continue
            if hu_sent_open(gpu):
                absorbed.append((alert, fingerprint(str(gpu), HOST_UNREACHABLE)))
                continue
        ordered.append(Message(alert))
    for msg in ordered:  # a host-unreachable alert also lists what it absorbed earlier
        if msg.alert.get("issue") == HOST_UNREACHABLE and msg.alert.get("kind") == "escalated":
            msg.mentioned.extend(_absorbed_open(data, msg, open_keys))
    return ordered, absorbed, duplicates


def _is_duplicate(data: dict[str, Any], alert: dict[str, Any]) -> bool:
    sent = data["sent"].get(alert["fingerprint"])
    return (
        sent is not None
        and sent.get("state_key") == alert.get("state_key")
        and not alert.get("reminder")
        and not alert.get("unfolded")
    )


def _absorbed_open(data: dict[str, Any], msg: Message, open_keys) -> list[dict[str, Any]]:
    fp = msg.alert["fingerprint"]
    taken = {a["fingerprint"] for a in msg.folded}
    out = []
    for ofp, sent in data["sent"].items():
        if sent.get("folded_into") == fp and sent.get("kind") == "escalated" and ofp not in taken:
            other = sent.get("alert")
            if isinstance(other, dict) and _is_open(open_keys, other.get("gpu"), other.get("issue")):
                out.append(other)
    return out


def stored_copy(alert: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in alert.items() if k not in ("delivery", "reminder", "unfolded")}


def record_sent(
    data: dict[str, Any], alert: dict[str, Any], now_s: float, message_id: int | None, folded_into: str | None = None
) -> None:
    fp = alert["fingerprint"]
    prev = data["sent"].get(fp) or {}
    same = prev.get("state_key") == alert.get("state_key")
    entry = {
        "kind": alert.get("kind"),
        "sent_at": now_s,
        "state_key": alert.get("state_key"),
        "message_id": message_id,
        "first_sent_at": prev.get("first_sent_at", now_s) if same else now_s,
        "reminders": as_int(alert.get("reminder")),
        "alert": stored_copy(alert),
    }
    if folded_into:
        entry["folded_into"] = folded_into
    data["sent"][fp] = entry


def remove_from_queue(data: dict[str, Any], alerts: list[dict[str, Any]]) -> None:
    ids = {id(a) for a in alerts}
    data["queue"] = [a for a in data["queue"] if id(a) not in ids]


def unfold(data: dict[str, Any], gpu: str, open_keys: set[tuple[str, str]] | None) -> list[dict[str, Any]]:
    """The host is back: its absorbed escalations that are still open go out on their own."""
    hu_fp = fingerprint(gpu, HOST_UNREACHABLE)
    queued = {a["fingerprint"] for a in data["queue"]}
    out = []
    for fp, sent in data["sent"].items():
        if sent.get("folded_into") != hu_fp:
            continue
        del sent["folded_into"]
        alert = sent.get("alert")
        if sent.get("kind") == "escalated" and isinstance(alert, dict) and fp not in queued:
            if _is_open(open_keys, alert.get("gpu"), alert.get("issue")):
                standalone = dict(alert, unfolded=True, fingerprint=fp)
                data["queue"].append(standalone)
                out.append(standalone)
    return out


def prune_sent(data: dict[str, Any], open_keys: set[tuple[str, str]] | None, now_s: float) -> None:
    for fp in list(data["sent"]):
        sent = data["sent"][fp]
        sent_at = _sent_at(sent)
        age = now_s - sent_at if sent_at is not None else SENT_KEEP_S + 1
        if age <= SENT_KEEP_S:
            continue
        alert = sent.get("alert") if isinstance(sent.get("alert"), dict) else {}
        if sent.get("kind") == "escalated" and _is_open(open_keys, alert.get("gpu"), alert.get("issue")):
            continue
        del data["sent"][fp]


# --------------------------------------------------------------------------- delivery bookkeeping


def delivery(alert: dict[str, Any]) -> dict[str, Any]:
    """The alert's delivery bookkeeping ({"tries", "last_try_at", "last_error", "not_before"})."""
    d = alert.get("delivery")
    if not isinstance(d, dict):
        d = alert["delivery"] = {}
    return d


def note_failure(alerts: list[dict[str, Any]], now_s: float, detail: str) -> None:
    for a in alerts:
        d = delivery(a)
        d["tries"] = as_int(d.get("tries")) + 1
        d["last_try_at"] = now_s
        d["last_error"] = detail


def not_before(alert: dict[str, Any]) -> float:
    d = alert.get("delivery")
    return (as_time(d.get("not_before")) if isinstance(d, dict) else None) or 0.0
