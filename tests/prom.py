"""A real Prometheus on 127.0.0.1 for the test tier and the benchmarks (issue 13).

Debian's ``prometheus`` package (2.42; ``.ci/run`` installs it). Each instance gets its own free
port, config file and TSDB directory under a temp dir, so it never meets a packaged instance that a
system unit may have started. Scrape and evaluation interval: 1 s. Tests wait for real scrapes
(:meth:`PrometheusServer.wait_for`), never for a fixed sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import pytest
import yaml


def wait_ready(server, name: str, timeout_s: float) -> None:
    """Poll ``server.url + "/-/ready"`` (Prometheus and Alertmanager both serve it) until 200; a
    process that exits or never gets ready is stopped and reported with its log's tail."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {server.log_path.read_text('utf-8', 'replace')[-2000:]}")
        try:
            with urllib.request.urlopen(server.url + "/-/ready", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"{name} did not become ready")


def stop_server(server) -> None:
    """Terminate ``server.proc`` (kill it after 10 s) and close its log: Prometheus and Alertmanager alike."""
    if server.proc is not None and server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(10)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(5)
    if getattr(server, "log", None) is not None:
        server.log.close()


def prometheus_binary() -> str | None:
    found = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus")
    if found:
        return found
    return "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    """``prometheus`` scraping ``jobs`` ({job: [host:port, ...]} or {job: {"targets": [...],
    "labels": {...}, "metrics_path": ..., "authorization": ...}}) every ``interval_s``; ``rules``:
    recording rules ({record: expr}) evaluated every ``rule_interval_s`` (default ``interval_s``)."""

    def __init__(
        self,
        workdir: Path,
        jobs: dict,
        interval_s: float = 1.0,
        binary: str | None = None,
        rules: dict[str, str] | None = None,
        rule_interval_s: float | None = None,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.binary = binary or prometheus_binary()
        if self.binary is None:
            raise RuntimeError("prometheus is not installed (Debian: apt-get install prometheus)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        scrape = []
        for job, spec in jobs.items():
            spec = {"targets": spec} if isinstance(spec, list) else dict(spec)
            entry = {
                "job_name": job,
                "scrape_interval": f"{interval_s:g}s",
                "scrape_timeout": f"{interval_s:g}s",
                "static_configs": [{"targets": spec["targets"], "labels": spec.get("labels", {})}],
            }
            for key in ("metrics_path", "authorization", "honor_labels"):
                if key in spec:
                    entry[key] = spec[key]
            scrape.append(entry)
        config = {
            "global": {"scrape_interval": f"{interval_s:g}s", "evaluation_interval": f"{interval_s:g}s"},
            "scrape_configs": scrape,
        }
        if rules:
            group = {"name": "gpuheal", "interval": f"{rule_interval_s or interval_s:g}s",
                     "rules": [{"record": record, "expr": expr} for record, expr in rules.items()]}
            rules_path = self.workdir / "rules.yml"
            rules_path.write_text(yaml.safe_dump({"groups": [group]}))
            config["rule_files"] = [str(rules_path)]
        self.config_path = self.workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = self.workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> PrometheusServer:
        argv = [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=2d",
            "--log.level=warn",
        ]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_ready(self, "prometheus", timeout_s)
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""

    def query(self, promql: str, timeout_s: float = 10.0) -> list[dict]:
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            doc = json.load(resp)
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def wait_for(self, promql: str, predicate=lambda r: bool(r), timeout_s: float = 30.0) -> list[dict]:
        """Poll ``promql`` until ``predicate(result)`` holds (real scrapes, not a sleep)."""
        deadline = time.monotonic() + timeout_s
        result: list[dict] = []
        while time.monotonic() < deadline:
            try:
                result = self.query(promql)
            except OSError:
                result = []
            if predicate(result):
                return result
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {promql!r}; last result {result!r}")

    def wait_samples(self, metric: str, n: int, count: int = 1, timeout_s: float = 30.0) -> None:
        """Until ``count`` series of ``metric`` each hold at least ``n`` samples of the last minute."""
        self.wait_for(
            f"count_over_time({metric}[1m]) >= {n}", lambda r: len(r) >= count, timeout_s=timeout_s
        )

    def stop(self) -> None:
        stop_server(self)

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def scrape_jobs(dcgm_targets: Sequence[str], llama: Sequence[tuple[str, str]] = ()) -> dict:
    """The jobs a test needs: dcgm-exporter targets, and llama-server ``(host:port, api_key)``s."""
    jobs: dict = {"dcgm": list(dcgm_targets)}
    for i, (target, key) in enumerate(llama):
        jobs[f"llama{i}"] = {"targets": [target], "authorization": {"credentials": key}}
    return jobs


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    found = prometheus_binary()
    if found is None:
        if os.environ.get("GPUHEAL_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("prometheus is not installed (apt-get install prometheus)")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    return found


@pytest.fixture
def prom_server(tmp_path, prometheus_bin):
    """A factory: ``prom_server(jobs)`` → a started :class:`PrometheusServer`."""
    started = []

    def make(jobs, interval_s: float = 1.0, rules: dict[str, str] | None = None):
        srv = PrometheusServer(tmp_path / f"prom{len(started)}", jobs, interval_s, prometheus_bin, rules).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()
