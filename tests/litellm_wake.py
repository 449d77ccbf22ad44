"""The real LiteLLM 1.108.7 alerting ``gpuheal wake`` (issue 28 item 3), for the real-LiteLLM tier and
``benchmarks/wake_litellm.py``.

What runs, all on 127.0.0.1:

* a simulated fleet (gpu-monitor and llama-server look-alikes, its clock on real time) of two GPUs,
  each the only deployment of its model group (``dense``, ``solo``), so a failed request is not
  retried elsewhere and LiteLLM alerts on it;
* the real proxy in front of them with ``general_settings.alerting: ["slack"]`` and
  ``SLACK_WEBHOOK_URL=http://127.0.0.1:PORT/wake/TOKEN`` (formats.md §4.x);
* :class:`TimedWakeListener` on PORT: what systemd's ``Accept=yes`` does for
  ``cron/gpuheal-wake.socket`` — one ``gpuheal wake`` per connection, the connection as its stdin and
  stdout — stamping when each connection came, when the process said a cycle started, and when it
  ended (the cycle done).

A run (:meth:`WakeRig.fail_once`) closes one llama-server's port (connection refused, as a killed
server), sends a chat completion through the proxy every 2 s, and measures from the first one that
failed to the woken ``heal --apply`` cycle.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

from gpuheal.sim import Scenario, SimFleet
from tests.lab import BASE_GPU
from tests.litellm_proxy import MASTER_KEY, LiteLLMProxy, deployment, start_proxy

GPUHEAL = str(Path(sys.executable).with_name("gpuheal"))
TOKEN = "5f0c2a9e7d41b3c8a6e2f1d09b7c4e3a"  # hex: it travels in a URL
# the user's prompt: never kept; and its lines cannot pass for the alert's own (formats.md §4.x)
PROMPT = "wake-bench private prompt 7c1e\nAPI Base: `http://127.0.0.1:9/v1`\nmodel_group: `forged`"
GROUPS = {"gpu-dense": "dense", "gpu-solo": "solo"}
ALERTING = {"alerting": ["slack"], "alerting_threshold": 15,
            "alerting_args": {"outage_alert_ttl": 60, "minor_outage_alert_threshold": 2,
                              "major_outage_alert_threshold": 4}}  # fmt: skip


@dataclass
class WakeRun:
    """One ``gpuheal wake`` process: monotonic stamps, its exit status and its stderr."""

    accepted_s: float
    started_s: float | None = None  # the line "... cycle: heal cycle started"
    ended_s: float | None = None
    returncode: int | None = None
    stderr: list[str] = field(default_factory=list)

    @property
    def cycled(self) -> bool:
        return self.started_s is not None


class TimedWakeListener:
    """127.0.0.1:port; each connection runs ``argv`` (changeable between runs) with the socket as
    fds 0 and 1, its stderr read line by line as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.runs: list[WakeRun] = []
        self.lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            run = WakeRun(time.monotonic())
            with self.lock:
                self.runs.append(run)
            t = threading.Thread(target=self._serve, args=(conn, run, list(self.argv)), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket, run: WakeRun, argv: list[str]) -> None:
        with conn:
            proc = subprocess.Popen(argv, stdin=conn, stdout=conn, stderr=subprocess.PIPE, text=True, env=self.env,
                                    cwd=self.cwd)  # fmt: skip
        assert proc.stderr is not None
        for line in proc.stderr:
            run.stderr.append(line.rstrip("\n"))
            if " cycle: heal cycle started" in line and run.started_s is None:
                run.started_s = time.monotonic()
        run.returncode = proc.wait(timeout=300)
        run.ended_s = time.monotonic()

    def since(self, t0: float) -> list[WakeRun]:
        with self.lock:
            return [r for r in self.runs if r.accepted_s >= t0]

    def close(self) -> None:
        self.sock.close()
        for t in self._threads:
            t.join(120)


@dataclass
class Measured:
    """Seconds from the first failed request's start (the user sent it): to its ``500`` (LiteLLM's own
    retries come first), to LiteLLM's first alert reaching gpuheal, to the woken cycle's start, to
    its end. ``runs``: every wake process of the window."""

    answered_s: float
    alert_s: float
    cycle_started_s: float
    cycle_done_s: float
    failed_requests: int
    runs: list[WakeRun]
    state_dir: Path


class WakeRig:
    def __init__(self, litellm_bin: str, workdir: Path, flush_interval_s: int | None = None) -> None:
        """``flush_interval_s``: LiteLLM's ``DEFAULT_FLUSH_INTERVAL_SECONDS`` (its alerts are queued
        and sent every 5 s by default), unset when ``None``."""
        self.workdir = workdir
        start = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        gpus = [{**BASE_GPU, "alias": a, "host": f"ct{i + 8}", "litellm_group": g} for i, (a, g) in enumerate(GROUPS.items())]
        scn = {"name": "wake-litellm", "start": start, "reload_s": 0.3, "gpus": gpus}
        self.fleet = SimFleet(Scenario.from_dict(scn), ports="ephemeral", realtime_speed=1.0).start()
        self.listener: TimedWakeListener | None = None
        self.proxy: LiteLLMProxy | None = None
        try:
            self.listener = TimedWakeListener([], self._env(), workdir)
            models = [deployment(g, a, self.fleet.endpoints[a] + "/v1") for a, g in GROUPS.items()]
            hook = f"http://127.0.0.1:{self.listener.port}/wake/{TOKEN}"
            env = {"SLACK_WEBHOOK_URL": hook}
            if flush_interval_s is not None:
                env["DEFAULT_FLUSH_INTERVAL_SECONDS"] = str(flush_interval_s)
            self.proxy = start_proxy(litellm_bin, workdir / "litellm", models, general_settings=ALERTING,
                                     extra_env=env)  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
        return {**keep, "NO_COLOR": "1", "GPUHEAL_WAKE_TOKEN": TOKEN, "LITELLM_MASTER_KEY": MASTER_KEY}

    def write_config(self, state_dir: Path) -> Path:
        assert self.proxy is not None
        raw = self.fleet.config_dict()
        raw["litellm"].update({"url": self.proxy.url, "timeout_s": 5})
        raw["monitor"]["timeout_s"] = 2
        raw["probe"] = {"timeout_s": 2}
        for g in raw["gpus"]:
            g["litellm_model_id"] = g["alias"]
        path = state_dir.parent / (state_dir.name + ".yaml")
        path.write_text(yaml.safe_dump(raw))
        return path

    def chat(self, alias: str, timeout_s: float = 30.0) -> int:
        """One chat completion through the proxy to ``alias``'s model group: its HTTP status."""
        assert self.proxy is not None
        body = json.dumps({"model": GROUPS[alias], "messages": [{"role": "user", "content": PROMPT}],
                           "max_tokens": 4}).encode()  # fmt: skip
        req = urllib.request.Request(self.proxy.url + "/v1/chat/completions", data=body, method="POST",
                                     headers={"Authorization": f"Bearer {MASTER_KEY}",
                                              "Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, TimeoutError, OSError):
            return 0

    def fail_once(self, alias: str, state_dir: Path, timeout_s: float = 60.0) -> Measured:
        """Close ``alias``'s port, send a request every 2 s, and wait for a woken cycle to end."""
        assert self.listener is not None
        state_dir.mkdir(parents=True, exist_ok=True)
        config = self.write_config(state_dir)
        self.listener.argv = [GPUHEAL, "--config", str(config), "--state-dir", str(state_dir), "wake"]
        assert self.chat(alias) == 200, "the deployment serves before the fault"
        self.fleet.apply({"gpu": alias, "fault": "dead", "heals_on_restart": True})
        window_s = time.monotonic()
        first_failed_s, failed = None, 0
        deadline = window_s + timeout_s
        while time.monotonic() < deadline:
            sent_s = time.monotonic()
            if self.chat(alias, timeout_s=20) != 200:
                failed += 1
                if first_failed_s is None:
                    first_failed_s, answered_s = sent_s, time.monotonic() - sent_s
            done = [r for r in self.listener.since(window_s) if r.cycled and r.ended_s is not None]
            if done:
                break
            time.sleep(max(0.0, 2.0 - (time.monotonic() - sent_s)))
        runs = self.listener.since(window_s)
        woken = [r for r in runs if r.cycled]
        assert first_failed_s is not None, "no request failed"
        assert woken and woken[0].ended_s is not None, f"no woken cycle within {timeout_s:g} s: {runs}"
        self.fleet.apply({"gpu": alias, "fault": "none"})
        self.first_failed_s = first_failed_s
        cycle = woken[0]
        return Measured(answered_s, runs[0].accepted_s - first_failed_s, cycle.started_s - first_failed_s,  # type: ignore[operator]
                        cycle.ended_s - first_failed_s, failed, runs, state_dir)  # fmt: skip

    def settle(self, alias: str, timeout_s: float = 60.0, quiet_s: float = 8.0) -> None:
        """Wait until the proxy serves ``alias`` again (after its fault is cleared) and has sent no
        alert for ``quiet_s`` (more than its flush interval): a late alert of this fault must not
        wake the next run's state directory before its own fault (it would book a cycle there, and
        the next fault's alerts would rightly be answered 429 within ``wake.min_interval_s``)."""
        assert self.listener is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.chat(alias, timeout_s=10) != 200:
            time.sleep(1)
        while time.monotonic() < deadline:
            with self.listener.lock:
                last_s = max((r.accepted_s for r in self.listener.runs), default=0.0)
            if time.monotonic() - last_s >= quiet_s:
                return
            time.sleep(0.5)

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self.listener is not None:
            self.listener.close()
        self.fleet.stop()


def summary(measured: list[Measured]) -> dict[str, object]:
    def stats(values: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(values), 2), "worst": round(max(values), 2)}

    return {
        "runs": len(measured),
        "answered_s": stats([m.answered_s for m in measured]),
        "alert_s": stats([m.alert_s for m in measured]),
        "cycle_started_s": stats([m.cycle_started_s for m in measured]),
        "cycle_done_s": stats([m.cycle_done_s for m in measured]),
        "each": [{"answered_s": round(m.answered_s, 2), "alert_s": round(m.alert_s, 2), "cycle_started_s": round(m.cycle_started_s, 2),
                  "cycle_done_s": round(m.cycle_done_s, 2), "failed_requests": m.failed_requests,
                  "wake_processes": len(m.runs)} for m in measured],  # fmt: skip
    }
