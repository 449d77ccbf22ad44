"""The alert queue between ``heal`` (producer) and ``escalate`` (the only sender).

Contract ("Alerts"): alerts are queued by ``heal`` and sent only by ``escalate``; one per
(gpu, issue) fingerprint until its state changes; unsent alerts survive to the next run.
Stored as ``alerts.json`` (internal)::

    {"queue": [ALERT, ...],               # not yet delivered, oldest first
     "sent":  {FINGERPRINT: {"kind": ..., "sent_at": epoch_s, "state_key": str}},
     "clean_cycles": int}                 # consecutive clean heal cycles (All Clear every Nth)

    ALERT = {"fingerprint": "ALIAS/ISSUE" | "fleet/all-clear", "gpu": ALIAS | "fleet",
             "issue": ID | None, "kind": "escalated" | "resolved" | "all-clear",
             "state_key": str,            # changes when the (gpu, issue) state changes
             "created_at": epoch_s, "run_id": str | None,
             "detected": {...}, "tried": [...], "attempts": int, "since": ISO | None,
             "summary": str}
"""

from __future__ import annotations

from typing import Any

FILE = "alerts.json"


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
    if isinstance(data.get("clean_cycles"), int):
        out["clean_cycles"] = data["clean_cycles"]
    return out


def enqueue(data: dict[str, Any], alert: dict[str, Any]) -> bool:
    """Queue ``alert`` unless the same fingerprint in the same state is queued or was sent.

    A newer alert for a fingerprint replaces a queued older one (the state changed before the
    old one could be delivered: only the current truth is worth sending). Returns True if queued.
    """
    fp, key = alert["fingerprint"], alert["state_key"]
    sent = data["sent"].get(fp)
    if sent is not None and sent.get("state_key") == key:
        return False
    for i, queued in enumerate(data["queue"]):
        if queued["fingerprint"] == fp:
            if queued["state_key"] == key:
                return False
            data["queue"][i] = alert
            return True
    data["queue"].append(alert)
    return True


def fingerprint(gpu: str, issue: str | None) -> str:
    return f"{gpu}/{issue or 'all-clear'}"
