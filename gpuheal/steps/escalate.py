"""``gpuheal escalate``: deliver the queued alerts to Zulip; unsent ones stay queued.

Orchestration only: what to send — reminders, folding, dedup — is decided by the pure
:mod:`gpuheal.core.alerts` from what the rules declare (:class:`~gpuheal.core.alerts.AlertPolicy`);
rendering and sending is :mod:`gpuheal.actions.deliver`'s; this module loads the queue, calls them,
records and saves.

``heal`` queues (``alerts.json``, :mod:`gpuheal.alerts`); this is the only sender. Each run:

1. brings the knowledge graph up to date with the audit trail (:func:`gpuheal.kg.sync`);
2. queues a **reminder** for every escalation already sent whose (gpu, issue) is still open in
   ``gpu-health.json`` and whose last message is older than ``alerts.repeat_interval_h``
   (default 4 h) — "repeated after a configurable interval while it stays broken";
3. **folds** a host's other escalations into its host-level alert (the rule that inhibits its host's
   other issues: Rule 6, one message that lists them); while that escalation stays open, later
   escalations of the same host are absorbed without a message of their own (they appear in
   its reminders), and are re-sent on their own when the host's resolution goes out;
4. **groups** (:func:`gpuheal.core.alerts.group`): a GPU's lower tiers of an incident family go inside
   its highest tier's message (one incident); incidents of the same kind and issue sharing a ``alerts.group_by``
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
import logging
from typing import Any

from gpuheal.actions import deliver
from gpuheal.actions.deliver import Outbox
from gpuheal.core import alerts as core
from gpuheal.core.alert import Alert
from gpuheal.core.alerts import AlertPolicy, AlertQueue, Message
from gpuheal.render.escalate import epoch_text, message_entry, queued_entries
from gpuheal.rules import ALL
from gpuheal.state import files
from gpuheal.state.store import StateDir

log = logging.getLogger("gpuheal")
POLICY = AlertPolicy.of(ALL)  # what the rules declare about their alerts


def load_alerts(store: StateDir) -> AlertQueue:
    return AlertQueue.from_json(store.read(files.ALERTS, None))


def command(rt: Any, store: StateDir, dry_run: bool = False, post: Any = None) -> Any:
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
    before = core.Snapshot.of(data)  # what "changed" is measured against (issue 29: not the whole document's JSON)
    if dry_run:
        data = copy.deepcopy(data)
    open_keys = core.open_issue_keys(store.read_raw(files.GPU_HEALTH))
    out = Outbox(rt.cfg, rt.now, secrets, POLICY)
    data.queue.extend(core.due_reminders(data, open_keys, now_s, out.interval_s, policy=POLICY))
    messages, absorbed, duplicates = core.fold(data, open_keys, POLICY)
    messages = core.group(messages, out.label_of, out.max_messages, POLICY)
    doc["grouped"] = sum(len(m.peers) for m in messages)
    doc["over_budget"] = sum(len(m.incidents) for m in messages if m.summary)
    _settle(doc, data, duplicates, absorbed, now_s, out, dry_run)
    error: dict[str, Any] | None = None
    if dry_run:
        _preview(doc, messages, out, now_s)
    elif messages:
        error = deliver.send(store, data, messages, open_keys, out, doc, post)
    if not dry_run:
        core.prune_sent(data, open_keys, now_s)
        if core.changed(data, before):  # cron runs this every minute: an unchanged file is not rewritten
            store.write(files.ALERTS, out.redacted(data.to_json()))
    doc["queued"] = out.redacted(queued_entries(data))  # a failed try's detail may name a secret
    if error is not None:
        _report_error(doc, error, len(data.queue), secrets)
    code = exit_codes.OK if dry_run or not data.queue else exit_codes.ATTENTION

    def render() -> None:
        from gpuheal.render.escalate import render_escalate

        render_escalate(doc, out.stream, out.topic)

    return CommandResult(document=doc, exit_code=code, render=render, warnings=warnings)


def _sync_knowledge_graph(rt: Any, store: StateDir, secrets: tuple[str, ...], doc: dict[str, Any]) -> list[str]:
    """Step 1: the knowledge graph catches up with the audit trail; its warnings are the run's."""
    from gpuheal import kg

    summary = kg.sync(rt.cfg, store, rt.now, secrets)
    warnings: list[str] = summary.pop("warnings")
    doc["knowledge_graph"] = summary
    return warnings


def _report_error(doc: dict[str, Any], error: dict[str, Any], queued: int, secrets: tuple[str, ...]) -> None:
    from gpuheal.redact import redact_text

    error["detail"] = redact_text(error["detail"], secrets)
    doc["error"] = error
    log.error("escalate: %s; %d alert(s) stay queued", error["detail"], queued)


def _settle(
    doc: dict[str, Any], data: AlertQueue, duplicates: list[Alert], absorbed: list[tuple[Alert, str]], now_s: float,
    out: Outbox, dry_run: bool,
) -> None:
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


def _preview(doc: dict[str, Any], messages: list[Message], out: Outbox, now_s: float) -> None:
    """``--dry-run``: each message as it would be sent, and when."""
    for msg in messages:
        title, content = out.render(msg)
        entry = message_entry(msg, title)
        entry.update(topic=msg.alert.topic or out.topic, stream=out.stream, content=content)
        nb = msg.alert.not_before
        entry["not_before"] = epoch_text(nb) if nb > now_s else None
        doc["would_send"].append(entry)
