"""The chaos week's exchange path in process (issue 29, wave 10), in CPU time, on a 100-GPU chaos fleet:

    .venv/bin/python benchmarks/chaos_exchange_micro.py                              # this tree
    git archive 4800a37 | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/chaos_exchange_micro.py      # the code before

- one poll's llama-server exchanges (``/health``, ``/metrics``, ``/slots`` of every GPU through
  ``run_exchanges`` on ``use_network``, what ``sources.sense`` runs; gpuheal's telemetry parsing included);
- the same three requests of every GPU by an exchange that parses nothing (the seam and the sim only);
- the sim's answer to one of those requests (``InProcessNetwork.answer``);
- gpuheal's framing of one of those answers (``sources.http._framed``);
- the gpu-monitor document of the fleet (``World.gpu_data``).

Each is the median of 7 runs. The fleet's clock moves a minute before each poll, as in the week.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_inject import Layout  # noqa: E402
from chaos_world import scenario  # noqa: E402

from gpuheal.sim import Scenario, SimFleet  # noqa: E402
from gpuheal.sources import http, llama_telemetry  # noqa: E402


def median_cpu(fn: Any, repeat: int, per: int) -> float:
    """Median over 7 runs of ``repeat`` calls of ``fn``: CPU µs per ``per`` items of one call."""
    runs = []
    for _ in range(7):
        t = time.process_time()
        for _ in range(repeat):
            fn()
        runs.append((time.process_time() - t) / repeat / per * 1e6)
    return statistics.median(runs)


def main() -> int:
    layout = Layout.of(100)
    fleet = SimFleet(Scenario.from_dict(scenario(layout, 1)), ports="ephemeral", serve="in-process").start()
    try:
        net, world, endpoints = fleet.network(), fleet.world, fleet.endpoints

        def poll() -> None:
            world.advance(60)
            with http.use_network(net):
                http.run_exchanges(((a, endpoints[a], lambda: llama_telemetry.server_exchange("not-needed", 5.0))
                                    for a in layout.gpus), deadline_s=5.0, max_open=32)

        auth = (("Authorization", "Bearer not-needed"),)

        def bare() -> Any:
            for path in ("/health", "/metrics", "/slots"):
                yield http.Ask(path, auth if path != "/health" else (), 1 << 16)

        def bare_poll() -> None:
            world.advance(60)
            with http.use_network(net):
                http.run_exchanges(((a, endpoints[a], bare) for a in layout.gpus), deadline_s=5.0, max_open=32)

        requests = []
        for alias in layout.gpus:
            parts = urlsplit(endpoints[alias])
            for path in ("/health", "/metrics", "/slots"):
                requests.append((parts.hostname, parts.port, (
                    f"GET {path} HTTP/1.1\r\nHost: {parts.hostname}:{parts.port}\r\nUser-Agent: gpuheal\r\n"
                    "Accept: application/json\r\nAuthorization: Bearer not-needed\r\n\r\n").encode()))

        def answers() -> list[Any]:
            world.advance(60)
            return [net.answer(host, port, request) for host, port, request in requests]

        raws = [got[0] for got in answers()]
        ask = http.Ask("/metrics")
        print(f"one poll's llama-server exchanges, 100 GPUs: {median_cpu(poll, 20, 1) / 1000:.2f} ms CPU")
        print(f"the same requests, parsed by nothing: {median_cpu(bare_poll, 20, 1) / 1000:.2f} ms CPU")
        print(f"the sim's answer: {median_cpu(answers, 20, len(requests)):.2f} µs CPU a request")
        print(f"gpuheal's framing: {median_cpu(lambda: [http._framed(r, ask, 0.0) for r in raws], 20, len(raws)):.2f}"
              " µs CPU an answer")
        print(f"World.gpu_data, 100 GPUs: {median_cpu(world.gpu_data, 100, 1) / 1000:.3f} ms CPU")
    finally:
        fleet.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
