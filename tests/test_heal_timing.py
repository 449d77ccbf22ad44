"""Heal-side time counted in polls (issue 9, point 1, the leftovers): a verification window, a GPU's
cool-down before its load comes back, the restarts-per-hour budgets, the startup grace before another
restart, the escalation reminder and the bench startup grace decide at the same poll under a cron-like
clock (starts 0–1.5 s after the minute, now and then a few seconds late) as under whole seconds.

Each test drives one decision poll by poll, with every time involved (when the attempt was made, when
the GPU restarted, when the alert went out) taken at its own jittered poll, and compares the polls at
which the decision changes with the whole-second run. Raw ``now - t < X`` comparisons fail these.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal import benchdata
from gpuheal.core import alerts, verify
from gpuheal.core import plan as planner
from gpuheal.core.bench import exclusion_reason
from gpuheal.core.engine import new_book
from gpuheal.core.heal_state import HealState, Mitigation
from gpuheal.core.issue import Issue
from gpuheal.core.plan import empty_state
from gpuheal.core.view import FleetView, Restarts
from gpuheal.rules import ALL, REMEDIES
from gpuheal.rules.benchmark_regression.monitor import ingest
from gpuheal.state.history import History

plan = partial(planner.plan, remedies=REMEDIES)  # every rule's remedy, as heal plans

try:
    from tests.series import fleet_config, fleet_trace
    from tests.test_plan import cfg, issue, only
    from tests.test_verify import attempt
except ImportError:
    from series import fleet_config, fleet_trace
    from test_plan import cfg, issue, only
    from test_verify import attempt

T0 = 1_800_000_000.0  # on the minute
WHOLE = [0.0] * 80
# start offsets of cron (0.2–1.5 s), a poll 2 s late, one 3.5 s late
OFFSETS = st.lists(st.sampled_from([0.0, 0.2, 0.9, 1.5, 2.0, 3.5]), min_size=80, max_size=80)


def poll(i: int, offsets: list[float]) -> float:
    return T0 + 60 * i + offsets[i]


def changes(decisions: list) -> list[tuple[int, object]]:
    """``(poll, decision)`` at each poll whose decision differs from the previous poll's."""
    return [(i, d) for i, d in enumerate(decisions) if i == 0 or d != decisions[i - 1]]


def _judged(offsets):
    a = replace(attempt(status="pending"), started_at=poll(0, offsets), verify_by=poll(0, offsets) + 180)
    open_issue = Issue.from_json({"since": a.since, "state": "verifying"})
    return [verify.judge(a, open_issue, False, poll(i, offsets)) for i in range(1, 8)]


@settings(max_examples=200, deadline=None)
@given(OFFSETS)
def test_a_verification_window_passes_at_the_same_poll(offsets):
    """verify_within_s 180 from poll 0: the poll at 180 s still waits, the next one fails it."""
    assert _judged(offsets) == _judged(WHOLE)
    assert changes(_judged(WHOLE)) == [(0, None), (3, verify.WINDOW_PASSED)]


def _restored(offsets):
    state = HealState.from_json(empty_state()).with_mitigation("gpu-0", Mitigation(("shed-load",), "thermal-critical"))
    out = []
    for i in range(1, 16):  # hot at poll 1, cool from poll 2 on
        hot = {"gpu-0"} if i == 1 else set()
        state, due = verify.cooldown(state, hot, {"gpu-0"}, poll(i, offsets), 600.0)
        out.append(bool(due))
    return out


@settings(max_examples=200, deadline=None)
@given(OFFSETS)
def test_the_load_comes_back_after_restore_after_s_at_the_same_poll(offsets):
    """restore_after_s 600: cool from poll 2, restored at poll 12 (600 s of polls later) at any clock."""
    assert _restored(offsets) == _restored(WHOLE)
    assert changes(_restored(WHOLE)) == [(0, False), (11, True), (12, False)]


def _restart_decisions(offsets, first=0):
    """model-stuck on gpu-0 planned at polls 60..64 after restarts at polls 0, 1 and 2 (budget 3/h)."""
    state = empty_state()
    state["restarts"]["gpu-0"] = [poll(i, offsets) for i in range(first, first + 3)]
    return [only(plan([issue()], state, cfg(max_restarts_per_hour=3), poll(i, offsets))).decision
            for i in range(first + 59, first + 64)]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(OFFSETS)
def test_the_restart_budget_frees_an_hour_of_polls_later(offsets):
    assert _restart_decisions(offsets) == _restart_decisions(WHOLE)
    assert _restart_decisions(WHOLE) == ["escalate", "act", "act", "act", "act"]


def _graced(offsets):
    state = empty_state()
    state["restarts"]["gpu-0"] = [poll(2, offsets)]
    return [only(plan([issue()], state, cfg(startup_grace_s=120), poll(i, offsets))).decision for i in range(3, 7)]


@settings(max_examples=200, deadline=None)
@given(OFFSETS)
def test_the_startup_grace_holds_the_same_polls(offsets):
    """Restarted at poll 2, grace 120 s: poll 3 waits, poll 4 (120 s later) may restart again."""
    assert _graced(offsets) == _graced(WHOLE)
    assert _graced(WHOLE) == ["blocked", "act", "act", "act"]


def _litellm_decisions(offsets):
    """gpu-0's LiteLLM restart (poll 0, verify_within 180 s) being verified holds back gpu-1's, then
    the service's hourly budget (restarts at polls 0, 1, 2; 3 per hour) until poll 60 frees it."""
    state = empty_state()
    state["attempts"]["k"] = {"gpu": "gpu-0", "issue": "circuit-breaker-stuck", "since": "S", "n": 1,
                              "status": "pending", "verify_by": poll(0, offsets) + 180,
                              "actions": ["restart-litellm"]}  # fmt: skip
    state["service_restarts"]["litellm"] = [poll(i, offsets) for i in (0, 1, 2)]
    breaker = issue(gpu="gpu-1", issue_id="circuit-breaker-stuck", severity="warning")
    return [only(plan([breaker], state, cfg(max_restarts_per_hour=3), poll(i, offsets))).decision
            for i in (1, 3, 4, 59, 60, 61)]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(OFFSETS)
def test_a_shared_service_is_held_and_budgeted_in_polls(offsets):
    assert _litellm_decisions(offsets) == _litellm_decisions(WHOLE)
    assert _litellm_decisions(WHOLE) == ["blocked", "blocked", "escalate", "escalate", "act", "act"]


def _reminded(offsets):
    data = alerts.AlertQueue()
    a = alerts.issue_alert("gpu-0", "model-stuck", "escalated", "S", poll(0, offsets), "stuck", run_id="r",
                           detected={}, tried=[], attempts=1)  # fmt: skip
    alerts.record_sent(data, a, poll(0, offsets), 1)
    policy = alerts.AlertPolicy.of(ALL)
    return [bool(alerts.due_reminders(data, {("gpu-0", "model-stuck")}, poll(i, offsets), 3600, policy=policy))
            for i in (59, 60, 61)]


@settings(max_examples=200, deadline=None)
@given(OFFSETS)
def test_a_reminder_goes_out_at_the_same_poll(offsets):
    assert _reminded(offsets) == _reminded(WHOLE) == [False, True, True]


BENCH_CFG = fleet_config()
DENSE = "gpu-dense"


def _bench_excluded(offsets):
    """Restarted at poll 1 (grace 120 s); gpu-monitor's benchmark taken at each later poll is kept
    out of the baseline at poll 2 only — through ``check``'s ingestion and ``bench``'s own."""
    trace = fleet_trace(BENCH_CFG, {DENSE: {"bench_tok_s": "50x6"}})
    restarted = trace[0].at.timestamp() + 60 + offsets[1]
    restarts = Restarts(last={DENSE: restarted}, grace_s=120)
    bench, book, out = benchdata.empty(), new_book(), []
    for i in range(2, 6):
        at = trace[0].at.timestamp() + 60 * i + offsets[i]
        obs = trace[i]
        sample = obs.gpus[DENSE]
        moved = replace(sample, bench_measured_at=sample.bench_measured_at.fromtimestamp(at, tz=obs.at.tzinfo))
        polled = replace(obs, gpus={**obs.gpus, DENSE: moved})
        view = FleetView(BENCH_CFG, polled.at.timestamp(), polled, History(), bench, book.memory, restarts)
        ingest(bench, view, book.issues.values())
        own = exclusion_reason(DENSE, at, [], [restarted], 120, fleet_incidents=())
        out.append((bench["results"][DENSE][-1]["excluded"], own is not None))
    return out


@settings(max_examples=100, deadline=None)
@given(OFFSETS)
def test_the_bench_startup_grace_counts_in_polls(offsets):
    offsets = [0.0] + offsets[1:]  # the trace starts on the minute
    assert _bench_excluded(offsets) == _bench_excluded(WHOLE)
    assert _bench_excluded(WHOLE) == [(True, True), (False, False), (False, False), (False, False)]
