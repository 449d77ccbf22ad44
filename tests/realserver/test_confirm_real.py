"""Confirm within the run on a real llama-server (issue 28 item 1): ONE ``heal --apply`` run (as cron
starts it, real clock for its re-probes) restarts a server killed with SIGKILL (connection refused) or
frozen with SIGSTOP (``/health`` times out), instead of the 3rd cron poll: the run re-probes it every
``heal.confirm_interval_s`` and acts once ``host-unreachable``'s hold in seconds of evidence is met
(``hold_s`` 20 over ``min_probes`` 3). The audit's ``detected`` holds each probe, its time and its
answer. The fixture is Rule 6's (drill supervisor standing in for systemd)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.realserver.test_rule6_start_restart_real import CRON_TIMES, gpuheal, rule6_lines, unit, wait_health  # noqa: F401

pytestmark = pytest.mark.realserver


@pytest.mark.parametrize(("fault", "answer"), [(signal.SIGKILL, "refused"), (signal.SIGSTOP, "timeout")])
def test_one_heal_run_restarts_a_killed_or_frozen_server(unit, tmp_path, fault, answer):  # noqa: F811
    sup, port, config = unit
    raw = json.loads(config.read_text())
    raw["heal"].update({"confirm_budget_s": 30, "confirm_interval_s": 5})
    config.write_text(json.dumps(raw))
    old = sup.pid("llama")
    os.kill(old, fault)
    if fault == signal.SIGKILL:
        sup.services["llama"].proc.wait(10)
    started = time.monotonic()
    doc = gpuheal(tmp_path, config, CRON_TIMES[0])
    took_s = time.monotonic() - started
    assert sup.pid("llama") != old and wait_health(port, 30), sup.verbs
    assert len(sup.verbs) == 1, sup.verbs
    acted = [a for a in doc["actions"] if a["issue"] == "host-unreachable"]
    assert [(a["action"], a["result"]) for a in acted] == [("restart-llama-server", "pending")], doc["issues"]
    intent = [r for r in rule6_lines(tmp_path) if r["phase"] == "intent"]
    probes = intent[0]["detected"]["probes"]
    assert [p["answer"] for p in probes] == [answer] * len(probes) and len(probes) >= 3, probes
    assert intent[0]["detected"]["confirmation"] == "confirmed"
    assert took_s < 60, took_s  # inside the cron minute, restart and its proof included
    print(f"\n{answer}: one run {took_s:.1f} s, {len(probes)} probes")
