"""The per-GPU rows every rememberer keeps in the issue book (``core/memory_rows``): a damaged book or
row — a state file edited by hand, written by another version, cut short — is replaced and the poll
folded in, never a crash; the same poll folded twice counts once; a GPU gone from the config is dropped."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest

from gpuheal.core import memory_rows
from gpuheal.core.context_change import remember_context
from gpuheal.core.decode import remember_decode
from gpuheal.core.litellm_rate import remember_litellm
from gpuheal.core.routing import counter_points, remember_counters
from gpuheal.core.taskloop import remember_taskloop
from gpuheal.model import GpuSample, Observation

AT = datetime(2026, 7, 18, 8, 0, 7, 400_000, tzinfo=UTC)  # cron's late start: not a whole second
SAMPLE = GpuSample(endpoint="ok", n_decode_total=120.0, requests_processing=1, requests_deferred=0,
                   is_sleeping=False, litellm_requests_total=40.0, litellm_failures_total=2.0, n_ctx=4096,
                   litellm_model_group="chat")
DAMAGE = [None, 7, "text", [1, 2], {"gpu-a": "text"}, {"gpu-a": {"at_s": "soon", "n": "x"}},
          {"gpu-a": {"at_s": True}}, {"gpu-a": [["x"], [1.0]]}, {"gpu-a": {"at_s": float("nan")}}]


def fold_all(memory: dict) -> None:
    obs = Observation(AT, {"gpu-a": SAMPLE}, True)
    remember_decode(memory, obs, ("gpu-a",))
    remember_taskloop(memory, obs, ("gpu-a",))
    remember_litellm(memory, obs, ("gpu-a",))
    remember_context(memory, obs, ("gpu-a",), lambda alias: 50.0)
    remember_counters(memory, obs, ("gpu-a",), 3600.0)


@pytest.mark.parametrize("damage", DAMAGE, ids=repr)
def test_a_damaged_book_or_row_is_replaced_and_the_poll_folded_in(damage):
    memory = {key: copy.deepcopy(damage) for key in ("decode", "taskloop", "litellm", "context", "routing")}
    fold_all(memory)
    now_s = AT.timestamp()
    assert memory["decode"]["gpu-a"]["n"] == 120.0 and memory["decode"]["gpu-a"]["at_s"] == now_s
    assert memory["litellm"]["gpu-a"]["total"] == 40.0
    assert memory["context"]["gpu-a"]["n_ctx"] == 4096
    assert counter_points(memory, "gpu-a", now_s - 60) == [(now_s, 40.0)]


def test_the_same_poll_twice_counts_once_and_a_gone_gpu_is_dropped():
    memory: dict = {"decode": {"gone": {"n": 1.0, "at_s": 1.0}}}
    fold_all(memory)
    first = {k: dict(v) if isinstance(v, dict) else v for k, v in memory.items()}
    fold_all(memory)
    assert memory["routing"]["gpu-a"] == [[AT.timestamp(), 40.0, "chat"]]  # not appended twice
    assert {k: v for k, v in memory.items() if k != "routing"} == {k: v for k, v in first.items() if k != "routing"}
    assert "gone" not in memory["decode"]


@pytest.mark.parametrize("at_s", [None, "1", True, [1]])
def test_previous_of_a_row_without_a_time_is_none(at_s):
    assert memory_rows.previous({"a": {"at_s": at_s}}, "a", 5.0) == (None, False)
    assert memory_rows.previous({"a": {"at_s": 5.0}}, "a", 5.0)[1] is True  # the same poll again
