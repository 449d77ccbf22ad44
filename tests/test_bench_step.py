"""``gpuheal bench`` as a step: GPUs one at a time, a dead one among live ones, L1/L2, exclusions,
Rule 4 state in ``benchmark-regression.json``, and the exit code. Real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from test_bench_fakes import (
    HANG,
    LOADING,
    FakeLlama,
    Reply,
    completion_body,
    dead_endpoint,
    timings,
)

from gpuheal import benchdata
from gpuheal.config import load_config_dict
from gpuheal.core.engine import Evaluation
from gpuheal.core.issue import Issue
from gpuheal.errors import GpuhealError
from gpuheal.runtime import Runtime
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import bench as step

T0 = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)


@pytest.fixture
def evaluate():
    """The rules engine's bench evaluation, which ``bench`` calls after recording."""
    import gpuheal.steps.evaluate as ev

    return ev


@pytest.fixture
def fakes():
    made = []

    def make(routes=None, **kw):
        srv = FakeLlama(routes, **kw)
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.stop()


def config(endpoints: dict[str, str], **extra):
    gpus = []
    for i, (alias, url) in enumerate(endpoints.items()):
        gpus.append({"alias": alias, "host": f"h{i}", "endpoint": url, "baseline_tok_s": 74.8})
    raw = {
        "litellm": {"api_key": "not-needed"},
        "bench": {"n_predict": 16, "timeout_s": 2, "warmup": True, "keep_days": 35},
        "gpus": gpus,
    }
    for key, value in extra.items():
        if key == "gpu_overrides":
            for alias, over in value.items():
                next(g for g in gpus if g["alias"] == alias).update(over)
        else:
            raw.setdefault(key, {}).update(value)
    return load_config_dict(raw)


def run_bench(cfg, state_dir, now=T0, gpu=None):
    rt = Runtime(cfg=cfg, state_dir=state_dir, now=now, json_out=True)
    with StateDir(state_dir) as store:
        return step.command(rt, store, gpu=gpu)


def speed_routes(gen: float):
    return {"POST /completion": Reply(200, completion_body(16, timings(16, gen=gen)))}


# ----------------------------------------------------------------------------- the fleet


def test_one_dead_gpu_while_others_are_benchmarked_one_at_a_time(tmp_path, fakes, evaluate):
    a = fakes({"POST /completion": Reply(200, completion_body(16, timings(16)), delay_s=0.05)})
    b = fakes({"POST /completion": Reply(200, completion_body(16, timings(16, gen=160.0)), delay_s=0.05)})
    cfg = config({"gpu-dense": a.url, "gpu-dead": dead_endpoint(), "gpu-light": b.url})
    res = run_bench(cfg, tmp_path)
    doc = res.document
    by = {r["gpu"]: r for r in doc["results"]}
    assert list(by) == ["gpu-dense", "gpu-dead", "gpu-light"]
    assert by["gpu-dense"]["ok"] and by["gpu-dense"]["gen_tok_s"] == pytest.approx(74.9)
    assert by["gpu-light"]["ok"] and by["gpu-light"]["gen_tok_s"] == pytest.approx(160.0)
    assert not by["gpu-dead"]["ok"] and by["gpu-dead"]["error"] == "refused"
    for r in doc["results"]:
        assert set(r) >= {"gpu", "gen_tok_s", "prompt_tok_s", "ok", "error", "tokens", "model", "n_ctx", "excluded"}
    assert by["gpu-dense"]["n_ctx"] == 131072
    assert res.exit_code == 0
    # never concurrently: every request to b started after the last one to a had ended
    assert max(s.ended for s in a.requests()) <= min(s.started for s in b.requests())
    json.dumps(doc, allow_nan=False)


def test_results_are_recorded(tmp_path, fakes, evaluate):
    a = fakes()
    cfg = config({"gpu-dense": a.url})
    run_bench(cfg, tmp_path)
    with StateDir(tmp_path) as store:
        data = benchdata.normalise(store.read(files.BENCH))
    (rec,) = data["results"]["gpu-dense"]
    assert rec["at"] == T0.timestamp() and rec["ok"] and rec["source"] == "bench"
    assert rec["gen_tok_s"] == pytest.approx(74.9) and rec["prompt_tok_s"] == pytest.approx(812.5)
    assert rec["tokens"] == 32 and rec["n_ctx"] == 131072 and rec["model"].endswith(".gguf")
    assert rec["excluded"] is False and rec["excluded_reason"] is None


def test_gpu_option_and_unknown_alias(tmp_path, fakes, evaluate):
    a, b = fakes(), fakes()
    cfg = config({"gpu-dense": a.url, "gpu-light": b.url})
    res = run_bench(cfg, tmp_path, gpu="gpu-light")
    assert [r["gpu"] for r in res.document["results"]] == ["gpu-light"]
    assert a.requests() == []
    with pytest.raises(GpuhealError) as err:
        run_bench(cfg, tmp_path, gpu="gpu-nope")
    assert "gpu-nope" in str(err.value) and "gpu-dense, gpu-light" in str(err.value)


def test_paused_gpu_is_skipped_unless_named(tmp_path, fakes, evaluate):
    a, b = fakes(), fakes()
    cfg = config({"gpu-dense": a.url, "gpu-light": b.url}, gpu_overrides={"gpu-light": {"paused": True}})
    doc = run_bench(cfg, tmp_path).document
    assert [r["gpu"] for r in doc["results"]] == ["gpu-dense"]
    assert doc["skipped"] == [{"gpu": "gpu-light", "reason": "paused"}]
    assert b.requests() == []
    doc = run_bench(cfg, tmp_path, now=T0 + timedelta(hours=1), gpu="gpu-light").document
    assert [r["gpu"] for r in doc["results"]] == ["gpu-light"]


# ----------------------------------------------------------------------------- L1 / L2


def test_rejected_key_is_reported_once_not_retried_and_bench_moves_on(tmp_path, fakes, evaluate):
    strict = fakes(require_key="sk-loc-secret-5678")
    ok = fakes()
    cfg = config({"gpu-light": strict.url, "gpu-dense": ok.url})
    res = run_bench(cfg, tmp_path)
    doc = res.document
    assert res.exit_code == 1
    assert len(strict.requests()) == 1  # L2: no retry of any kind
    by = {r["gpu"]: r for r in doc["results"]}
    assert by["gpu-light"]["error"] == "unauthorized" and by["gpu-light"]["key_sent"] == "not-needed"
    assert by["gpu-dense"]["ok"]
    issues = [i for i in doc["issues"] if i["issue"] == "api-key-mismatch"]
    assert len(issues) == 1
    issue = issues[0]
    assert issue["gpu"] == "gpu-light" and issue["severity"] == "critical"
    assert issue["detected"]["key_sent"] == "not-needed"
    alerts = doc["regressions"]["gpu-light"]["alerts"]
    assert [a["issue"] for a in alerts] == ["api-key-mismatch"]


def test_a_real_secret_is_never_written_anywhere(tmp_path, fakes, evaluate):
    secret = "sk-loc-abcdef-5678"
    strict = fakes(require_key="something-else")
    cfg = load_config_dict(
        {
            "litellm": {"api_key": secret},
            "bench": {"n_predict": 8, "timeout_s": 2},
            "gpus": [{"alias": "gpu-light", "host": "ct110", "endpoint": strict.url}],
        }
    )
    res = run_bench(cfg, tmp_path)
    text = json.dumps(res.document, ensure_ascii=False)
    assert secret not in text and "sk-…(18 chars)" in text
    for path in tmp_path.iterdir():
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path.name


def test_rules_engine_issue_wins_and_gets_the_key(tmp_path, fakes, evaluate, monkeypatch):
    strict = fakes(require_key="x-other-key")
    cfg = config({"gpu-light": strict.url})
    engine_issue = {
        "gpu": "gpu-light",
        "issue": "api-key-mismatch",
        "severity": "critical",
        "state": "firing",
        "since": "2026-07-18T07:00:00Z",
        "detected": {"status": 401},
    }
    monkeypatch.setattr(evaluate, "evaluate_bench_full", lambda cfg, store, now, *verdicts: Evaluation(issues=[Issue.from_json(engine_issue)]))
    doc = run_bench(cfg, tmp_path).document
    (issue,) = doc["issues"]
    assert issue["since"] == "2026-07-18T07:00:00Z"
    assert issue["detected"]["key_sent"] == "not-needed"


# ----------------------------------------------------------------------------- loading / hang


def test_loading_is_recorded_but_not_a_sample(tmp_path, fakes, evaluate):
    srv = fakes({"GET /props": Reply(503, LOADING)})
    cfg = config({"gpu-dense": srv.url})
    res = run_bench(cfg, tmp_path)
    (r,) = res.document["results"]
    assert r["error"] == "loading" and not r["ok"] and r["gen_tok_s"] is None
    assert res.exit_code == 0
    assert res.document["regressions"]["gpu-dense"]["trend"] == "unknown"


def test_a_hanging_gpu_costs_one_deadline(tmp_path, fakes, evaluate):
    import time

    hung = fakes({"GET /props": HANG})
    ok = fakes()
    cfg = config({"gpu-hung": hung.url, "gpu-dense": ok.url}, bench={"timeout_s": 0.5})
    started = time.monotonic()
    doc = run_bench(cfg, tmp_path).document
    assert time.monotonic() - started < 3
    assert [r["error"] for r in doc["results"]] == ["timeout", None]


# ----------------------------------------------------------------------------- exclusions


def write_health(tmp_path, issues):
    """Open issues as the engine's book holds them (what ``check``/``heal``/``bench`` update)."""
    from gpuheal.core.engine import new_book

    book = new_book().to_json()  # the on-disk shape
    for i in issues:
        rec = {"state": "firing", "since": "2026-07-18T07:00:00Z", "since_s": 0.0, "hits": 2, **i}
        book["issues"][f"{i['gpu']}|{i['issue']}"] = rec
    with StateDir(tmp_path) as store:
        store.write(files.ISSUES, book)


def test_result_during_an_open_incident_is_excluded(tmp_path, fakes, evaluate):
    srv = fakes()
    cfg = config({"gpu-dense": srv.url, "gpu-light": fakes().url})
    write_health(
        tmp_path,
        [
            {"gpu": "gpu-dense", "issue": "thermal-critical", "severity": "critical", "state": "firing"},
            {"gpu": "gpu-light", "issue": "context-window", "severity": "info", "state": "firing"},
            {"gpu": "gpu-light", "issue": "vram-leak", "severity": "warning", "state": "pending"},
        ],
    )
    doc = run_bench(cfg, tmp_path).document
    by = {r["gpu"]: r for r in doc["results"]}
    assert by["gpu-dense"]["excluded"] and by["gpu-dense"]["excluded_reason"] == "incident: thermal-critical"
    assert not by["gpu-light"]["excluded"]  # info and pending issues are not incidents


def test_fleet_cooling_incident_excludes_every_gpu(tmp_path, fakes, evaluate):
    cfg = config({"gpu-dense": fakes().url})
    write_health(tmp_path, [{"gpu": "fleet", "issue": "cooling-infrastructure", "severity": "critical"}])
    (r,) = run_bench(cfg, tmp_path).document["results"]
    assert r["excluded"]


def test_damaged_health_and_heal_files_do_not_crash(tmp_path, fakes, evaluate):
    cfg = config({"gpu-dense": fakes().url})
    (tmp_path / files.GPU_HEALTH).write_text('{"issues": [1, {"gpu": "gpu-dense"}, {"issue": 5}]}')
    (tmp_path / files.HEAL).write_text('{"schema_version": 1, "data": {"restarts": {"gpu-dense": ["x", true, null]}}}')
    (r,) = run_bench(cfg, tmp_path).document["results"]
    assert r["ok"] and not r["excluded"]


def test_result_inside_startup_grace_is_excluded(tmp_path, fakes, evaluate):
    cfg = config({"gpu-dense": fakes().url, "gpu-light": fakes().url}, heal={"startup_grace_s": 120})
    with StateDir(tmp_path) as store:
        store.write(
            files.HEAL,
            {"restarts": {"gpu-dense": [T0.timestamp() - 3600, T0.timestamp() - 45], "gpu-light": [T0.timestamp() - 600]}},
        )
    doc = run_bench(cfg, tmp_path).document
    by = {r["gpu"]: r for r in doc["results"]}
    assert by["gpu-dense"]["excluded"] and by["gpu-dense"]["excluded_reason"].startswith("startup-grace")
    assert not by["gpu-light"]["excluded"]


# ----------------------------------------------------------------------------- Rule 4


def test_regression_only_after_three_slow_runs_and_recovery_within_ten_percent(tmp_path, fakes, evaluate):
    slow = speed_routes(50.0)
    srv = fakes(slow)
    cfg = config({"gpu-dense": srv.url})
    codes, trends = [], []
    for i in range(3):
        res = run_bench(cfg, tmp_path, now=T0 + timedelta(hours=i))
        codes.append(res.exit_code)
        trends.append(res.document["regressions"]["gpu-dense"]["trend"])
    assert codes == [0, 0, 1]
    assert trends == ["stable", "stable", "regressing"]
    doc = res.document
    assert any(i["issue"] == "benchmark-regression" and i["gpu"] == "gpu-dense" for i in doc["issues"])
    # 85 % of baseline: better, but not recovered (needs within 10 %)
    srv.routes.update(speed_routes(74.8 * 0.85))
    res = run_bench(cfg, tmp_path, now=T0 + timedelta(hours=3))
    assert res.document["regressions"]["gpu-dense"]["trend"] == "regressing"
    srv.routes.update(speed_routes(74.8 * 0.95))
    res = run_bench(cfg, tmp_path, now=T0 + timedelta(hours=4))
    assert res.document["regressions"]["gpu-dense"]["trend"] == "stable"
    assert res.exit_code == 0


def test_one_slow_run_among_fast_ones_never_alerts(tmp_path, fakes, evaluate):
    srv = fakes(speed_routes(75.0))
    cfg = config({"gpu-dense": srv.url})
    speeds = [75.0, 40.0, 75.0, 40.0, 40.0, 76.0]
    for i, gen in enumerate(speeds):
        srv.routes.update(speed_routes(gen))
        res = run_bench(cfg, tmp_path, now=T0 + timedelta(hours=i))
        assert res.document["regressions"]["gpu-dense"]["trend"] != "regressing"
        assert res.exit_code == 0


def test_benchmark_regression_file_shape(tmp_path, fakes, evaluate):
    cfg = config({"gpu-dense": fakes().url, "gpu-light": dead_endpoint()})
    run_bench(cfg, tmp_path)
    doc = json.loads((tmp_path / files.BENCHMARK_REGRESSION).read_text())
    assert doc["schema_version"] == 1
    dense = doc["gpu-dense"]
    assert dense == {
        "gpu": "gpu-dense",
        "baseline_tok_sec": 74.8,
        "current_tok_sec": pytest.approx(74.9),
        "trend": "stable",
        "alerts": [],
        "baseline_source": "config",
        "samples": 1,
        "alert_below_tok_sec": pytest.approx(59.84),
        "updated_at": "2026-07-18T08:00:00Z",
    }
    assert doc["gpu-light"]["trend"] == "unknown" and doc["gpu-light"]["current_tok_sec"] is None


def test_improving_after_three_fast_runs(tmp_path, fakes, evaluate):
    srv = fakes(speed_routes(90.0))
    cfg = config({"gpu-dense": srv.url})
    for i in range(3):
        res = run_bench(cfg, tmp_path, now=T0 + timedelta(hours=i))
    assert res.document["regressions"]["gpu-dense"]["trend"] == "improving"


def test_human_render_does_not_crash(tmp_path, fakes, evaluate, capsys):
    cfg = config({"gpu-dense": fakes().url, "gpu-dead": dead_endpoint(), "gpu-key": fakes(require_key="k").url})
    res = run_bench(cfg, tmp_path)
    res.render()
    out = capsys.readouterr().out
    assert "gpu-dense" in out and "refused" in out and "unauthorized" in out
    assert "api-key-mismatch" in out
