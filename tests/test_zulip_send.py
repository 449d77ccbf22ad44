"""The official Zulip client against the suite's Zulip look-alike (issue 21 point 7): the design
card pipes ``gpuheal report --weekly`` into Zulip's own ``zulip-send`` (PyPI's ``zulip`` package,
a test dependency). The look-alike answers ``GET /api/v1/server_settings`` as Zulip does (the
client asks it first), and the weekly report of a 1,000-GPU fleet arrives whole: within 10,000
characters, so Zulip would not cut it. Loopback only: the zuliprc names http://127.0.0.1:PORT."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from gpuheal.sim.zulip import DEFAULT_EMAIL, DEFAULT_KEY, MAX_MESSAGE_LENGTH, ZulipLookalike

try:
    from tests.test_weekly_size import NOW, bench_for
    from tests.zulip_server import seed
except ImportError:
    from test_weekly_size import NOW, bench_for
    from zulip_server import seed

from gpuheal.state import files

BIN = Path(sys.executable).parent


def zulip_send() -> str:
    found = BIN / "zulip-send"
    if not found.exists():
        found = Path(shutil.which("zulip-send") or "")
    if not found.name:
        pytest.skip("zulip-send not installed (pip install -e '.[test]': the zulip package)")
    return str(found)


def zuliprc(tmp_path: Path, url: str) -> Path:
    assert url.startswith("http://127.0.0.1:")
    rc = tmp_path / "zuliprc"
    rc.write_text(f"[api]\nemail={DEFAULT_EMAIL}\nkey={DEFAULT_KEY}\nsite={url}\n")
    rc.chmod(0o600)
    return rc


def test_server_settings_answers_as_zulip_does():
    """Unauthenticated, the fields the official client reads (zulip_version, zulip_feature_level)."""
    import zulip

    with ZulipLookalike() as srv:
        with urllib.request.urlopen(srv.url + "/api/v1/server_settings", timeout=5) as resp:  # noqa: S310 (loopback)
            doc = json.load(resp)
        client = zulip.Client(email=DEFAULT_EMAIL, api_key=DEFAULT_KEY, site=srv.url)
        official = client.get_server_settings()
    assert doc["result"] == "success" and doc == official
    assert isinstance(doc["zulip_version"], str) and isinstance(doc["zulip_feature_level"], int)
    assert doc["realm_url"] == srv.url and "authentication_methods" in doc


def test_zulip_send_delivers_the_weekly_report_whole(tmp_path):
    n = 1000
    state = tmp_path / "state"
    seed(state, files.BENCH, bench_for(n))
    gpus = [{"alias": f"gpu-{i:04d}", "host": f"node{i:04d}", "endpoint": "http://127.0.0.1:9"} for i in range(n)]
    cfg = tmp_path / "gpuheal.yaml"
    cfg.write_text(yaml.safe_dump({"gpus": gpus}))
    env = {"PATH": str(BIN), "GPUHEAL_NOW": NOW.isoformat(), "HOME": str(tmp_path)}
    report = subprocess.run(
        [str(BIN / "gpuheal"), "--config", str(cfg), "--state-dir", str(state), "report", "--weekly"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )
    assert report.returncode == 0, report.stderr
    text = report.stdout
    assert "GPUs steady (±5 %)" in text and len(text) <= MAX_MESSAGE_LENGTH
    with ZulipLookalike() as srv:
        sent = subprocess.run(
            [zulip_send(), "--config-file", str(zuliprc(tmp_path, srv.url)), "--stream", "agent-hub",
             "--subject", "weekly-gpu"],
            input=text, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
        )
        paths = [r["path"] for r in srv.requests]
        messages = list(srv.messages)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert len(messages) == 1
    assert messages[0]["content"] == text.strip() and messages[0]["topic"] == "weekly-gpu"
    assert messages[0]["to"] == "agent-hub" and paths == ["/api/v1/messages"]
