"""``gpuheal report`` and ``report --weekly``: golden Markdown over a simulated week, the JSON
documents, ``--send`` to a loopback Zulip (a weekly report that cannot be sent is queued for
``escalate``), and tolerance of missing or damaged state."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuheal import zulip
from gpuheal.render import weekly
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import escalate, report

try:
    from tests.zulip_server import (
        DEFAULT_EMAIL,
        DEFAULT_KEY,
        ZulipLookalike,
        config_dict,
        health_doc,
        read_state,
        runtime,
        seed,
        simulated_week,
    )
except ImportError:
    from zulip_server import (
        DEFAULT_EMAIL,
        DEFAULT_KEY,
        ZulipLookalike,
        config_dict,
        health_doc,
        read_state,
        runtime,
        seed,
        simulated_week,
    )

NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
GOLDEN = Path(__file__).parent / "golden"


def golden(name: str, text: str) -> None:
    """Compare with tests/golden/NAME; ``GPUHEAL_UPDATE_GOLDEN=1`` rewrites it."""
    path = GOLDEN / name
    if os.environ.get("GPUHEAL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"golden file {path} missing (run with GPUHEAL_UPDATE_GOLDEN=1)"
    assert text == path.read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZULIP_EMAIL", DEFAULT_EMAIL)
    monkeypatch.setenv("ZULIP_API_KEY", DEFAULT_KEY)


@pytest.fixture
def state(tmp_path):
    return tmp_path / "state"


def run(state, site=None, weekly_=False, send=False, now=NOW):
    rt = runtime(config_dict(site), state, now)
    with StateDir(state) as store:
        result = report.command(rt, store, weekly=weekly_, send=send)
        result.warnings[:0] = store.warnings
    return result


# --------------------------------------------------------------------------- weekly


def test_weekly_report_golden(state):
    simulated_week(state, NOW)
    r = run(state, weekly_=True)
    assert r.exit_code == 0
    golden("weekly-report.md", r.document["markdown"])
    assert any("skipped 3 unreadable line(s)" in w for w in r.warnings)


def test_weekly_document(state):
    simulated_week(state, NOW)
    doc = run(state, weekly_=True).document
    assert doc["kind"] == "weekly"
    assert doc["period"] == {"start": "2026-07-11T08:00:00Z", "end": "2026-07-18T08:00:00Z"}
    g = {row["gpu"]: row for row in doc["gpus"]}
    assert [r["gpu"] for r in doc["regressions"]] == ["gpu-light"]
    assert g["gpu-light"]["regression"] and g["gpu-light"]["change_pct"] < -10
    assert not g["gpu-dense"]["regression"] and abs(g["gpu-dense"]["change_pct"]) < 1
    assert g["strix-moe"]["prev_week_mean_tok_s"] is None and g["strix-moe"]["change_pct"] is None
    assert g["strix-moe"]["sparkline"][3] == weekly.NO_DATA and len(g["strix-moe"]["sparkline"]) == 7
    assert g["gpu-dense"]["failed_runs"] == 1
    assert g["gpu-dense"]["baseline_tok_s"] == 74.6 and g["gpu-dense"]["baseline_source"] == "rolling-30d"
    assert g["gpu-light"]["baseline_tok_s"] == 165.2 and g["gpu-light"]["baseline_source"] == "config"
    inc = doc["incidents"]
    assert (inc["total"], inc["resolved"], inc["open"]) == (4, 3, 1)
    by = {row["issue"]: row for row in inc["by_issue"]}
    assert by["model-stuck"]["median_resolve_s"] == 240  # from detected.since, 2 min before the first record
    assert by["host-unreachable"]["escalated"] == 1 and by["host-unreachable"]["median_resolve_s"] == 3 * 3600
    assert by["thermal-critical"]["count"] == 1  # the one before the week is left out
    assert [(e["gpu"], e["issue"]) for e in doc["escalations"]] == [("gpu-light", "host-unreachable")]
    rem = {row["action"]: row for row in doc["remediations"]}
    assert rem["restart-llama-server"] == {"action": "restart-llama-server", "count": 4, "resolved": 1, "failed": 3, "other": 0}
    assert rem["restart-llama-server-memcap"]["other"] == 1


SPEC_FLEET = Path(__file__).resolve().parent.parent / "examples" / "fleet.yaml"


def spec_fleet_fortnight(state, now) -> None:
    """Two weeks of benchmarks every 6 h on the spec's three GPUs (examples/fleet.yaml): gpu-light
    falls from ~165 to ~140 tok/s this week (a >10 % regression), gpu-dense and strix-moe hold
    their baselines within a percent. No audit trail."""
    t_now, day = now.timestamp(), 86400.0
    base = {"gpu-dense": 74.8, "gpu-light": 165.2, "strix-moe": 70.5}
    results: dict[str, list[dict]] = {alias: [] for alias in base}
    for i in range(56):
        at = t_now - 14 * day + (i + 0.5) * day / 4
        this_week = at >= t_now - 7 * day
        for alias, tok in base.items():
            if alias == "gpu-light" and this_week:
                tok = 140.0
            wobble = ((i * 7 + len(alias)) % 5 - 2) * 0.2  # ±0.4 tok/s: a steady GPU's noise
            results[alias].append({"at": at, "gen_tok_s": round(tok + wobble, 2), "ok": True, "source": "bench"})
    seed(state, files.BENCH, {"results": results, "baselines": {}})


def test_weekly_report_of_the_spec_fleet_gives_every_gpu_its_trend(state, tmp_path):
    """Issue 27 item 17, the spec's "per-GPU tok/s trend over 7 days": on examples/fleet.yaml with one
    GPU regressed, every GPU has its row (the regression first), none is folded into "N GPUs
    steady" while the report fits one Zulip message."""
    spec_fleet_fortnight(state, NOW)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")}
    env["GPUHEAL_NOW"] = "2026-07-18T08:00:00Z"
    p = subprocess.run(
        [str(Path(sys.executable).with_name("gpuheal")), "--config", str(SPEC_FLEET), "--state-dir", str(state),
         "report", "--weekly"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert p.returncode == 0, p.stderr
    golden("weekly-report-spec-fleet.md", p.stdout)
    rows = [line.split(" ")[1] for line in p.stdout.splitlines() if line.startswith("| ") and "`" in line]
    assert rows == ["gpu-light", "gpu-dense", "strix-moe"]  # the regression first, then by the size of the move
    assert "steady" not in p.stdout and len(p.stdout) <= zulip.MAX_CONTENT  # one Zulip message


def test_weekly_with_no_data_at_all(state):
    r = run(state, weekly_=True)
    assert r.exit_code == 0
    md = r.document["markdown"]
    assert "`·······`" in md and "**Incidents:** none this week." in md and "**Escalations:** none this week." in md


def test_sparkline():
    assert weekly.sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert weekly.sparkline([5, 5, None, 5]) == "▄▄·▄"
    assert weekly.sparkline([None, None]) == "··"


def test_weekly_cli_stdout_is_the_markdown(state, tmp_path):
    import yaml

    simulated_week(state, NOW)
    cfg = tmp_path / "gpuheal.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(None)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")}
    env["GPUHEAL_NOW"] = "2026-07-18T08:00:00Z"
    p = subprocess.run(
        [str(Path(sys.executable).with_name("gpuheal")), "--config", str(cfg), "--state-dir", str(state), "report", "--weekly"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == (GOLDEN / "weekly-report.md").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- --send


def test_weekly_send_posts_the_markdown(state):
    simulated_week(state, NOW)
    with ZulipLookalike() as srv:
        r = run(state, srv.url, weekly_=True, send=True)
    assert r.exit_code == 0
    assert r.document["sent"] == {"message_id": srv.messages[0]["id"], "stream": "agent-hub", "topic": "alerts-gpu"}
    assert srv.messages[0]["content"] == r.document["markdown"].strip()


def test_weekly_send_failure_queues_it_for_escalate(state):
    simulated_week(state, NOW)
    with ZulipLookalike() as srv:
        srv.mode = "500"
        r = run(state, srv.url, weekly_=True, send=True)
        assert r.exit_code == 1 and r.document["queued_for_escalate"] is True
        [queued] = read_state(state, files.ALERTS)["queue"]
        assert queued["kind"] == "report" and queued["fingerprint"] == "fleet/weekly-report"

        srv.mode = "ok"
        rt = runtime(config_dict(srv.url), state, NOW)
        with StateDir(state) as store:
            e = escalate.command(rt, store)
        assert e.exit_code == 0
        assert srv.messages[0]["content"] == r.document["markdown"].strip()


def test_send_without_credentials_is_attention(state, monkeypatch):
    monkeypatch.delenv("ZULIP_API_KEY")
    with ZulipLookalike() as srv:
        r = run(state, srv.url, send=True)
        assert r.exit_code == 1 and srv.requests == []
    assert r.document["sent"] is None and r.document["queued_for_escalate"] is False


def test_summary_send(state):
    seed(state, files.GPU_HEALTH, health_doc([("gpu-light", "host-unreachable")]), raw=True)
    with ZulipLookalike() as srv:
        r = run(state, srv.url, send=True)
    assert r.exit_code == 0
    assert srv.messages[0]["content"].startswith("🔴 **GPU Fleet — DOWN**")


# --------------------------------------------------------------------------- summary


def test_summary_with_no_state_at_all(state):
    r = run(state)
    assert r.exit_code == 0
    doc = r.document
    assert doc["status"] == "unknown" and doc["health_at"] is None and doc["stale"] is True
    assert set(doc["gpus"]) == {"gpu-dense", "gpu-light", "strix-moe"}
    assert doc["gpus"]["gpu-dense"]["temp_c"] is None and doc["gpus"]["gpu-dense"]["baseline_tok_s"] == 74.8
    assert doc["alerts"]["queued"] == 0 and doc["issues"] == []


def test_summary_reads_health_heal_state_bench_and_queue(state):
    seed(state, files.GPU_HEALTH, health_doc([("gpu-light", "host-unreachable")], at="2026-07-18T07:59:00Z"), raw=True)
    t = NOW.timestamp()
    seed(state, files.HEAL, {
        "restarts": {"gpu-light": [t - 4000, t - 1200, t - 600], "gpu-dense": ["junk"]},
        "attempts": {
            "a1": {"gpu": "gpu-light", "issue": "host-unreachable", "since": "2026-07-18T06:00:00Z", "n": 1, "status": "failed"},
            "a2": {"gpu": "gpu-light", "issue": "host-unreachable", "since": "2026-07-18T06:00:00Z", "n": 2, "status": "failed"},
            "old": {"gpu": "gpu-light", "issue": "host-unreachable", "since": "2026-07-17T01:00:00Z", "n": 1, "status": "resolved"},
        },
        "escalated": {"gpu-light/host-unreachable": {"at": t - 300, "reason": "3 failed", "since": "2026-07-18T06:00:00Z"}},
        "paused": {"fleet": None, "gpus": {"strix-moe": {"reason": "driver upgrade", "at": t - 100}}},
    })
    seed(state, files.BENCH, {"results": {"gpu-dense": [{"at": t - 100, "gen_tok_s": 73.91, "ok": True}]}, "baselines": {}})
    seed(state, files.ALERTS, {"queue": [{"fingerprint": "gpu-light/host-unreachable", "state_key": "x", "kind": "escalated", "created_at": t - 300,
                                          "delivery": {"tries": 2, "last_error": "HTTP 500", "not_before": t + 60}}], "sent": {}, "clean_cycles": 0})
    doc = run(state).document
    assert doc["status"] == "down" and doc["health_at"] == "2026-07-18T07:59:00Z" and doc["stale"] is False
    light = doc["gpus"]["gpu-light"]
    assert light["endpoint"] == "refused" and light["restarts_last_hour"] == 2 and light["restart_budget_left"] == 1
    assert doc["gpus"]["gpu-dense"]["current_tok_s"] == 73.9
    assert doc["gpus"]["strix-moe"]["paused"] == "driver upgrade"
    [issue] = doc["issues"]
    assert issue["attempts"] == 2 and issue["escalated"] is True and issue["severity"] == "critical"
    assert doc["alerts"] == {"queued": 1, "oldest_queued_at": "2026-07-18T07:55:00Z", "last_error": "HTTP 500",
                             "not_before": "2026-07-18T08:01:00Z", "clean_cycles": 0}


def test_summary_human_output_golden(state, capsys):
    seed(state, files.GPU_HEALTH, health_doc([("gpu-light", "host-unreachable")]), raw=True)
    r = run(state)
    r.render()
    golden("report-summary.txt", capsys.readouterr().out)


def test_summary_survives_damaged_files(state):
    state.mkdir()
    (state / files.GPU_HEALTH).write_text("{not json")
    (state / files.HEAL).write_text('{"schema_version": 1, "data": {"restarts": "x", "attempts": [1], "paused": 7}}')
    (state / files.BENCH).write_text('{"schema_version": 1, "data": {"results": {"gpu-dense": "x"}}}')
    (state / files.AUDIT_LOG).write_bytes(b"\xff\xfe garbage\n{}\n")
    r = run(state)
    assert r.exit_code == 0 and r.document["status"] == "unknown"
    assert any("gpu-health.json" in w for w in r.warnings)
    r = run(state, weekly_=True)
    assert r.exit_code == 0


def test_weekly_flags_a_gpu_running_far_below_its_baseline():
    """Rule 4's view in the weekly report: a week that is steady (no week-over-week change) but
    25 % under the baseline must still be called out, not hidden behind "no regression"."""
    from datetime import UTC, datetime

    from gpuheal import benchdata
    from gpuheal.render import weekly

    now = datetime(2026, 7, 25, 8, 0, tzinfo=UTC)
    data = benchdata.empty()
    for i in range(20):
        at = now.timestamp() - i * 6 * 3600
        benchdata.add_result(data, "gpu-dense", {"at": at, "gen_tok_s": 56.0, "ok": True})
    data["results"]["gpu-dense"].sort(key=lambda r: r["at"])
    doc = weekly.build(["gpu-dense"], {"gpu-dense": 74.8}, data, [], now)
    row = doc["gpus"][0]
    assert row["below_baseline"] is True and row["current_vs_baseline_pct"] == -25.1
    text = weekly.markdown(doc, limit=10_000)
    assert "gpu-dense** runs at 56.0 tok/s, -25.1%" in text


def test_alert_queue_summary_survives_damaged_times():
    from gpuheal.core.report import _alerts_summary

    queue = {"queue": [{"fingerprint": "a/b", "created_at": 10**400, "delivery": {"not_before": 1e300}},
                       {"fingerprint": "c/d", "created_at": 1_800_000_000.5}], "clean_cycles": 3}  # fmt: skip
    out = _alerts_summary(queue, 1_800_000_100.0)
    assert out["queued"] == 2 and out["oldest_queued_at"] == "2027-01-15T08:00:00Z" and out["not_before"] is None


def test_weekly_time_to_resolve_has_median_and_p90_per_rule():
    """Issue 20: MTTR per rule — the median and the 90th percentile, beside the max."""
    incidents = [{"issue": "model-stuck", "start_s": 0.0, "end_s": float(s), "escalated": False}
                 for s in (120, 150, 180, 200, 240, 260, 300, 330, 400, 900)]
    incidents.append({"issue": "model-stuck", "start_s": 0.0, "end_s": None, "escalated": False})
    row = weekly._by_issue(incidents)[0]
    assert (row["count"], row["resolved"], row["open"]) == (11, 10, 1)
    assert row["median_resolve_s"] == 250 and row["p90_resolve_s"] == 450 and row["max_resolve_s"] == 900
