"""Start, or restart, the real LiteLLM proxy as ``docker restart litellm`` would — the ``restart_command``
the config-file redirect test hands gpuheal (issue 27 item 7).

    python tests/restart_litellm.py STATE.json

``STATE.json``: ``{"argv": [...], "env": {...}, "cwd": DIR, "log": FILE, "pidfile": FILE}``. A running proxy
(its pid in ``pidfile``) is stopped (SIGTERM, SIGKILL after 15 s), then the same argv is started detached in
a session of its own, its pid written back. Exits once it is started; the caller waits for liveliness.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone
    except (OSError, IndexError):
        return False


def stop(pidfile: str) -> None:
    try:
        pid = int(open(pidfile, encoding="ascii").read().strip())
    except (OSError, ValueError):
        return
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except OSError:
            return
        end = time.monotonic() + wait_s
        while time.monotonic() < end and _alive(pid):
            time.sleep(0.1)
        if not _alive(pid):
            return


def main() -> int:
    state = json.loads(open(sys.argv[1], encoding="utf-8").read())
    stop(state["pidfile"])
    with open(state["log"], "ab") as log:
        proc = subprocess.Popen(state["argv"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=state["env"], cwd=state["cwd"], start_new_session=True)
    with open(state["pidfile"], "w", encoding="ascii") as fh:
        fh.write(str(proc.pid))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--stop":
        stop(sys.argv[2])
        raise SystemExit(0)
    raise SystemExit(main())
