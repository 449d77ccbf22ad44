"""Rule 6's "if the host itself is unreachable → infrastructure alert", told apart from a crash whose host's
SSH blips: **two silent SSH looks a cron run apart** (the in-run confirmation's look in the previous run, the
look before the restart in this one) → no restart down that dead connection, the GPU is escalated; one silent
look → restarted as before (issue 29: the chaos week's 4 futile restarts per lost host, 12 per rack; the
reverted escalate-on-one-look, which escalated a crash whose host's SSH blipped at that one moment).

The memory is the rule's own (``rules/host_unreachable/reach.SilentLooks``, its remedy's ``state_file``), time
is an argument, and the runs' clocks here are jittered as cron's are (a start 0.2-1.5 s after the minute, now
and then a couple of seconds late)."""

from __future__ import annotations

import random

import pytest

from gpuheal.actions.execute import run_item
from gpuheal.rules.host_unreachable import reach
from tests.test_execute import FakeRunner, Outcome, ok_verify
from tests.test_rule6_look_first import cfg, unreachable

T0 = 1_780_000_000.0


def _runs(n: int, seed: int) -> list[float]:
    """``n`` cron runs a minute apart, each started with cron's jitter."""
    rnd = random.Random(seed)
    return [T0 + 60 * i + rnd.uniform(0.2, 1.5) + (rnd.choice([0, 0, 0, 2.5])) for i in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_two_silent_looks_a_run_apart_mean_the_host_is_lost(seed):
    first, second = _runs(2, seed)
    looks = reach.SilentLooks().after({"ct8": True}, first)
    assert looks.lost("ct8", second)
    assert not looks.lost("ct9", second)  # another host: never looked at


@pytest.mark.parametrize("seed", range(6))
def test_one_silent_look_is_not_enough(seed):
    (first,) = _runs(1, seed)
    looks = reach.SilentLooks().after({"ct8": True}, first)
    assert not looks.lost("ct8", first)  # the same run's look: one look, not two
    assert not looks.lost("ct8", first + 0.8)
    assert not reach.SilentLooks().lost("ct8", first + 60)  # nothing remembered


def test_a_look_that_answered_between_ends_the_silence():
    a, b, c = _runs(3, 1)
    looks = reach.SilentLooks().after({"ct8": True}, a).after({"ct8": False}, b)
    assert not looks.lost("ct8", c)
    assert looks.to_json() == {}  # nothing left to remember: the file is not even written


def test_silences_long_apart_are_not_one_outage():
    """A blip seen ten minutes ago is not the previous run's look; one missed run (the lock held) still is."""
    assert not reach.SilentLooks().after({"ct8": True}, T0).lost("ct8", T0 + 600)
    assert reach.SilentLooks().after({"ct8": True}, T0).lost("ct8", T0 + 121.3)
    stale = reach.SilentLooks().after({"ct8": True}, T0).after({"ct8": True}, T0 + 600)
    assert not stale.lost("ct8", T0 + 600.4)  # the streak started again at the later look


def test_the_streak_is_not_restarted_by_a_second_look_in_the_same_run():
    """Another GPU of the host asked in this run too: the previous run's silent look still counts."""
    a, b = _runs(2, 2)
    looks = reach.SilentLooks().after({"ct8": True}, a).after({"ct8": True}, b)
    assert looks.lost("ct8", b)


def test_a_clock_stepped_back_is_never_two_looks():
    looks = reach.SilentLooks().after({"ct8": True}, T0)
    assert not looks.lost("ct8", T0 - 60)
    assert not looks.after({"ct8": True}, T0 - 60).lost("ct8", T0 - 59)


def test_the_record_round_trips_and_survives_junk():
    looks = reach.SilentLooks().after({"ct8": True, "ct9": True, "ct7": False}, T0)
    assert reach.SilentLooks.from_json(looks.to_json()) == looks
    for junk in (None, [], "x", {"ct8": "soon"}, {"ct8": {"since_s": "nan"}}, {"ct8": {"since_s": 1.0}}):
        assert reach.SilentLooks.from_json(junk).lost("ct8", T0) is False


@pytest.mark.parametrize("error", ["timeout", "refused"])
def test_a_host_silent_in_the_previous_run_too_is_escalated_with_no_restart_sent(error):
    c = cfg()
    now = T0 + 61.2
    record = reach.SilentLooks().after({"ct8": True}, T0).to_json()
    runner = FakeRunner({"systemctl": Outcome(rc=None, error=error)})
    ex = run_item(unreachable(c), c, runner, ok_verify, (), record=record, now_s=now)
    sent = [argv for _, argv in runner.calls]
    assert ["systemctl", "is-active", "llama-server"] in sent
    assert not [a for a in sent if "restart" in a or "start" in a]
    assert ex.result == "escalated" and "infrastructure" in ex.escalate_reason and error in ex.escalate_reason
    assert ex.evidence["process"]["ran"] == "none" and ex.found["process"].endswith("not restarted")


@pytest.mark.parametrize(
    ("record", "outcome"),
    [({}, Outcome(rc=None, error="timeout")),  # one silent look (a crash whose host's SSH blips now): as before
     (reach.SilentLooks().after({"ct8": True}, T0).to_json(), Outcome(rc=0, stdout="active\n")),  # it answers now
     (reach.SilentLooks().after({"ct8": True}, T0).to_json(), Outcome(rc=None, error="timeout", timed_out=True)),
     (reach.SilentLooks().after({"ct8": True}, T0).to_json(), Outcome(rc=None, error="host key unknown")),
     (reach.SilentLooks().after({"ct9": True}, T0).to_json(), Outcome(rc=None, error="timeout"))],
)  # fmt: skip
def test_otherwise_the_restart_goes_out_as_before(record, outcome):
    c = cfg()
    runner = FakeRunner({"is-active": outcome})
    ex = run_item(unreachable(c), c, runner, ok_verify, (), record=record, now_s=T0 + 60.7)
    assert ["systemctl", "restart", "llama-server"] in [argv for _, argv in runner.calls]
    assert ex.evidence["process"]["ran"] == "restart"


def test_a_look_that_answers_before_a_restart_ends_the_remembered_silence():
    from gpuheal.actions.context import Records

    c = cfg()
    records = Records(None, {}, {"host-unreachable": reach.SilentLooks().after({"ct8": True}, T0).to_json()})
    runner = FakeRunner({"is-active": Outcome(rc=0, stdout="active\n")})
    ex = run_item(unreachable(c), c, runner, ok_verify, (), now_s=T0 + 60.7, records=records)
    assert ex.evidence["process"]["state"] == "running"
    assert records.get("host-unreachable") == {}  # the next run's silent look is one look again
