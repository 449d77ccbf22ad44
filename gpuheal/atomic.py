"""Write a file all or nothing: the one atomic writer (issue 19 item 6) that the state directory,
the metrics textfile and the config-validated marker share.

A temp file next to the target (same filesystem, so the rename is atomic), fsync, rename: a reader
(cron's next run, node_exporter's textfile collector) sees the old file or the new one, never a
torn one, and a failure before the rename removes the temp file. Stdlib only, no IO at import.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from pathlib import Path

WRITE_STEP = 1 << 20  # a str is encoded and written this many characters at a time


def write_atomic(path: Path | str, *parts: Iterable[str | bytes], mode: int = 0o600) -> None:
    """Write the chunks of ``parts`` in order to ``path`` (created with ``mode``). A ``str`` is
    encoded a megabyte at a time: the history of a large fleet is tens of MB, and a whole encoded
    copy would be held at once (peak RSS). A lone surrogate (from a peer's label or name) is written
    as ``?``: it never stops the write. Raises ``OSError``; the temp file is gone by then."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            for payload in itertools.chain.from_iterable(parts):
                for start in range(0, len(payload), WRITE_STEP):
                    piece = payload[start : start + WRITE_STEP]
                    view = memoryview(piece.encode("utf-8", "replace") if isinstance(piece, str) else piece)
                    while view:
                        view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
