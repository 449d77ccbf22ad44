"""The attempt lifecycle (core/verify.py) and the typed heal state (core/heal_state.py): pure
values in and out, ``now`` a parameter; damaged state is coerced field by field, never fatal."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.core import verify
from gpuheal.core.actions import RunCommand
from gpuheal.core.heal_state import Attempt, HealState, Mitigation
from gpuheal.core.issue import Issue
from gpuheal.core.remedy import PlanItem
from gpuheal.core.verify import (
    TRANSITIONS,
    BadTransition,
    judge,
    reserve,
    transition,
)

NOW = 1_800_000_000.0 + random.Random(10).uniform(0.001, 0.999)  # real time is not whole seconds
SINCE = "2026-07-18T08:00:00Z"


def item(key="gpu-a/model-stuck/x/1", gpu="gpu-a", issue="model-stuck", actions=("restart-llama-server",)):
    steps = tuple(RunCommand(a, ("true",), "local") for a in actions)
    return PlanItem(gpu=gpu, issue=issue, decision="act", reason="attempt 1", steps=steps, attempt_no=1, key=key,
                    since=SINCE)  # fmt: skip


def attempt(**kw) -> Attempt:
    a = reserve(item(), now_s=NOW, verify_within_s=180.0, run_id="gpu-self-heal-20260718-001")
    return Attempt(**{**a.__dict__, **kw})


def seen(since: str) -> Issue:
    """The attempt's issue as the engine reports it while the attempt is verified."""
    return Issue.from_json({"since": since, "state": "verifying"})


def test_reserved_attempt_is_running_with_its_window():
    a = attempt()
    assert a.status == verify.RUNNING and a.verify_by == pytest.approx(NOW + 180.0)


@pytest.mark.parametrize(
    ("status", "event", "expected"),
    [
        ("running", "executed", "pending"),
        ("running", "exec-failed", "failed"),
        ("running", "exec-escalated", "escalated"),
        ("running", "issue-cleared", "resolved"),  # killed mid-command; the issue cleared since
        ("pending", "issue-cleared", "resolved"),
        ("pending", "new-occurrence", "superseded"),
        ("pending", "window-passed", "failed"),
        ("failed", "operator-clear", "cleared"),
        ("escalated", "operator-clear", "cleared"),
    ],
)
def test_table_moves(status, event, expected):
    assert transition(attempt(status=status), event, NOW).status == expected


@pytest.mark.parametrize("status", ["resolved", "superseded", "cleared"])
def test_closed_attempts_move_no_further(status):
    for event in {e for _, e in TRANSITIONS}:
        with pytest.raises(BadTransition):
            transition(attempt(status=status), event, NOW)


def test_pending_cannot_be_executed_twice():
    with pytest.raises(BadTransition):
        transition(attempt(status="pending"), "executed", NOW)


def test_judge_from_fresh_data():
    a = attempt(status="pending")
    assert judge(a, None, False, NOW + 10) == verify.ISSUE_CLEARED
    assert judge(a, None, True, NOW + 10) is None, "hidden (its source is down): not known, never resolved"
    assert judge(a, seen("2026-07-18T09:00:00Z"), False, NOW + 10) == verify.NEW_OCCURRENCE
    assert judge(a, seen(SINCE), False, NOW + 179.5) is None
    # the poll at verify_by, 0.2 s late, is still the poll at it (core/timing); the next poll, early, is past it
    assert judge(a, seen(SINCE), False, NOW + 180.2) is None
    assert judge(a, seen(SINCE), False, NOW + 238.8) == verify.WINDOW_PASSED
    assert judge(attempt(status="failed"), None, False, NOW) is None
    assert judge(attempt(verify_by=None), seen(SINCE), False, NOW) == verify.WINDOW_PASSED


def test_the_resolved_record_is_the_proving_reading_and_the_attempt_drops_what_it_kept():
    """The spec's Audit Trail Format: ``"verification": {"temp_c": 76, "after_s": 300}`` (issue 27 item 13)."""
    reading = {"temp_c": 76, "vram_used_mb": None, "endpoint": "ok", "n_ctx": 4096,
               "provenance": {"gpu-monitor GET /gpu-data": ["temp_c", "vram_used_mb"], "x": "junk"}}
    proved = verify.proof(reading, {"ok": True, "completion_s": 1.2, "proof_tok_s": 70.0, "error": None},
                          "2026-07-18T08:05:00Z", verify.open_for_s(attempt(), NOW + 300.4))  # fmt: skip
    assert proved == {"at": "2026-07-18T08:05:00Z", "after_s": 300, "temp_c": 76, "endpoint": "ok",
                      "provenance": {"gpu-monitor GET /gpu-data": ["temp_c"]}, "completion_s": 1.2, "proof_tok_s": 70.0}
    assert verify.proof("garbage", None, "T", 0) == {"at": "T", "after_s": 0}  # type: ignore[arg-type]
    kept = replace(attempt(status="pending"), outcome={"steps": [], "detected": {"temp_c": 87}})
    done = transition(kept, "issue-cleared", NOW + 300, proved)
    assert done.status == "resolved" and done.verification == proved and done.outcome is None
    assert HealState.from_json(HealState().with_attempt(kept).to_json()).attempts[kept.key].outcome == kept.outcome


def test_clear_lifts_the_escalation_and_its_failures():
    state = HealState.from_json({"escalated": {"gpu-a/model-stuck": {"at": NOW, "reason": "x", "since": SINCE}}})
    state = state.with_attempt(attempt(status="failed")).with_attempt(attempt(key="k2", n=2, status="escalated"))
    state, found = verify.clear(state, "gpu-a", "model-stuck", NOW)
    assert found and not state.escalated
    assert {a.status for a in state.attempts.values()} == {"cleared"}


def test_cooldown_restores_only_after_the_gpu_stayed_cool():
    state = HealState(active={"gpu-a": Mitigation(("shed-load",), "thermal-critical")})
    state, due = verify.cooldown(state, set(), {"gpu-a"}, NOW, 300.0)
    assert due == [] and state.active["gpu-a"].cool_since == NOW
    state, due = verify.cooldown(state, {"gpu-a"}, {"gpu-a"}, NOW + 200, 300.0)
    assert due == [] and state.active["gpu-a"].cool_since is None, "hot again: the cool-down starts over"
    state, _ = verify.cooldown(state, set(), {"gpu-a"}, NOW + 260, 300.0)
    state, due = verify.cooldown(state, set(), {"gpu-a"}, NOW + 560.5, 300.0)
    assert [r.alias for r in due] == ["gpu-a"] and "gpu-a" not in state.active


def test_book_counts_restarts_services_and_mitigations_before_running():
    a = reserve(item("k1", issue="thermal-critical", actions=("shed-load", "redirect-traffic")), now_s=NOW,
                verify_within_s=300.0, run_id="r")  # fmt: skip
    state = verify.book(HealState(), a, False, NOW)
    assert state.active["gpu-a"].actions == ("shed-load", "redirect-traffic") and state.restarts == {}
    b = reserve(item("k2", "gpu-b", "circuit-breaker-stuck", ("restart-litellm",)), now_s=NOW, verify_within_s=120.0,
                run_id="r")  # fmt: skip
    assert verify.book(state, b, False, NOW).service_restarts == {"litellm": (NOW,)}


# --------------------------------------------------------------------------- damaged state


HUGE = int("9" * 400)


def test_a_400_digit_integer_anywhere_is_coerced_not_fatal():
    """Issue 9 point 6: a heal-state.json holding a 400-digit integer made every heal exit 3."""
    data = {
        "restarts": {"gpu-a": [HUGE, NOW]},
        "attempts": {
            "k": {
                "gpu": "gpu-a",
                "issue": "model-stuck",
                "n": HUGE,
                "status": "pending",
                "verify_by": HUGE,
                "started_at": -HUGE,
                "actions": ["restart-llama-server"],
                "since": HUGE,
            }
        },
        "escalated": {"gpu-a/vram-leak": {"at": HUGE, "reason": HUGE}},
        "active": {"gpu-a": {"actions": ["shed-load"], "restore_failures": HUGE, "cool_since": HUGE}},
        "litellm_restarts": [HUGE],
        "service_restarts": {"litellm": [HUGE, 1.0]},
        "run_seq": {"day": "20260718", "n": HUGE},
    }
    state = HealState.from_json(data)
    a = state.attempts["k"]
    assert (a.n, a.verify_by, a.started_at) == (0, None, None) and a.since == str(HUGE)
    assert state.restarts == {"gpu-a": (NOW,)} and state.litellm_restarts == ()
    assert state.active["gpu-a"].restore_failures == 0 and state.active["gpu-a"].cool_since is None
    assert state.escalated["gpu-a/vram-leak"].at is None and state.run_n == 0
    json.dumps(state.to_json())  # and it saves


def test_wrong_types_lose_only_the_field():
    state = HealState.from_json(
        {
            "attempts": {
                "k": {
                    "gpu": "gpu-a",
                    "issue": "model-stuck",
                    "status": 7,
                    "actions": [1, "shed-load"],
                    "verification": "yes",
                    "run_id": 12,
                }
            },
            "paused": {"fleet": "yes", "gpus": {"gpu-a": {"reason": None}, "gpu-b": 3}},
            "active": {"gpu-a": {"issue": 5}},
        }
    )
    a = state.attempts["k"]
    assert (a.status, a.actions, a.verification, a.run_id) == ("superseded", ("shed-load",), None, "12")
    assert state.paused_fleet is None and list(state.paused_gpus) == ["gpu-a"]
    assert state.paused_gpus["gpu-a"].reason == "maintenance"
    assert state.active["gpu-a"].issue == "5"


def test_todays_format_round_trips():
    """State written by the release before the typed records reads back unchanged."""
    written = {
        "restarts": {"gpu-a": [NOW - 10]},
        "attempts": {
            "gpu-a/model-stuck/S/1": {
                "key": "gpu-a/model-stuck/S/1",
                "gpu": "gpu-a",
                "issue": "model-stuck",
                "since": "S",
                "n": 1,
                "actions": ["restart-llama-server"],
                "status": "pending",
                "started_at": NOW - 10,
                "verify_by": NOW + 170,
                "run_id": "gpu-self-heal-20260718-001",
                "verification": {"ok": True},
            }
        },
        "escalated": {"gpu-b/vram-leak": {"at": NOW, "reason": "leak", "since": "S"}},
        "paused": {"fleet": None, "gpus": {"gpu-c": {"reason": "driver", "at": "2026-07-18T08:00:00Z"}}},
        "active": {
            "gpu-a": {"actions": ["shed-load"], "issue": "thermal-critical", "restore_failures": 1, "cool_since": NOW}
        },
        "run_seq": {"day": "20260718", "n": 4},
        "litellm_restarts": [NOW - 5],
        "service_restarts": {"litellm": [NOW - 5]},
    }
    assert HealState.from_json(written).to_json() == written


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "restarts",
                        "attempts",
                        "escalated",
                        "paused",
                        "active",
                        "run_seq",
                        "gpu",
                        "issue",
                        "n",
                        "status",
                        "verify_by",
                        "actions",
                        "fleet",
                        "gpus",
                        "day",
                        "gpu-a",
                        "k",
                        "a/b",
                    ]
                ),
                inner,
                max_size=6,
            )
        ),
        max_leaves=30,
    )
)
def test_any_json_reads_as_a_state(data):
    state = HealState.from_json(data)
    assert HealState.from_json(state.to_json()) == state
    json.dumps(state.to_json(), allow_nan=False)


def test_note_restore_keeps_the_value_found_before_the_first_change():
    state = HealState(active={"gpu-a": Mitigation(("shed-load",), "thermal-critical")})
    first = {"model_id": "dep-a", "field": "weight", "before": 0.55, "after": 0.275}
    state = verify.note_restore(state, "gpu-a", [first])
    assert state.active["gpu-a"].restore == ("dep-a", "weight", 0.55)
    again = {"model_id": "dep-a", "field": "weight", "before": 0.275, "after": 0.0}
    assert verify.note_restore(state, "gpu-a", [again]) == state, "a later shed never overwrites it"
    assert verify.note_restore(HealState(), "gpu-a", [first]) == HealState(), "nothing mitigated: nothing to note"
