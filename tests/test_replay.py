"""``gpuheal replay``: golden traces named after the spec's incidents, bad input, the same timeline as
``check`` run by cron (one process state per poll, a real state directory), and the real CLI."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest

from gpuheal.config import load_config_dict
from gpuheal.errors import GpuhealError
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import book as book_file
from gpuheal.steps import check
from gpuheal.steps.replay import replay
from gpuheal.trace import read_trace

try:
    from tests.series import JITTER_SEEDS, START, cron_clock, fleet_trace, polls, timing
    from tests.servers import run_gpuheal
except ImportError:
    from series import JITTER_SEEDS, START, cron_clock, fleet_trace, polls, timing
    from servers import run_gpuheal

TRACES = Path(__file__).resolve().parent / "traces"
CFG = load_config_dict(json.loads((TRACES / "fleet.json").read_text()))
UPDATE = os.environ.get("GPUHEAL_UPDATE_GOLDENS") == "1"
ALL_TRACES = sorted(p.stem for p in TRACES.glob("*.jsonl"))


def compact(result) -> dict:
    return {
        "timeline": [[t["poll"], t["at"], t["gpu"], t["issue"], t["event"]] for t in result.timeline],
        "open_at_end": [[i.gpu, i.issue, i.state] for i in result.open_at_end],
        "fired": len(result.fired),
    }


def dump_golden(doc: dict) -> str:
    """One timeline entry per line: goldens that read like the timeline they pin."""
    def rows(items):
        return "[\n" + ",\n".join("  " + json.dumps(x, ensure_ascii=False) for x in items) + "\n ]" if items else "[]"

    return (f'{{\n "timeline": {rows(doc["timeline"])},\n "open_at_end": {rows(doc["open_at_end"])},\n'
            f' "fired": {doc["fired"]}\n}}\n')


def replay_file(name: str):
    observations, warnings = read_trace(TRACES / f"{name}.jsonl")
    assert warnings == []
    return replay(CFG, observations)


# --------------------------------------------------------------------------- goldens


@pytest.mark.parametrize("name", ALL_TRACES)
def test_golden_timeline(name):
    got = compact(replay_file(name))
    golden = TRACES / f"{name}.expected.json"
    if UPDATE or not golden.exists():
        golden.write_text(dump_golden(got))
        if not UPDATE:
            pytest.fail(f"wrote missing golden {golden.name}; review it and run again")
    assert got == json.loads(golden.read_text())


@pytest.mark.parametrize("seed", (0, *JITTER_SEEDS))
@pytest.mark.parametrize("name", ALL_TRACES)
def test_golden_timeline_under_a_cron_like_clock(name, seed):
    """Issue 9: the same issues fire (and resolve) at the same polls when each poll starts 0-1.5 s
    after its minute, some 2 s late, as with the whole-second clock the golden was recorded with."""
    observations, _ = read_trace(TRACES / f"{name}.jsonl")
    assert timing(replay(CFG, cron_clock(observations, seed))) == timing(replay(CFG, observations))


def test_l1_api_key_401_fires_at_once_and_masks_model_stuck():
    r = replay_file("l1_api_key_401")
    assert polls(r, "gpu-light", "api-key-mismatch") == [1]
    assert polls(r, "gpu-light", "model-stuck", "pending") == []  # a restart cannot fix a key
    assert polls(r, "gpu-light", "api-key-mismatch", "resolved") == [6]


def test_rule1_one_hot_poll_never_fires():
    r = replay_file("rule1_one_hot_poll")
    assert r.fired == [] and r.open_at_end == []


def test_rule2_vram_leak_gpu_light_fires_after_the_window():
    r = replay_file("rule2_vram_leak_gpu_light")
    assert polls(r, "gpu-light", "vram-leak") == [345]
    assert replay_file("rule2_250_mb_per_hour_on_300").timeline == []


def test_incidents_dead_host_and_monitor_outage():
    r = replay_file("rule6_rule7_dead_host_and_monitor_outage")
    assert polls(r, "strix-moe", "host-unreachable") == [4]  # refused from poll 2: the 3rd refused poll
    assert polls(r, "fleet", "data-source-unreachable") == [7]
    assert polls(r, "fleet", "data-source-unreachable", "resolved") == [9]


def test_l5_one_oversized_poll_is_not_an_issue():
    r = replay_file("l5_one_oversized_monitor_poll")
    assert r.fired == [] and r.open_at_end == []


# --------------------------------------------------------------------------- cron = replay

CRON_TRACES = [n for n in ALL_TRACES if not n.startswith("rule2_")]


@pytest.mark.parametrize("name", CRON_TRACES)
def test_check_by_cron_gives_the_same_timeline_as_replay(name, tmp_path):
    """One StateDir session per poll (as cron runs `gpuheal check` every minute); the transitions the
    engine logged in the issue book equal replay's timeline, poll for poll."""
    observations, _ = read_trace(TRACES / f"{name}.jsonl")
    state = tmp_path / "state"
    statuses = []
    for obs in observations:
        with StateDir(state, 1.0) as store:
            result = check.run(CFG, store, obs.at, obs=obs)
            statuses.append(result.health["status"])
    with StateDir(state, 1.0) as store:
        logged = book_file.log_lines(store)
    cron = [[t["at"], t["gpu"], t["issue"], t["event"]] for t in logged]
    replayed = replay(CFG, observations)
    assert cron == [[t["at"], t["gpu"], t["issue"], t["event"]] for t in replayed.timeline]
    assert len(statuses) == len(observations)


@pytest.mark.parametrize("name", CRON_TRACES)
def test_check_by_cron_under_a_cron_like_clock_gives_the_whole_second_timeline(name, tmp_path):
    """cron's real path (history packed to disk and read back each poll) at a jittered clock."""
    observations, _ = read_trace(TRACES / f"{name}.jsonl")
    jittered = cron_clock(observations, 0)
    poll_of = {obs.at.strftime("%Y-%m-%dT%H:%M:%SZ"): i for i, obs in enumerate(jittered)}
    state = tmp_path / "state"
    for obs in jittered:
        with StateDir(state, 1.0) as store:
            check.run(CFG, store, obs.at, obs=obs)
    with StateDir(state, 1.0) as store:
        logged = book_file.log_lines(store)
    cron = [(poll_of[t["at"]], t["gpu"], t["issue"], t["event"]) for t in logged]
    assert cron == timing(replay(CFG, observations))


def test_check_writes_the_public_trend_and_breaker_files(tmp_path):
    opened = START - timedelta(minutes=3)
    trace = fleet_trace(CFG, {"gpu-light": {"vram_used_mb": "10000+10x20", "breaker": "1x20",
                                            "breaker_opened_at": opened}})
    for obs in trace:
        with StateDir(tmp_path / "s", 1.0) as store:
            result = check.run(CFG, store, obs.at, obs=obs)
    trend = json.loads((tmp_path / "s" / files.VRAM_TREND).read_text())
    assert trend["schema_version"] == 1
    light = trend["gpu-light"]
    assert set(light) == {"gpu", "current_mb", "rate_mb_per_hour", "projected_full_in_hours", "samples", "span_h"}
    assert light["rate_mb_per_hour"] == 600.0 and light["samples"] == 21 and light["current_mb"] == 10200
    breakers = json.loads((tmp_path / "s" / files.CIRCUIT_BREAKER_STATUS).read_text())
    assert breakers["gpu-light"] == {"gpu": "gpu-light", "open": True, "auto_reset_attempted": False,
                                     "last_reset": None, "opened_at": "2026-07-18T07:57:00Z"}
    assert breakers["gpu-dense"]["open"] is False
    assert [(i.issue, i.state) for i in result.issues] == [("circuit-breaker-stuck", "firing")]
    assert result.health["status"] == "degraded"


def test_heal_restart_mutes_the_gpu_during_the_startup_grace(tmp_path):
    trace = fleet_trace(CFG, {"strix-moe": {"endpoint": "refused*6"}})
    with StateDir(tmp_path / "s", 1.0) as store:
        store.write(files.HEAL, {"restarts": {"strix-moe": [trace[1].at.timestamp()]}, "paused": {}})
    events = []
    for obs in trace:
        with StateDir(tmp_path / "s", 1.0) as store:
            ev = check.run(CFG, store, obs.at, obs=obs).evaluation
            events += [(t["at"], t["event"]) for t in ev.transitions if t["issue"] == "host-unreachable"]
            assert ev.muted == (["strix-moe"] if obs.at in (trace[1].at, trace[2].at) else [])
    # polls 1-2 muted (grace 120 s): the hold counts polls 0, 3, 4 → fires at poll 4
    assert events == [("2026-07-18T08:00:00Z", "pending"), ("2026-07-18T08:04:00Z", "firing")]


# --------------------------------------------------------------------------- bad input


def write(tmp_path, lines: list[str], final_newline: bool = True) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    return path


def good_lines(n: int = 3, **series) -> list[str]:
    return [json.dumps(o.to_dict()) for o in fleet_trace(CFG, series or None, n=n)]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"monitor_ok": true, "gpus": {}}', "no 'at'"),
        ('{"at": "yesterday", "monitor_ok": true, "gpus": {}}', "not an observation"),
        ('{"at": "2026-07-18T09:00:00Z", "gpus": {}}', "monitor_ok"),
        ('{"at": "2026-07-18T09:00:00Z", "monitor_ok": true, "gpus": []}', "'gpus'"),
        ('{"at": "2026-07-18T09:00:00Z", "monitor_ok": true, "gpus": {"gpu-dense": {"temp_c": "hot"}}}', "gpus.gpu-dense.temp_c"),
        ('{"at": "2026-07-18T09:00:00Z", "monitor_ok": true, "gpus": {"gpu-dense": {"temp_c": NaN}}}', "not JSON"),
        ('{"at": "2026-07-18T09:00:00Z", "monitor_ok": true, "gpus": {"gpu-dense": {"temp_c": -5}}}', "temp_c"),
        ('{"at": "2026-07-18T09:00:00Z", "monitor_ok": true, "gpus": {"gpu-dense": {"endpoint": 200}}}', "endpoint"),
        ('{"at": "2026-07-18T09:00:00Z", "monitor_ok": true, "gpus": {"gpu-dense": {"breaker": true}}}', "breaker"),
        ('{"at": "2026-07-18T09:00:00Z", "monitor_ok": true, "gpus": {"gpu-dense": 7}}', "not an object"),
    ],
)
def test_a_bad_line_is_one_error_naming_its_line(tmp_path, bad, message):
    lines = good_lines(2)
    path = write(tmp_path, [lines[0], "", bad, lines[1]])
    with pytest.raises(GpuhealError) as err:
        read_trace(path)
    assert "line 3" in str(err.value) and message in str(err.value) and "\n" not in str(err.value)


def test_an_incomplete_last_line_is_skipped_with_a_warning(tmp_path):
    lines = good_lines(3)
    path = write(tmp_path, [*lines[:2], lines[2][:40]], final_newline=False)
    observations, warnings = read_trace(path)
    assert len(observations) == 2 and "line 3" in warnings[0] and "incomplete" in warnings[0]


def test_none_fields_and_missing_gpus_are_no_data(tmp_path):
    lines = good_lines(3)
    sparse = json.loads(lines[1])
    sparse["gpus"] = {"gpu-dense": {"temp_c": None, "endpoint": None}}  # two GPUs missing, None fields
    path = write(tmp_path, [lines[0], json.dumps(sparse), lines[2]])
    observations, warnings = read_trace(path)
    assert warnings == [] and set(observations[1].gpus) == {"gpu-dense"}
    result = replay(CFG, observations)
    assert result.timeline == []


def test_hot_gpu_missing_from_a_poll_keeps_its_hold(tmp_path):
    lines = [json.loads(x) for x in good_lines(3, **{"gpu-dense": {"temp_c": "90 90 90"}})]
    del lines[1]["gpus"]["gpu-dense"]
    result = replay(CFG, read_trace(write(tmp_path, [json.dumps(x) for x in lines]))[0])
    assert polls(result, "gpu-dense", "thermal-critical") == [2]


def test_unknown_alias_is_ignored_with_one_warning(tmp_path):
    lines = [json.loads(x) for x in good_lines(3)]
    for line in lines:
        line["gpus"]["gpu-ghost"] = {"temp_c": 99.0, "endpoint": "refused"}
    result = replay(CFG, read_trace(write(tmp_path, [json.dumps(x) for x in lines]))[0])
    assert result.warnings == ["trace GPU 'gpu-ghost' is not in the config; ignored"]
    assert result.timeline == []


def test_out_of_order_observation_is_skipped_with_a_warning(tmp_path):
    lines = good_lines(3)
    observations, warnings = read_trace(write(tmp_path, [lines[0], lines[2], lines[1]]))
    assert len(observations) == 2 and "line 3" in warnings[0] and "not after" in warnings[0]


def test_empty_or_missing_trace_cannot_run(tmp_path):
    with pytest.raises(GpuhealError, match="no observations"):
        read_trace(write(tmp_path, ["", "  "]))
    with pytest.raises(GpuhealError, match="not found"):
        read_trace(tmp_path / "nope.jsonl")


# --------------------------------------------------------------------------- the real CLI


def test_cli_replay_json_is_the_same_timeline_and_touches_no_state(tmp_path):
    state = tmp_path / "state"
    trace = TRACES / "rule1_rule8_demo_ramp.jsonl"
    proc = run_gpuheal("--config", str(TRACES / "fleet.json"), "--state-dir", str(state), "replay", str(trace), "--json",
                       env={"GPUHEAL_NOW": "2030-01-01T00:00:00Z"})
    assert proc.returncode == 1, proc.stderr  # something fired
    doc = json.loads(proc.stdout)
    expected = replay_file("rule1_rule8_demo_ramp")
    assert [[t["poll"], t["at"], t["gpu"], t["issue"], t["event"]] for t in doc["timeline"]] == compact(expected)["timeline"]
    assert doc["polls"] == 17 and doc["fired"] == 3 and doc["start"] == "2026-07-18T08:00:00Z"
    assert doc["open_at_end"] == [] and doc["resolved"] == 3
    assert not state.exists()
    assert proc.stderr == ""


def test_cli_replay_exit_0_when_nothing_fired_and_human_output(tmp_path):
    proc = run_gpuheal("--config", str(TRACES / "fleet.json"), "--state-dir", str(tmp_path / "s"), "replay",
                       str(TRACES / "rule1_one_hot_poll.jsonl"))
    assert proc.returncode == 0, proc.stderr
    assert "PENDING" in proc.stdout and "thermal-critical" in proc.stdout and "fired: 0" in proc.stdout
    proc = run_gpuheal("--config", str(TRACES / "fleet.json"), "replay", str(TRACES / "l1_api_key_401.jsonl"))
    assert proc.returncode == 1 and "FIRING" in proc.stdout and "api-key-mismatch" in proc.stdout


def test_cli_replay_bad_trace_exits_3_with_one_line(tmp_path):
    path = write(tmp_path, [good_lines(1)[0], "garbage"])
    proc = run_gpuheal("--config", str(TRACES / "fleet.json"), "replay", str(path), "--json")
    assert proc.returncode == 3 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "line 2" in proc.stderr
