"""The alert queue's logic (issue 10, items 1 and 5). Pure: values in, values out; ``now_s`` a parameter.

Contract ("Alerts"): alerts are queued by ``heal`` and sent only by ``escalate``; one per
(gpu, issue) fingerprint until its state changes; unsent alerts survive to the next run; the All
Clear on every Nth clean cycle. Stored as ``alerts.json`` (internal)::

    {"queue": [ALERT, ...],               # not yet delivered, oldest first
     "sent":  {FINGERPRINT: {"kind", "sent_at": epoch_s, "state_key", "message_id",
                             "first_sent_at", "reminders": n, "alert": ALERT,
                             "folded_into": FINGERPRINT (absorbed into a host-unreachable alert)}},
     "clean_cycles": int}                 # consecutive clean heal cycles

    ALERT = Alert.to_json(): {"fingerprint", "gpu", "issue", "kind", "state_key", "created_at",
            "run_id", "detected", "tried", "attempts", "since", "summary"} + when set {"title",
            "content", "topic"} (a queued report), {"reminder": n, "unfolded": true,
            "delivery": {"tries", "last_try_at", "last_error", "not_before"}} (escalate's)

In memory the queue is typed: an :class:`AlertQueue` of :class:`Alert` records (with their
:class:`Tries`), read from that document by :meth:`AlertQueue.from_json` and written back by
:meth:`AlertQueue.to_json` — the file format is unchanged. A queued document is read tolerantly:
an entry without a fingerprint is dropped, a junk field becomes "not known", never a crash.

Here: fingerprinting and dedup (:meth:`AlertQueue.enqueue`), All Clear counting
(:func:`count_clean_cycle`), reminders (:func:`due_reminders`), folding a host's escalations into
its host-level alert (:func:`fold`, :func:`unfold`), one message per incident (:func:`group`) and the
dedup memory (:func:`record_sent`, :func:`prune_sent`). Which issue is host-level, which alerts are
one incident and which are never repeated is what the rules declare (:class:`AlertPolicy`), never an
issue id named here. :mod:`gpuheal.steps.escalate` loads, calls these, sends, and saves.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuheal.core import timing
from gpuheal.core.alert import Alert, as_int, text_of
from gpuheal.core.issue import OPEN_STATES, Reported
from gpuheal.core.remedy import Incident
from gpuheal.core.rule import Rule

FILE = "alerts.json"
SENT_KEEP_S = 30 * 86400  # settled entries of the dedup memory are forgotten after this

@dataclass(frozen=True)
class AlertPolicy:
    """What the rules declare about their alerts (read from the registry by :meth:`of`):

    ``host_issue``: the issue that hides its host's other issues (a rule's ``INHIBITS`` ``"host"``:
    Rule 6) — its escalation carries the host's other escalations in one message; ``incidents``: the
    incident family and rank of each issue (``REMEDY.incident``: Rule 1 over Rule 8's tiers, Rule 4.3);
    ``no_reminders``: issues whose escalation is never repeated (``REMEDY.remind``: Rule 10 alerts once
    per incident, then asks for its alias audit)."""

    host_issue: str | None = None
    incidents: Mapping[str, Incident] = field(default_factory=dict)
    no_reminders: frozenset[str] = frozenset()

    @classmethod
    def of(cls, rules: Iterable[Rule[Any]]) -> AlertPolicy:
        rules = tuple(rules)
        return cls(
            next((r.ID for r in rules if r.INHIBITS == "host"), None),
            {r.ID: r.REMEDY.incident for r in rules if r.REMEDY.incident is not None},
            frozenset(r.ID for r in rules if not r.REMEDY.remind),
        )


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
    return Alert(fingerprint(gpu, issue), gpu, issue, kind, f"{kind}:{since}", now_s, summary, run_id, detected,
                 tuple(tried), attempts, since)  # fmt: skip


def all_clear(now_s: float, every: int) -> Alert:
    return Alert(fingerprint("fleet", None), "fleet", None, "all-clear", f"all-clear:{now_s:.0f}", now_s,
                 f"{every} clean cycles in a row", detected={"clean_cycles": every})  # fmt: skip


# --------------------------------------------------------------------------- the queue document


@dataclass
class AlertQueue:
    """``alerts.json`` in memory: the queue (typed), the dedup memory, the clean-cycle count."""

    queue: list[Alert] = field(default_factory=list)
    sent: dict[str, dict[str, Any]] = field(default_factory=dict)
    clean_cycles: int = 0

    @classmethod
    def from_json(cls, data: Any) -> AlertQueue:
        out = cls()
        if not isinstance(data, dict):
            return out
        if isinstance(data.get("queue"), list):
            out.queue = [a for a in map(Alert.from_json, data["queue"]) if a is not None]
        if isinstance(data.get("sent"), dict):
            out.sent = {k: v for k, v in data["sent"].items() if isinstance(v, dict)}
        if isinstance(data.get("clean_cycles"), int) and not isinstance(data["clean_cycles"], bool):
            out.clean_cycles = max(0, min(data["clean_cycles"], 1 << 31))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"queue": [a.to_json() for a in self.queue], "sent": self.sent, "clean_cycles": self.clean_cycles}

    def enqueue(self, alert: Alert) -> bool:
        """Queue ``alert`` unless the same fingerprint in the same state is queued or was sent.

        A newer alert for a fingerprint replaces a queued older one (the state changed before the
        old one could be delivered: only the current truth is worth sending). Returns True if queued.
        """
        sent = self.sent.get(alert.fingerprint)
        if sent is not None and text_of(sent.get("state_key")) == alert.state_key:
            return False
        for i, queued in enumerate(self.queue):
            if queued.fingerprint == alert.fingerprint:
                if queued.state_key == alert.state_key:
                    return False
                self.queue[i] = alert
                return True
        self.queue.append(alert)
        return True

    def remove(self, alerts: list[Alert]) -> None:
        ids = {id(a) for a in alerts}
        self.queue = [a for a in self.queue if id(a) not in ids]

    def note_failure(self, alerts: list[Alert], now_s: float, detail: str) -> None:
        """The delivery of ``alerts`` failed: each stays queued with one more try noted."""
        ids = {id(a) for a in alerts}
        self.queue = [a.failed(now_s, detail) if id(a) in ids else a for a in self.queue]

    def hold(self, until_s: float) -> None:
        """Zulip asked to wait (a 429): nothing in the queue goes before ``until_s``."""
        self.queue = [a.held_until(until_s) for a in self.queue]


@dataclass(frozen=True)
class Snapshot:
    """``alerts.json`` as a run loaded it, for :func:`changed` (issue 29): the queue's sorted JSON (the queue
    is what is live), the dedup memory's entries as loaded — compared by identity: an entry is replaced
    (:func:`record_sent`, :func:`unfold`) or deleted (:func:`prune_sent`), never changed in place — and
    the clean-cycle count."""

    queue: str
    sent: Mapping[str, dict[str, Any]]
    clean_cycles: int

    @classmethod
    def of(cls, data: AlertQueue) -> Snapshot:
        return cls(_sorted_json([a.to_json() for a in data.queue]), dict(data.sent), data.clean_cycles)


def _sorted_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def changed(data: AlertQueue, before: Snapshot) -> bool:
    """Whether ``data`` differs from what was loaded exactly where the sorted JSON of the whole document
    would (what ``escalate`` compared, twice a run, before issue 29): the queue and the entries replaced
    since are serialised, the 30-day memory's untouched entries are not."""
    if data.clean_cycles != before.clean_cycles or data.sent.keys() != before.sent.keys():
        return True
    was = before.sent
    if any(e is not was[fp] and _sorted_json(e) != _sorted_json(was[fp]) for fp, e in data.sent.items()):
        return True
    return _sorted_json([a.to_json() for a in data.queue]) != before.queue


def normalise(data: Any) -> dict[str, Any]:
    """A stored ``alerts.json`` document, repaired: what a reader of the file format gets."""
    return AlertQueue.from_json(data).to_json()


ACTIONABLE = ("warning", "critical")  # contract "Alerts": the severities that reset the All Clear count


def clean_cycle(issues: Iterable[Any], acted: bool) -> bool:
    """Contract "Alerts": a clean cycle has no open ``warning`` or ``critical`` issue (an ``info``
    recommendation is no problem) and no action (what :func:`count_clean_cycle` counts)."""
    return not acted and not any(i.severity in ACTIONABLE for i in issues)


def count_clean_cycle(data: AlertQueue, clean: bool, every: int, now_s: float) -> None:
    """Contract: the All Clear on every Nth clean cycle (no open warning or critical issue — an open
    ``info`` recommendation is no problem — and no action); any other cycle, and each All Clear,
    starts the count over."""
    if not clean:
        data.clean_cycles = 0
        return
    data.clean_cycles += 1
    if data.clean_cycles >= every:
        data.clean_cycles = 0
        data.enqueue(all_clear(now_s, every))


# --------------------------------------------------------------------------- what escalate sends


@dataclass
class Message:
    """One Zulip message: an incident (a GPU's alert, what its host's outage absorbed, the lower tiers
    its issue inhibits), the same cause on other GPUs (``peers``), or the run's over-budget summary."""

    alert: Alert
    folded: list[Alert] = field(default_factory=list)  # queued alerts sent inside this one
    mentioned: list[Alert] = field(default_factory=list)  # already-absorbed, still open
    tiers: list[Alert] = field(default_factory=list)  # the same GPU's lower tiers, inhibited in the message
    peers: list[Message] = field(default_factory=list)  # other GPUs' incidents of the same cause
    summary: bool = False  # the rest of the run, beyond alerts.max_messages_per_run

    @property
    def members(self) -> list[Alert]:
        own = [self.alert, *self.folded, *self.tiers]
        return own + [a for p in self.peers for a in p.members]

    @property
    def incidents(self) -> list[Message]:
        """This message's incidents, its own first."""
        return [self, *self.peers]


GROUPED_KINDS = ("escalated", "resolved")


def group(
    messages: list[Message], label_of: Callable[[str], str], max_messages: int, policy: AlertPolicy
) -> list[Message]:
    """One cause, one message (contract "Alerts"): each GPU's alerts become one incident, incidents of
    the same kind sharing a group label become one message naming every GPU, and a run sends at most
    ``max_messages`` (the rest folded into one summary). Dedup, reminders and All Clear stay per
    (GPU, issue) underneath: every member is recorded as sent on its own fingerprint."""
    incidents = _incidents(messages, policy.incidents)
    grouped: list[Message] = []
    by_cause: dict[tuple[Any, ...], Message] = {}
    for msg in incidents:
        key = _cause(msg, label_of)
        if key is None:
            grouped.append(msg)
        elif key in by_cause:
            by_cause[key].peers.append(msg)
        else:
            by_cause[key] = msg
            grouped.append(msg)
    if len(grouped) <= max_messages:
        return grouped
    keep, rest = grouped[: max_messages - 1], grouped[max_messages - 1 :]
    first = rest[0]
    return [*keep, Message(first.alert, first.folded, first.mentioned, first.tiers,
                           [*first.peers, *[m for r in rest[1:] for m in r.incidents]], summary=True)]


def _incidents(messages: list[Message], families: Mapping[str, Incident]) -> list[Message]:
    """Alertmanager's ``inhibit_rules``, per GPU: its highest-ranked alert of an incident family carries,
    inside its message, the same kind's alerts of that family with a lower rank (one incident, one line
    each). An alert already carrying others, or a reminder, stands alone."""

    def family(msg: Message) -> Incident | None:
        return None if msg.folded or msg.alert.reminder else families.get(str(msg.alert.issue))

    heads: dict[tuple[Any, str | None, str], tuple[Message, int]] = {}
    for msg in messages:
        inc = family(msg)
        if inc is None:
            continue
        key = (msg.alert.gpu, msg.alert.kind, inc.family)
        if key not in heads or heads[key][1] < inc.rank:
            heads[key] = (msg, inc.rank)
    out: list[Message] = []
    for msg in messages:
        inc = family(msg)
        head = heads.get((msg.alert.gpu, msg.alert.kind, inc.family)) if inc is not None else None
        if inc is not None and head is not None and inc.rank < head[1]:
            head[0].tiers.append(msg.alert)
            continue
        out.append(msg)
    return out


def _cause(msg: Message, label_of: Callable[[str], str]) -> tuple[Any, ...] | None:
    """What groups this incident with others: (kind, issue, reminder or not, group label); ``None``
    when it stands alone (a fleet-wide issue, a host outage carrying folded alerts, a report)."""
    a = msg.alert
    if a.kind not in GROUPED_KINDS or a.gpu in (None, "fleet") or msg.folded or msg.mentioned:
        return None
    return (a.kind, a.issue, bool(a.reminder), label_of(str(a.gpu)))


def open_issue_keys(health: Any) -> set[tuple[str, str]] | None:
    """(gpu, issue) pairs open in ``gpu-health.json``; ``None`` when that is unknown."""
    if not isinstance(health, dict) or not isinstance(health.get("issues"), list):
        return None
    return {(str(i.gpu), str(i.issue)) for i in Reported.all_of(health["issues"]) if i.state in OPEN_STATES}


def _is_open(keys: set[tuple[str, str]] | None, gpu: Any, issue: Any) -> bool:
    return keys is None or (str(gpu), str(issue)) in keys


def _sent_at(sent: dict[str, Any]) -> float | None:
    """When a dedup entry was sent: a missing one is "long ago" (0), junk is ``None``."""
    try:
        return float(sent.get("sent_at") or 0)
    except (TypeError, ValueError, OverflowError):
        return None


def _sent_alert(sent: dict[str, Any], fp: str) -> Alert | None:
    """The alert a dedup entry remembers, under that entry's fingerprint."""
    alert = Alert.from_json({**sent["alert"], "fingerprint": fp}) if isinstance(sent.get("alert"), dict) else None
    return alert


def due_reminders(
    data: AlertQueue,
    open_keys: set[tuple[str, str]] | None,
    now_s: float,
    interval_s: float,
    tol: float = timing.TOLERANCE_S,
    *,
    policy: AlertPolicy,
) -> list[Alert]:
    """Reminders for sent escalations still open after ``interval_s``. Needs a health document:
    without one nothing is known to be still broken, so nothing is repeated. The interval is
    counted in polls (core/timing, issue 9): a run a second early sends the reminder it stands for."""
    if open_keys is None:
        return []
    queued = {a.fingerprint for a in data.queue}
    out = []
    for fp, sent in data.sent.items():
        if not _may_remind(sent, fp, queued, open_keys, policy):
            continue
        if timing.less_than(now_s - (_sent_at(sent) or 0.0), interval_s, tol):
            continue
        alert = _sent_alert(sent, fp)  # parsed only when due (issue 29: the memory is kept 30 days)
        if alert is not None:
            out.append(replace(alert, delivery=None, reminder=as_int(sent.get("reminders")) + 1))
    return out


def _may_remind(sent: dict[str, Any], fp: str, queued: set[str], open_keys: set[tuple[str, str]],
                policy: AlertPolicy) -> bool:  # fmt: skip
    """Whether a dedup entry is a sent escalation, neither queued nor absorbed, whose (gpu, issue) is still
    open and may be repeated: read off the stored alert's own fields, as :meth:`Alert.from_json` would read
    them (``text_of``; ``str(text_of(x)) == str(x)``), so that only a due entry's alert is parsed (issue 29:
    each run used to parse every entry of the 30-day memory)."""
    stored = sent.get("alert")
    if sent.get("kind") != "escalated" or fp in queued or sent.get("folded_into") or not isinstance(stored, dict):
        return False
    if text_of(stored.get("issue")) in policy.no_reminders:
        return False
    return (str(stored.get("gpu")), str(stored.get("issue"))) in open_keys


def fold(
    data: AlertQueue, open_keys: set[tuple[str, str]] | None, policy: AlertPolicy
) -> tuple[list[Message], list[tuple[Alert, str]], list[Alert]]:
    """(messages, absorbed (alert, into-fingerprint), duplicates) for the current queue.

    A host's other escalations go out inside its host-level alert (``policy.host_issue``: one message
    that lists them); while an escalated host-level alert of that host stays open, later
    escalations of the same host are absorbed without a message of their own. An alert whose
    state was already sent is a duplicate."""
    host_issue = policy.host_issue
    duplicates = [a for a in data.queue if _is_duplicate(data, a)]
    live = [a for a in data.queue if not _is_duplicate(data, a)]
    hu_resolving = {a.gpu for a in live if host_issue and a.issue == host_issue and a.kind == "resolved"}

    def hu_sent_open(gpu: Any) -> bool:
        sent = data.sent.get(fingerprint(str(gpu), host_issue)) if host_issue else None
        return bool(
            sent
            and sent.get("kind") == "escalated"
            and gpu not in hu_resolving
            and _is_open(open_keys, gpu, host_issue)
        )

    hosts = {id(a): Message(a) for a in live if a.kind == "escalated" and host_issue and a.issue == host_issue}
    by_gpu = {m.alert.gpu: m for m in hosts.values()}  # the host's (last) host-unreachable alert
    ordered: list[Message] = []
    absorbed: list[tuple[Alert, str]] = []
    for alert in live:
        if id(alert) in hosts:
            ordered.append(hosts[id(alert)])
            continue
        if alert.kind == "escalated" and alert.gpu != "fleet":
            if alert.gpu in by_gpu:
                by_gpu[alert.gpu].folded.append(alert)
                continue
            if hu_sent_open(alert.gpu):
                absorbed.append((alert, fingerprint(str(alert.gpu), host_issue)))
                continue
        ordered.append(Message(alert))
    for msg in ordered:  # a host-level alert also lists what it absorbed earlier
        if host_issue and msg.alert.issue == host_issue and msg.alert.kind == "escalated":
            msg.mentioned.extend(_absorbed_open(data, msg, open_keys))
    return ordered, absorbed, duplicates


def _is_duplicate(data: AlertQueue, alert: Alert) -> bool:
    sent = data.sent.get(alert.fingerprint)
    return (
        sent is not None
        and text_of(sent.get("state_key")) == alert.state_key
        and not alert.reminder
        and not alert.unfolded
    )


def _absorbed_open(data: AlertQueue, msg: Message, open_keys: set[tuple[str, str]] | None) -> list[Alert]:
    fp = msg.alert.fingerprint
    taken = {a.fingerprint for a in msg.folded}
    out = []
    for ofp, sent in data.sent.items():
        if sent.get("folded_into") == fp and sent.get("kind") == "escalated" and ofp not in taken:
            other = _sent_alert(sent, ofp)
            if other is not None and _is_open(open_keys, other.gpu, other.issue):
                out.append(other)
    return out


def record_sent(
    data: AlertQueue, alert: Alert, now_s: float, message_id: int | None, folded_into: str | None = None
) -> None:
    fp = alert.fingerprint
    prev = data.sent.get(fp) or {}
    same = text_of(prev.get("state_key")) == alert.state_key
    entry = {
        "kind": alert.kind,
        "sent_at": now_s,
        "state_key": alert.state_key,
        "message_id": message_id,
        "first_sent_at": prev.get("first_sent_at", now_s) if same else now_s,
        "reminders": alert.reminder,
        "alert": alert.stored().to_json(),
    }
    if folded_into:
        entry["folded_into"] = folded_into
    data.sent[fp] = entry


def unfold(data: AlertQueue, gpu: str, open_keys: set[tuple[str, str]] | None, policy: AlertPolicy) -> list[Alert]:
    """The host is back: its absorbed escalations that are still open go out on their own."""
    if policy.host_issue is None:
        return []
    hu_fp = fingerprint(gpu, policy.host_issue)
    queued = {a.fingerprint for a in data.queue}
    out = []
    for fp, sent in list(data.sent.items()):
        if sent.get("folded_into") != hu_fp:
            continue
        # a new entry, never the loaded one changed in place: escalate's change detection (:func:`changed`)
        sent = data.sent[fp] = {k: v for k, v in sent.items() if k != "folded_into"}
        alert = _sent_alert(sent, fp)
        if sent.get("kind") == "escalated" and alert is not None and fp not in queued:
            if _is_open(open_keys, alert.gpu, alert.issue):
                standalone = replace(alert, unfolded=True)
                data.queue.append(standalone)
                out.append(standalone)
    return out


def prune_sent(data: AlertQueue, open_keys: set[tuple[str, str]] | None, now_s: float) -> None:
    for fp in list(data.sent):
        sent = data.sent[fp]
        sent_at = _sent_at(sent)
        age = now_s - sent_at if sent_at is not None else SENT_KEEP_S + 1
        if age <= SENT_KEEP_S:
            continue
        stored = sent.get("alert")
        alert = stored if isinstance(stored, dict) else {}
        if sent.get("kind") == "escalated" and _is_open(open_keys, alert.get("gpu"), alert.get("issue")):
            continue
        del data.sent[fp]
