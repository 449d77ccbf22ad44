"""No secret ever appears in an alert, a report, the knowledge graph, the state, the metrics file,
stdout or stderr (contract "Alerts"; spec L1, L4).

Distinctive secret values go into the environment (the Zulip key, the LiteLLM key, any
``*_TOKEN``) and the config (``litellm.api_key``); ``escalate``, ``report``, ``report --weekly``
and ``--metrics-file`` run as cron runs them (real subprocesses) against a loopback Zulip; then
every file in the state directory, every message Zulip received, and every byte of stdout and
stderr is searched for each secret. A second test plants the secrets in queued alerts and in the
audit trail (as if an upstream step had leaked them) and checks that nothing gpuheal *sends or
writes* carries them on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import yaml

from gpuheal.state import files

try:
    from tests.zulip_server import (
        DEFAULT_EMAIL,
        ZulipLookalike,
        alert,
        config_dict,
        health_doc,
        seed,
        simulated_week,
    )
except ImportError:
    from zulip_server import (
        DEFAULT_EMAIL,
        ZulipLookalike,
        alert,
        config_dict,
        health_doc,
        seed,
        simulated_week,
    )

ZULIP_KEY = "zk-SECRET-7f3a9c2e51d0"
LITELLM_KEY = "sk-litellm-SECRET-5d8e1b77"
ENV_TOKEN = "tok-SECRET-a1b2c3d4e5"
SECRETS = (ZULIP_KEY, LITELLM_KEY, ENV_TOKEN)
NOW = "2026-07-18T08:00:00Z"


def gpuheal(tmp_path, state, site, *args, key=ZULIP_KEY):
    cfg = tmp_path / "gpuheal.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(site, litellm={"api_key": LITELLM_KEY})))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEAL_", "ZULIP_"))}
    env.update(GPUHEAL_NOW=NOW, ZULIP_EMAIL=DEFAULT_EMAIL, ZULIP_API_KEY=key, HF_TOKEN=ENV_TOKEN)
    metrics = tmp_path / "gpuheal.prom"
    p = subprocess.run(
        [str(Path(sys.executable).with_name("gpuheal")), "-vv", "--config", str(cfg), "--state-dir", str(state),
         "--metrics-file", str(metrics), *args],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path,
    )
    return p


def assert_clean(label: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{label} contains a secret ({secret[:6]}…)"


def state_files(state: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    out = {}
    for path in sorted(state.rglob("*")):
        if path.is_file() and path.name not in skip:
            out[str(path.relative_to(state))] = path.read_text("utf-8", "replace")
    return out


def test_secrets_from_env_and_config_never_leak(tmp_path):
    state = tmp_path / "state"
    simulated_week(state, datetime(2026, 7, 18, 8, 0, tzinfo=UTC))
    seed(state, files.GPU_HEALTH, health_doc([("gpu-dense", "model-stuck")]), raw=True)
    seed(state, files.ALERTS, {"queue": [alert("gpu-dense", "model-stuck"), alert("gpu-light", "vram-leak", kind="resolved")],
                               "sent": {}, "clean_cycles": 0})
    outputs = []
    with ZulipLookalike(api_key=ZULIP_KEY) as srv:
        srv.mode = "500"
        outputs.append(gpuheal(tmp_path, state, srv.url, "escalate"))
        outputs.append(gpuheal(tmp_path, state, srv.url, "escalate", key="zk-SECRET-wrong-key-0000"))  # a 401
        srv.mode = "ok"
        outputs.append(gpuheal(tmp_path, state, srv.url, "escalate", "--dry-run"))
        outputs.append(gpuheal(tmp_path, state, srv.url, "escalate", "--json"))
        outputs.append(gpuheal(tmp_path, state, srv.url, "report"))
        outputs.append(gpuheal(tmp_path, state, srv.url, "report", "--json"))
        outputs.append(gpuheal(tmp_path, state, srv.url, "report", "--weekly", "--send"))
        outputs.append(gpuheal(tmp_path, state, srv.url, "report", "--weekly", "--json"))
        messages = list(srv.messages)
    assert [p.returncode for p in outputs] == [1, 1, 0, 0, 0, 0, 0, 0], [p.stderr for p in outputs]
    assert len(messages) == 3  # two alerts and the weekly report
    for p in outputs:
        assert_clean(f"stdout of {p.args[-1]}", p.stdout)
        assert_clean(f"stderr of {p.args[-1]}", p.stderr)
        assert "zk-SECRET-wrong-key-0000" not in p.stdout + p.stderr
    for m in messages:
        assert_clean("a Zulip message", m["content"] + m["topic"])
    for name, text in state_files(state).items():
        assert_clean(f"state file {name}", text)
    assert_clean("the metrics file", (tmp_path / "gpuheal.prom").read_text())


def test_secrets_planted_upstream_are_not_carried_on(tmp_path):
    state = tmp_path / "state"
    leaky = {
        "cmdline": f"llama-server -m model.gguf --api-key {LITELLM_KEY} -c 131072",
        "journal": f"curl -H 'Authorization: Bearer {ZULIP_KEY}' http://ct8:8080/health\nHF_TOKEN={ENV_TOKEN}",
    }
    seed(state, files.GPU_HEALTH, health_doc([("gpu-dense", "api-key-mismatch")]), raw=True)
    seed(state, files.ALERTS, {"queue": [alert("gpu-dense", "api-key-mismatch", detected=leaky, summary=f"key {LITELLM_KEY} rejected")],
                               "sent": {}, "clean_cycles": 0})
    (state / files.AUDIT_LOG).write_text(
        '{"run_id":"gpu-self-heal-20260718-001","timestamp":"2026-07-18T07:59:00Z","gpu":"gpu-dense","issue":"api-key-mismatch",'
        f'"detected":{{"key_sent":"{LITELLM_KEY}"}},"action":"alert","result":"escalated","verification":null,"escalated":true,"phase":"outcome"}}\n'
    )
    with ZulipLookalike(api_key=ZULIP_KEY) as srv:
        srv.mode = "500"
        first = gpuheal(tmp_path, state, srv.url, "escalate")
        assert first.returncode == 1
        # even an undelivered alert is stored redacted at rest
        assert_clean("alerts.json after a failed delivery", (state / files.ALERTS).read_text())
        srv.mode = "ok"
        second = gpuheal(tmp_path, state, srv.url, "escalate")
        weekly = gpuheal(tmp_path, state, srv.url, "report", "--weekly")
        messages = list(srv.messages)
    assert second.returncode == 0 and len(messages) == 1
    assert "<redacted>" in messages[0]["content"]
    for p in (first, second, weekly):
        assert_clean("stdout", p.stdout)
        assert_clean("stderr", p.stderr)
    assert_clean("the Zulip message", messages[0]["content"])
    for name, text in state_files(state, skip=(files.AUDIT_LOG,)).items():  # the planted input itself
        assert_clean(f"state file {name}", text)
    assert_clean("the metrics file", (tmp_path / "gpuheal.prom").read_text())
