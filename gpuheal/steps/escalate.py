"""``gpuheal escalate``: deliver the queued alerts to Zulip; unsent ones stay queued.

Orchestration only: what to send — reminders, folding, dedup — is decided by the pure
:mod:`gpuheal.core.alerts`; this module loads the queue, calls it, sends, records and saves.

``heal`` queues (``alerts.json``, :mod:`gpuheal.alerts`); this is the only sender. Each run:

1. brings the knowledge graph up to date with the audit trail (:func:`gpuheal.kg.sync`);
2. queues a **reminder** for every escalation already sent whose (gpu, issue) is still open in
   ``gpu-health.json`` and whose last message is older than ``alerts.repeat_interval_h``
   (default 4 h) — "repeated after a configurable interval while it stays broken";
3. **folds** a host's other escalations into its ``host-unreachable`` alert (one message that
   lists them); while an escalated ``host-unreachable`` of that host stays open, later
   escalations of the same host are absorbed without a message of their own (they appear in
   its reminders), and are re-sent on their own when the host's resolution goes out;
4. **groups** (:func:`gpuheal.core.alerts.group`): a GPU's lower thermal tiers go inside its highest
   tier's message (one incident); incidents of the same kind and issue sharing a ``alerts.group_by``
   label are one message naming every GPU; at most ``alerts.max_messages_per_run`` messages, the rest
   folded into one summary — one cause, one message;
5. sends the messages oldest first. One per (gpu, issue) fingerprint and state: an alert whose
   state was already sent is dropped as a duplicate.

Failures keep every undelivered alert queued and make the exit status 1 (contract): a 429 whose
``retry-after`` is at most ``SHORT_RETRY_S`` is waited out once, a longer one is recorded as
"not before" on the queued alerts and the run stops sending; a 401 stops the run with one line
on stderr naming the credential variables; a 5xx, a timeout (the sink's hard deadline: ``zulip.timeout_s``)
or a refused connection stops the run likewise. Missing credentials: one line naming the
variable, exit 1. ``--dry-run`` prints the messages and changes nothing.

``--json`` document::

    {"dry_run": bool, "sent": [MSG], "would_send": [MSG + {"topic", "content"}],
     "grouped": N (incidents sent inside another GPU's message of the same cause),
     "over_budget": N (incidents folded into the summary past alerts.max_messages_per_run),
     "absorbed": [{"fingerprint", "folded_into"}], "dropped": [{"fingerprint", "reason"}],
     "queued": [{"fingerprint", "gpu", "issue", "kind", "reminder", "tries", "last_error",
                 "not_before"}],
     "error": null | {"kind", "detail"}, "knowledge_graph": {"written", "posted", "pending"}}
    MSG = {"fingerprint", "gpu", "issue", "kind", "reminder", "title", "message_id",
           "folded": [FINGERPRINT, ...]}
"""

from __future__ import annotations

import copy
import json
import logging
import time
from typing import Any

from gpuheal.core import alerts as core
from gpuheal.core.alerts import HOST_UNREACHABLE, Alert, Message
from gpuheal.render.escalate import epoch_text, message_entry, queued_entries
from gpuheal.state import files

log = logging.getLogger("gpuheal")

SHORT_RETRY_S = 2.0  # a 429 asking for at most this long is waited out once inside the run
RETRY_WITHOUT_HINT_S = 60.0  # a 429 without retry-after: hold the queue a minute (Zulip's usual window)
_sleep = time.sleep  # tests replace it


def load_alerts(store) -> core.AlertQueue:
    return core.AlertQueue.from_json(store.read(files.ALERTS, None))


def command(rt, store, dry_run: bool = False, post=None):
    """CLI adapter: the run in the module docstring's order. ``post`` replaces the HTTP transport
    in unit tests."""
    from gpuheal import exit_codes
    from gpuheal.credentials import secrets_for
    from gpuheal.runtime import CommandResult

    now_s = rt.now.timestamp()
    secrets = secrets_for(rt.cfg)
    doc: dict[str, Any] = dict(dry_run=dry_run, sent=[], would_send=[], absorbed=[], dropped=[], queued=[],
                               error=None, knowledge_graph=None)  # fmt: skip
    warnings = [] if dry_run else _sync_knowledge_graph(rt, store, secrets, doc)
    data = load_alerts(store)
    before = json.dumps(data.to_json(), sort_keys=True, default=str)
    if dry_run:
        data = copy.deepcopy(data)
    open_keys = core.open_issue_keys(store.read_raw(files.GPU_HEALTH))
    out = _Outbox(rt, secrets)
    data.queue.extend(core.due_reminders(data, open_keys, now_s, out.interval_s))
    messages, absorbed, duplicates = core.fold(data, open_keys)
    messages = core.group(messages, out.label_of, out.max_messages)
    doc["grouped"] = sum(len(m.peers) for m in messages)
    doc["over_budget"] = sum(len(m.incidents) for m in messages if m.summary)
    _settle(doc, data, duplicates, absorbed, now_s, out, dry_run)
    error: dict[str, Any] | None = None
    if dry_run:
        _preview(doc, messages, out, now_s)
    elif messages:
        error = _send(rt, store, data, messages, open_keys, out, doc, post)
    if not dry_run:
        core.prune_sent(data, open_keys, now_s)
        after = data.to_json()
        if json.dumps(after, sort_keys=True, default=str) != before:  # cron runs this every minute
            store.write(files.ALERTS, out.redacted(after))
    doc["queued"] = out.redacted(queued_entries(data))  # a failed try's detail may name a secret
    if error is not None:
        _report_error(doc, error, len(data.queue), secrets)
    code = exit_codes.OK if dry_run or not data.queue else exit_codes.ATTENTION

    def render() -> None:
        from gpuheal.render.escalate import render_escalate

        render_escalate(doc, out.stream, out.topic)

    return CommandResult(document=doc, exit_code=code, render=render, warnings=warnings)


def _sync_knowledge_graph(rt, store, secrets, doc: dict[str, Any]) -> list[str]:
    """Step 1: the knowledge graph catches up with the audit trail; its warnings are the run's."""
    from gpuheal import kg

    summary = kg.sync(rt.cfg, store, rt.now, secrets)
    warnings = summary.pop("warnings")
    doc["knowledge_graph"] = summary
    return warnings


class _Outbox:
    """Where and how messages go: the sink's destination (its stream and topic, its length limit) and
    the sink-neutral ``alerts:`` policy; each alert rendered and redacted."""

    def __init__(self, rt, secrets) -> None:
        from gpuheal.sinks import destination

        self.now, self.cfg, self.secrets = rt.now, rt.cfg, secrets
        self.to = destination(rt.cfg)
        policy = rt.cfg.alerts
        self.interval_s = policy.repeat_interval_h * 3600.0
        self.stream, self.topic = self.to.channel, self.to.topic
        self.host_aliases = {g.host: g.alias for g in rt.cfg.gpus}
        group_by = policy.group_by
        self._group_by = str(group_by or "")
        self._labels = {g.alias: g.labels.get(group_by, "") if group_by else "" for g in rt.cfg.gpus}
        self._hosts = {g.alias: g.host for g in rt.cfg.gpus}
        self.max_messages = policy.max_messages_per_run

    def label_of(self, gpu: str) -> str:
        """The GPU's ``alerts.group_by`` label ("" = none, or not configured)."""
        return self._labels.get(gpu, "")

    def render(self, msg: Message) -> tuple[str, str]:
        """(title, content) of one message, secrets redacted, content fitted to the sink's limit."""
        from gpuheal.redact import redact_text
        from gpuheal.render.report import alert_content, alert_title

        if msg.peers or msg.summary:
            return self._render_group(msg)
        alert = msg.alert.to_json()  # the renderer reads documents: a queued one may carry more
        title = redact_text(alert_title(alert), self.secrets)
        content = alert_content(
            alert,
            self.now,
            folded=[a.to_json() for a in msg.folded + msg.mentioned],
            repeat_interval_h=self.interval_s / 3600.0,
            host_aliases=self.host_aliases,
            inhibited=[a.to_json() for a in msg.tiers],
        )
        return title, self.to.fit(redact_text(content, self.secrets))

    def _render_group(self, msg: Message) -> tuple[str, str]:
        """A group of GPUs with one cause (or the run's over-budget summary) as one table."""
        from gpuheal.redact import redact_text
        from gpuheal.render.incident import group_content, group_title

        incidents = [{**m.alert.to_json(), "tiers": [t.issue for t in m.tiers]} for m in msg.incidents]
        kind, issue = str(msg.alert.kind), str(msg.alert.issue)
        gpus = len({str(m.alert.gpu) for m in msg.incidents})
        cause = self._site_cause(msg) if issue == HOST_UNREACHABLE and not msg.summary else None
        content = group_content(incidents, kind=kind, issue=issue, summary=msg.summary, labels=self._labels,
                                limit=self.to.max_chars, cause=cause)
        title = redact_text(group_title(kind, issue, gpus, msg.summary, cause), self.secrets)
        return title, self.to.fit(redact_text(content, self.secrets))

    def _site_cause(self, msg: Message) -> str | None:
        """Most (over half) of the hosts sharing the message's group label — the whole fleet without
        ``alerts.group_by`` — unreachable at once: one "network or site" incident (issue 21 point 2)."""
        label = self._labels.get(str(msg.alert.gpu), "")
        hosts = {h for a, h in self._hosts.items() if self._labels.get(a, "") == label}
        down = {self._hosts.get(str(m.alert.gpu)) for m in msg.incidents} & hosts
        if len(hosts) < 2 or 2 * len(down) <= len(hosts):
            return None
        where = f" in {self._group_by} {label}" if label else ""
        return f"network or site: {len(down)} of {len(hosts)} hosts{where} unreachable"

    def redacted(self, value: Any) -> Any:
        from gpuheal.redact import redact

        return redact(value, self.secrets)

    def redacted_alert(self, alert: Alert) -> Alert:
        return alert.mapped(self.redacted)


def _report_error(doc: dict[str, Any], error: dict[str, Any], queued: int, secrets) -> None:
    from gpuheal.redact import redact_text

    error["detail"] = redact_text(error["detail"], secrets)
    doc["error"] = error
    log.error("escalate: %s; %d alert(s) stay queued", error["detail"], queued)


def _settle(doc, data, duplicates, absorbed, now_s: float, out: _Outbox, dry_run: bool) -> None:
    """Drop what was already sent in this state; record what a host's open alert absorbs."""
    for alert in duplicates:
        doc["dropped"].append({"fingerprint": alert.fingerprint, "reason": "already sent in this state"})
    for alert, into in absorbed:
        doc["absorbed"].append({"fingerprint": alert.fingerprint, "folded_into": into})
    if dry_run:
        return
    data.remove(duplicates)
    for alert, into in absorbed:
        core.record_sent(data, out.redacted_alert(alert), now_s, None, folded_into=into)
    data.remove([a for a, _ in absorbed])


def _preview(doc, messages, out: _Outbox, now_s: float) -> None:
    """``--dry-run``: each message as it would be sent, and when."""
    for msg in messages:
        title, content = out.render(msg)
        entry = message_entry(msg, title)
        entry.update(topic=msg.alert.topic or out.topic, stream=out.stream, content=content)
        nb = msg.alert.not_before
        entry["not_before"] = epoch_text(nb) if nb > now_s else None
        doc["would_send"].append(entry)


def _send(rt, store, data, messages, open_keys, out: _Outbox, doc, post) -> dict[str, Any] | None:
    """Send in order; stop at the first failure. Returns the error (or None).

    Each delivery is saved at once (a crash after it repeats nothing sent); a host's resolution
    queues, behind it, the escalations it had absorbed that are still open."""
    from gpuheal.sink import SinkUnavailable
    from gpuheal.sinks import open_sink

    now_s = rt.now.timestamp()
    try:
        sink = open_sink(rt.cfg, post)
    except SinkUnavailable as exc:
        data.note_failure([a for m in messages for a in m.members], now_s, exc.detail)
        return {"kind": exc.kind, "detail": exc.detail}
    queue = list(messages)
    i = 0
    while i < len(queue):
        msg = queue[i]
        i += 1
        nb = max(a.not_before for a in msg.members)
        if nb > now_s:
            return {"kind": "rate-limited", "detail": f"{sink.name} asked to wait until {epoch_text(nb)} (HTTP 429)"}
        title, content = out.render(msg)
        outcome = _post(sink, msg.alert.topic or out.topic, content)
        if not outcome.ok:
            return _failed(sink, data, msg, outcome, now_s)
        for incident in msg.incidents:  # dedup and reminders stay per (GPU, issue) underneath
            primary = incident.alert
            core.record_sent(data, out.redacted_alert(primary), now_s, outcome.message_id)
            for other in incident.folded:
                into = primary.fingerprint
                core.record_sent(data, out.redacted_alert(other), now_s, outcome.message_id, folded_into=into)
            for tier in incident.tiers:
                core.record_sent(data, out.redacted_alert(tier), now_s, outcome.message_id)
            if primary.kind == "resolved" and primary.issue == HOST_UNREACHABLE:
                queue += [Message(a) for a in core.unfold(data, str(primary.gpu), open_keys)]
        data.remove(msg.members)
        doc["sent"].append(message_entry(msg, title, outcome.message_id))
        store.write(files.ALERTS, out.redacted(data.to_json()))
    return None


def _post(sink, topic: str, content: str):
    """One message; a 429 asking for at most ``SHORT_RETRY_S`` is waited out once."""
    from gpuheal.sink import SendStatus

    outcome = sink.send(content, topic)
    if outcome.kind == SendStatus.RATE_LIMITED and (outcome.retry_after_s or 0) <= SHORT_RETRY_S:
        _sleep(outcome.retry_after_s or 0)
        outcome = sink.send(content, topic)
    return outcome


def _failed(sink, data, msg: Message, outcome, now_s: float) -> dict[str, Any]:
    """A delivery failed: the message's alerts note it (they stay queued); the run's error.
    A longer 429 holds the whole queue until the sink's "not before"."""
    data.note_failure(msg.members, now_s, outcome.detail)
    if outcome.kind == "rate-limited":  # SendStatus is a StrEnum
        retry = outcome.retry_after_s or RETRY_WITHOUT_HINT_S
        until = now_s + retry
        data.hold(until)
        detail = f"{sink.name} rate limit ({outcome.detail}); retry after {retry:g} s, not before {epoch_text(until)}"
        return {"kind": "rate-limited", "detail": detail}
    if outcome.kind == "unauthorized":
        detail = f"{sink.name} rejected the bot credentials ({outcome.detail}); check {sink.credential_hint}"
        return {"kind": "unauthorized", "detail": detail}
    return {"kind": str(outcome.kind), "detail": f"{sink.name} delivery failed: {outcome.detail}"}
