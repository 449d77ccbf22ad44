"""The spec's "Also wakes on gpu-fleet health degradation" against the real Alertmanager: an alert
fired into its API reaches ``gpuheal wake`` through its webhook receiver (bearer token in
``http_config.authorization``), and one ``heal --apply`` cycle runs on the simulated fleet within
seconds, without waiting for cron."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from gpuheal.sim.zulip import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike
from tests.alertmanager import Alertmanager, WakeListener
from tests.lab import Lab, scenario

pytestmark = [pytest.mark.alertmanager, pytest.mark.realserver]

GPUHEAL = str(Path(sys.executable).with_name("gpuheal"))
TOKEN = "am-wake-token-5f0c2a9e"


@pytest.fixture
def hot_lab(tmp_path):
    """gpu-a turns 88 °C; the first cron run saw it (onset), the shed is due at the next poll."""
    lab = Lab(
        tmp_path,
        scenario([{"alias": "gpu-a", "host": "ct1", "temp_c": 84}, {"alias": "gpu-b", "host": "ct2"}],
                 [{"at": 30, "gpu": "gpu-a", "set": {"temp_c": 88}}]),  # fmt: skip
    )
    ctl = [sys.executable, "-m", "gpuheal.sim.control", lab.fleet.control_url, "set", "{alias}"]
    lab.gpu_raw("gpu-a")["shed_load_command"] = [*ctl, '{{"temp_c": 78, "util_pct": 30}}']
    lab.gpu_raw("gpu-a")["restore_load_command"] = [*ctl, '{{"util_pct": 50}}']
    lab.write_config()
    lab.heal()  # cron's run: thermal-critical seen
    lab.fleet.advance(60)
    yield lab
    lab.close()


def listener(lab: Lab, token: str | None = TOKEN, extra_env: dict[str, str] | None = None) -> WakeListener:
    env = {**os.environ, "GPUHEAL_NOW": lab.fleet.now().strftime("%Y-%m-%dT%H:%M:%SZ"), "NO_COLOR": "1",
           **(extra_env or {})}  # fmt: skip
    env.pop("GPUHEAL_WAKE_TOKEN", None)
    if token:
        env["GPUHEAL_WAKE_TOKEN"] = token
    argv = [GPUHEAL, "--config", str(lab.config_path), "--state-dir", str(lab.state_dir), "wake"]
    return WakeListener(argv, env, lab.tmp)


def test_an_alert_fired_into_alertmanager_runs_a_heal_cycle_within_seconds(hot_lab, tmp_path, alertmanager_bin):
    wake = listener(hot_lab)
    am = Alertmanager(tmp_path / "am", alertmanager_bin, wake.url, TOKEN).start()
    try:
        assert hot_lab.fleet.state()["gpus"]["gpu-a"]["temp_c"] == 88
        fired = time.monotonic()
        am.fire("GpuFleetDegraded", severity="critical", gpu="gpu-a")
        run = wake.wait_runs(1, timeout_s=30)[0]
        took_s = time.monotonic() - fired
        assert run.returncode == 0 and "202 cycle" in run.stderr and "Traceback" not in run.stderr, run.stderr
        assert hot_lab.fleet.state()["gpus"]["gpu-a"]["temp_c"] == 78  # the woken cycle shed the load
        audit = hot_lab.audit()
        woke = [r for r in audit if r.get("issue") == "wake"]
        assert woke and "GpuFleetDegraded" in woke[0]["detected"]["woken_by"]
        assert any(r.get("action") == "shed-load" and r["gpu"] == "gpu-a" for r in audit)
        assert TOKEN not in json.dumps(audit) and TOKEN not in run.stderr
        deadline = time.monotonic() + 10
        while am.metric("alertmanager_notifications_total") < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert am.metric("alertmanager_notifications_total") >= 1
        assert am.metric("alertmanager_notifications_failed_total") == 0  # it read our 202
        assert took_s < 20, took_s  # group_wait 1 s, then the cycle: seconds, not cron's minute
    finally:
        am.stop()
        wake.close()


def test_the_woken_cycle_delivers_what_it_could_not_fix(hot_lab, tmp_path, alertmanager_bin):
    """The woken cycle is cron's whole minute cycle, heal then escalate: with no way to shed load on
    gpu-a, thermal-critical is escalated at once, and the humans read it seconds after the alert
    fired, not at the next cron minute."""
    for key in ("shed_load_command", "restore_load_command"):
        hot_lab.gpu_raw("gpu-a").pop(key)
    zulip = ZulipLookalike().start()
    hot_lab.raw["zulip"] = {"site": zulip.url, "timeout_s": 3}
    hot_lab.write_config()
    wake = listener(hot_lab, extra_env={"ZULIP_EMAIL": DEFAULT_EMAIL, "ZULIP_API_KEY": DEFAULT_KEY})
    am = Alertmanager(tmp_path / "am", alertmanager_bin, wake.url, TOKEN).start()
    try:
        am.fire("GpuFleetDegraded", severity="critical", gpu="gpu-a")
        run = wake.wait_runs(1, timeout_s=30)[0]
        assert run.returncode == 0 and "alerts sent 1, queued 0" in run.stderr, run.stderr
        titles = [m["content"].splitlines()[0] for m in zulip.messages]
        assert titles == ["⚠ GPU Self-Heal — gpu-a needs attention"], titles
        assert DEFAULT_KEY not in run.stderr
    finally:
        am.stop()
        wake.close()
        zulip.stop()


def test_alertmanager_with_a_wrong_token_gets_401_and_nothing_runs(hot_lab, tmp_path, alertmanager_bin):
    wake = listener(hot_lab)
    am = Alertmanager(tmp_path / "am", alertmanager_bin, wake.url, "not-the-token-at-all").start()
    try:
        am.fire("GpuFleetDegraded", severity="critical")
        run = wake.wait_runs(1, timeout_s=30)[0]
        assert run.returncode == 1 and "401" in run.stderr and "Traceback" not in run.stderr, run.stderr
        deadline = time.monotonic() + 15
        while am.metric("alertmanager_notifications_failed_total") < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert am.metric("alertmanager_notifications_failed_total") >= 1  # Alertmanager saw the refusal
        assert hot_lab.fleet.state()["gpus"]["gpu-a"]["temp_c"] == 88  # nothing ran
        assert not any(r.get("issue") == "wake" for r in hot_lab.audit())
    finally:
        am.stop()
        wake.close()
