"""``gpuheal escalate`` for a person: one line per message sent, folded, dropped or kept."""

from __future__ import annotations

from typing import Any

from gpuheal.render.human import clean, print_line


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
