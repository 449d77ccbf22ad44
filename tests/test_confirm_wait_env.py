"""``GPUHEAL_CONFIRM_WAIT=simulated`` (steps/confirm.default_clock): a ``gpuheal heal`` process on a pinned
clock against a simulated fleet (the demo, the tests that run gpuheal as cron does) counts the in-run
confirmation's waits instead of sleeping them; without it the waits are real seconds."""

from __future__ import annotations

import time

from gpuheal.steps.confirm import Clock, default_clock


def test_without_the_variable_the_confirmation_waits_real_seconds(monkeypatch):
    monkeypatch.delenv("GPUHEAL_CONFIRM_WAIT", raising=False)
    assert default_clock() == Clock(now=time.monotonic, sleep=time.sleep)
    monkeypatch.setenv("GPUHEAL_CONFIRM_WAIT", "yes please")  # only the one word switches it
    assert default_clock() == Clock(now=time.monotonic, sleep=time.sleep)


def test_simulated_waits_are_counted_not_slept(monkeypatch):
    monkeypatch.setenv("GPUHEAL_CONFIRM_WAIT", "simulated")
    clock = default_clock()
    started = time.monotonic()
    assert clock.now() == 0.0
    clock.sleep(5.0)
    clock.sleep(25.0)
    clock.sleep(-3.0)  # a late wake-up never runs the clock back
    assert clock.now() == 30.0
    assert time.monotonic() - started < 5.0
    assert default_clock().now() == 0.0  # each run its own count
