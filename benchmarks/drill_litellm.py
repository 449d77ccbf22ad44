"""The drill's real LiteLLM in front (issue 28, item 5): ``benchmarks/drill.py --litellm``.

The proxy is the suite's pinned LiteLLM 1.108.7 (installed once per machine by
``scripts/install-litellm.sh`` into ~/.cache/gpuheal; the drill never installs it, it asks
``--check`` and says what to run), started the way the real-LiteLLM tier starts it
(``tests/litellm_proxy.py``: config.yaml, no database, offline cost map, 127.0.0.1). Each faulted
server shares a model group with a healthy twin; the busy server and the controls are groups of
their own. Every deployment's ``model_info.id`` is its server's name, which is the GPU's alias and
``litellm_model_id`` in gpuheal's config, so gpuheal's shed/redirect path can act on it (through
``/model/update``: a config-file proxy refuses it, and gpuheal says so).

A user's request is a 4-token text completion (``POST /v1/completions``, ``model`` = the group) with
the master key; ok = HTTP 200 with ``choices``.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from drill_report import group_of  # noqa: E402

# LiteLLM's own defaults for routing around a failing deployment, but a per-deployment timeout under
# the prober's 10 s, so a hung deployment's request fails over instead of hanging the client out:
ROUTER_SETTINGS: dict[str, Any] = {"timeout": 8}


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


def start(workdir: Path, ports: dict[str, int], api_key: str, router_settings: dict[str, Any]):
    """The real proxy in front of the fleet; returns tests/litellm_proxy.py's ``LiteLLMProxy``."""
    from litellm_proxy import start_proxy

    return start_proxy(litellm_path(), workdir, model_list(ports, api_key), router_settings=router_settings)


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
