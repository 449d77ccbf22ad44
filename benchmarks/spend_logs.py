"""What reading Rule 10's window of LiteLLM spend logs costs a poll (issue 22 item 6).

A loopback HTTP server answers ``GET /spend/logs/v2`` with pre-built pages of rows shaped as the real
1.108.7 proxy writes them (every ``LiteLLM_SpendLogs`` column, no stored prompts: ~1 KB a row); each run
times :func:`gpuheal.sources.litellm_spend.fetch_spend` for the whole window plus
:func:`gpuheal.core.routing.tally` against three roles. Prints the median of ``--runs`` per size.

    .venv/bin/python benchmarks/spend_logs.py --runs 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from gpuheal.config.model import Role
from gpuheal.core.routing import Deployment, tally
from gpuheal.sources.litellm_spend import PAGE_SIZE, fetch_spend

ALIASES = ("gpu-dense", "gpu-light", "strix-moe")
GPUS = [Deployment(a, frozenset({a}), f"http://127.0.0.1:{18080 + i}", Role(a, (a,), ("chat", "vision"), None, 32000))
        for i, a in enumerate(ALIASES)]


def row(i: int) -> dict:
    alias = ALIASES[i % 3]
    return {"request_id": f"chatcmpl-{i:012d}", "call_type": "acompletion", "api_key": "8" * 64, "spend": 0.0,
            "total_tokens": 420, "prompt_tokens": 300 + i % 5000, "completion_tokens": 120,
            "startTime": "2026-07-18T08:00:00.123000Z", "endTime": "2026-07-18T08:00:02.456000Z",
            "request_duration_ms": 2333, "completionStartTime": "2026-07-18T08:00:00.523000Z", "model": alias,
            "model_id": alias, "model_group": alias, "custom_llm_provider": "openai",
            "api_base": "http://127.0.0.1:18080/v1", "user": "", "metadata": {"user_api_key_alias": "agent-7",
            "status": "success", "additional_usage_values": {}}, "cache_hit": "False", "cache_key": "Cache OFF",
            "request_tags": ["chat"] if i % 7 else ["code"], "team_id": None, "organization_id": None,
            "end_user": None, "requester_ip_address": "127.0.0.1", "messages": {}, "response": {},
            "session_id": f"s-{i // 10}", "status": "success", "proxy_server_request": {}}


def serve(n_rows: int) -> tuple[ThreadingHTTPServer, str]:
    rows = [row(i) for i in range(n_rows)]
    pages = max(1, (n_rows + PAGE_SIZE - 1) // PAGE_SIZE)
    bodies = [json.dumps({"data": rows[p * PAGE_SIZE:(p + 1) * PAGE_SIZE], "total": n_rows, "page": p + 1,
                          "page_size": PAGE_SIZE, "total_pages": pages, "total_is_capped": False}).encode()
              for p in range(pages)]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            page = int(parse_qs(urlparse(self.path).query)["page"][0])
            body = bodies[page - 1] if page <= pages else b'{"data": [], "total_pages": 0}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    for n in (1_000, 5_000, 20_000):
        server, url = serve(n)
        times, size = [], 0
        for _ in range(args.runs):
            t0 = time.perf_counter()
            got = fetch_spend(url, "sk-bench", 0.0, 3600.0, deadline_s=60.0, max_rows=n)
            tallies = tally(got.rows, GPUS, 3600.0)
            times.append(time.perf_counter() - t0)
            size = sum(t.requests for t in tallies.values())
        server.shutdown()
        print(f"{n:>6} rows ({size} tallied): median {statistics.median(times) * 1000:.0f} ms over {args.runs} runs")


if __name__ == "__main__":
    main()
