"""Rule 3 from a hung task loop (issue 20; contract "Rule timing"): ``/health`` ok while ``/metrics``
and ``/slots`` do not answer within the probe deadline is a stalled poll; ``model-stuck`` fires at the
3rd consecutive one, on a jittered cron clock. One answer from the task loop ends the run; a poll that
cannot say (``/health`` failing, telemetry disabled) neither advances nor resets it."""

from __future__ import annotations

import pytest

try:
    from tests.series import fleet_config, fleet_trace, polls, run
except ImportError:
    from series import fleet_config, fleet_trace, polls, run

from gpuheal.core.taskloop import classify
from gpuheal.model import GpuSample

CFG = fleet_config()
G = "gpu-dense"
NO_MONITOR_COUNTS = {"requests_60s": "_", "failures_60s": "_"}


def trace(metrics: str, slots: str, endpoint: str | None = None, step_s: float = 60.0, jitter: bool = True):
    fields = {"metrics": metrics, "slots": slots, **NO_MONITOR_COUNTS}
    if endpoint is not None:
        fields["endpoint"] = endpoint
    return run(CFG, fleet_trace(CFG, {G: fields}, step_s=step_s), jitter=jitter)


def test_fires_at_the_third_stalled_poll_and_says_what_answered():
    r = trace("ok timeout*4", "idle timeout*4")
    assert polls(r, G, "model-stuck", "pending") == [2]
    assert polls(r, G, "model-stuck") == [3]
    issue = next(i for i in r.open_at_end if i.issue == "model-stuck")
    d = issue.detected
    assert d["source"] == "llama-server task loop"
    assert d["answered"] == ["/health"] and d["not_answered"] == ["/metrics", "/slots"]
    assert "task loop is hung" in issue.summary and "/health says ok" in issue.summary


@pytest.mark.parametrize("step_s", [47.3, 58.9, 61.7, 73.1])
def test_jittered_cadence_still_fires_at_the_third_stalled_poll(step_s):
    assert polls(trace("ok timeout*4", "idle timeout*4", step_s=step_s), G, "model-stuck") == [3]


def test_one_answer_from_the_task_loop_ends_the_run():
    # a busy server answers /metrics between decode steps: never two silent polls in a row here
    r = trace("timeout ok timeout timeout ok timeout timeout", "timeout*7")
    assert polls(r, G, "model-stuck", "pending") == [3, 6]
    assert polls(r, G, "model-stuck") == []


def test_metrics_disabled_but_slots_silent_is_a_stalled_poll():
    assert polls(trace("disabled*5", "timeout*5"), G, "model-stuck") == [2]


def test_telemetry_disabled_is_not_known_never_stuck():
    assert polls(trace("disabled*5", "disabled*5"), G, "model-stuck", "pending") == []


def test_a_failing_health_is_rule_6s_and_neither_advances_nor_resets():
    r = trace("timeout timeout _ timeout", "timeout timeout _ timeout", endpoint="ok ok timeout ok")
    assert polls(r, G, "model-stuck") == [3]


def test_recovers_once_the_task_loop_answers():
    r = trace("timeout*3 ok*4", "timeout*3 idle*4")
    assert polls(r, G, "model-stuck") == [2]
    assert polls(r, G, "model-stuck", "resolved") == [3]


@pytest.mark.parametrize("sample, want", [
    (GpuSample(endpoint="ok", metrics="timeout", slots="timeout"), True),
    (GpuSample(endpoint="ok", metrics="ok", slots="timeout"), False),
    (GpuSample(endpoint="ok", metrics="timeout", slots="ok"), False),
    (GpuSample(endpoint="timeout", metrics="timeout"), None),
    (GpuSample(endpoint="ok", metrics="unauthorized", slots="unauthorized"), None),
    (GpuSample(endpoint="ok", metrics=42, slots=["garbage"]), None),  # a hand-made trace may hold anything
    (None, None),
])
def test_classify(sample, want):
    assert classify(sample)[0] is want


@pytest.mark.parametrize("slots, why", [
    ("ok", "judged by its task loop answering /slots"),
    ("disabled", "task loop answers (/metrics, /slots)"),
])
def test_rules_off_says_which_signals_a_gpu_without_metrics_still_has(slots, why):
    from gpuheal.core.coverage import rules_off
    from gpuheal.rules import ALL

    obs = fleet_trace(CFG, {G: {"metrics": "disabled", "slots": slots, **NO_MONITOR_COUNTS}})[0]
    off = {o["rule"]: o for o in rules_off("smi", obs, ALL)}
    assert off["model-stuck"]["gpus"] == [G] and why in off["model-stuck"]["why"], off["model-stuck"]


def test_a_gpu_serving_neither_metrics_nor_slots_is_not_judged_by_the_task_loop():
    r = trace("disabled*5", "disabled*5")
    assert polls(r, G, "model-stuck", "pending") == []


@pytest.mark.parametrize("sample, now_s, every, want", [
    (GpuSample(endpoint="ok", metrics="disabled", slots="disabled"), 120.0, 1, True),
    (GpuSample(endpoint="ok", metrics="ok", slots="ok", requests_processing=2), 120.0, 1, False),  # busy: never
    (GpuSample(endpoint="ok", metrics="ok", slots="idle"), 120.0, 1, False),  # the task loop answered
    (GpuSample(endpoint="ok", metrics="timeout", slots="timeout"), 120.0, 1, False),  # already silent
    (GpuSample(endpoint="ok", metrics="disabled", slots="disabled", is_sleeping=True), 120.0, 1, False),
    (GpuSample(endpoint="refused"), 120.0, 1, False),
    (GpuSample(endpoint="ok", metrics="disabled", slots="disabled"), 181.3, 2, False),  # minute 3 of every 2
    (GpuSample(endpoint="ok", metrics="disabled", slots="disabled"), 241.9, 2, True),
])
def test_canary_runs_only_where_nothing_else_shows_the_task_loop(sample, now_s, every, want):
    from gpuheal.sources.sense import canary_due

    assert canary_due(sample, now_s, every) is want


def test_a_silent_canary_is_a_stalled_poll():
    r = run(CFG, fleet_trace(CFG, {G: {"metrics": "disabled*4", "slots": "disabled*4", "canary": "ok timeout*3",
                                       **NO_MONITOR_COUNTS}}))
    assert polls(r, G, "model-stuck") == [3]
    issue = next(i for i in r.open_at_end if i.issue == "model-stuck")
    assert issue.detected["not_answered"] == ["/completion"]


def test_without_gpu_monitor_a_canary_is_what_lets_rule_3_judge_a_server_without_metrics_or_slots():
    from dataclasses import replace

    def smi_run(fields):  # the polls as nvidia-smi / rocm-smi read them: no failure ratio
        return run(CFG, [replace(o, source="smi") for o in fleet_trace(CFG, {G: fields})])

    fields = {"metrics": "disabled*4", "slots": "disabled*4", "canary": "_ timeout*3"}
    assert polls(smi_run({**fields, "canary": "_*4"}), G, "model-stuck", "pending") == []
    assert polls(smi_run(fields), G, "model-stuck") == [3]


def test_a_silent_task_loop_looked_at_every_5_s_fires_after_silent_hold_s_not_the_ratio_s_grace():
    """Issue 28: a task loop answering nothing is every request stuck, a hard fault held for
    ``silent_hold_s`` (20 s) of evidence within a run — the finding starts at the 1st silent look (poll 1),
    so the look 20 s later fires it (poll 5), not the one 30 s later (poll 7, ``grace_s``)."""
    r = trace("ok timeout*9", "idle timeout*9", step_s=5.0, jitter=False)
    assert polls(r, G, "model-stuck") == [5]


def test_a_failure_ratio_looked_at_every_5_s_still_waits_for_its_grace():
    """The shorter hold is the silent task loop's alone: gpu-monitor's "> 50 % failing" keeps the spec's
    30 s grace whatever the cadence (it fires on neither more nor fewer seconds than before)."""
    fields = {"requests_60s": "10*12", "failures_60s": "0 9*11", "metrics": "ok*12", "slots": "idle*12"}
    r = run(CFG, fleet_trace(CFG, {G: fields}, step_s=5.0), jitter=False)
    fired = polls(r, G, "model-stuck")
    assert fired and (fired[0] - 1) * 5.0 >= 30, fired  # 30 s since the 1st failing look (poll 1), as before
