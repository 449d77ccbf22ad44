"""``gpuheal escalate``: deliver the queued alerts to Zulip; unsent ones stay queued.

Orchestration only: what to send — reminders, folding, dedup — is decided by the pure
:mod:`gpuheal.core.alerts`; this module loads the queue, calls it, sends, records and saves.

``heal`` queues (``alerts.json``, :mod:`gpuheal.alerts`); this is the only sender. Each run:

1. brings the knowledge graph up to date with the audit trail (:func:`gpuheal.kg.sync`);
2. queues a **reminder** for every escalation already sent whose (gpu, issue) is still open in
   ``gpu-health.json`` and whose last message is older than ``zulip.repeat_interval_h``
   (default 4 h) — "repeated after a configurable interval while it stays broken";
3. **folds** a host's other escalations into its ``host-unreachable`` alert (one message that
   lists them); while an escalated ``host-unreachable`` of that host stays open, later
   escalations of the same host are absorbed without a message of their own (they appear in
   its reminders), and are re-sent on their own when the host's resolution goes out;
4. sends the messages oldest first. One per (gpu, issue) fingerprint and state: an alert whose
   state was already sent is dropped as a duplicate.

Failures keep every undelivered alert queued and make the exit status 1 (contract): a 429 whose
``retry-after`` is at most ``SHORT_RETRY_S`` is waited out once, a longer one is recorded as
"not before" on the queued alerts and the run stops sending; a 401 stops the run with one line
on stderr naming the credential variables; a 5xx, a timeout (hard deadline ``zulip.timeout_s``)
or a refused connection stops the run likewise. Missing credentials: one line naming the
variable, exit 1. ``--dry-run`` prints the messages and changes nothing.

``--json`` document::

    {"dry_run": bool, "sent": [MSG], "would_send": [MSG + {"topic", "content"}],
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

from gpuheal.clock import format_epoch
from gpuheal.core import alerts as core
from gpuheal.core.alerts import HOST_UNREACHABLE, Message
from gpuheal.state import files

log = logging.getLogger("gpuheal")

SHORT_RETRY_S = 2.0  # a 429 asking for at most this long is waited out once inside the run
_sleep = time.sleep  # tests replace it


# --------------------------------------------------------------------------- the command


def _msg_doc(msg: Message, title: str, message_id: int | None = None) -> dict[str, Any]:
    a = msg.alert
    return {
        "fingerprint": a["fingerprint"],
        "gpu": a.get("gpu"),
        "issue": a.get("issue"),
        "kind": a.get("kind"),
        "reminder": core.as_int(a.get("reminder")),
        "title": title,
        "message_id": message_id,
        "folded": [f["fingerprint"] for f in msg.folded],
    }


def _queued_doc(data: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for a in data["queue"]:
        d = a.get("delivery") if isinstance(a.get("delivery"), dict) else {}
        nb = d.get("not_before")
        out.append(
            {
                "fingerprint": a["fingerprint"],
                "gpu": a.get("gpu"),
                "issue": a.get("issue"),
                "kind": a.get("kind"),
                "reminder": core.as_int(a.get("reminder")),
                "tries": core.as_int(d.get("tries")),
                "last_error": d.get("last_error"),
                "not_before": _iso(core.as_time(nb)) if core.as_time(nb) is not None else None,
            }
        )
    return out


def _iso(epoch: float) -> str:
    try:
        return format_epoch(epoch)
    except (OverflowError, OSError, ValueError):  # a year beyond 9999 in a damaged queue
        return "?"


def load_alerts(store) -> dict[str, Any]:
    return core.normalise(store.read(files.ALERTS, None))


def command(rt, store, dry_run: bool = False, post=None):
    """CLI adapter. ``post`` replaces the HTTP transport in unit tests."""
    from gpuheal import exit_codes, zulip
    from gpuheal.redact import redact, redact_text
    from gpuheal.render.report import alert_content, alert_title
    from gpuheal.runtime import CommandResult

    cfg = rt.cfg
    now_s = rt.now.timestamp()
    zcfg = cfg.zulip
    secrets = zulip.secrets_for(cfg)
    doc: dict[str, Any] = dict(dry_run=dry_run, sent=[], would_send=[], absorbed=[], dropped=[], queued=[],
                               error=None, knowledge_graph=None)  # fmt: skip
    warnings: list[str] = []
    if not dry_run:
        from gpuheal import kg

        kg_summary = kg.sync(cfg, store, rt.now, secrets)
        warnings += kg_summary.pop("warnings")
        doc["knowledge_graph"] = kg_summary

    data = load_alerts(store)
    before = json.dumps(data, sort_keys=True, default=str)
    if dry_run:
        data = copy.deepcopy(data)
    health = store.read_raw(files.GPU_HEALTH)
    open_keys = core.open_issue_keys(health)
    interval_s = float(zcfg["repeat_interval_h"]) * 3600.0
    data["queue"].extend(core.due_reminders(data, open_keys, now_s, interval_s))
    messages, absorbed, duplicates = core.fold(data, open_keys)
    stream = str(zcfg["stream"])
    topic = zulip.fit_topic(str(zcfg["topic"]))

    _settle(doc, data, duplicates, absorbed, now_s, secrets, dry_run)
    host_aliases = {g.host: g.alias for g in cfg.gpus}

    def render_msg(msg: Message) -> tuple[str, str]:
        title = redact_text(alert_title(msg.alert), secrets)
        content = alert_content(
            msg.alert,
            rt.now,
            folded=msg.folded + msg.mentioned,
            repeat_interval_h=interval_s / 3600.0,
            host_aliases=host_aliases,
        )
        return title, zulip.fit_content(redact_text(content, secrets))

    error: dict[str, Any] | None = None
    if dry_run:
        _preview(doc, messages, render_msg, stream, topic, now_s)
    elif messages:
        creds, error = _credentials(cfg)
        if error is not None:
            core.note_failure([a for m in messages for a in m.members], now_s, error["detail"])
        else:
            where = (zcfg["site"], creds, stream, topic)
            error = _deliver(rt, store, data, messages, open_keys, where, render_msg, doc, post, secrets)

    if not dry_run:
        core.prune_sent(data, open_keys, now_s)
        if json.dumps(data, sort_keys=True, default=str) != before:  # cron runs this every minute
            store.write(files.ALERTS, redact(data, secrets))
    doc["queued"] = _queued_doc(data)
    if error is not None:
        n = len(data["queue"])
        error["detail"] = redact_text(error["detail"], secrets)
        doc["error"] = error
        log.error("escalate: %s; %d alert(s) stay queued", error["detail"], n)
    code = exit_codes.OK if dry_run or not data["queue"] else exit_codes.ATTENTION

    def render() -> None:
        from gpuheal.render.escalate import render_escalate

        render_escalate(doc, stream, topic)

    return CommandResult(document=doc, exit_code=code, render=render, warnings=warnings)


def _settle(doc, data, duplicates, absorbed, now_s: float, secrets, dry_run: bool) -> None:
    """Drop what was already sent in this state; record what a host's open alert absorbs."""
    from gpuheal.redact import redact

    for alert in duplicates:
        doc["dropped"].append({"fingerprint": alert["fingerprint"], "reason": "already sent in this state"})
    for alert, into in absorbed:
        doc["absorbed"].append({"fingerprint": alert["fingerprint"], "folded_into": into})
    if dry_run:
        return
    core.remove_from_queue(data, duplicates)
    for alert, into in absorbed:
        core.record_sent(data, redact(alert, secrets), now_s, None, folded_into=into)
    core.remove_from_queue(data, [a for a, _ in absorbed])


def _preview(doc, messages, render_msg, stream: str, topic: str, now_s: float) -> None:
    """``--dry-run``: each message as it would be sent, and when."""
    for msg in messages:
        title, content = render_msg(msg)
        entry = _msg_doc(msg, title)
        entry.update(topic=msg.alert.get("topic") or topic, stream=stream, content=content)
        nb = core.not_before(msg.alert)
        entry["not_before"] = _iso(nb) if nb > now_s else None
        doc["would_send"].append(entry)


def _credentials(cfg) -> tuple[Any, dict[str, Any] | None]:
    """The bot's credentials, or why nothing can be sent (no site, no credentials)."""
    from gpuheal import zulip

    if not cfg.zulip.get("site"):
        return None, {"kind": "not-configured", "detail": "zulip.site is not set in the config"}
    try:
        return zulip.load_credentials(cfg), None
    except zulip.CredentialsError as exc:
        return None, {"kind": "no-credentials", "detail": str(exc)}


def _deliver(rt, store, data, messages, open_keys, where, render_msg, doc, post, secrets) -> dict[str, Any] | None:
    """Send in order; stop at the first failure. Returns the error (or None)."""
    from gpuheal import zulip
    from gpuheal.redact import redact

    site, creds, stream, topic = where
    now_s = rt.now.timestamp()
    timeout_s = float(rt.cfg.zulip["timeout_s"])
    queue = list(messages)
    i = 0
    while i < len(queue):
        msg = queue[i]
        i += 1
        nb = max(core.not_before(a) for a in msg.members)
        if nb > now_s:
            until = _iso(nb)
            return {"kind": "rate-limited", "detail": f"Zulip asked to wait until {until} (HTTP 429)"}
        title, content = render_msg(msg)
        msg_topic = zulip.fit_topic(str(msg.alert.get("topic") or topic))
        outcome = zulip.send_message(site, creds, stream, msg_topic, content, timeout_s, post=post)
        if outcome.kind == "rate-limited" and (outcome.retry_after_s or 0) <= SHORT_RETRY_S:
            _sleep(outcome.retry_after_s or 0)
            outcome = zulip.send_message(site, creds, stream, msg_topic, content, timeout_s, post=post)
        if outcome.ok:
            primary = msg.alert
            core.record_sent(data, redact(primary, secrets), now_s, outcome.message_id)
            for other in msg.folded:
                into = primary["fingerprint"]
                core.record_sent(data, redact(other, secrets), now_s, outcome.message_id, folded_into=into)
            core.remove_from_queue(data, msg.members)
            doc["sent"].append(_msg_doc(msg, title, outcome.message_id))
            if primary.get("kind") == "resolved" and primary.get("issue") == HOST_UNREACHABLE:
                for standalone in core.unfold(data, str(primary.get("gpu")), open_keys):
                    queue.append(Message(standalone))
            store.write(files.ALERTS, redact(data, secrets))  # a crash now repeats nothing sent
            continue
        if outcome.kind == "rate-limited":
            retry = outcome.retry_after_s or 60.0
            until = now_s + retry
            for a in data["queue"]:
                core.delivery(a)["not_before"] = max(until, core.not_before(a))
            core.note_failure(msg.members, now_s, outcome.detail)
            iso = _iso(until)
            return {
                "kind": "rate-limited",
                "detail": f"Zulip rate limit ({outcome.detail}); retry after {retry:g} s, not before {iso}",
            }
        core.note_failure(msg.members, now_s, outcome.detail)
        if outcome.kind == "unauthorized":
            names = (
                f"{rt.cfg.zulip.get('email_env') or 'ZULIP_EMAIL'}/{rt.cfg.zulip.get('api_key_env') or 'ZULIP_API_KEY'}"
            )
            return {
                "kind": "unauthorized",
                "detail": f"Zulip rejected the bot credentials ({outcome.detail}); check {names}",
            }
        return {"kind": outcome.kind, "detail": f"Zulip delivery failed: {outcome.detail}"}
    return None
