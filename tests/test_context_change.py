"""Rule 9's follow-through, pure (``gpuheal.rules.context_window.change``): a context change seen between polls
(Rule 9's memory, ``rules/context_window/memory.py``, folded in by the engine), its re-benchmark and the
verdict — with bad input as normal input and a jittered cron clock."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from functools import cache

import pytest

from gpuheal import benchdata
from gpuheal.clock import format_epoch
from gpuheal.config import load_config_dict
from gpuheal.core import engine, rebench
from gpuheal.core.memory import Memory
from gpuheal.core.view import FleetView
from gpuheal.model import GpuSample, Observation
from gpuheal.parse.llama_metrics import known_n_ctx
from gpuheal.rules import ALL, context_window
from gpuheal.rules.context_window import change as cc
from gpuheal.state.history import History

START = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
ALIASES = ("gpu-dense", "gpu-light")


@cache
def config(target: float | None):
    """The fleet of ``ALIASES``; ``target`` is each GPU's configured baseline (a change's target)."""
    gpus = [{"alias": a, "host": a, "endpoint": f"http://127.0.0.1:{9 + i}", "transport": "local",
             **({} if target is None else {"baseline_tok_s": target})} for i, a in enumerate(ALIASES)]
    return load_config_dict({"monitor": {"url": "http://127.0.0.1:9/gpu-data"}, "gpus": gpus})


def remember_context(memory: Memory, obs: Observation, target: float | None) -> list[cc.ContextChange]:
    """One poll folded into every rule's memory by the engine, as ``check`` does; the changes it saw."""
    view = FleetView(config(target), obs.at.timestamp(), obs, History(), benchdata.empty(), memory)
    engine.remember(ALL, view, memory)
    return list(cc.awaiting(memory, seen_at_s=view.now_s).values())


def jittered(n: int, seed: int = 7) -> list[datetime]:
    """Cron's minute ticks, each started 0.3–2.7 s late (real time is not whole seconds)."""
    rnd = random.Random(seed)
    return [START + timedelta(seconds=60 * i + rnd.uniform(0.3, 2.7)) for i in range(n)]


def poll(at: datetime, **n_ctx) -> Observation:
    gpus = {alias: GpuSample(endpoint="ok", n_ctx=value) for alias, value in n_ctx.items()}
    return Observation(at=at, gpus=gpus, monitor_ok=True)


def run(series: list, target: float | None = 74.8) -> tuple[Memory, list[list[cc.ContextChange]]]:
    """Feed gpu-dense's n_ctx poll by poll (``None``: the GPU absent from the poll)."""
    memory = Memory()
    seen = []
    for at, value in zip(jittered(len(series)), series, strict=True):
        obs = poll(at) if value is None else Observation(at=at, gpus={"gpu-dense": GpuSample(n_ctx=value)}, monitor_ok=True)
        seen.append(remember_context(memory, obs, target))
    return memory, seen


def test_first_sighting_is_not_a_change():
    memory, seen = run([4096, 4096, 4096])
    assert seen == [[], [], []]
    assert memory.to_json()["context"]["gpu-dense"]["n_ctx"] == 4096
    assert cc.awaiting(memory) == {}


def test_a_change_between_polls_is_recorded_with_from_to_when_and_target():
    memory, seen = run([4096, 4096, 3072, 3072])
    assert [len(s) for s in seen] == [0, 0, 1, 0]
    change = seen[2][0]
    assert (change.gpu, change.from_n_ctx, change.to_n_ctx, change.target_tok_s) == ("gpu-dense", 4096, 3072, 74.8)
    assert change.at_s == jittered(4)[2].timestamp()
    assert cc.awaiting(memory) == {"gpu-dense": change}
    assert cc.awaiting(memory, seen_at_s=change.at_s) == {"gpu-dense": change}
    assert cc.awaiting(memory, seen_at_s=jittered(4)[3].timestamp()) == {}  # audited once, at its poll


def test_a_restart_that_keeps_the_context_is_not_a_change():
    """The server down for two polls (no /props: not known), back with the same n_ctx."""
    _, seen = run([4096, None, None, 4096, 4096])
    assert all(s == [] for s in seen)


def test_a_restart_with_another_context_is_one_change_across_the_unknown_polls():
    memory, seen = run([4096, None, 2048, 2048])
    assert [len(s) for s in seen] == [0, 0, 1, 0]
    assert (seen[2][0].from_n_ctx, seen[2][0].to_n_ctx) == (4096, 2048)


@pytest.mark.parametrize("bad", [None, 0, -4096, 4096.5, "4096", True, float("nan"), float("inf"), 10**12, [4096], {}])
def test_bad_n_ctx_is_not_known_and_never_a_change(bad):
    assert known_n_ctx(bad) is None
    memory, seen = run([4096, bad, bad, 4096])
    assert all(s == [] for s in seen)
    assert memory.to_json()["context"]["gpu-dense"]["n_ctx"] == 4096


def test_a_whole_float_counts_and_the_same_poll_twice_counts_once():
    assert known_n_ctx(2048.0) == 2048
    memory = Memory()
    at = jittered(2)
    remember_context(memory, poll(at[0], **{"gpu-dense": 4096}), 70.0)
    assert remember_context(memory, poll(at[0], **{"gpu-dense": 2048}), 70.0) == []
    assert len(remember_context(memory, poll(at[1], **{"gpu-dense": 2048}), 70.0)) == 1


def test_damaged_memory_is_tolerated_and_dropped_gpus_forgotten():
    memory = Memory.from_json({"context": {"gpu-dense": {"n_ctx": "x", "at_s": "y", "change": {"from_n_ctx": -1}},
                                           "gone": {}}})
    at = jittered(1)[0]
    assert remember_context(memory, poll(at, **{"gpu-dense": 4096}), 70.0) == []
    assert "gone" not in memory.to_json()["context"]
    assert memory.to_json()["context"]["gpu-dense"] == {"n_ctx": 4096, "at_s": at.timestamp(), "change": None}
    assert remember_context(Memory.from_json({"context": []}), poll(at, **{"gpu-dense": 4096}), 1.0) == []
    assert cc.awaiting(Memory.from_json({"context": {"gpu-dense": "junk"}})) == {}
    assert cc.escalation(Memory.from_json({"context": 5}), "gpu-dense", format_epoch) is None


# --------------------------------------------------------------------------- re-benchmark and verdict


def changed(target: float | None = 74.8) -> tuple[Memory, cc.ContextChange]:
    memory, seen = run([131072, 131072, 98304], target=target)
    return memory, seen[2][0]


def result(at_s: float, tok_s, ok: bool = True, n_ctx=98304) -> dict:
    return {"at": at_s, "gen_tok_s": tok_s, "ok": ok, "n_ctx": n_ctx}


def settle(memory: Memory, results: list[dict], floor: float = 0.9, aliases=ALIASES) -> list[cc.Verdict]:
    """Each change's re-benchmark through the one mechanism, pure (``steps/rebench.answer`` without the
    state directory): the ask Rule 9's memory raises, answered by the latest result after it and judged
    (core/rebench), its verdict kept in Rule 9's row. gpu-dense has ``results``; a GPU not in ``aliases``
    is no longer configured."""
    verdicts = []
    for raised in context_window.REMEDY.asks(memory, 0.0):
        ask, recorded = raised.ask, results if raised.ask.gpu == "gpu-dense" else []
        answer = rebench.answering(ask, recorded, None) if ask.gpu in aliases else None
        verdict = None if answer is None else cc.verdict_on(
            memory, ask, answer, rebench.measured(ask, answer, None, floor), recorded)
        verdicts += [] if verdict is None else [verdict]
    return verdicts


def test_pending_until_a_successful_result_after_the_change():
    memory, change = changed()
    before = [result(change.at_s - 600, 74.0), result(change.at_s, 74.0)]  # taken before (or at) the change
    failed = [result(change.at_s + 300, None, ok=False), result(change.at_s + 310, 0.0)]
    assert settle(memory, before + failed) == []
    assert cc.awaiting(memory) == {"gpu-dense": change}


def test_within_ten_percent_of_target_is_verified():
    memory, change = changed()
    [verdict] = settle(memory, [result(change.at_s + 300, 67.4)])  # 90.1 %
    assert (verdict.state, verdict.ratio_pct) == (cc.VERIFIED, 90.1)
    assert cc.awaiting(memory) == {}  # the pending re-bench is cleared once done
    assert cc.escalation(memory, "gpu-dense", format_epoch) is None
    assert settle(memory, [result(change.at_s + 300, 67.4)]) == []  # each result judged once


def test_faster_than_target_is_headroom_not_a_loss():
    memory, change = changed()
    [verdict] = settle(memory, [result(change.at_s + 300, 95.0)])
    assert verdict.state == cc.VERIFIED


def test_below_ninety_percent_is_the_spec_escalation_until_a_later_result_recovers():
    memory, change = changed()
    [verdict] = settle(memory, [result(change.at_s + 300, 60.0)])
    assert (verdict.state, verdict.ratio_pct) == (cc.PERF_LOSS, 80.2)
    detected = cc.escalation(memory, "gpu-dense", format_epoch)
    assert detected["escalation"] == "context can't be adjusted without significant perf loss"
    assert (detected["from_n_ctx"], detected["to_n_ctx"], detected["gen_tok_s"]) == (131072, 98304, 60.0)
    assert detected["changed_at"] == format_epoch(change.at_s)
    assert "perf loss" in cc.escalation_summary("gpu-dense", detected)
    [again] = settle(memory, [result(change.at_s + 300, 60.0), result(change.at_s + 3900, 72.0)])
    assert again.state == cc.VERIFIED
    assert cc.escalation(memory, "gpu-dense", format_epoch) is None


def test_the_latest_result_after_the_change_judges_and_another_context_is_skipped():
    memory, change = changed()
    results = [result(change.at_s + 100, 50.0), result(change.at_s + 200, 73.0),
               result(change.at_s + 300, 40.0, n_ctx=65536)]  # a further change the polls have not seen
    [verdict] = settle(memory, results)
    assert (verdict.state, verdict.gen_tok_s, verdict.measured_at_s) == (cc.VERIFIED, 73.0, change.at_s + 200)


def test_no_target_is_said_never_guessed():
    memory, change = changed(target=None)
    [verdict] = settle(memory, [result(change.at_s + 300, 60.0)])
    assert (verdict.state, verdict.ratio_pct) == (cc.NO_TARGET, None)
    assert cc.escalation(memory, "gpu-dense", format_epoch) is None


def test_a_gpu_no_longer_configured_is_not_judged():
    memory, change = changed()
    assert settle(memory, [result(change.at_s + 300, 60.0)], aliases=("gpu-light",)) == []


def test_audit_lines_say_from_to_when_and_what_proved_it():
    memory, change = changed()
    line = cc.detected_audit(change, format_epoch, "gpu-self-heal-20260718-001")
    assert line["run_id"] == "gpu-self-heal-20260718-001"
    assert line["issue"] == "context-window" and line["action"] == "context-change" and line["result"] == "pending"
    assert line["detected"]["context_change"] == {"from_n_ctx": 131072, "to_n_ctx": 98304,
                                                  "changed_at": format_epoch(change.at_s), "target_tok_s": 74.8}
    [verdict] = settle(memory, [result(change.at_s + 300, 60.0)])
    line = cc.verdict_audit(verdict, "2026-07-18T09:00:00Z", format_epoch, "gpu-self-heal-20260718-002")
    assert (line["action"], line["result"], line["escalated"]) == ("re-benchmark", "escalated", True)
    assert line["verification"]["gen_tok_s"] == 60.0 and line["verification"]["ratio_pct"] == 80.2
    assert line["detected"]["escalation"] == cc.ESCALATION


def test_the_loss_message_says_old_and_new_context_tok_s_before_and_after_and_the_ctx_size_back():
    """Issue 27 item 3: one message per change naming the GPU, both n_ctx, the tok/s before and after and
    the --ctx-size that puts the old context back (per slot x the re-benchmark's slots)."""
    memory, change = changed()
    results = [result(change.at_s - 900, 70.0, n_ctx=131072), result(change.at_s - 600, 74.5, n_ctx=131072),
               result(change.at_s - 300, 20.0, n_ctx=65536),  # another context before: not "before"
               {**result(change.at_s + 300, 60.0), "slots": 2}]
    [verdict] = settle(memory, results)
    assert (verdict.before_tok_s, verdict.slots) == (74.5, 2)
    text = cc.loss_message(verdict, format_epoch)
    assert text.startswith("gpu-dense: context can't be adjusted without significant perf loss (Rule 9)")
    assert "n_ctx 131072 -> 98304" in text and format_epoch(change.at_s) in text
    assert "60 tok/s after, 74.5 tok/s before (last result at n_ctx 131072), 80.2 % of its 74.8 tok/s target" in text
    assert text.endswith("--ctx-size 262144 (131072 per slot x 2 slots)")
    assert cc.verdict_audit(verdict, "2026-07-18T09:00:00Z", format_epoch, "gpu-self-heal-20260718-002")["detected"]["ctx_size_back"] == 262144


@pytest.mark.parametrize("slots", [None, 0, -1, True, "2", 2.5, 10**9, [2]])
def test_bad_or_missing_slots_and_no_result_before_say_so_and_never_guess(slots):
    memory, change = changed()
    bad = [{"at": change.at_s - 60, "gen_tok_s": "fast", "ok": True}, {"at": "x", "gen_tok_s": 70.0, "ok": True},
           {"at": change.at_s - 30, "gen_tok_s": 70.0, "ok": False}]
    [verdict] = settle(memory, [*bad, {**result(change.at_s + 300, 60.0), "slots": slots}])
    assert (verdict.before_tok_s, verdict.slots) == (None, None)
    text = cc.loss_message(verdict, format_epoch)
    assert "no result before it at the old context" in text
    assert text.endswith("--ctx-size 131072 (per slot: x -np if the server runs several)")


def test_bench_table_says_each_verdict_in_one_line_with_markup_escaped(capsys):
    from gpuheal.render.bench import render_bench

    render_bench({"generated_at": "2026-07-18T08:05:00Z", "results": [], "context_changes": [
        {"gpu": "gpu-dense", "from_n_ctx": 131072, "to_n_ctx": 98304, "state": "perf-loss", "gen_tok_s": 61.0,
         "ratio_pct": 81.6, "target_tok_s": 74.8},
        {"gpu": "g[bold]x", "from_n_ctx": 1, "to_n_ctx": 2, "state": "no-target", "gen_tok_s": 1.0,
         "ratio_pct": None, "target_tok_s": None},
    ]})
    out = capsys.readouterr()
    text = out.out + out.err
    assert "CONTEXT  gpu-dense n_ctx 131072 -> 98304: perf-loss, 61.0 tok/s = 81.6 % of target 74.8" in text
    assert "g[bold]x n_ctx 1 -> 2: no-target" in text
