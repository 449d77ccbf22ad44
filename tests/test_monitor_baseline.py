"""gpu-monitor's ``baseline_tok_s`` (issue 27 item 14; contract "gpu-monitor /gpu-data", "Rule 4"; the
spec's "current baselines live in gpu-monitor"): read from its ``benchmarks`` entry, kept in
``bench-results.json``, Rule 4's seed when the config has none (the configured one wins when both are
there, the rolling 30-day average over both once a week of results exists), a ``doctor`` warning when
the two differ by more than 10 %. Bad input is not known, never zero. Unit tests, then the simulated
fleet over real HTTP on loopback."""

from __future__ import annotations

import math

import pytest

from gpuheal import benchdata
from gpuheal.config import load_config_dict
from gpuheal.doctor import OK, SKIP, WARN, checks
from gpuheal.parse.gpu_data import parse_gpu_data

try:
    from tests.lab import Lab, scenario
except ImportError:
    from lab import Lab, scenario

DAY_S = 86400.0
BAD = [math.nan, math.inf, -74.8, "74.8", 10**400, 1e7, 1e-320, 0.001, True, [74.8], {"v": 1}]


def doc_with(baseline) -> dict:
    entry = {"current_tok_s": 74.9}
    if baseline is not ...:
        entry["baseline_tok_s"] = baseline
    return {"gpus": [{"hostname": "ct8", "temp_c": 50}], "benchmarks": {"ct8": entry}}


# --------------------------------------------------------------------------- parsing


def test_the_benchmarks_entry_gives_its_baseline():
    doc = parse_gpu_data(doc_with(74.8))
    assert doc.bench_baselines == {"ct8": 74.8} and doc.problems == []
    assert doc.benchmarks["ct8"][0] == 74.9  # the reading it came with is unchanged


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_bad_baseline_is_not_known_and_named(bad):
    doc = parse_gpu_data(doc_with(bad))
    assert doc.bench_baselines["ct8"] is None
    assert any("benchmarks.ct8.baseline_tok_s" in p for p in doc.problems)


@pytest.mark.parametrize("absent", [..., None, 0])
def test_an_absent_or_zero_baseline_is_not_known_without_a_fault(absent):
    doc = parse_gpu_data(doc_with(absent))
    assert doc.bench_baselines["ct8"] is None and doc.problems == []


# --------------------------------------------------------------------------- benchdata


def test_the_configured_baseline_wins_then_gpu_monitor_then_none():
    data = benchdata.empty()
    assert benchdata.baseline(data, "g", None) == (None, "config")
    assert benchdata.note_monitor_baseline(data, "g", 60.0, 100.0) is True
    assert benchdata.baseline(data, "g", None) == (60.0, "monitor")
    assert benchdata.baseline(data, "g", 74.8) == (74.8, "config")
    data["baselines"]["g"] = {"baseline_tok_s": 70.0, "source": "rolling-30d", "computed_at": 0, "n": 30}
    assert benchdata.baseline(data, "g", 74.8) == (70.0, "rolling-30d")
    assert benchdata.baseline(data, "g", None) == (70.0, "rolling-30d")


@pytest.mark.parametrize("bad", [*BAD, 0, None, -0.0], ids=repr)
def test_a_bad_monitor_baseline_changes_nothing(bad):
    data = benchdata.empty()
    benchdata.note_monitor_baseline(data, "g", 60.0, 100.0)
    assert benchdata.note_monitor_baseline(data, "g", bad, 200.0) is False
    assert data["monitor_baselines"]["g"] == {"baseline_tok_s": 60.0, "seen_at": 100.0}
    assert benchdata.baseline(data, "h", None) == (None, "config")
    assert benchdata.note_monitor_baseline(data, "h", bad, 200.0) is False and "h" not in data["monitor_baselines"]


def test_an_unchanged_baseline_is_not_rewritten_a_new_one_is():
    data = benchdata.empty()
    assert benchdata.note_monitor_baseline(data, "g", 60.0, 100.0) is True
    assert benchdata.note_monitor_baseline(data, "g", 60.0, 160.0) is False
    assert benchdata.note_monitor_baseline(data, "g", 61.5, 220.0) is True
    assert data["monitor_baselines"]["g"] == {"baseline_tok_s": 61.5, "seen_at": 220.0}


def test_a_damaged_file_keeps_only_good_monitor_baselines():
    raw = {"results": {}, "baselines": {}, "monitor_baselines": {
        "a": {"baseline_tok_s": 70.0, "seen_at": 1.0}, "b": {"baseline_tok_s": "70"}, "c": 5,
        "d": {"baseline_tok_s": -1}, "e": {"baseline_tok_s": 10**400}}}
    data = benchdata.normalise(raw)
    assert list(data["monitor_baselines"]) == ["a"]
    assert benchdata.normalise({"monitor_baselines": "junk"})["monitor_baselines"] == {}
    # an old file without the key reads as before
    old = benchdata.normalise({"results": {}, "baselines": {}})
    assert benchdata.baseline(old, "a", None) == (None, "config")


def test_the_rolling_baseline_records_the_monitor_seed_and_prune_forgets_a_removed_gpu():
    data = benchdata.empty()
    benchdata.note_monitor_baseline(data, "g", 60.0, 0.0)
    benchdata.note_monitor_baseline(data, "gone", 50.0, 0.0)
    for i in range(8):
        benchdata.add_result(data, "g", {"at": i * DAY_S, "gen_tok_s": 58.0, "ok": True})
    benchdata.recompute_baseline(data, "g", 7 * DAY_S + 1, None)
    assert data["baselines"]["g"]["seed_tok_s"] == 60.0 and data["baselines"]["g"]["baseline_tok_s"] == 58.0
    benchdata.prune(data, 7 * DAY_S, 35, aliases=("g",))
    assert "gone" not in data["monitor_baselines"]


def test_check_keeps_gpu_monitor_baseline_from_the_poll():
    from datetime import UTC, datetime

    from gpuheal.core.engine import new_book
    from gpuheal.core.view import NO_RESTARTS, FleetView
    from gpuheal.model import GpuSample, Observation
    from gpuheal.rules.benchmark_regression.monitor import ingest
    from gpuheal.state.history import History

    cfg = load_config_dict({"gpus": [{"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:9"},
                                     {"alias": "b", "host": "h2", "endpoint": "http://127.0.0.1:9"}]})
    at = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
    obs = Observation(at, {"a": GpuSample(bench_baseline_tok_s=61.0), "b": GpuSample()}, True)
    bench = benchdata.empty()
    book = new_book()
    view = FleetView(cfg, at.timestamp(), obs, History(), bench, book.memory, NO_RESTARTS)
    assert ingest(bench, view, book.issues.values()) is True
    assert bench["monitor_baselines"] == {"a": {"baseline_tok_s": 61.0, "seen_at": at.timestamp()}}
    assert ingest(bench, view, book.issues.values()) is False  # unchanged: no rewrite


# --------------------------------------------------------------------------- doctor (pure part)


def _cfg(*gpus):
    return load_config_dict({"gpus": [{"endpoint": "http://127.0.0.1:9", **g} for g in gpus]})


def test_doctor_warns_past_ten_percent_with_a_fix_and_says_which_wins():
    cfg = _cfg({"alias": "far", "host": "h1", "baseline_tok_s": 74.8},
               {"alias": "near", "host": "h2", "baseline_tok_s": 74.8},
               {"alias": "edge", "host": "h3", "baseline_tok_s": 100.0},
               {"alias": "mon-only", "host": "h4"},
               {"alias": "cfg-only", "host": "h5", "baseline_tok_s": 70.0},
               {"alias": "neither", "host": "h6"})
    rows = {r.target: r for r in checks.baseline_rows(
        cfg, {"h1": 60.0, "h2": 80.0, "h3": 110.0, "h4": 65.0, "h5": None})}
    far = rows["far"]
    assert far.status == WARN and "74.8" in far.detail and "60" in far.detail and "-19.8 %" in far.detail
    assert "uses the configured one" in far.detail and "gpus[].baseline_tok_s of far" in far.fix
    assert rows["near"].status == OK and rows["edge"].status == OK  # 10 % exactly is within
    assert rows["mon-only"].status == OK and "gpu-monitor's 65 tok/s seeds Rule 4" in rows["mon-only"].detail
    assert rows["cfg-only"].status == OK and rows["neither"].status == SKIP


def test_doctor_does_not_compare_a_host_several_gpus_share():
    cfg = _cfg({"alias": "a", "host": "h1", "gpu_index": 0, "baseline_tok_s": 74.8},
               {"alias": "b", "host": "h1", "gpu_index": 1, "baseline_tok_s": 74.8})
    rows = checks.baseline_rows(cfg, {"h1": 10.0})
    assert [r.status for r in rows] == [OK, OK] and all("gives none" in r.detail for r in rows)


# --------------------------------------------------------------------------- the simulated fleet


@pytest.fixture
def lab(tmp_path):
    """Three simulated GPUs whose gpu-monitor gives a baseline of 75 tok/s each; the config gives
    gpu-mon none, gpu-far 90 (20 % off) and gpu-same 75. gpu-mon really runs at 50 tok/s."""
    lab = Lab(tmp_path, scenario([
        {"alias": "gpu-mon", "host": "ct8", "tok_s": 50.0},
        {"alias": "gpu-far", "host": "ct110", "tok_s": 75.0},
        {"alias": "gpu-same", "host": "ct15", "tok_s": 75.0},
    ]))
    del lab.gpu_raw("gpu-mon")["baseline_tok_s"]
    lab.gpu_raw("gpu-far")["baseline_tok_s"] = 90.0
    lab.gpu_raw("gpu-same")["baseline_tok_s"] = 75.0
    lab.write_config()
    yield lab
    lab.close()


def test_doctor_on_the_sim_fleet_warns_about_the_baseline_that_differs(lab):
    rows = checks.baseline_checks(lab.cfg)
    by = {r.target: r for r in rows}
    assert by["gpu-far"].status == WARN and "-16.7 %" in by["gpu-far"].detail
    assert "90" in by["gpu-far"].detail and "75" in by["gpu-far"].detail and by["gpu-far"].fix
    assert by["gpu-mon"].status == OK and "gpu-monitor's 75 tok/s seeds Rule 4" in by["gpu-mon"].detail
    assert by["gpu-same"].status == OK


def test_doctor_with_a_garbage_monitor_baseline_compares_nothing_and_keeps_the_configured(lab):
    lab.fleet.apply({"gpu": "fleet", "monitor": "invalid"})  # strings, NaN, negatives (sim/servers.py _corrupt)
    by = {r.target: r for r in checks.baseline_checks(lab.cfg)}
    assert by["gpu-far"].status == OK and "gpu-monitor gives none" in by["gpu-far"].detail
    assert by["gpu-mon"].status == SKIP


def test_rule4_judges_a_gpu_without_a_configured_baseline_against_gpu_monitors(lab):
    """One check poll keeps gpu-monitor's baselines; then three slow benchmarks of gpu-mon (50 tok/s
    against gpu-monitor's 75) are Rule 4's regression; the report shows where the baseline came from."""
    from gpuheal.runtime import Runtime
    from gpuheal.state import files
    from gpuheal.state.store import StateDir
    from gpuheal.steps import bench, report

    lab.check()
    kept = lab.read(files.BENCH)["monitor_baselines"]
    assert {a: b["baseline_tok_s"] for a, b in kept.items()} == {"gpu-mon": 75.0, "gpu-far": 75.0, "gpu-same": 75.0}
    for _ in range(3):
        lab.fleet.advance(3600)
        with StateDir(lab.state_dir) as store:
            res = bench.command(Runtime(cfg=lab.cfg, state_dir=lab.state_dir, now=lab.fleet.now()), store,
                                gpu="gpu-mon")
    [issue] = [i for i in res.document["issues"] if i["issue"] == "benchmark-regression"]
    assert issue["gpu"] == "gpu-mon"
    assert issue["detected"]["baseline_tok_s"] == 75.0 and issue["detected"]["baseline_source"] == "monitor"
    with StateDir(lab.state_dir) as store:
        summary = report.command(Runtime(cfg=lab.cfg, state_dir=lab.state_dir, now=lab.fleet.now()), store).document
    gpus = summary["gpus"]
    assert (gpus["gpu-mon"]["baseline_tok_s"], gpus["gpu-mon"]["baseline_source"]) == (75.0, "monitor")
    assert (gpus["gpu-far"]["baseline_tok_s"], gpus["gpu-far"]["baseline_source"]) == (90.0, "config")


def test_the_weekly_report_names_gpu_monitor_as_the_seed():
    from datetime import UTC, datetime

    from gpuheal.render import weekly

    now = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
    data = benchdata.empty()
    benchdata.note_monitor_baseline(data, "gpu-mon", 75.0, now.timestamp() - DAY_S)
    benchdata.add_result(data, "gpu-mon", {"at": now.timestamp() - 3600, "gen_tok_s": 74.0, "ok": True})
    doc = weekly.build(["gpu-mon", "gpu-cfg"], {"gpu-mon": None, "gpu-cfg": 70.0}, data, [], now)
    row = doc["gpus"][0]
    assert (row["baseline_tok_s"], row["baseline_source"]) == (75.0, "monitor")
    assert "gpu-mon seeded from gpu-monitor" in weekly.markdown(doc, limit=10_000)
