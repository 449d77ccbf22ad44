"""``gpuheal escalate``: deliver the queued alerts to Zulip; unsent ones stay queued.

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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpuheal import alerts as alertq
from gpuheal.clock import format_iso
from gpuheal.state import files

log = logging.getLogger("gpuheal")

HOST_UNREACHABLE = "host-unreachable"
SHORT_RETRY_S = 2.0  # a 429 asking for at most this long is waited out once inside the run
SENT_KEEP_S = 30 * 86400  # settled entries of the dedup memory are forgotten after this
OPEN_STATES = ("firing", "pending", "verifying")
_sleep = time.sleep  # tests replace it


@dataclass
class Message:
    alert: dict[str, Any]
    folded: list[dict[str, Any]] = field(default_factory=list)  # queued alerts sent inside this one
    mentioned: list[dict[str, Any]] = field(default_factory=list)  # already-absorbed, still open

    @property
    def members(self) -> list[dict[str, Any]]:
        return [self.alert, *self.folded]


# --------------------------------------------------------------------------- pure planning


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


def due_reminders(
    data: dict[str, Any], open_keys: set[tuple[str, str]] | None, now_s: float, interval_s: float
) -> list[dict[str, Any]]:
    """Reminders for sent escalations still open after ``interval_s``. Needs a health document:
    without one nothing is known to be still broken, so nothing is repeated."""
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
        try:
            last = float(sent.get("sent_at") or 0)
        except (TypeError, ValueError):
            last = 0.0
        if now_s - last < interval_s:
            continue
        reminder = {k: v for k, v in alert.items() if k != "delivery"}
        reminder["reminder"] = _int(sent.get("reminders")) + 1
        reminder["fingerprint"] = fp
        out.append(reminder)
    return out


def plan(
    data: dict[str, Any], open_keys: set[tuple[str, str]] | None
) -> tuple[list[Message], list[tuple[dict[str, Any], str]], list[dict[str, Any]]]:
    """(messages, absorbed (alert, into-fingerprint), duplicates) for the current queue."""
    messages: list[Message] = []
    absorbed: list[tuple[dict[str, Any], str]] = []
    duplicates: list[dict[str, Any]] = []
    live = []
    for alert in data["queue"]:
        sent = data["sent"].get(alert["fingerprint"])
        if (
            sent is not None
            and sent.get("state_key") == alert.get("state_key")
            and not alert.get("reminder")
            and not alert.get("unfolded")
        ):
            duplicates.append(alert)
        else:
            live.append(alert)

    hu_queued = {
        a.get("gpu"): a for a in live if a.get("issue") == HOST_UNREACHABLE and a.get("kind") == "escalated"
    }
    hu_resolving = {a.get("gpu") for a in live if a.get("issue") == HOST_UNREACHABLE and a.get("kind") == "resolved"}

    def hu_sent_open(gpu: Any) -> bool:
        sent = data["sent"].get(alertq.fingerprint(str(gpu), HOST_UNREACHABLE))
        return bool(
            sent
            and sent.get("kind") == "escalated"
            and gpu not in hu_resolving
            and _is_open(open_keys, gpu, HOST_UNREACHABLE)
        )

    folded_into: dict[int, Message] = {}
    for alert in live:
        if alert.get("kind") == "escalated" and alert.get("issue") == HOST_UNREACHABLE:
            msg = Message(alert)
            messages.append(msg)
            folded_into[id(alert)] = msg
    by_gpu = {a.get("gpu"): folded_into[id(a)] for a in hu_queued.values()}
    ordered: list[Message] = []
    for alert in live:
        if id(alert) in folded_into:
            ordered.append(folded_into[id(alert)])
            continue
        gpu = alert.get("gpu")
        if alert.get("kind") == "escalated" and gpu != "fleet":
            if gpu in by_gpu:
                by_gpu[gpu].folded.append(alert)
                continue
            if hu_sent_open(gpu):
                absorbed.append((alert, alertq.fingerprint(str(gpu), HOST_UNREACHABLE)))
                continue
        ordered.append(Message(alert))
    for msg in ordered:  # a host-unreachable alert also lists what it absorbed earlier
        if msg.alert.get("issue") == HOST_UNREACHABLE and msg.alert.get("kind") == "escalated":
            fp = msg.alert["fingerprint"]
            taken = {a["fingerprint"] for a in msg.folded}
            for ofp, sent in data["sent"].items():
                if sent.get("folded_into") == fp and sent.get("kind") == "escalated" and ofp not in taken:
                    other = sent.get("alert")
                    if isinstance(other, dict) and _is_open(open_keys, other.get("gpu"), other.get("issue")):
                        msg.mentioned.append(other)
    return ordered, absorbed, duplicates


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
        "reminders": _int(alert.get("reminder")),
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
    hu_fp = alertq.fingerprint(gpu, HOST_UNREACHABLE)
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
        try:
            age = now_s - float(sent.get("sent_at") or 0)
        except (TypeError, ValueError):
            age = SENT_KEEP_S + 1
        if age <= SENT_KEEP_S:
            continue
        alert = sent.get("alert") if isinstance(sent.get("alert"), dict) else {}
        if sent.get("kind") == "escalated" and _is_open(open_keys, alert.get("gpu"), alert.get("issue")):
            continue
        del data["sent"][fp]


# --------------------------------------------------------------------------- the command


def _msg_doc(msg: Message, title: str, message_id: int | None = None) -> dict[str, Any]:
    a = msg.alert
    return {
        "fingerprint": a["fingerprint"],
        "gpu": a.get("gpu"),
        "issue": a.get("issue"),
        "kind": a.get("kind"),
        "reminder": _int(a.get("reminder")),
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
                "reminder": _int(a.get("reminder")),
                "tries": _int(d.get("tries")),
                "last_error": d.get("last_error"),
                "not_before": _iso(nb) if isinstance(nb, int | float) else None,
            }
        )
    return out


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _iso(epoch: float) -> str:
    return format_iso(datetime.fromtimestamp(epoch, UTC))


def _delivery(alert: dict[str, Any]) -> dict[str, Any]:
    """The alert's delivery bookkeeping ({"tries", "last_try_at", "last_error", "not_before"})."""
    d = alert.get("delivery")
    if not isinstance(d, dict):
        d = alert["delivery"] = {}
    return d


def _note_failure(alerts: list[dict[str, Any]], now_s: float, detail: str) -> None:
    for a in alerts:
        d = _delivery(a)
        d["tries"] = _int(d.get("tries")) + 1
        d["last_try_at"] = now_s
        d["last_error"] = detail


def _not_before(alert: dict[str, Any]) -> float:
    d = alert.get("delivery")
    nb = d.get("not_before") if isinstance(d, dict) else None
    return float(nb) if isinstance(nb, int | float) else 0.0


def load_alerts(store) -> dict[str, Any]:
    return alertq.normalise(store.read(files.ALERTS, None))


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
    doc: dict[str, Any] = {
        "dry_run": dry_run,
        "sent": [],
        "would_send": [],
        "absorbed": [],
        "dropped": [],
        "queued": [],
        "error": None,
        "knowledge_graph": None,
    }
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
    open_keys = open_issue_keys(health)
    interval_s = float(zcfg.get("repeat_interval_h") or 4) * 3600.0
    data["queue"].extend(due_reminders(data, open_keys, now_s, interval_s))
    messages, absorbed, duplicates = plan(data, open_keys)
    stream = str(zcfg.get("stream") or "agent-hub")
    topic = zulip.fit_topic(str(zcfg.get("topic") or "alerts-gpu"))

    for alert in duplicates:
        doc["dropped"].append({"fingerprint": alert["fingerprint"], "reason": "already sent in this state"})
    for alert, into in absorbed:
        doc["absorbed"].append({"fingerprint": alert["fingerprint"], "folded_into": into})
    if not dry_run:
        remove_from_queue(data, duplicates)
        for alert, into in absorbed:
            record_sent(data, redact(alert, secrets), now_s, None, folded_into=into)
        remove_from_queue(data, [a for a, _ in absorbed])

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
        for msg in messages:
            title, content = render_msg(msg)
            entry = _msg_doc(msg, title)
            entry.update(topic=msg.alert.get("topic") or topic, stream=stream, content=content)
            nb = _not_before(msg.alert)
            entry["not_before"] = _iso(nb) if nb > now_s else None
            doc["would_send"].append(entry)
    elif messages:
        site = zcfg.get("site")
        creds = None
        if not site:
            error = {"kind": "not-configured", "detail": "zulip.site is not set in the config"}
        else:
            try:
                creds = zulip.load_credentials(cfg)
            except zulip.CredentialsError as exc:
                error = {"kind": "no-credentials", "detail": str(exc)}
        if error is not None:
            _note_failure([a for m in messages for a in m.members], now_s, error["detail"])
        else:
            error = _deliver(rt, store, data, messages, open_keys, site, creds, stream, topic, render_msg, doc, post, secrets)

    if not dry_run:
        prune_sent(data, open_keys, now_s)
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
        _render(doc, stream, topic)

    return CommandResult(document=doc, exit_code=code, render=render, warnings=warnings)


def _deliver(rt, store, data, messages, open_keys, site, creds, stream, topic, render_msg, doc, post, secrets) -> dict[str, Any] | None:
    """Send in order; stop at the first failure. Returns the error (or None)."""
    from gpuheal import zulip
    from gpuheal.redact import redact

    now_s = rt.now.timestamp()
    timeout_s = float(rt.cfg.zulip.get("timeout_s") or 10)
    queue = list(messages)
    i = 0
    while i < len(queue):
        msg = queue[i]
        i += 1
        nb = max(_not_before(a) for a in msg.members)
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
            record_sent(data, redact(primary, secrets), now_s, outcome.message_id)
            for other in msg.folded:
                record_sent(data, redact(other, secrets), now_s, outcome.message_id, folded_into=primary["fingerprint"])
            remove_from_queue(data, msg.members)
            doc["sent"].append(_msg_doc(msg, title, outcome.message_id))
            if primary.get("kind") == "resolved" and primary.get("issue") == HOST_UNREACHABLE:
                for standalone in unfold(data, str(primary.get("gpu")), open_keys):
                    queue.append(Message(standalone))
            store.write(files.ALERTS, redact(data, secrets))  # a crash now repeats nothing sent
            continue
        if outcome.kind == "rate-limited":
            retry = outcome.retry_after_s or 60.0
            until = now_s + retry
            for a in data["queue"]:
                _delivery(a)["not_before"] = max(until, _not_before(a))
            _note_failure(msg.members, now_s, outcome.detail)
            iso = _iso(until)
            return {"kind": "rate-limited", "detail": f"Zulip rate limit ({outcome.detail}); retry after {retry:g} s, not before {iso}"}
        _note_failure(msg.members, now_s, outcome.detail)
        if outcome.kind == "unauthorized":
            names = f"{rt.cfg.zulip.get('email_env') or 'ZULIP_EMAIL'}/{rt.cfg.zulip.get('api_key_env') or 'ZULIP_API_KEY'}"
            return {
                "kind": "unauthorized",
                "detail": f"Zulip rejected the bot credentials ({outcome.detail}); check {names}",
            }
        return {"kind": outcome.kind, "detail": f"Zulip delivery failed: {outcome.detail}"}
    return None


def _render(doc: dict[str, Any], stream: str, topic: str) -> None:
    from gpuheal.render.human import clean, print_line

    if doc["dry_run"]:
        for m in doc["would_send"]:
            print_line(f"── would send to #{clean(m['stream'])} > {clean(m['topic'])}" + (f" (not before {m['not_before']})" if m.get("not_before") else "") + " ──", "bold")
            for line in m["content"].splitlines():
                print_line(line)
            print_line("")
        for a in doc["absorbed"]:
            print_line(f"would fold {a['fingerprint']} into {a['folded_into']} (no message of its own)", "dim")
        n = len(doc["would_send"])
        print_line(f"dry run: {n} message{'s' if n != 1 else ''} would be sent; nothing sent, queue untouched")
        return
    for m in doc["sent"]:
        extra = f" (+ {', '.join(m['folded'])})" if m["folded"] else ""
        print_line(f"sent     {m['title']}{extra} → #{clean(stream)} > {clean(topic)}, message {m['message_id']}", "green")
    for a in doc["absorbed"]:
        print_line(f"folded   {a['fingerprint']} into {a['folded_into']}", "dim")
    for a in doc["dropped"]:
        print_line(f"dropped  {a['fingerprint']}: {a['reason']}", "dim")
    for q in doc["queued"]:
        why = q["last_error"] or "not tried this run"
        if q.get("not_before"):
            why += f"; not before {q['not_before']}"
        print_line(f"queued   {q['fingerprint']} ({q['kind']}): {clean(why, 200)}", "yellow")
    if not (doc["sent"] or doc["queued"] or doc["absorbed"] or doc["dropped"]):
        print_line("nothing to send")
