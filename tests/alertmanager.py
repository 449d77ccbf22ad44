"""A real Alertmanager on 127.0.0.1 and a socket listener that runs ``gpuheal wake`` per connection
(issue 22 item 7), for the real-Alertmanager tier.

Debian's ``prometheus-alertmanager`` (0.25; ``.ci/run`` installs it). Each instance gets its own
free port, config and storage under a temp dir; clustering is off (``--cluster.listen-address=``),
so nothing listens beyond loopback. :class:`WakeListener` does what systemd's ``Accept=yes`` does
for ``cron/gpuheal-wake.socket``: accept, then start one ``gpuheal wake`` with the connection as its
stdin and stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.prom import free_port, stop_server, wait_ready


def alertmanager_binary() -> str | None:
    for name in ("prometheus-alertmanager", "alertmanager"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    found = alertmanager_binary()
    if found is None:
        why = "prometheus-alertmanager is not installed (apt-get install prometheus-alertmanager)"
        if os.environ.get("GPUHEAL_REQUIRE_ALERTMANAGER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return found


class WakeListener:
    """127.0.0.1:port; each connection runs ``argv`` with the socket as fds 0 and 1 (stderr kept)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/wake"
        self.runs: list[subprocess.CompletedProcess] = []
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            proc = subprocess.run(self.argv, stdin=conn, stdout=conn, stderr=subprocess.PIPE, text=True,
                                  env=self.env, cwd=self.cwd, timeout=120)  # fmt: skip
        self.runs.append(proc)

    def wait_runs(self, n: int, timeout_s: float = 30.0) -> list[subprocess.CompletedProcess]:
        deadline = time.monotonic() + timeout_s
        while len(self.runs) < n and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(self.runs) >= n, f"{len(self.runs)} wake run(s), wanted {n}"
        return self.runs

    def close(self) -> None:
        self.sock.close()
        for t in self._threads:
            t.join(30)


class Alertmanager:
    """``prometheus-alertmanager`` whose only receiver is a webhook to ``webhook_url`` with a bearer
    token in ``http_config.authorization``; group_wait 1 s, so an alert is sent within seconds."""

    def __init__(self, workdir: Path, binary: str, webhook_url: str, token: str) -> None:
        self.workdir, self.binary = Path(workdir), binary
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "route": {"receiver": "gpuheal", "group_by": ["alertname"], "group_wait": "1s",
                      "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "gpuheal", "webhook_configs": [{
                "url": webhook_url, "send_resolved": False,
                "http_config": {"authorization": {"type": "Bearer", "credentials": token}},
            }]}],
        }  # fmt: skip
        self.config_path = self.workdir / "alertmanager.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = self.workdir / "alertmanager.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> Alertmanager:
        argv = [self.binary, f"--config.file={self.config_path}", f"--storage.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address=", "--log.level=warn"]  # fmt: skip
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_ready(self, "alertmanager", timeout_s)
        return self

    def fire(self, alertname: str, **labels: str) -> None:
        """POST /api/v2/alerts, as Prometheus or gpu-monitor's exporter rules would."""
        doc = [{"labels": {"alertname": alertname, **labels}, "annotations": {"summary": "gpu fleet degraded"}}]
        req = urllib.request.Request(self.url + "/api/v2/alerts", data=json.dumps(doc).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")  # fmt: skip
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200

    def metric(self, name: str, integration: str = "webhook") -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{") and f'integration="{integration}"' in line)  # fmt: skip

    def stop(self) -> None:
        stop_server(self)
