"""What ``escalate`` sends, and sending it: each message rendered for the configured sink (its stream and
topic, its length limit), redacted, and delivered oldest first, every delivery saved at once.

Failures keep every undelivered alert queued: a 429 whose ``retry-after`` is at most
``SHORT_RETRY_S`` is waited out once, a longer one is recorded as "not before" on the queued alerts
and the run stops sending; a 401, a 5xx, a timeout or a refused connection stops the run likewise.
The decisions (reminders, folding, grouping, dedup) are :mod:`gpuheal.core.alerts`'; the order of
the run is :mod:`gpuheal.steps.escalate`'s.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from gpuheal.config.model import Config
from gpuheal.core import alerts as core
from gpuheal.core.alert import Alert
from gpuheal.core.alerts import AlertPolicy, AlertQueue, Message
from gpuheal.render.escalate import epoch_text, message_entry
from gpuheal.sink import AlertSink, SendOutcome, SendStatus
from gpuheal.state import files
from gpuheal.state.store import StateDir

SHORT_RETRY_S = 2.0  # a 429 asking for at most this long is waited out once inside the run
RETRY_WITHOUT_HINT_S = 60.0  # a 429 without retry-after: hold the queue a minute (Zulip's usual window)
_sleep = time.sleep  # tests replace it


class Outbox:
    """Where and how messages go: the sink's destination (its stream and topic, its length limit), the
    sink-neutral ``alerts:`` policy and what the rules declare about alerts (:class:`AlertPolicy`);
    each alert rendered and redacted."""

    def __init__(self, cfg: Config, now: datetime, secrets: tuple[str, ...], policy: AlertPolicy) -> None:
        from gpuheal.sinks import destination

        self.now, self.cfg, self.secrets, self.policy = now, cfg, secrets, policy
        self.to = destination(cfg)
        self.interval_s = cfg.alerts.repeat_interval_h * 3600.0
        self.stream, self.topic = self.to.channel, self.to.topic
        self.host_aliases = {g.host: g.alias for g in cfg.gpus}
        group_by = cfg.alerts.group_by
        self._group_by = str(group_by or "")
        self._labels = {g.alias: g.labels.get(group_by, "") if group_by else "" for g in cfg.gpus}
        self._hosts = {g.alias: g.host for g in cfg.gpus}
        self.max_messages = cfg.alerts.max_messages_per_run

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
        cause = self._site_cause(msg) if issue == self.policy.host_issue and not msg.summary else None
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


def send(
    store: StateDir, data: AlertQueue, messages: list[Message], open_keys: set[tuple[str, str]] | None,
    out: Outbox, doc: dict[str, Any], post: Any,
) -> dict[str, Any] | None:
    """Send in order; stop at the first failure. Returns the error (or None).

    Each delivery is saved at once (a crash after it repeats nothing sent); a host's resolution
    queues, behind it, the escalations it had absorbed that are still open."""
    from gpuheal.sink import SinkUnavailable
    from gpuheal.sinks import open_sink

    now_s = out.now.timestamp()
    try:
        sink = open_sink(out.cfg, post)
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
        queue += _sent(data, msg, outcome.message_id, open_keys, out, now_s)
        data.remove(msg.members)
        doc["sent"].append(message_entry(msg, title, outcome.message_id))
        store.write(files.ALERTS, out.redacted(data.to_json()))
    return None


def _sent(
    data: AlertQueue, msg: Message, message_id: int | None, open_keys: set[tuple[str, str]] | None, out: Outbox,
    now_s: float,
) -> list[Message]:
    """Record one delivered message, per (GPU, issue) underneath (dedup, reminders); the messages a
    host's resolution unfolds behind it."""
    more: list[Message] = []
    for incident in msg.incidents:
        primary = incident.alert
        core.record_sent(data, out.redacted_alert(primary), now_s, message_id)
        for other in incident.folded:
            core.record_sent(data, out.redacted_alert(other), now_s, message_id, folded_into=primary.fingerprint)
        for tier in incident.tiers:
            core.record_sent(data, out.redacted_alert(tier), now_s, message_id)
        if primary.kind == "resolved" and primary.issue == out.policy.host_issue:
            more += [Message(a) for a in core.unfold(data, str(primary.gpu), open_keys, out.policy)]
    return more


def _post(sink: AlertSink, topic: str, content: str) -> SendOutcome:
    """One message; a 429 asking for at most ``SHORT_RETRY_S`` is waited out once."""
    outcome = sink.send(content, topic)
    if outcome.kind == SendStatus.RATE_LIMITED and (outcome.retry_after_s or 0) <= SHORT_RETRY_S:
        _sleep(outcome.retry_after_s or 0)
        outcome = sink.send(content, topic)
    return outcome


def _failed(sink: AlertSink, data: AlertQueue, msg: Message, outcome: SendOutcome, now_s: float) -> dict[str, Any]:
    """A delivery failed: the message's alerts note it (they stay queued); the run's error.
    A longer 429 holds the whole queue until the sink's "not before"."""
    data.note_failure(msg.members, now_s, outcome.detail)
    if outcome.kind == SendStatus.RATE_LIMITED:
        retry = outcome.retry_after_s or RETRY_WITHOUT_HINT_S
        until = now_s + retry
        data.hold(until)
        detail = f"{sink.name} rate limit ({outcome.detail}); retry after {retry:g} s, not before {epoch_text(until)}"
        return {"kind": "rate-limited", "detail": detail}
    if outcome.kind == SendStatus.UNAUTHORIZED:
        detail = f"{sink.name} rejected the bot credentials ({outcome.detail}); check {sink.credential_hint}"
        return {"kind": "unauthorized", "detail": detail}
    return {"kind": str(outcome.kind), "detail": f"{sink.name} delivery failed: {outcome.detail}"}
