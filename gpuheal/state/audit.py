"""The audit trail's recent end as records (``gpuheal report``, the metrics file): read tolerantly —
a torn first line, junk lines and non-objects are skipped and counted in one warning line, never
fatal (the trail is append-only and may be damaged; contract: Audit trail)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from gpuheal.clock import to_datetime
from gpuheal.state import files

if TYPE_CHECKING:
    from gpuheal.state.store import StateDir

AUDIT_TAIL_BYTES = 16 << 20  # the report reads at most this much of the audit trail's end


def audit_records(
    store: StateDir, since_s: float | None = None, max_bytes: int = AUDIT_TAIL_BYTES
) -> list[dict[str, Any]]:
    """Audit records at or after ``since_s`` from the trail's last ``max_bytes``; junk skipped."""
    path = store.path / files.AUDIT_LOG
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            start = max(0, size - max_bytes)
            fh.seek(start)
            raw = fh.read()
    except OSError:
        return []
    lines = raw.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first line is cut
    out, junk = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            junk += 1
            continue
        if not isinstance(rec, dict):
            junk += 1
            continue
        if since_s is not None:
            dt = to_datetime(rec.get("timestamp"))
            if dt is None or dt.timestamp() < since_s:
                continue
        out.append(rec)
    if junk:
        store.warnings.append(f"{files.AUDIT_LOG}: skipped {junk} unreadable line(s)")
    return out
