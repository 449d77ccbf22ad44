"""The real LiteLLM proxy on 127.0.0.1 for the test suite: no look-alike where the real one can run.

:func:`litellm_binary` finds (or, unless ``GPUHEAL_SKIP_REALLITELLM=1``, installs once per machine
with ``scripts/install-litellm.sh``) the pinned ``litellm[proxy]`` virtualenv. :func:`start_proxy`
writes a ``config.yaml`` with the given ``model_list`` and ``master_key`` and runs
``litellm --config config.yaml --host 127.0.0.1 --port <free>`` with
``LITELLM_LOCAL_MODEL_COST_MAP=True`` (offline: no cost-map download), waiting until
``GET /health/liveliness`` answers. :meth:`LiteLLMProxy.stop` kills and reaps it.

No database: ``litellm[proxy]`` does not ship prisma, so the proxy runs the way most fleets run it
(models in ``config.yaml``). The database-backed behaviour (updates that work) is the look-alike's
``litellm_database`` mode, whose answers are compared to this proxy's in
``tests/reallitellm/test_lookalike_matches.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install-litellm.sh"
HOST = "127.0.0.1"
MASTER_KEY = "sk-gpuheal-master-0123456789"
READY_TIMEOUT_S = 120.0
SKIP_ENV = "GPUHEAL_SKIP_REALLITELLM"


def litellm_binary() -> tuple[str | None, str]:
    """(path, why-not). Installs when missing unless ``GPUHEAL_SKIP_REALLITELLM=1``."""
    check = subprocess.run(["bash", str(SCRIPT), "--check"], capture_output=True, text=True)
    if check.returncode == 0 and check.stdout.strip():
        return check.stdout.strip().splitlines()[-1], ""
    if os.environ.get(SKIP_ENV) == "1":
        return None, f"the real LiteLLM proxy is not installed and {SKIP_ENV}=1 (run scripts/install-litellm.sh)"
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"scripts/install-litellm.sh failed: {last}"
    return proc.stdout.strip().splitlines()[-1], ""


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def deployment(group: str, model_id: str, api_base: str, **params: Any) -> dict[str, Any]:
    """One ``model_list`` entry in front of an OpenAI-compatible server (llama-server)."""
    return {
        "model_name": group,
        "litellm_params": {"model": f"openai/{model_id}", "api_base": api_base, "api_key": "not-needed", **params},
        "model_info": {"id": model_id},
    }


@dataclass
class LiteLLMProxy:
    url: str
    master_key: str
    proc: subprocess.Popen
    workdir: Path
    started_s: float = 0.0
    log_path: Path = field(default_factory=Path)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass

    stop = kill


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the test process dies, so a pytest killed by a
    timeout (no fixture teardown) leaves no ~350 MB proxy behind (Linux ``PR_SET_PDEATHSIG``)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


def start_proxy(
    binary: str,
    workdir: Path,
    model_list: list[dict[str, Any]],
    master_key: str = MASTER_KEY,
    router_settings: dict[str, Any] | None = None,
    litellm_settings: dict[str, Any] | None = None,
    general_settings: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
) -> LiteLLMProxy:
    """``general_settings`` join the master key (e.g. ``{"alerting": ["slack"]}``); ``extra_env``
    joins the proxy's environment (e.g. ``SLACK_WEBHOOK_URL``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"model_list": model_list,
                              "general_settings": {**(general_settings or {}), "master_key": master_key}}  # fmt: skip
    if router_settings:
        config["router_settings"] = router_settings
    if litellm_settings:  # e.g. {"callbacks": ["prometheus"]}: LiteLLM's own /metrics (issue 20)
        config["litellm_settings"] = litellm_settings
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    log_path = workdir / "litellm.log"
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "NO_DOCS": "True",
        "DISABLE_ADMIN_UI": "True",
    }
    env.pop("DATABASE_URL", None)
    env.pop("LITELLM_MASTER_KEY", None)
    for name in ("SLACK_WEBHOOK_URL", "ALERTING_WEBHOOK_URL"):  # never a webhook of the machine's own
        env.pop(name, None)
    env.update(extra_env or {})
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                "--config",
                str(workdir / "config.yaml"),
                "--host",
                HOST,
                "--port",
                str(port),
                "--num_workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=workdir,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    proxy = LiteLLMProxy(f"http://{HOST}:{port}", master_key, proc, workdir, log_path=log_path)
    from gpuheal.sources.http import request

    deadline = started + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"litellm exited with {proc.returncode} before it was ready:\n{proxy.log_tail()}")
        r = request("GET", proxy.url + "/health/liveliness", deadline_s=2)
        if getattr(r, "status", None) == 200:
            proxy.started_s = time.monotonic() - started
            return proxy
        time.sleep(0.25)
    proxy.kill()
    raise RuntimeError(f"litellm not ready within {READY_TIMEOUT_S:g} s:\n{proxy.log_tail()}")
