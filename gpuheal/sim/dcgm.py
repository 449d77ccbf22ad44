"""A dcgm-exporter look-alike: ``GET /metrics`` in Prometheus text format for N simulated GPUs.

What a real Prometheus scrapes in the test tier and the benchmarks (issue 13), so gpuheal's
Prometheus source is checked against the real engine, not a fake query API. Metric and label names
are dcgm-exporter's (``docs/formats.md`` §6.4, NVIDIA/dcgm-exporter ``default-counters.csv``)::

    # HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
    # TYPE DCGM_FI_DEV_GPU_TEMP gauge
    DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-…",device="nvidia0",modelName="…",Hostname="…"} 44

Values come from a callable (``values() -> [(Hostname, gpu index, {reading: value})]``) read at
each scrape, so a scenario (a VRAM ramp, a hot GPU) or the simulator's :class:`World` plays
through it. A reading that is ``None`` is left out (dcgm-exporter omits fields it cannot read).
Stdlib only; binds loopback only.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# reading → (metric, help, formatter); dcgm-exporter prints integers for these gauges and %f for power
METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("temp_c", "DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "int"),
    ("power_w", "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "float"),
    ("util_pct", "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "int"),
    ("vram_free_mb", "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "int"),
    ("vram_used_mb", "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "int"),
)
MODEL = "NVIDIA GeForce RTX 3090"

Reading = tuple[str, int, dict[str, Any]]


def uuid_of(hostname: str, index: int) -> str:
    h = hashlib.sha1(f"{hostname}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _fmt(value: Any, kind: str) -> str:
    if isinstance(value, str):
        return value  # a scenario may serve a raw token on purpose (NaN, +Inf)
    if kind == "int":
        return str(int(round(float(value))))
    return f"{float(value):.6f}"


def exposition(readings: Iterable[Reading], model: str = MODEL, extra_labels: str = "") -> str:
    """The text dcgm-exporter serves for ``readings``. ``vram_free_mb`` is derived from
    ``vram_total_mb - vram_used_mb`` when only those are given (the simulator's values)."""
    rows = []
    for hostname, index, values in readings:
        v = dict(values)
        if v.get("vram_free_mb") is None and v.get("vram_total_mb") is not None and v.get("vram_used_mb") is not None:
            v["vram_free_mb"] = max(0.0, float(v["vram_total_mb"]) - float(v["vram_used_mb"]))
        labels = (
            f'gpu="{index}",UUID="{uuid_of(hostname, index)}",device="nvidia{index}",'
            f'modelName="{v.get("model", model)}",Hostname="{hostname}"{extra_labels}'
        )
        rows.append((labels, v))
    out: list[str] = []
    for reading, metric, help_text, kind in METRICS:
        out.append(f"# HELP {metric} {help_text}\n# TYPE {metric} gauge\n")
        out.extend(
            f"{metric}{{{labels}}} {_fmt(v[reading], kind)}\n" for labels, v in rows if v.get(reading) is not None
        )
    return "".join(out)


class Exporter:
    """Serves :func:`exposition` of ``source()`` at ``http://127.0.0.1:PORT/metrics``.

    ``source`` may also return the whole body as ``str`` (a hostile exporter, for faults).
    """

    def __init__(self, source: Callable[[], Iterable[Reading] | str], host: str = "127.0.0.1", port: int = 0):
        if not host.startswith("127."):
            raise ValueError("the exporter binds loopback only")
        self.source = source
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                got = exporter.source()
                body = (got if isinstance(got, str) else exposition(got)).encode("utf-8")
                exporter.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:  # the scraper gave up (its timeout, or it is stopping)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}/metrics"
        self.target = f"{host}:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="dcgm-exporter", daemon=True)

    def start(self) -> Exporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Exporter:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def world_readings(world: Any, hosts: dict[str, tuple[str, int]]) -> Callable[[], list[Reading]]:
    """A ``source`` reading the simulator's :class:`~gpuheal.sim.world.World` (its virtual now):
    ``hosts`` maps alias → (Hostname, gpu index). The same values gpu-monitor serves."""

    def source() -> list[Reading]:
        return [(host, index, world.gpu_values(alias)) for alias, (host, index) in hosts.items()]

    return source
