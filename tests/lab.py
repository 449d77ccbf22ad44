"""A simulated fleet plus a gpuheal config and state directory, for end-to-end tests.

``Lab`` starts :class:`gpuheal.sim.SimFleet` on ephemeral loopback ports and builds a config whose
restart commands are real local commands (``python -m gpuheal.sim.control ... restart {alias}``).
``lab.poll()`` advances the virtual clock by one cron period and runs one gpuheal step in-process,
opening the state directory afresh each time — one cron run per poll.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gpuheal.config import load_config_dict
from gpuheal.sim import Scenario, SimFleet
from gpuheal.state.store import StateDir

ROOT = Path(__file__).resolve().parent.parent
GPUHEAL = str(Path(sys.executable).with_name("gpuheal"))

BASE_GPU = {
    "vendor": "nvidia",
    "vram_total_mb": 24576,
    "vram_used_mb": 12000,
    "temp_c": 55,
    "util_pct": 50,
    "power_w": 200,
    "power_limit_w": 350,
    "baseline_tok_s": 75.0,
    "requests_60s": 20,
}


def scenario(gpus: list[dict[str, Any]], events: list[dict[str, Any]] | None = None, **top) -> dict[str, Any]:
    return {
        "name": "test",
        "start": "2026-07-18T08:00:00Z",
        "reload_s": 0.3,
        "gpus": [{**BASE_GPU, **g} for g in gpus],
        "events": events or [],
        **top,
    }


class Lab:
    def __init__(self, tmp_path: Path, scn: dict[str, Any], **config_overrides) -> None:
        self.tmp = tmp_path
        self.fleet = SimFleet(Scenario.from_dict(scn), host="127.0.0.1", ports="ephemeral").start()
        self.state_dir = tmp_path / "state"
        raw = self.fleet.config_dict(api_key="not-needed")
        raw["monitor"]["timeout_s"] = 1
        raw["probe"] = {"timeout_s": 1}
        raw["litellm"]["timeout_s"] = 1
        raw["litellm"]["restart_command"] = [sys.executable, "-m", "gpuheal.sim.control", self.fleet.control_url, "restart", "litellm"]
        raw["heal"] = {
            "reload_wait_s": 5,
            "verify_timeout_s": 5,
            "startup_grace_s": 90,
            "command_timeout_s": 10,
            "confirm_budget_s": 0,  # cron polls only; tests of the in-run confirmation (issue 28) turn it on
            "gpu_monitor_restart_command": [sys.executable, "-m", "gpuheal.sim.control", self.fleet.control_url, "restart", "monitor"],
        }
        raw["state"] = {"lock_wait_s": 10}
        raw["bench"] = {"n_predict": 8, "timeout_s": 5}
        _merge(raw, config_overrides)
        self.raw = raw
        self.config_path = tmp_path / "gpuheal.yaml"
        self.write_config()

    def write_config(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.raw))
        self.cfg = load_config_dict(copy.deepcopy(self.raw), path=str(self.config_path))

    def gpu_raw(self, alias: str) -> dict[str, Any]:
        return next(g for g in self.raw["gpus"] if g["alias"] == alias)

    # ------------------------------------------------------------------ running gpuheal
    def heal(self, apply: bool = True, advance_s: float = 60, **filters):
        from gpuheal.steps.heal import Heal

        if advance_s:
            self.fleet.advance(advance_s)
        with StateDir(self.state_dir, 10) as store:
            heal = Heal(self.cfg, store, self.fleet.now(), apply)
            return heal.run(filters.get("gpu"), filters.get("issue"))

    def check(self, advance_s: float = 60):
        from gpuheal.steps import check

        if advance_s:
            self.fleet.advance(advance_s)
        with StateDir(self.state_dir, 10) as store:
            return check.run(self.cfg, store, self.fleet.now()).health

    def cli(self, *args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run the real ``gpuheal`` console script with the virtual clock pinned."""
        full_env = {**os.environ, "GPUHEAL_NOW": self.fleet.now().strftime("%Y-%m-%dT%H:%M:%SZ"), "NO_COLOR": "1", **(env or {})}
        return subprocess.run(
            [GPUHEAL, "--config", str(self.config_path), "--state-dir", str(self.state_dir), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            cwd=str(self.tmp),
        )

    def audit(self) -> list[dict[str, Any]]:
        import json

        path = self.state_dir / "gpu-self-heal-log.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def read(self, name: str) -> Any:
        with StateDir(self.state_dir, 10) as store:
            return store.read(name, {})

    def restarts(self, alias: str) -> int:
        return self.fleet.restart_count(alias)

    def close(self) -> None:
        self.fleet.stop()


def _merge(base: dict, over: dict) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
