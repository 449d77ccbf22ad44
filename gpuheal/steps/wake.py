"""``gpuheal wake``: one webhook request on stdin/stdout wakes one ``heal --apply`` cycle (issue 22
item 7, the spec's "Also wakes on gpu-fleet health degradation"; contract "Waking on an event").

inetd style, as a systemd socket unit with ``Accept=yes`` runs it (``cron/gpuheal-wake.socket``):
no daemon, one process per connection, the connection on fds 0 and 1. The order is the safe one:

1. read the head within 5 s; method, token (``Authorization: Bearer`` or the last path segment of
   ``POST /wake/TOKEN``, constant time) and length are judged before any body is read, so a wrong
   token never costs a megabyte and a 10 MB body is never read;
2. read the body (still within the 5 s), accept any JSON, summarise what woke us (of a LiteLLM
   alert only its type, model group, API base and the GPU that base is: never the user's prompt);
3. a run confirming a fault between its probes (the lock file's mark, issue 28), or the state lock
   held → a run is going, it will see the state (202, nothing runs); ``wake.json`` says a cycle ran
   within ``wake.min_interval_s`` → 429;
4. book the cycle's time, audit what woke it (escaped, capped, redacted), answer 202 and hang up,
   then run the cycle under the same lock — a webhook sender never waits for a heal.

A path-token sender (LiteLLM, which counts only ``200`` as delivered) is answered ``200`` where a
bearer sender is answered ``202``; every other answer is the same for both.

Every refusal is one line on stderr (the journal) and an HTTP answer; never a traceback.
"""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from gpuheal.actions.record import old_run_counter
from gpuheal.core import wake as core
from gpuheal.state.files import WAKE as WAKE_FILE  # internal: {"last_cycle_s", "last_cycle_at", "woken_by"}

if TYPE_CHECKING:
    from gpuheal.runtime import Runtime
    from gpuheal.state.store import StateDir


@dataclass(frozen=True)
class Settings:
    """What one wake needs besides the connection: values, so a test can run many in threads."""

    token: str | None
    min_interval_s: float
    state_dir: Path
    secrets: tuple[str, ...] = ()
    deadline_s: float = core.READ_DEADLINE_S
    endpoints: tuple[tuple[str, str], ...] = ()  # (alias, endpoint): the GPU a LiteLLM alert names


@dataclass(frozen=True)
class Outcome:
    status: int
    decision: str  # refused | busy | rate-limited | cycle
    detail: str


def serve(in_fd: int, out_fd: int, settings: Settings, now: datetime, cycle: Callable[[StateDir], str]) -> Outcome:
    """Answer the request on ``in_fd``/``out_fd``; ``cycle(store)`` runs the heal cycle under the lock."""
    from gpuheal.errors import GpuhealError, StateLockedError
    from gpuheal.state.store import StateDir

    got = read_request(in_fd, settings, out_fd)
    if isinstance(got, core.Refusal):
        return _answer(out_fd, Outcome(got.status, "refused", got.why))
    summary, ok = _redacted(got.summary, settings), got.ok_status
    store = StateDir(settings.state_dir, 0.0)
    if store.confirming(time.time()):  # a run confirming a fault between its probes: it acts, a cycle now would not
        return _answer(out_fd, Outcome(ok, "busy", f"a gpuheal run is confirming a fault; it will act ({summary})"))
    try:
        store.open()
    except StateLockedError:
        return _answer(out_fd, Outcome(ok, "busy", f"a gpuheal run holds the state; it will see it ({summary})"))
    except GpuhealError as exc:  # an unusable state directory: the sender hears it, and the journal
        return _answer(out_fd, Outcome(500, "refused", str(exc)))
    try:
        last = store.read(WAKE_FILE, {})
        last_s = last.get("last_cycle_s") if isinstance(last, dict) else None
        last_s = float(last_s) if isinstance(last_s, int | float) and not isinstance(last_s, bool) else None
        if not core.cycle_due(last_s, now.timestamp(), settings.min_interval_s):
            detail = f"a cycle ran within wake.min_interval_s={settings.min_interval_s:g} s ({summary})"
            return _answer(out_fd, Outcome(429, "rate-limited", detail))
        _book(store, now, summary, got.litellm)
        _answer(out_fd, Outcome(ok, "cycle", f"heal cycle started ({summary})"))
        _hang_up(in_fd, out_fd)
        began = time.monotonic()
        result = cycle(store)
        _ended(store, now.timestamp() + time.monotonic() - began)  # a burst outlasting the cycle: still one
        sys.stderr.write(f"gpuheal wake: heal cycle done: {core.shown(result)}\n")
        return Outcome(ok, "cycle", summary)
    finally:
        store.close()


def read_request(fd: int, settings: Settings, out_fd: int | None = None) -> core.Woken | core.Refusal:
    """What woke us, or why the request is refused. One deadline for head and body together."""
    end = time.monotonic() + settings.deadline_s
    buf = bytearray()
    while (cut := _head_end(buf)) is None:
        if len(buf) > core.MAX_HEAD_BYTES:
            return core.Refusal(400, f"request head over {core.MAX_HEAD_BYTES} bytes")
        chunk = _read(fd, end)
        if chunk is None:
            return core.Refusal(400, f"no complete request within {settings.deadline_s:g} s")
        if not chunk:
            return core.Refusal(400, "connection closed before a complete request")
        buf += chunk
    if cut[0] > core.MAX_HEAD_BYTES:
        return core.Refusal(400, f"request head over {core.MAX_HEAD_BYTES} bytes")
    head = core.parse_head(bytes(buf[: cut[0]]))
    if isinstance(head, core.Refusal):
        return head
    via = core.judge(head, settings.token)
    if isinstance(via, core.Refusal):
        return via
    body = buf[cut[1]:]
    length = head.content_length or 0
    if head.expect_continue and len(body) < length and out_fd is not None:
        _send(out_fd, b"HTTP/1.1 100 Continue\r\n\r\n")
    while len(body) < length:
        chunk = _read(fd, end)
        if not chunk:
            return core.Refusal(400, f"body of {length} bytes not received within {settings.deadline_s:g} s")
        body += chunk
    return core.summarise(bytes(body[:length]), via, settings.endpoints)


def _head_end(buf: bytearray) -> tuple[int, int] | None:
    for sep in (b"\r\n\r\n", b"\n\n"):
        at = buf.find(sep)
        if at >= 0:
            return at, at + len(sep)
    return None


def _read(fd: int, end: float) -> bytes | None:
    """Up to 64 KiB; ``b""`` at end of input, ``None`` past the deadline or on a read error."""
    left = end - time.monotonic()
    if left <= 0:
        return None
    try:
        ready, _, _ = select.select([fd], [], [], left)
        return os.read(fd, 65536) if ready else None
    except OSError:
        return b""


def _redacted(text: str, settings: Settings) -> str:
    from gpuheal.redact import redact_text

    return redact_text(text, tuple(s for s in (*settings.secrets, settings.token) if s))


def _book(store: StateDir, now: datetime, summary: str, alert: core.LiteLLMAlert | None = None) -> None:
    """The cycle's time and its cause, saved before it runs: a killed cycle still counts. A LiteLLM
    alert's deployment (its model group, API base and GPU) is named under ``detected.litellm``. The
    ``heal-cycle`` line carries this run's id (contract "Audit trail"); the cycle's own attempts get theirs."""
    from gpuheal.clock import format_iso
    from gpuheal.state import files

    store.write(WAKE_FILE, {"last_cycle_s": now.timestamp(), "last_cycle_at": format_iso(now), "woken_by": summary})
    detected: dict[str, object] = {"woken_by": summary}
    if alert is not None:
        detected["litellm"] = alert.to_dict()
    run_id = store.run_id(now, old_run_counter)
    record = {"run_id": run_id, "timestamp": format_iso(now), "gpu": "fleet", "issue": "wake", "detected": detected,
              "action": "heal-cycle", "result": "started", "escalated": False}  # fmt: skip
    store.append_lines(files.AUDIT_LOG, [record])


def _answer(out_fd: int, outcome: Outcome) -> Outcome:
    sys.stderr.write(f"gpuheal wake: {outcome.status} {outcome.decision}: {core.shown(outcome.detail)}\n")
    if _send(out_fd, core.response(outcome.status, outcome.detail)):
        _linger(out_fd)
    return outcome


def _send(fd: int, data: bytes) -> bool:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # the sender hung up: nothing to tell it
        return False
    return True


def _linger(fd: int, wait_s: float = 1.0, max_bytes: int = 2 * core.MAX_BODY_BYTES) -> None:
    """Half-close, then drain what the sender still sends, briefly: closing a socket with unread
    input sends a reset, and the sender would lose the answer (a 401, a 400 for a 10 MB body)."""
    import socket

    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_WR)
    except OSError:  # a pipe, or already gone
        return
    end, drained = time.monotonic() + wait_s, 0
    while drained < max_bytes and (chunk := _read(fd, end)):
        drained += len(chunk)


def _hang_up(in_fd: int, out_fd: int) -> None:
    """Close the connection now (the heal cycle may take a minute): shut the socket down, then point
    fds 0 and 1 at /dev/null so nothing the cycle prints reaches the sender."""
    import socket

    try:
        with socket.socket(fileno=os.dup(out_fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # a pipe, not a socket
        pass
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (in_fd, out_fd):
        os.dup2(null, fd)
    os.close(null)


def command(load_runtime: Callable[[], Runtime], in_fd: int = 0, out_fd: int = 1) -> int:
    """The CLI's half: the config (a config that does not load is a 500 and one line), then :func:`serve`."""
    from gpuheal.credentials import lookup
    from gpuheal.errors import GpuhealError

    try:
        rt = load_runtime()
        wake = rt.cfg.wake
        token, _ = lookup(wake.token_env, rt.cfg.path)
    except GpuhealError as exc:
        _answer(out_fd, Outcome(500, "refused", f"gpuheal cannot run: {exc}"))
        return 3
    if not token:
        sys.stderr.write(f"gpuheal wake: ${wake.token_env} is not set: every request is refused\n")
    from gpuheal.credentials import secrets_for

    endpoints = tuple((g.alias, g.endpoint) for g in rt.cfg.gpus)
    settings = Settings(token, float(wake.min_interval_s), Path(rt.state_dir), tuple(secrets_for(rt.cfg)),
                        endpoints=endpoints)  # fmt: skip
    outcome = serve(in_fd, out_fd, settings, rt.now, lambda store: _heal_cycle(rt, store))
    return 0 if outcome.status in (200, 202, 429) else 1


def _heal_cycle(rt: Runtime, store: StateDir) -> str:
    """The minute cycle cron runs, on the store the wake already holds: ``heal --apply``, then
    ``escalate``, so an incident the wake found reaches the humans now, not at the next cron minute.
    The metrics textfile is left to the next cron run (the CLI writes it; ``steps`` does not import
    ``metrics``)."""
    from gpuheal.steps import escalate, heal

    result = heal.command(rt, store, apply=True)
    sent = escalate.command(rt, store)
    delivered = len(sent.document.get("sent", []))
    queued = len(sent.document.get("queued", []))
    return f"fleet {result.document.get('status')}, exit {result.exit_code}; alerts sent {delivered}, queued {queued}"


def _ended(store: StateDir, end_s: float) -> None:
    """``wake.min_interval_s`` counts from the cycle's end too: alerts of the same fault that go on while a
    cycle confirms and restarts (20 s and more) start no second cycle right after it."""
    last = store.read(WAKE_FILE, {})
    store.write(WAKE_FILE, {**(last if isinstance(last, dict) else {}), "last_cycle_s": end_s})
