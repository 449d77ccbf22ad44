"""The state directory: an exclusive lock, atomic JSON files, an append-only audit trail.

Contract ("State directory"): writes are atomic (temp file, fsync, rename, fsync of the
directory), a run never leaves a half-written file, two runs never act at once (``flock`` on
``.lock``; a second run waits ``lock_wait_s`` then gives up with :class:`StateLockedError`), a
corrupt file is renamed aside with a warning and never crashes a run. Files are 0600 and the
directory 0700: the state names hosts and holds evidence an operator may not want world-readable.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from gpuheal.errors import GpuhealError, StateLockedError

SCHEMA_VERSION = 1
LOCK_FILE = ".lock"


class StateDir:
    """Use as a context manager; everything inside runs under the exclusive lock."""

    def __init__(self, path: Path | str, lock_wait_s: float = 10.0) -> None:
        self.path = Path(path)
        self.lock_wait_s = lock_wait_s
        self.warnings: list[str] = []
        self._lock_fd: int | None = None

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
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.lock_wait_s
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
                        f"(waited {self.lock_wait_s:g} s); not acting"
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

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

    def write(self, name: str, data: Any) -> None:
        """Atomically replace ``name`` with ``{"schema_version": N, "data": data}``."""
        self.write_raw(name, {"schema_version": SCHEMA_VERSION, "data": data})

    def write_raw(self, name: str, doc: dict[str, Any]) -> None:
        """Atomically write a document whose shape is public (the contract's files)."""
        payload = json.dumps(doc, separators=(",", ":"), sort_keys=False, allow_nan=False)
        self._atomic_write(self.path / name, payload.encode() + b"\n")

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

    def _atomic_write(self, path: Path, payload: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        dir_fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    # ------------------------------------------------------------------ JSON lines
    def append_lines(self, name: str, records: list[dict[str, Any]]) -> None:
        """Append whole lines with one ``write`` each, then fsync: a kill never truncates a line.

        A previous run killed mid-line (impossible with one ``write`` of a small record on a
        local filesystem, but cheap to guard) is healed by starting on a fresh line.
        """
        if not records:
            return
        path = self.path / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = os.fstat(fd).st_size
            prefix = b""
            if size:
                with open(path, "rb") as fh:
                    fh.seek(size - 1)
                    if fh.read(1) != b"\n":
                        prefix = b"\n"
            for i, record in enumerate(records):
                line = json.dumps(record, separators=(",", ":"), allow_nan=False).encode() + b"\n"
                os.write(fd, (prefix if i == 0 else b"") + line)
            os.fsync(fd)
        finally:
            os.close(fd)

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
