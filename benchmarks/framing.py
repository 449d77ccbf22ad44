"""The HTTP/1.1 framing's cost, hand-written (``gpuheal/sources/http.py``'s ``_Response``) against
h11 (issue 19, item 5: "if h11 costs more than 10 % on the 1000-GPU check, keep a hand-written
framing and say why"). Figures, not a timed test.

One 1000-GPU poll parses ~3000 answers (``/health``, ``/metrics``, ``/slots`` of busy servers, the
bodies a real b11312 llama-server gives, as in ``benchmarks/run.py``'s check-1000). For each framing
this builds the request bytes and parses one answer of each kind, 1000 times, and reports the
median of 5 such polls; then the import time of h11 in a fresh interpreter (median of 5).

    .venv/bin/python benchmarks/framing.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from gpuheal.sources.http import Ask, _Job, _request_bytes, _Response

METRICS = b"".join(b"# HELP llamacpp:m%d a metric\n# TYPE llamacpp:m%d counter\nllamacpp:m%d %d\n" % (i, i, i, i * 7)
                   for i in range(40))
SLOTS = b'[{"id": 0, "is_processing": true, "n_ctx": 8192, "params": {"n_predict": -1}, "next_token": ' \
        b'{"has_next_token": true, "n_decoded": 120}}]' * 2
BODIES = [b'{"status":"ok"}', METRICS, SLOTS]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nKeep-Alive: timeout=5, max=100\r\n" \
       b"Server: llama.cpp\r\nAccess-Control-Allow-Origin: \r\nContent-Length: %d\r\n\r\n"
WIRES = [HEAD % len(body) + body for body in BODIES]
PATHS = ["/health", "/metrics", "/slots"]
GPUS = 1000


def hand_poll() -> None:
    job = _Job("g", None, "127.0.0.1", 8080, "/gpu-0001", "", 1.0, 0.0)
    for _ in range(GPUS):
        for path, wire in zip(PATHS, WIRES, strict=True):
            _request_bytes(job, Ask(path))
            resp = _Response(1 << 20)
            assert resp.feed(wire) and resp.body


def h11_poll() -> None:
    import h11

    for _ in range(GPUS):
        for path, wire in zip(PATHS, WIRES, strict=True):
            conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=65536)
            conn.send(h11.Request(method="GET", target="/gpu-0001" + path,
                                  headers=[("Host", "127.0.0.1:8080"), ("User-Agent", "gpuheal"),
                                           ("Accept", "application/json")]))
            conn.send(h11.EndOfMessage())
            conn.receive_data(wire)
            body = b""
            while True:
                event = conn.next_event()
                if type(event) is h11.Data:
                    body += event.data
                elif type(event) is h11.EndOfMessage:
                    break
                elif event is h11.NEED_DATA:
                    raise SystemExit("h11 wants more of a complete answer")
            assert body


def median_s(poll, runs: int = 5) -> float:
    took = []
    for _ in range(runs):
        started = time.perf_counter()
        poll()
        took.append(time.perf_counter() - started)
    return statistics.median(took)


def h11_import_ms(runs: int = 5) -> float:
    took = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import h11"], capture_output=True, text=True)
        last = [line for line in out.stderr.splitlines() if line.rstrip().endswith("| h11")][-1]
        took.append(int(last.split("|")[1]) / 1000)
    return statistics.median(took)


def main() -> None:
    hand, h11_s = median_s(hand_poll), median_s(h11_poll)
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"hand-written framing, {3 * GPUS} answers: {hand * 1000:.0f} ms ({hand / (3 * GPUS) * 1e6:.1f} us each)")
    print(f"h11 framing,          {3 * GPUS} answers: {h11_s * 1000:.0f} ms ({h11_s / (3 * GPUS) * 1e6:.1f} us each)")
    print(f"h11 costs {(h11_s - hand) * 1000:.0f} ms more per 1000-GPU poll; import h11: {h11_import_ms():.1f} ms")


if __name__ == "__main__":
    main()
