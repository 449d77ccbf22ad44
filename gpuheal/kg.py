"""Knowledge-graph records (spec "Reporting" §1): every audit record as a ``[GPU-SELF-HEAL] <run_id>``
node, driven incrementally from the audit trail so ``heal`` stays decoupled from it.

:func:`sync` reads the audit trail from a stored byte offset (complete lines only), turns each new
record into a node, appends the nodes to a JSON-lines file (``knowledge_graph.file``, default
``knowledge-graph.jsonl`` in the state directory; a relative path is taken relative to the state
directory), and — when ``knowledge_graph.url`` is set — POSTs each node as JSON with a hard
deadline. A node that cannot be posted waits in ``kg-state.json`` and is retried first on the next
sync (at least once: a crash between the file append and the offset update can repeat a node).

A node line is an MCP-memory-style entity, so the file loads into a knowledge-graph store as is::

    {"type": "entity", "name": "[GPU-SELF-HEAL] gpu-self-heal-20260718-001",
     "entityType": "gpu-self-heal", "gpu": ALIAS, "issue": ID, "timestamp": ISO,
     "observations": ["2026-07-18T08:00:00Z gpu-dense model-stuck: restart-llama-server → resolved"],
     "record": {...the full audit record, secrets redacted...}}
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuheal.state import files

if TYPE_CHECKING:
    from gpuheal.config.model import Config
    from gpuheal.state.store import StateDir

log = logging.getLogger("gpuheal")

STATE_FILE = files.KG_STATE  # internal: {"offset", "ino", "pending": [NODE, ...]}
NODE_PREFIX = "[GPU-SELF-HEAL]"
MAX_READ_BYTES = 8 << 20  # one sync reads at most this much new audit trail (the rest next run)
MAX_PENDING = 5000  # nodes waiting for the endpoint; the oldest are dropped beyond this
MAX_POSTS_PER_SYNC = 200


def node_for(record: dict[str, Any], secrets: tuple[str, ...] = ()) -> dict[str, Any]:
    from gpuheal.redact import redact

    record = redact(record, secrets)
    run_id = str(record.get("run_id") or "unknown-run")
    gpu, issue = record.get("gpu"), record.get("issue")
    outcome = f"{record.get('action', '?')} → {record.get('result', '?')}"
    summary = f"{record.get('timestamp', '?')} {gpu} {issue}: {outcome}"
    if record.get("phase"):
        summary += f" ({record['phase']})"
    if record.get("escalated") is True:
        summary += ", escalated"
    return {
        "type": "entity",
        "name": f"{NODE_PREFIX} {run_id}",
        "entityType": "gpu-self-heal",
        "gpu": gpu,
        "issue": issue,
        "timestamp": record.get("timestamp"),
        "observations": [summary],
        "record": record,
    }


def kg_file(cfg: Config, state_dir: Path) -> Path:
    configured = (cfg.knowledge_graph or {}).get("file")
    if not configured:
        return state_dir / files.KG_LOG
    path = Path(os.path.expanduser(str(configured)))
    return path if path.is_absolute() else state_dir / path


@dataclass(frozen=True)
class KgState:
    """``kg-state.json``: how far into the audit trail the graph is (``offset`` in the file whose inode
    is ``ino``) and the nodes the endpoint has not taken yet. A damaged value reads as its default."""

    offset: int = 0
    ino: int | None = None
    pending: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_json(cls, data: Any) -> KgState:
        if not isinstance(data, dict):
            return cls()
        offset, ino, pending = data.get("offset"), data.get("ino"), data.get("pending")
        return cls(
            offset if isinstance(offset, int) and offset >= 0 else 0,
            ino if isinstance(ino, int) else None,
            tuple(n for n in pending if isinstance(n, dict)) if isinstance(pending, list) else (),
        )

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "ino": self.ino, "pending": list(self.pending)}


def read_new_records(path: Path, state: KgState) -> tuple[list[dict[str, Any]], int, int | None, int]:
    """New complete lines after ``state.offset``: (records, new offset, inode, junk lines).

    A replaced (different inode) or truncated file is read from its start.
    """
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return [], 0, None, 0
    with fh:
        st = os.fstat(fh.fileno())
        offset = state.offset
        if state.ino is not None and state.ino != st.st_ino:
            offset = 0
        if st.st_size < offset:
            offset = 0
        fh.seek(offset)
        chunk = fh.read(MAX_READ_BYTES)
    end = chunk.rfind(b"\n")
    if end < 0:
        return [], offset, st.st_ino, 0
    complete = chunk[: end + 1]
    records, junk = [], 0
    for line in complete.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            junk += 1
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            junk += 1
    return records, offset + len(complete), st.st_ino, junk


def append_nodes(path: Path, nodes: list[dict[str, Any]]) -> str | None:
    """Whole lines, then fsync: the state directory's JSON-lines append (a torn tail left by a
    killed run is repaired first; the warning says so)."""
    from gpuheal.state.store import append_json_lines

    if not nodes:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    return append_json_lines(path, nodes, default=str, ensure_ascii=False)


def post_nodes(url: str, nodes: list[dict[str, Any]], timeout_s: float) -> tuple[int, str | None]:
    """POST nodes one by one; stop at the first failure. Returns (posted, error or None)."""
    from gpuheal import __version__
    from gpuheal.sources.http import HttpFault, request

    posted = 0
    for node in nodes[:MAX_POSTS_PER_SYNC]:
        body = json.dumps(node, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8", "replace")
        res = request(
            "POST",
            url,
            deadline_s=timeout_s,
            connect_timeout_s=min(timeout_s, 5.0),
            max_bytes=65536,
            headers={"Content-Type": "application/json", "User-Agent": f"gpuheal/{__version__}"},
            body=body,
        )
        if isinstance(res, HttpFault):
            return posted, f"{res.kind}: {res.detail}"[:200]
        if not 200 <= res.status < 300:
            return posted, f"HTTP {res.status}"
        posted += 1
    return posted, None


def sync(
    cfg: Config, store: StateDir, now: datetime | None = None, secrets: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """Bring the knowledge graph up to date with the audit trail. Never raises for IO trouble:
    problems come back as ``warnings`` (the caller's run goes on)."""
    if secrets is None:
        from gpuheal.credentials import secrets_for

        secrets = secrets_for(cfg)
    state = KgState.from_json(store.read(STATE_FILE, None))
    summary: dict[str, Any] = {"written": 0, "posted": 0, "pending": len(state.pending), "warnings": []}
    records, offset, ino, junk = read_new_records(store.path / files.AUDIT_LOG, state)
    if junk:
        summary["warnings"].append(f"{files.AUDIT_LOG}: skipped {junk} unreadable line(s) for the knowledge graph")
    nodes = [node_for(r, secrets) for r in records]
    target = kg_file(cfg, store.path)
    try:
        torn = append_nodes(target, nodes)
    except (OSError, ValueError) as exc:
        summary["warnings"].append(
            f"knowledge graph file {target}: {getattr(exc, 'strerror', None) or exc}; will retry"
        )
        return summary  # offset unchanged: the same records are tried again next run
    summary["written"] = len(nodes)
    if torn:
        summary["warnings"].append(f"knowledge graph file {target}: {torn}")
    url = (cfg.knowledge_graph or {}).get("url")
    pending = [*state.pending, *nodes] if url else []  # no endpoint (any more): nothing waits
    if url and pending:
        timeout = float(cfg.knowledge_graph["timeout_s"])
        posted, error = post_nodes(str(url), pending, timeout)
        pending = pending[posted:]
        summary["posted"] = posted
        if error:
            summary["warnings"].append(
                f"knowledge graph endpoint: {error}; {len(pending)} node(s) kept for the next run"
            )
    if len(pending) > MAX_PENDING:
        dropped = len(pending) - MAX_PENDING
        pending = pending[dropped:]
        summary["warnings"].append(
            f"knowledge graph endpoint backlog over {MAX_PENDING}: dropped the {dropped} oldest node(s)"
            " (they are in the file)"
        )
    summary["pending"] = len(pending)
    new_state = KgState(offset, ino, tuple(pending))
    if new_state != state:
        store.write(STATE_FILE, new_state.to_json())
    return summary
