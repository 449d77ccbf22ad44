"""The state directory: an exclusive lock, atomic JSON files, an append-only audit trail.

The audit trail is appended here and nowhere else, and every line is checked as it is appended
(contract "Audit trail"): ``timestamp, gpu, issue, action, result, run_id``, the id in the form
``gpu-self-heal-YYYYMMDD-NNN``, whichever command writes it (:meth:`StateDir.append_lines`). The ids
are numbered per UTC day across runs (:meth:`StateDir.next_run_id`); a command with no id of its own
takes this run's (:meth:`StateDir.run_id`), allocated at its first line.

Contract ("State directory"): writes are atomic (temp file, fsync, rename, fsync of the
directory), a run never leaves a half-written file, two runs never act at once (``flock`` on
``.lock``; a second run waits ``lock_wait_s`` then gives up with :class:`StateLockedError`), a
corrupt file is renamed aside with a warning and never crashes a run. Files are 0600 and the
directory 0700: the state names hosts and holds evidence an operator may not want world-readable.
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, AnyStr

from gpuheal.atomic import WRITE_STEP, write_atomic
from gpuheal.errors import GpuhealError, StateLockedError
from gpuheal.state import files

SCHEMA_VERSION = 1
LOCK_FILE = ".lock"
CONFIRMING = "confirming-until"  # the lock file's mark of a run that let go only while it confirms
MAX_CONFIRMING_S = 3600.0  # a mark further ahead than this is damaged (confirm_budget_s is at most 50 s)
AUDIT_FIELDS = ("timestamp", "gpu", "issue", "action", "result", "run_id")  # contract "Audit trail"
AUDIT_RESULTS = frozenset({"pending", "resolved", "failed", "escalated", "superseded", "started"})
RUN_ID = re.compile(r"gpu-self-heal-(\d{8})-(\d{3,})")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)")  # ISO 8601 with its zone
MAX_RUNS_A_DAY = 10**6  # a stored counter beyond this is damage, not a day's runs
# where a run counter carries on from when run-ids.json holds none: (day "YYYYMMDD", n) or None
OldCounter = Callable[["StateDir"], "tuple[str, int] | None"]
STREAM_LEVELS = 3  # objects written key by key by write_raw(stream=True): the document, "data", "raw"/"coarse"


class AuditLineError(ValueError):
    """A line that is not in the contract's audit form: a programming error, never written."""


def is_run_id(value: object) -> bool:
    """Whether ``value`` is a run id in the contract's form (``gpu-self-heal-YYYYMMDD-NNN``)."""
    return isinstance(value, str) and RUN_ID.fullmatch(value) is not None


def audit_problem(record: object) -> str | None:
    """What keeps ``record`` from being an audit line (contract "Audit trail"), or ``None``."""
    if not isinstance(record, dict):
        return f"an audit line is an object, not {type(record).__name__}"
    for key in AUDIT_FIELDS:
        value = record.get(key)
        if not isinstance(value, str) or not value:
            return f"audit line without {key!r} (got {value!r:.80})"
    if not is_run_id(record["run_id"]):
        return f"run_id {record['run_id']!r:.80} is not gpu-self-heal-YYYYMMDD-NNN"
    if TIMESTAMP.fullmatch(record["timestamp"]) is None:
        return f"timestamp {record['timestamp']!r:.80} is not ISO 8601 with its zone"
    if record["result"] not in AUDIT_RESULTS:
        return f"result {record['result']!r:.80} is not one of {', '.join(sorted(AUDIT_RESULTS))}"
    return None


def _run_seq(doc: object) -> tuple[str, int] | None:
    """A stored ``{"day": "YYYYMMDD", "n": N}``; ``None`` when it is not one."""
    if not isinstance(doc, dict):
        return None
    day, n = doc.get("day"), doc.get("n")
    if not (isinstance(day, str) and re.fullmatch(r"\d{8}", day)) or type(n) is not int or not 0 <= n < MAX_RUNS_A_DAY:
        return None
    return day, n


def encoded_pieces(value: Any, depth: int) -> Iterator[str]:
    """``json.dumps(value, separators=(",", ":"), allow_nan=False)`` in pieces, for :meth:`StateDir.write_raw`'s
    ``stream``: the outer ``depth`` levels of objects key by key, everything below in one call of the C
    encoder each. ``JSONEncoder.iterencode`` gave the same text from the pure-Python encoder, a call per
    token: the chaos week's history save (issue 29). Objects with a key that is not a string go whole."""
    if depth <= 0 or not isinstance(value, dict) or not value or not all(isinstance(k, str) for k in value):
        yield json.dumps(value, separators=(",", ":"), allow_nan=False)
        return
    sep = "{"
    for key, item in value.items():
        yield sep + json.dumps(key) + ":"
        yield from encoded_pieces(item, depth - 1)
        sep = ","
    yield "}"


def _buffered(chunks: Iterable[AnyStr], empty: AnyStr) -> Iterator[AnyStr]:
    """Join an encoder's many small pieces (text, or encoded: ``empty`` is ``""`` or ``b""``) into ~1 MB writes."""
    buf: list[AnyStr] = []
    size = 0
    for chunk in chunks:
        buf.append(chunk)
        size += len(chunk)
        if size >= WRITE_STEP:
            yield empty.join(buf)
            buf, size = [], 0
    if buf:
        yield empty.join(buf)


class StateDir:
    """Use as a context manager; everything inside runs under the exclusive lock."""

    def __init__(self, path: Path | str, lock_wait_s: float = 10.0) -> None:
        self.path = Path(path)
        self.lock_wait_s = lock_wait_s
        self.warnings: list[str] = []
        self._lock_fd: int | None = None
        self._run_id: str | None = None
        self._stamp = ""  # "pid token" written into the lock file by this holder (see resume)
        self._released = False

    # ------------------------------------------------------------------ lock
    def __enter__(self) -> StateDir:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.path, 0o700)
        except OSError as exc:
            raise GpuhealError(
                f"cannot use state directory {self.path}: {exc.strerror} (set --state-dir)"
            ) from None
        self._lock(self.lock_wait_s)

    def _lock(self, wait_s: float) -> str:
        """Take the lock (waiting up to ``wait_s``), stamp the lock file with this holder (pid and a fresh
        token) and return the stamp it held before: the last holder's."""
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise StateLockedError(
                        f"state directory {self.path} is locked by another gpuheal run "
                        f"(waited {wait_s:g} s); not acting"
                    ) from None
                time.sleep(0.05)
        before = os.pread(fd, 200, 0).decode("ascii", "replace")
        self._stamp = f"{os.getpid()} {os.urandom(8).hex()}\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, self._stamp.encode(), 0)
        self._lock_fd = fd
        self._remove_stale_temp_files()
        return before

    def release(self, for_s: float = 0.0) -> None:
        """Let another run take the lock while this one only waits (issue 28: the in-run confirmation's
        sleeps). Whatever this run must keep is written first, by the caller; :meth:`resume` takes it back.
        ``for_s``: how long it means to wait, marked in the lock file (:func:`confirming`) so that a wake
        does not start a cycle that would only make this one stand down."""
        if self._lock_fd is not None:
            if for_s > 0:
                pid, token = self._stamp.split()[:2]
                self._stamp = f"{pid} {token} {CONFIRMING} {time.time() + for_s:.3f}\n"
                os.ftruncate(self._lock_fd, 0)
                os.pwrite(self._lock_fd, self._stamp.encode(), 0)
            self.close()
            self._released = True

    def resume(self, wait_s: float) -> bool:
        """Take the lock back after :meth:`release`, waiting up to ``wait_s`` (past it
        :class:`StateLockedError`). True when no other run held it meanwhile — the lock file still bears
        this run's stamp, which every holder replaces with its own — so what this run read of the state
        is still the state; False when one did: it saw the state and may have acted on it."""
        if not self._released:
            return True
        self._released, mine = False, self._stamp
        return self._lock(wait_s) == mine

    def confirming(self, now_s: float) -> bool:
        """Whether another process let the lock go only to confirm a fault within its run and comes back
        for it before its mark runs out (:meth:`release`). A dead process's mark is no run."""
        try:
            text = (self.path / LOCK_FILE).read_text("ascii", "replace")
        except OSError:
            return False
        return confirming_mark(text, now_s, os.getpid())

    def _remove_stale_temp_files(self) -> None:
        """A run killed between creating its temp file and the rename leaves ``.NAME.PID.tmp``;
        under the lock no other run can be writing one, so any found now is litter."""
        for tmp in self.path.glob(".*.tmp"):
            try:
                tmp.unlink()
            except OSError:
                pass

    def close(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # ------------------------------------------------------------------ JSON files
    def read(self, name: str, default: Any = None) -> Any:
        """The ``data`` of file ``name``; ``default`` if absent; corrupt → set aside + default."""
        path = self.path / name
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return default
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or "schema_version" not in doc:
                raise ValueError("no schema_version")
            version = doc["schema_version"]
            if version != SCHEMA_VERSION:
                raise ValueError(f"schema_version {version!r}, this gpuheal reads {SCHEMA_VERSION}")
        except (ValueError, RecursionError) as exc:
            self.set_aside(name, str(exc)[:120])
            return default
        return doc.get("data", default)

    def write(self, name: str, data: Any, *, stream: bool = False) -> None:
        """Atomically replace ``name`` with ``{"schema_version": N, "data": data}``."""
        self.write_raw(name, {"schema_version": SCHEMA_VERSION, "data": data}, stream=stream)

    def write_raw(self, name: str, doc: dict[str, Any], *, stream: bool = False) -> None:
        """Atomically write a document whose shape is public (the contract's files).

        ``stream``: encode piece by piece instead of into one string first — for a document of
        a few large strings (the packed history of a big fleet) it saves a whole copy at peak;
        for one of many small numbers the one-shot C encoder is faster.
        """
        if stream:  # {"schema_version", "data": {"raw"/"coarse": {alias: one GPU's block}}}: a block a piece
            self._atomic_write(self.path / name, _buffered(encoded_pieces(doc, STREAM_LEVELS), ""), ["\n"])
            return
        data = (json.dumps(doc, separators=(",", ":"), sort_keys=False, allow_nan=False) + "\n").encode(
            "utf-8", "replace")  # as write_atomic encodes text: a lone surrogate is written as "?"
        if not self._holds(name, data):
            self._atomic_write(self.path / name, [data])

    def _holds(self, name: str, data: bytes) -> bool:
        """Whether file ``name`` is already exactly ``data`` as a write would leave it: a regular file of this
        user's, mode 0600, one link, these bytes. Then its write (a temp file, fsync, rename, fsync of the
        directory) would change nothing and is skipped: cron rewrote ``heal-state.json`` and
        ``circuit-breaker-status.json`` unchanged at nearly every run (issue 29). Costs a ``stat`` when the
        size differs, a read of the file when it is the same."""
        path = self.path / name
        try:
            st = os.lstat(path)
            if not (stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1
                    and st.st_uid == os.getuid() and st.st_size == len(data)):
                return False
            return path.read_bytes() == data
        except OSError:
            return False

    def write_encoded(self, name: str, data: Iterable[bytes]) -> None:
        """:meth:`write` of a ``data`` its owner encoded already (the UTF-8 of its compact JSON, in pieces):
        the same file, written in ~1 MB pieces (the packed history, :meth:`History.encoded_files`)."""
        head = b'{"schema_version":%d,"data":' % SCHEMA_VERSION
        self._atomic_write(self.path / name, _buffered(itertools.chain((head,), data, (b"}\n",)), b""))

    def write_bytes(self, name: str, pieces: Iterable[bytes]) -> None:
        """Atomically replace ``name`` with the concatenated ``pieces`` (a file that is not JSON: the raw
        history's float64 columns, :func:`gpuheal.state.history.raw_file`), in ~1 MB writes."""
        self._atomic_write(self.path / name, _buffered(pieces, b""))

    def read_bytes(self, name: str) -> bytes | None:
        """File ``name``'s bytes; ``None`` when absent (its reader judges them, and sets a damaged one aside)."""
        try:
            return (self.path / name).read_bytes()
        except FileNotFoundError:
            return None

    def stamp(self, name: str) -> tuple[int, int, int, int] | None:
        """File ``name``'s (inode, size, mtime_ns, ctime_ns), ``None`` when absent: every write of it (a new
        file renamed over it) and every edit changes it, which a reader that indexed it checks (the coarse
        history, ``history_store``)."""
        try:
            st = os.stat(self.path / name)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def remove(self, name: str) -> None:
        """Remove file ``name`` if it is there (the directory fsynced, as after a write)."""
        try:
            (self.path / name).unlink()
        except FileNotFoundError:
            return
        self._fsync_dir()

    def read_raw(self, name: str) -> dict[str, Any] | None:
        path = self.path / name
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (ValueError, RecursionError) as exc:
            self.set_aside(name, str(exc)[:120])
            return None
        if not isinstance(doc, dict):
            self.set_aside(name, "not a JSON object")
            return None
        return doc

    def set_aside(self, name: str, reason: str) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = self.path / f"{name}.corrupt-{stamp}-{os.getpid()}"
        try:
            os.replace(self.path / name, target)
        except OSError:
            pass
        self.warnings.append(f"state file {name} was unreadable ({reason}); set aside as {target.name}")
        return target

    def _atomic_write(self, path: Path, *parts: Iterable[str | bytes]) -> None:
        """:func:`gpuheal.atomic.write_atomic` (mode 0600), then the directory fsynced so the
        rename itself survives a crash."""
        write_atomic(path, *parts)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        dir_fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    # ------------------------------------------------------------------ run ids
    def next_run_id(self, now: datetime, carried: OldCounter) -> str:
        """A new ``gpu-self-heal-YYYYMMDD-NNN``: numbered per UTC day of ``now`` across runs and
        commands (``run-ids.json``). Without a counter there, ``carried(self)`` says where to carry on
        from: the one ``heal-state.json`` kept before this file existed
        (:func:`gpuheal.core.heal_state.old_run_counter`; the state layer reads no heal state itself).
        A damaged counter starts the day over."""
        day = now.astimezone(UTC).strftime("%Y%m%d")
        seq = _run_seq(self.read(files.RUN_IDS, None))
        if seq is None:
            seq = carried(self)
        n = (seq[1] if seq is not None and seq[0] == day else 0) + 1
        self.write(files.RUN_IDS, {"day": day, "n": n})
        return f"gpu-self-heal-{day}-{n:03d}"

    def run_id(self, now: datetime, carried: OldCounter) -> str:
        """This run's id, for the lines a command writes without one of their own (``check``'s and
        ``bench``'s Rule 9 lines, ``wake``'s ``heal-cycle``): allocated at the first, then the same."""
        if self._run_id is None:
            self._run_id = self.next_run_id(now, carried)
        return self._run_id

    # ------------------------------------------------------------------ JSON lines
    def append_lines(self, name: str, records: list[dict[str, Any]]) -> None:
        """Append whole JSON lines to ``name`` in the state directory (:func:`append_json_lines`).
        The audit trail's lines are checked first (:func:`audit_problem`): one that is not in the
        contract's form raises :class:`AuditLineError` and nothing is written."""
        if name == files.AUDIT_LOG:
            for record in records:
                problem = audit_problem(record)
                if problem:
                    raise AuditLineError(problem)
        warning = append_json_lines(self.path / name, records)
        if warning:
            self.warnings.append(f"{name}: {warning}")

    def read_lines(self, name: str) -> list[dict[str, Any]]:
        """Every parsable line of a JSON-lines file; junk lines are skipped with a warning."""
        path = self.path / name
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return []
        out: list[dict[str, Any]] = []
        bad = 0
        for line in raw.splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(record, dict):
                out.append(record)
            else:
                bad += 1
        if bad:
            self.warnings.append(f"{name}: skipped {bad} unreadable line(s)")
        return out


def append_json_lines(path: Path, records: list[dict[str, Any]], *, default: Any = None,
                      ensure_ascii: bool = True) -> str | None:
    """Append whole JSON lines (serialised first: a bad record writes nothing), then fsync.

    A SIGKILL can tear a write: Linux checks for a fatal signal between the pages it copies, so a
    run killed mid-append may leave a partial last line. Readers never return such a tail as a
    record, and the next append removes it before writing (returning a warning that says so). A
    tail that is a whole record that only lacks its newline gets the newline instead. Torn bytes
    never stay in the middle of the file. Used by the audit trail and the knowledge-graph file.
    """
    if not records:
        return None
    payload = b"".join(
        json.dumps(record, separators=(",", ":"), allow_nan=False, default=default, ensure_ascii=ensure_ascii).encode(
            "utf-8", "replace"  # a lone surrogate from a source (ensure_ascii=False) never stops the append
        )
        + b"\n"
        for record in records
    )
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        warning = _heal_torn_tail(fd)
        view = memoryview(payload)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    return warning


def _heal_torn_tail(fd: int) -> str | None:
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return None
    cut = 0  # just after the last newline
    pos = size
    while pos > 0:
        step = min(65536, pos)
        block = os.pread(fd, step, pos - step)
        nl = block.rfind(b"\n")
        if nl >= 0:
            cut = pos - step + nl + 1
            break
        pos -= step
    tail = os.pread(fd, size - cut, cut)
    try:
        whole = isinstance(json.loads(tail), dict)
    except (ValueError, RecursionError):
        whole = False
    if whole:
        os.write(fd, b"\n")
        return None
    os.ftruncate(fd, cut)
    return f"removed a partial last line ({size - cut} bytes) left by an interrupted run"


def confirming_mark(text: str, now_s: float, own_pid: int) -> bool:
    """``pid token confirming-until EPOCH``, its process alive, not this one, and the time not past."""
    parts = text.split()
    if len(parts) != 4 or parts[2] != CONFIRMING or not parts[0].isdigit():
        return False
    try:
        until_s, pid = float(parts[3]), int(parts[0])
    except ValueError:
        return False
    if pid == own_pid or not now_s < until_s < now_s + MAX_CONFIRMING_S:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # alive, another user's
    return True
