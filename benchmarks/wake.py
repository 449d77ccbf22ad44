"""How long a webhook sender waits for ``gpuheal wake``'s answer (issue 22 item 7).

Each run starts the real ``gpuheal wake`` process with a socketpair as its stdin/stdout, as
systemd's ``Accept=yes`` does, and times from the start to the first bytes of the answer: a 401
(wrong token) and a 429 (a cycle ran within ``wake.min_interval_s``; the first good request books
one, against a config whose fleet is unreachable). Loopback only. Prints the median of ``--runs``.

    .venv/bin/python benchmarks/wake.py --runs 11
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPUHEAL = str(Path(sys.executable).with_name("gpuheal"))
CONFIG = (
    "monitor: {url: 'http://127.0.0.1:9', timeout_s: 1}\nlitellm: {url: 'http://127.0.0.1:9'}\n"
    "gpus:\n  - {alias: a, host: 127.0.0.1, endpoint: 'http://127.0.0.1:9', vram_total_mb: 24576}\n"
)


def answer_s(workdir: Path, token: bytes) -> tuple[float, bytes]:
    body = b'{"status": "firing", "alerts": [{"labels": {"alertname": "GpuFleetDegraded"}}]}'
    req = b"POST /wake HTTP/1.1\r\nAuthorization: Bearer " + token + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
    client, server = socket.socketpair()
    client.sendall(req + body)
    client.shutdown(socket.SHUT_WR)
    env = {**os.environ, "GPUHEAL_WAKE_TOKEN": "bench-token-123456"}
    started = time.monotonic()
    proc = subprocess.Popen([GPUHEAL, "-c", str(workdir / "g.yaml"), "--state-dir", str(workdir / "st"), "wake"],
                            stdin=server, stdout=server, stderr=subprocess.DEVNULL, env=env)  # fmt: skip
    server.close()
    head = client.recv(12)
    took = time.monotonic() - started
    proc.wait(120)
    client.close()
    return took, head


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=11)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "g.yaml").write_text(CONFIG)
        answer_s(workdir, b"bench-token-123456")  # books a cycle (and warms the config cache)
        for name, token in (("401 wrong token", b"wrong"), ("429 rate-limited", b"bench-token-123456")):
            runs = [answer_s(workdir, token) for _ in range(args.runs)]
            assert all(head.endswith(name[:3].encode()) for _, head in runs), runs[0]
            print(f"{name}: median {statistics.median(t for t, _ in runs) * 1000:.0f} ms over {args.runs} runs")


if __name__ == "__main__":
    main()
