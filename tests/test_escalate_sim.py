"""End to end, as cron runs it: the simulated fleet's incidents (examples/scenarios/incidents.yaml),
``gpuheal heal --apply`` then ``gpuheal escalate`` once a simulated minute, real processes, a
loopback Zulip. Every message carries one of the contract's titles, nothing stays queued, and the
knowledge graph holds one node per audit record."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from gpuheal.clock import format_iso
from gpuheal.sim import Scenario, SimFleet

try:
    from tests.zulip_server import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike
except ImportError:
    from zulip_server import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike

ROOT = Path(__file__).resolve().parent.parent
TITLES = re.compile(
    r"^(🛠 GPU Self-Heal — [a-z0-9.-]+ [a-z-]+ resolved|⚠ GPU Self-Heal — [a-z0-9.-]+ needs attention|✅ GPU Fleet: All Clear)$"
)


def test_simulated_incidents_reach_zulip(tmp_path):
    gpuheal = str(Path(sys.executable).with_name("gpuheal"))
    scn = Scenario.load(str(ROOT / "examples" / "scenarios" / "incidents.yaml"))
    state = tmp_path / "state"
    with SimFleet(scn, host="127.0.0.1", ports="ephemeral") as fleet, ZulipLookalike() as zulip:
        cfg = fleet.config_dict(api_key="not-needed")
        cfg["zulip"] = {"site": zulip.url, "timeout_s": 3}
        # the simulator reloads in reload_s (1 s): a restart that heals is up well within 5 s, one that does
        # not (this scenario's escalations) is judged failed after 5 s, not the production 15 (examples/lab.yaml)
        cfg.setdefault("heal", {})["reload_wait_s"] = 5
        for g in cfg["gpus"]:
            g["transport"] = "local"
            g["restart_command"] = [sys.executable, "-m", "gpuheal.sim.control", fleet.control_url, "restart", "{alias}"]
        cfg_path = tmp_path / "gpuheal.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEAL_", "ZULIP_"))}
        # the in-run confirmation's waits on the simulated clock (steps/confirm.default_clock): the fleet
        # changes only when advanced, so the re-probes see what they would 5 real seconds apart
        env.update(ZULIP_EMAIL=DEFAULT_EMAIL, ZULIP_API_KEY=DEFAULT_KEY, GPUHEAL_CONFIRM_WAIT="simulated")
        for _ in range(6):
            env["GPUHEAL_NOW"] = format_iso(fleet.now())
            base = [gpuheal, "--config", str(cfg_path), "--state-dir", str(state)]
            heal = subprocess.run([*base, "heal", "--apply"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
            assert heal.returncode in (0, 1, 2), heal.stderr
            esc = subprocess.run([*base, "escalate", "--json"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
            assert esc.returncode == 0, esc.stderr
            doc = json.loads(esc.stdout)
            assert doc["queued"] == [] and doc["error"] is None
            fleet.advance(60)
        messages = list(zulip.messages)
    assert messages, "the incidents produced no alert"
    for m in messages:
        assert TITLES.match(m["content"].splitlines()[0]), m["content"]
        assert m["to"] == "agent-hub" and m["topic"] == "alerts-gpu"
        assert "ct8" not in m["content"] and "ct110" not in m["content"] and "ct15" not in m["content"]  # L6
    audit = (state / "gpu-self-heal-log.jsonl").read_text().splitlines()
    nodes = (state / "knowledge-graph.jsonl").read_text().splitlines()
    assert len(nodes) == len(audit)
    assert all(json.loads(n)["name"].startswith("[GPU-SELF-HEAL] gpu-self-heal-") for n in nodes)
