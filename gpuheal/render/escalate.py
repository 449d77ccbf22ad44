"""``gpuheal escalate`` for a person: one line per message sent, folded, dropped or kept."""

from __future__ import annotations

from typing import Any

from gpuheal.clock import format_epoch
from gpuheal.core.alert import Tries
from gpuheal.core.alerts import AlertQueue, Message
from gpuheal.render.human import clean, print_line


def message_entry(msg: Message, title: str, message_id: int | None = None) -> dict[str, Any]:
    """One message of the ``--json`` document's ``sent`` / ``would_send``."""
    a = msg.alert
    return {
        "fingerprint": a.fingerprint,
        "gpu": a.gpu,
        "issue": a.issue,
        "kind": a.kind,
        "reminder": a.reminder,
        "title": title,
        "message_id": message_id,
        "folded": [f.fingerprint for f in msg.folded],
        # one cause, one message (issue 21): the other GPUs and the inhibited lower tiers it carries
        "gpus": sorted({str(m.alert.gpu) for m in msg.incidents}),
        "grouped": [f.fingerprint for f in msg.members if f is not a and f not in msg.folded],
        "summary": msg.summary,
    }


def queued_entries(data: AlertQueue) -> list[dict[str, Any]]:
    """The ``--json`` document's ``queued``: what stays queued, and why it is not sent yet."""
    out = []
    for a in data.queue:
        d = a.delivery or Tries()
        out.append(
            {
                "fingerprint": a.fingerprint,
                "gpu": a.gpu,
                "issue": a.issue,
                "kind": a.kind,
                "reminder": a.reminder,
                "tries": d.tries,
                "last_error": d.last_error,
                "not_before": epoch_text(d.not_before) if d.not_before is not None else None,
            }
        )
    return out


def epoch_text(epoch: float) -> str:
    try:
        return format_epoch(epoch)
    except (OverflowError, OSError, ValueError):  # a year beyond 9999 in a damaged queue
        return "?"


def render_escalate(doc: dict[str, Any], stream: str, topic: str) -> None:
    """What ``gpuheal escalate`` sent, would send (``--dry-run``), folded, dropped and kept queued."""

    if doc["dry_run"]:
        for m in doc["would_send"]:
            print_line(
                f"── would send to #{clean(m['stream'])} > {clean(m['topic'])}"
                + (f" (not before {m['not_before']})" if m.get("not_before") else "")
                + " ──",
                "bold",
            )
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
        print_line(
            f"sent     {m['title']}{extra} → #{clean(stream)} > {clean(topic)}, message {m['message_id']}", "green"
        )
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
