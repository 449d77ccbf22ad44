"""Confirm within the run (issue 28 item 1; contract "Rule timing"): a ``heal --apply`` run whose poll
sees a hard fault re-probes that GPU and acts once the rule's hold in seconds of evidence is met —
not at cron's 3rd poll. On the simulated fleet (real HTTP, real restart commands) with an injected,
jittered clock whose sleeps take no time; the real llama-server tier is
tests/realserver/test_confirm_real.py."""

from __future__ import annotations

import random

import pytest

from gpuheal.core import confirm as core
from gpuheal.model import GpuSample
from gpuheal.state.store import StateDir
from gpuheal.steps.confirm import Clock
from gpuheal.steps.heal import Heal
from tests.lab import Lab, scenario

GPUS = [{"alias": "gpu-a", "host": "ct1"}, {"alias": "gpu-b", "host": "ct2"}, {"alias": "gpu-c", "host": "ct3"}]
ON = {"heal": {"confirm_budget_s": 30, "confirm_interval_s": 5}}


class FakeClock:
    """Monotonic seconds that move only when slept on, each sleep ``jitter_s`` late at random."""

    def __init__(self, jitter_s: float = 0.0, seed: int = 1) -> None:
        self.t, self.jitter_s, self.rng, self.sleeps = 1000.0, jitter_s, random.Random(seed), []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s + self.rng.uniform(0, self.jitter_s)

    @property
    def clock(self) -> Clock:
        return Clock(self.now, self.sleep)


def heal(lab: Lab, clock: FakeClock, advance_s: float = 60, lock_wait_s: float = 10):
    lab.fleet.advance(advance_s)
    with StateDir(lab.state_dir, lock_wait_s) as store:
        return Heal(lab.cfg, store, lab.fleet.now(), True, clock=clock.clock).run(None, None)


def restart_lines(lab: Lab) -> list[dict]:
    return [r for r in lab.audit() if r.get("action") == "restart-llama-server" and r.get("phase") != "verification"]


@pytest.mark.parametrize("fault,answer", [("dead", "refused"), ("hang", "timeout")])
@pytest.mark.parametrize("jitter_s", [0.0, 1.7])
def test_a_refused_or_frozen_server_is_restarted_in_the_first_run(tmp_path, fault, answer, jitter_s):
    lab = Lab(tmp_path, scenario(GPUS, [{"at": 5, "gpu": "gpu-a", "fault": fault}]), **ON)
    clock = FakeClock(jitter_s)
    try:
        health = heal(lab, clock)
        assert lab.restarts("gpu-a") == 1, health["issues"]
        assert lab.restarts("gpu-b") == lab.restarts("gpu-c") == 0
        acted = restart_lines(lab)
        assert acted and acted[0]["issue"] == "host-unreachable", acted
        probes = acted[0]["detected"]["probes"]
        assert [p["answer"] for p in probes] == [answer] * len(probes) and len(probes) >= 3, probes
        assert acted[0]["detected"]["confirmation"] == "confirmed"
        first, last = core_s(probes[0]["at"]), core_s(probes[-1]["at"])
        assert 20 - 5 / 4 <= last - first <= 20 + 5 + jitter_s, probes  # 20 s of evidence, not a poll more
        assert sum(clock.sleeps) <= 30, clock.sleeps  # within confirm_budget_s
    finally:
        lab.close()


def core_s(text: str) -> float:
    from gpuheal.clock import parse_iso

    return parse_iso(text).timestamp()


def test_nothing_suspicious_never_waits_nor_reprobes(tmp_path):
    lab = Lab(tmp_path, scenario(GPUS), **ON)
    clock = FakeClock()

    def no_probe(*_a):
        raise AssertionError("re-probed a healthy fleet")

    try:
        with StateDir(lab.state_dir, 10) as store:
            lab.fleet.advance(60)
            from gpuheal.steps import check, confirm

            result = check.run(lab.cfg, store, lab.fleet.now())
            assert confirm.run(lab.cfg, store, result, clock.clock, no_probe) is result
        heal(lab, clock)
        assert clock.sleeps == []
    finally:
        lab.close()


def test_a_flapping_server_is_never_restarted_on_mixed_evidence(tmp_path):
    """Refused, answering, refused ...: each answer resets the confirmation; cron polls that land on an
    answer drop the pending issue too, so nothing fires."""
    lab = Lab(tmp_path, scenario(GPUS, [{"at": 5, "gpu": "gpu-a", "fault": "dead"}]), **ON)
    clock = FakeClock(jitter_s=1.3)
    answers = iter(["ok", "refused"] * 50)

    def flapping(cfg, aliases, canary):
        return {a: GpuSample(endpoint=next(answers)) for a in aliases}

    try:
        from gpuheal.steps import check, confirm

        for _ in range(4):
            lab.fleet.advance(60)
            with StateDir(lab.state_dir, 10) as store:
                result = check.run(lab.cfg, store, lab.fleet.now())
                after = confirm.run(lab.cfg, store, result, clock.clock, flapping)
            states = [i.state for i in after.issues if i.issue == "host-unreachable"]
            assert "firing" not in states, after.issues
        assert lab.restarts("gpu-a") == 0
    finally:
        lab.close()


def test_an_answer_between_bad_probes_resets_the_evidence(tmp_path):
    """bad, bad, bad, ok, bad, bad, bad, bad, bad: the evidence starts again after the answer; it is
    met only by 20 s after it, never by the 15 s before it plus what follows."""
    watch = core.GpuWatch("g", core.Watch.WATCHING, (core.Probe(0.0, "refused"),))
    watch = watch.after(core.Seen.BAD_PROBE, core.Probe(5.0, "refused")).after(core.Seen.ANSWERED, core.Probe(10.0, "ok"))
    assert watch.state == core.Watch.RECOVERED
    with pytest.raises(core.BadTransition):
        watch.after(core.Seen.FIRED)


def always_refused(cfg, aliases, canary):
    """A re-probe that keeps seeing the fault, whatever another run did to the server meanwhile."""
    return {a: GpuSample(endpoint="refused") for a in aliases}


class Overlapped(FakeClock):
    """A jittered clock whose first sleep runs ``meanwhile`` (another run, while this one confirms)."""

    def __init__(self, meanwhile, jitter_s: float = 1.7) -> None:
        super().__init__(jitter_s)
        self.meanwhile, self.ran = meanwhile, None

    def sleep(self, s: float) -> None:
        if self.ran is None:
            self.ran = self.meanwhile()
        super().sleep(s)


def test_a_run_that_starts_meanwhile_takes_the_lock_and_nothing_runs_twice(tmp_path):
    """Run A confirms gpu-a without the lock; run B starts between A's probes, takes the lock, confirms and
    restarts gpu-a itself. A's own probes still see the fault and its hold is met, but B held the state
    meanwhile: A acts on nothing. One restart, one attempt."""
    lab = Lab(tmp_path, scenario(GPUS, [{"at": 5, "gpu": "gpu-a", "fault": "dead"}]), **ON)

    def run_b():
        lab.fleet.advance(12)
        with StateDir(lab.state_dir, 0.3) as store:  # old code: StateLockedError (A held it throughout)
            return Heal(lab.cfg, store, lab.fleet.now(), True, clock=FakeClock(1.3, seed=2).clock).run(None, None)

    a_clock = Overlapped(run_b)
    try:
        lab.fleet.advance(60)
        with StateDir(lab.state_dir, 10) as store:
            a = Heal(lab.cfg, store, lab.fleet.now(), True, clock=a_clock.clock, probe=always_refused)
            a.run(None, None)
        assert a_clock.ran is not None and lab.restarts("gpu-a") == 1, a_clock.ran
        assert len(restart_lines(lab)) == 1 and len({r["run_id"] for r in restart_lines(lab)}) == 1
        assert any("acts on nothing" in w for w in a.warnings), a.warnings
        heal(lab, FakeClock(), advance_s=20)  # the next run: the attempt is being verified
        assert lab.restarts("gpu-a") == 1 and len(restart_lines(lab)) == 1
    finally:
        lab.close()


def test_a_run_that_only_reads_the_state_meanwhile_still_makes_the_confirming_run_stand_down(tmp_path):
    """B is an operator's check (it writes the issue book): A's book is no longer the state, so A writes
    nothing and acts on nothing; cron's next run acts, once."""
    lab = Lab(tmp_path, scenario(GPUS, [{"at": 5, "gpu": "gpu-a", "fault": "dead"}]), **ON)
    a_clock = Overlapped(lambda: lab.check(advance_s=10))
    try:
        lab.fleet.advance(60)
        with StateDir(lab.state_dir, 10) as store:
            Heal(lab.cfg, store, lab.fleet.now(), True, clock=a_clock.clock, probe=always_refused).run(None, None)
        assert a_clock.ran is not None and lab.restarts("gpu-a") == 0
        heal(lab, FakeClock(0.9), advance_s=50)
        assert lab.restarts("gpu-a") == 1 and len(restart_lines(lab)) == 1
    finally:
        lab.close()


def test_a_real_second_process_runs_while_the_first_confirms_and_nothing_runs_twice(tmp_path):
    """B is a real ``gpuheal heal --apply`` process started between A's probes (cron's next run behind a slow
    drain, a wake): it does not wait for A, confirms and restarts; A then acts on nothing."""
    lab = Lab(tmp_path, scenario(GPUS, [{"at": 5, "gpu": "gpu-a", "fault": "dead"}]), **ON, state={"lock_wait_s": 0.5})

    def process_b():
        lab.fleet.advance(25)
        return lab.cli("heal", "--apply", "--json", timeout=120)

    a_clock = Overlapped(process_b)
    try:
        lab.fleet.advance(60)
        with StateDir(lab.state_dir, 10) as store:
            a = Heal(lab.cfg, store, lab.fleet.now(), True, clock=a_clock.clock, probe=always_refused)
            a.run(None, None)
        b = a_clock.ran
        assert b.returncode in (0, 1, 2), b.stderr  # not 3: the lock was free while A waited
        assert lab.restarts("gpu-a") == 1 and len(restart_lines(lab)) == 1, b.stdout[-2000:]
        assert any("acts on nothing" in w for w in a.warnings), a.warnings
    finally:
        lab.close()


def test_a_failure_ratio_alone_is_never_reprobed(tmp_path):
    """Soft signals keep their poll holds: failing requests with /health ok start no confirmation."""
    lab = Lab(tmp_path, scenario(GPUS, [{"at": 5, "gpu": "gpu-a", "fault": "failing"}]), **ON)
    clock = FakeClock()
    try:
        health = heal(lab, clock)
        assert clock.sleeps == [] and lab.restarts("gpu-a") == 0, health["issues"]
    finally:
        lab.close()


def test_a_hung_task_loop_is_confirmed_in_the_run(tmp_path):
    lab = Lab(tmp_path, scenario(GPUS, [{"at": 5, "gpu": "gpu-a", "fault": "taskloop-hang"}]), **ON)
    clock = FakeClock(jitter_s=0.9)
    try:
        heal(lab, clock)
        acted = restart_lines(lab)
        assert lab.restarts("gpu-a") == 1 and acted[0]["issue"] == "model-stuck", acted
        probes = acted[0]["detected"]["probes"]
        assert all(p["answer"].startswith("task loop silent") for p in probes), probes
        span_s = core_s(probes[-1]["at"]) - core_s(probes[0]["at"])
        assert 20 - 5 / 4 <= span_s < 30 - 5 / 4, probes  # silent_hold_s of evidence, not the ratio's grace_s
    finally:
        lab.close()


@pytest.mark.parametrize("jitter_s", [0.0, 1.1])
def test_a_confirmed_gpu_is_restarted_without_waiting_for_a_slower_ones_hold(tmp_path, jitter_s):
    """gpu-a refused (host-unreachable: 20 s of evidence) and gpu-b's task loop hung (model-stuck, an
    operator's 30 s ``silent_hold_s``): gpu-a is restarted as soon as its hold is met, while gpu-b is still being confirmed in the same
    run (it waited for gpu-b's hold before: the drill's SIGKILL waited for the frozen task loop). Each is
    restarted once, gpu-b on its own full evidence, all within the one budget."""
    from gpuheal.steps.confirm import real_probe

    faults = [{"at": 5, "gpu": "gpu-a", "fault": "dead"}, {"at": 5, "gpu": "gpu-b", "fault": "taskloop-hang"}]
    gpus = [*GPUS, *({"alias": f"gpu-{c}", "host": f"ct{c}"} for c in "def")]  # 2 of 6 down: within the fleet guard
    lab = Lab(tmp_path, scenario(gpus, faults), **ON, rules={"model-stuck": {"silent_hold_s": 30}})
    clock, seen = FakeClock(jitter_s), []

    def probe(cfg, aliases, canary):
        seen.append((tuple(sorted(aliases)), lab.restarts("gpu-a"), lab.restarts("gpu-b")))
        return real_probe(cfg, aliases, canary)

    try:
        lab.fleet.advance(60)
        with StateDir(lab.state_dir, 10) as store:
            Heal(lab.cfg, store, lab.fleet.now(), True, clock=clock.clock, probe=probe).run(None, None)
        assert lab.restarts("gpu-a") == lab.restarts("gpu-b") == 1 and lab.restarts("gpu-c") == 0, seen
        assert (("gpu-b",), 1, 0) in seen, seen  # gpu-a restarted while gpu-b was still re-probed
        acted = restart_lines(lab)
        assert [(r["gpu"], r["issue"]) for r in acted] == [("gpu-a", "host-unreachable"), ("gpu-b", "model-stuck")]
        b_probes = acted[1]["detected"]["probes"]
        assert core_s(b_probes[-1]["at"]) - core_s(b_probes[0]["at"]) >= 30 - 5 / 4, b_probes  # its own hold
        assert sum(clock.sleeps) <= 30 + 5, clock.sleeps  # one budget for both
        heal(lab, FakeClock(), advance_s=20)  # the next run: both attempts are being verified, none again
        assert lab.restarts("gpu-a") == lab.restarts("gpu-b") == 1 and len(restart_lines(lab)) == 2
    finally:
        lab.close()


@pytest.mark.parametrize("check_s", [6.0, 12.0])
def test_the_poll_s_own_seconds_count_as_evidence(tmp_path, monkeypatch, check_s):
    """The poll asked gpu-a when it began; its check took ``check_s`` more (a hung ``/health`` takes the
    probe deadline). The evidence counts from the asking: the restart comes 20 s after the poll began, not
    20 s after the check ended (one overdue re-probe at once, then the 5 s schedule from the poll)."""
    lab = Lab(tmp_path, scenario(GPUS, [{"at": 5, "gpu": "gpu-a", "fault": "dead"}]), **ON)
    clock, check = FakeClock(), Heal._check

    def slow_check(self, gpu_filter):
        out = check(self, gpu_filter)
        clock.t += check_s
        return out

    monkeypatch.setattr(Heal, "_check", slow_check)
    try:
        heal(lab, clock)
        assert lab.restarts("gpu-a") == 1
        probes = restart_lines(lab)[0]["detected"]["probes"]
        first, last = core_s(probes[0]["at"]), core_s(probes[-1]["at"])
        assert core_s(probes[1]["at"]) - first == pytest.approx(check_s), probes  # the overdue one, at once
        assert last - first == pytest.approx(20.0), probes
        assert sum(clock.sleeps) == pytest.approx(20.0 - check_s), clock.sleeps  # 20 s from the poll, not after
    finally:
        lab.close()


def test_a_run_that_takes_the_lock_between_rounds_makes_the_rest_stand_down_and_nothing_runs_twice(tmp_path):
    """Run A restarts gpu-a (its hold met) and goes on confirming gpu-b without the lock; run B starts then,
    sees gpu-a's attempt being verified (kept before A let go), confirms and restarts gpu-b itself. A takes
    the lock back, finds B held it, and acts on nothing more: one restart each, gpu-a's attempt kept."""
    faults = [{"at": 5, "gpu": "gpu-a", "fault": "dead"}, {"at": 5, "gpu": "gpu-b", "fault": "taskloop-hang"}]
    gpus = [*GPUS, *({"alias": f"gpu-{c}", "host": f"ct{c}"} for c in "def")]
    lab = Lab(tmp_path, scenario(gpus, faults), **ON, rules={"model-stuck": {"silent_hold_s": 30}})

    def run_b():
        lab.fleet.advance(3)
        with StateDir(lab.state_dir, 0.3) as store:
            return Heal(lab.cfg, store, lab.fleet.now(), True, clock=FakeClock(0.8, seed=3).clock).run(None, None)

    class AfterRoundOne(FakeClock):
        ran = None

        def sleep(self, s: float) -> None:
            if self.ran is None and lab.restarts("gpu-a") == 1:
                self.ran = run_b()
            super().sleep(s)

    a_clock = AfterRoundOne(1.2)
    try:
        lab.fleet.advance(60)
        with StateDir(lab.state_dir, 10) as store:
            a = Heal(lab.cfg, store, lab.fleet.now(), True, clock=a_clock.clock)
            a.run(None, None)
        assert a_clock.ran is not None, "B never ran between A's rounds"
        assert lab.restarts("gpu-a") == lab.restarts("gpu-b") == 1, restart_lines(lab)
        assert sorted(r["gpu"] for r in restart_lines(lab)) == ["gpu-a", "gpu-b"]
        assert any("acts on nothing" in w for w in a.warnings), a.warnings
        heal(lab, FakeClock(), advance_s=20)  # the next run: both attempts are being verified, none again
        assert lab.restarts("gpu-a") == lab.restarts("gpu-b") == 1 and len(restart_lines(lab)) == 2
    finally:
        lab.close()


def test_a_silence_is_evidence_until_the_probe_gave_up_a_refusal_only_when_asked(tmp_path):
    """gpu-a's ``/health`` times out (each probe takes the 5 s deadline), gpu-b refuses at once. The
    silence is known when the probe gives up, so gpu-a's evidence runs to each probe's deadline: the
    probe asked at 15 s ends 20 s of silence and gpu-a is restarted then, not after the probe asked at
    20 s gives up at 25 s. gpu-b, probed beside it, is stamped when asked, never at gpu-a's deadline, and
    fires on its own 20 s."""
    gpus = [*GPUS, *({"alias": f"gpu-{c}", "host": f"ct{c}"} for c in "def")]
    lab = Lab(tmp_path, scenario(gpus, [{"at": 5, "gpu": "gpu-a", "fault": "hang"},
                                        {"at": 5, "gpu": "gpu-b", "fault": "dead"}]), **ON)  # fmt: skip
    clock, seen = FakeClock(), []

    def probe(cfg, aliases, canary):
        seen.append((clock.t - 1000.0, tuple(sorted(aliases)), lab.restarts("gpu-a")))
        if "gpu-a" in aliases:
            clock.t += 5.0  # the hung one takes the probe deadline
        return {a: GpuSample(endpoint="timeout" if a == "gpu-a" else "refused") for a in aliases}

    try:
        lab.fleet.advance(60)
        with StateDir(lab.state_dir, 10) as store:
            Heal(lab.cfg, store, lab.fleet.now(), True, clock=clock.clock, probe=probe).run(None, None)
        assert lab.restarts("gpu-a") == lab.restarts("gpu-b") == 1, seen
        assert (20.0, ("gpu-b",), 1) in seen, seen  # gpu-a restarted at 20 s, gpu-b still confirming
        by_gpu = {r["gpu"]: r["detected"]["probes"] for r in restart_lines(lab)}
        a, b = ([core_s(p["at"]) - core_s(ps[0]["at"]) for p in ps] for ps in (by_gpu["gpu-a"], by_gpu["gpu-b"]))
        assert a == [0.0, 10.0, 15.0, 20.0], a  # asked at 5, 10, 15: known at 10, 15, 20
        assert b == [0.0, 5.0, 10.0, 15.0, 20.0], b  # asked and known at once
    finally:
        lab.close()


def test_budget_spent_leaves_the_issue_pending_for_cron(tmp_path):
    lab = Lab(tmp_path, scenario(GPUS, [{"at": 5, "gpu": "gpu-a", "fault": "dead"}]),
              heal={"confirm_budget_s": 10, "confirm_interval_s": 5})
    clock = FakeClock()
    try:
        health = heal(lab, clock)
        assert lab.restarts("gpu-a") == 0 and sum(clock.sleeps) <= 10
        issue = next(i for i in health["issues"] if i["issue"] == "host-unreachable")
        assert issue["state"] == "pending" and issue["detected"]["confirmation"] == "unconfirmed"
        heal(lab, clock)  # the next cron poll: 60 s of evidence over 4 probes -> fires
        assert lab.restarts("gpu-a") == 1
    finally:
        lab.close()


def test_the_engine_counts_evidence_by_time_over_a_minimum_of_probes():
    """``held`` (pure): seconds of evidence meet the hold only with ``min_probes`` set and reached; a
    poll hold is untouched (hold_polls and "more than hold_s")."""
    from gpuheal.core.engine import held
    from gpuheal.rules import host_unreachable as rule

    p = rule.Params(hold_polls=3, hold_s=20.0, min_probes=3, escalate_after_failures=3)
    assert held(rule, p, hits=3, span_s=19.0, tol=1.25)  # 20 s of evidence, a probe 1 s early
    assert not held(rule, p, hits=3, span_s=18.0, tol=1.25)  # not yet
    assert not held(rule, p, hits=2, span_s=60.0, tol=15.0)  # long, but 2 probes (cron's 2nd poll)
    assert held(rule, p, hits=3, span_s=120.0, tol=15.0)  # cron's 3rd poll, as before
    polls_only = rule.Params(hold_polls=3, hold_s=20.0, min_probes=0, escalate_after_failures=3)
    assert not held(rule, polls_only, hits=3, span_s=19.0, tol=1.25)  # "more than 20 s" by polls
    assert not held(rule, polls_only, hits=5, span_s=20.0, tol=0.0)


def test_a_raised_hold_polls_raises_the_probes_too():
    """An operator who sets ``hold_polls: 5`` with the default ``min_probes: 3`` asked for 5 observations:
    the seconds-of-evidence path never fires on fewer probes than the poll hold (it did at the 3rd poll,
    the merge of in-run confirmation and a raised hold, tests/test_signal_gaps.py)."""
    from gpuheal.core.engine import held
    from gpuheal.rules import host_unreachable as rule

    p = rule.Params(hold_polls=5, hold_s=20.0, min_probes=3, escalate_after_failures=3)
    assert not held(rule, p, hits=3, span_s=120.0, tol=15.0)  # cron's 3rd poll: 2 more to go
    assert not held(rule, p, hits=4, span_s=25.0, tol=1.25)  # in-run: 4 probes over 25 s, still short
    assert held(rule, p, hits=5, span_s=25.0, tol=1.25)  # 5 probes over 20 s and more
    assert held(rule, p, hits=5, span_s=240.0, tol=15.0)  # cron's 5th poll


def test_a_confirming_run_parses_the_heal_state_once(tmp_path, monkeypatch):
    """Issue 29: the in-run confirmation reads the restarts off the heal state the run's books parsed, under
    the same lock, instead of reading and parsing ``heal-state.json`` a second time. (A new state directory's
    first run id also reads the counter heal-state.json kept before run-ids.json, once in its life: a fresh
    lab has none, so that reader is left out here.)"""
    from gpuheal.actions import ledger
    from gpuheal.core.heal_state import HealState

    parses: list[object] = []
    real = HealState.from_json.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(HealState, "from_json", classmethod(lambda cls, data: parses.append(data) or real(cls, data)))
    monkeypatch.setattr(ledger, "old_run_counter", lambda store: None)
    lab = Lab(tmp_path, scenario(GPUS, [{"at": 5, "gpu": "gpu-a", "fault": "dead"}]), **ON)
    clock = FakeClock()
    try:
        heal(lab, clock)
        assert clock.sleeps and lab.restarts("gpu-a") == 1, "the run confirmed in-run and acted"
        assert len(parses) == 1, "one parse of heal-state.json a run"
    finally:
        lab.close()
