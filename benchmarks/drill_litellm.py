"""The drill's real LiteLLM in front (issue 28, item 5): ``benchmarks/drill.py --litellm``.

The proxy is the suite's pinned LiteLLM 1.108.7 (installed once per machine by
``scripts/install-litellm.sh`` into ~/.cache/gpuheal; the drill never installs it, it asks
``--check`` and says what to run), started the way the real-LiteLLM tier starts it
(``tests/litellm_proxy.py``: config.yaml, no database, offline cost map, 127.0.0.1). Each faulted
server shares a model group with a healthy twin; the busy server and the controls are groups of
their own. Every deployment's ``model_info.id`` is its server's name.

Drain first goes through the proxy the way it works without a database (``/model/update`` is refused
there: "No DB Connected"): the proxy is started, and restarted, by ``tests/restart_litellm.py`` (as
``docker restart litellm`` would), and gpuheal's config names its ``config.yaml``
(``litellm.config_file``) and that launcher (``litellm.restart_command``), as the real-LiteLLM tier's
``tests/reallitellm/test_drain_real.py`` does. At a hard fault's first bad poll gpuheal takes the
server's deployment out of the file, restarts the proxy and reads ``/v1/model/info`` back.

A user's request is a 4-token text completion (``POST /v1/completions``, ``model`` = the group) with
the master key; ok = HTTP 200 with ``choices``.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from drill_report import group_of  # noqa: E402
from drill_supervisor import wait_ok  # noqa: E402

# LiteLLM's own defaults for routing around a failing deployment, but a per-deployment timeout under
# the prober's 10 s, so a hung deployment's request fails over instead of hanging the client out:
ROUTER_SETTINGS: dict[str, Any] = {"timeout": 8}
LAUNCHER = ROOT / "tests" / "restart_litellm.py"
READY_S = 150.0  # a cold start of the proxy on a loaded 2-CPU machine takes 20-60 s
ENV_KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")  # the proxy's environment: nothing else of the drill's


@dataclass(frozen=True)
class Proxy:
    """The running proxy and how to restart it (``restart_command``) or stop it."""

    url: str
    master_key: str
    config_file: Path
    launcher_state: Path
    pidfile: Path
    log_path: Path

    @property
    def restart_command(self) -> list[str]:
        """What gpuheal runs after rewriting ``config_file`` (``litellm.restart_command``)."""
        return [sys.executable, str(LAUNCHER), str(self.launcher_state)]

    def stop(self) -> None:
        subprocess.run([sys.executable, str(LAUNCHER), "--stop", str(self.pidfile)], timeout=60)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def litellm_path() -> str:
    """The installed proxy's executable; never installs (one install per machine, by its script)."""
    check = subprocess.run(["bash", str(ROOT / "scripts" / "install-litellm.sh"), "--check"], capture_output=True,
                           text=True)
    if check.returncode != 0 or not check.stdout.strip():
        raise SystemExit("drill --litellm: the real LiteLLM is not installed here; run scripts/install-litellm.sh "
                         "(once per machine), then the drill")
    return check.stdout.strip().splitlines()[-1]


def model_list(ports: dict[str, int], api_key: str) -> list[dict[str, Any]]:
    """One deployment per server: the twins in their faulted server's group."""
    from litellm_proxy import deployment

    return [deployment(group_of(name), name, f"http://127.0.0.1:{port}/v1", api_key=api_key)
            for name, port in ports.items()]


def start(workdir: Path, ports: dict[str, int], api_key: str, router_settings: dict[str, Any]) -> Proxy:
    """The real proxy in front of the fleet, started by the launcher gpuheal restarts it with."""
    import yaml
    from litellm_proxy import HOST, MASTER_KEY, free_port

    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yaml"
    doc = {"model_list": model_list(ports, api_key), "general_settings": {"master_key": MASTER_KEY},
           "router_settings": router_settings}
    config.write_text("# the drill's LiteLLM config: gpuheal's drain first rewrites it\n"
                      + yaml.safe_dump(doc, sort_keys=False))
    port = free_port()
    env = {k: os.environ[k] for k in ENV_KEPT if k in os.environ}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR", NO_DOCS="True", DISABLE_ADMIN_UI="True")
    proxy = Proxy(f"http://{HOST}:{port}", MASTER_KEY, config, workdir / "launcher.json", workdir / "litellm.pid",
                  workdir / "litellm.log")
    proxy.launcher_state.write_text(json.dumps({
        "argv": [litellm_path(), "--config", str(config), "--host", HOST, "--port", str(port), "--num_workers", "1"],
        "env": env, "cwd": str(workdir), "log": str(proxy.log_path), "pidfile": str(proxy.pidfile)}))
    subprocess.run(proxy.restart_command, check=True, timeout=60)
    if not wait_alive(proxy.url, READY_S):
        proxy.stop()
        raise RuntimeError(f"litellm not ready within {READY_S:g} s:\n{proxy.log_tail()}")
    return proxy


def wait_alive(url: str, within_s: float) -> bool:
    """``GET /health/liveliness`` answers 200 within ``within_s``."""
    return wait_ok(int(url.rsplit(":", 1)[1]), "/health/liveliness", within_s, 0.5)


def gpuheal_litellm(proxy: Proxy, drain: bool = True) -> dict[str, Any]:
    """gpuheal's ``litellm:`` block: drain first through the config file and the launcher (``drain``), or
    only the proxy's url (``--no-drain``: LiteLLM alone routes around the fault)."""
    block: dict[str, Any] = {"url": proxy.url, "timeout_s": 10}
    if drain:
        block.update(config_file=str(proxy.config_file), restart_command=proxy.restart_command, reload_wait_s=READY_S)
    return block


def post_via_proxy(url: str, master_key: str, group: str, timeout_s: float) -> tuple[bool, str]:
    """One user request through LiteLLM; (ok, error). http.client to 127.0.0.1: never an HTTP proxy."""
    port = int(url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    body = json.dumps({"model": group, "prompt": "The drill says", "max_tokens": 4})
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Authorization": f"Bearer {master_key}",
                                                                     "Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            return False, f"HTTP {resp.status}"
        return ("choices" in json.loads(data)), ""
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return False, type(exc).__name__
    finally:
        conn.close()
