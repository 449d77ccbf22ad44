"""The Prometheus textfile: parsed with prometheus_client's own text parser; atomic; no
timestamps; unknown values left out (never 0); aliases only."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpuheal import metrics
from gpuheal.state import files
from gpuheal.state.store import StateDir

try:
    from tests.zulip_server import alert, config_dict, health_doc, runtime, seed
except ImportError:
    from zulip_server import alert, config_dict, health_doc, runtime, seed

NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)


def write(state, target, now=NOW):
    rt = runtime(config_dict(None), state, now)
    with StateDir(state) as store:
        metrics.write_metrics(rt, store, target)
    return target.read_text()


def samples(text):
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s
    return out


def value(parsed, name, **labels):
    return parsed[(name, tuple(sorted(labels.items())))].value


def test_an_issue_being_verified_is_still_open(tmp_path):
    """Contract "Issue state after a remediation": a ``verifying`` issue stays open (it ends resolved
    or firing again) — gpuheal_issues_open counts it; a ``pending`` one (its hold not run) is not open yet."""
    state = tmp_path / "state"
    doc = health_doc([("gpu-light", "model-stuck"), ("gpu-dense", "model-stuck"), ("gpu-dense", "vram-leak")])
    doc["issues"][0]["state"], doc["issues"][2]["state"] = "verifying", "pending"
    seed(state, files.GPU_HEALTH, doc, raw=True)
    p = samples(write(state, tmp_path / "gpuheal.prom"))
    assert value(p, "gpuheal_issues_open", issue="model-stuck") == 2
    assert value(p, "gpuheal_issues_open", issue="vram-leak") == 0
    assert value(p, "gpuheal_issue_active", gpu="gpu-light", issue="model-stuck", severity="critical",
                 state="verifying") == 1  # fmt: skip


def test_full_state_parses_and_carries_the_numbers(tmp_path):
    state = tmp_path / "state"
    seed(state, files.GPU_HEALTH, health_doc([("gpu-light", "host-unreachable")]), raw=True)
    t = NOW.timestamp()
    seed(state, files.HEAL, {"restarts": {"gpu-light": [t - 600]}, "attempts": {
        "k": {"gpu": "gpu-light", "issue": "host-unreachable", "since": "2026-07-18T06:00:00Z", "n": 1}}})
    seed(state, files.BENCH, {"results": {"gpu-dense": [{"at": t - 60, "gen_tok_s": 74.9, "ok": True}]}, "baselines": {}})
    seed(state, files.ALERTS, {"queue": [alert("gpu-light", "host-unreachable")], "sent": {}, "clean_cycles": 7})
    text = write(state, tmp_path / "gpuheal.prom")
    p = samples(text)
    assert value(p, "gpuheal_up") == 1
    assert value(p, "gpuheal_last_run_timestamp_seconds") == t
    assert value(p, "gpuheal_fleet_status", status="down") == 1 and value(p, "gpuheal_fleet_status", status="healthy") == 0
    assert value(p, "gpuheal_fleet_status_code") == 2
    assert value(p, "gpuheal_issues_open", issue="host-unreachable") == 1
    assert value(p, "gpuheal_issues_open", issue="thermal-critical") == 0
    assert value(p, "gpuheal_issue_active", gpu="gpu-light", issue="host-unreachable", severity="critical", state="firing") == 1
    assert value(p, "gpuheal_remediation_attempts", gpu="gpu-light", issue="host-unreachable") == 1
    assert value(p, "gpuheal_restarts_last_hour", gpu="gpu-light") == 1
    assert value(p, "gpuheal_restart_budget_remaining", gpu="gpu-light") == 2
    assert value(p, "gpuheal_gpu_temperature_celsius", gpu="gpu-dense") == 64
    assert value(p, "gpuheal_gpu_vram_used_bytes", gpu="gpu-dense") == 21600 * 1024 * 1024
    assert value(p, "gpuheal_gpu_utilization_ratio", gpu="gpu-dense") == 0.87
    assert value(p, "gpuheal_gpu_tokens_per_second", gpu="gpu-dense") == 74.9
    assert value(p, "gpuheal_gpu_baseline_tokens_per_second", gpu="gpu-light") == 165.2
    assert value(p, "gpuheal_gpu_endpoint_up", gpu="gpu-light") == 0
    assert value(p, "gpuheal_alerts_queued") == 1 and value(p, "gpuheal_clean_cycles") == 7
    # not known is not zero: gpu-light's temperature was not reported
    assert ("gpuheal_gpu_temperature_celsius", (("gpu", "gpu-light"),)) not in p
    # aliases only (L6): no host names anywhere
    assert "ct8" not in text and "ct110" not in text
    # textfile collector rules: no timestamps, trailing newline, one HELP/TYPE per family
    assert all(s.timestamp is None for s in p.values())
    assert text.endswith("\n")
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))


def test_empty_state_still_writes_a_valid_file(tmp_path):
    state = tmp_path / "state"
    text = write(state, tmp_path / "gpuheal.prom")
    p = samples(text)
    assert value(p, "gpuheal_up") == 1
    assert ("gpuheal_fleet_status_code", ()) not in p  # unknown, not "healthy"


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    state = tmp_path / "state"
    out = tmp_path / "textfile"
    out.mkdir()
    target = out / "gpuheal.prom"
    target.write_text("old\n")
    inode = os.stat(target).st_ino
    write(state, target)
    assert os.listdir(out) == ["gpuheal.prom"]
    assert os.stat(target).st_ino != inode  # replaced by rename, never rewritten in place
    assert oct(os.stat(target).st_mode & 0o777) == "0o644"


def test_unwritable_target_is_a_warning_not_a_failure(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("gpuheal"), "propagate", True)  # in case a CLI test ran setup_logging
    state = tmp_path / "state"
    write_to = tmp_path / "missing-dir" / "gpuheal.prom"
    rt = runtime(config_dict(None), state, NOW)
    with StateDir(state) as store:
        metrics.write_metrics(rt, store, write_to)
    assert "metrics file" in caplog.text and not write_to.exists()


def test_label_values_are_escaped():
    ex = metrics.Exposition()
    ex.add("x_metric", 'help with \\ and\nnewline', 1, {"gpu": 'a"b\\c\nd'})
    p = samples(ex.text())
    assert value(p, "x_metric", gpu='a"b\\c\nd') == 1


def test_cli_metrics_file_after_a_command(tmp_path):
    import yaml

    state = tmp_path / "state"
    seed(state, files.GPU_HEALTH, health_doc([]), raw=True)
    cfg = tmp_path / "gpuheal.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(None)))
    target = tmp_path / "gpuheal.prom"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEAL_", "ZULIP_"))}
    env["GPUHEAL_NOW"] = "2026-07-18T08:00:00Z"
    p = subprocess.run(
        [str(Path(sys.executable).with_name("gpuheal")), "--config", str(cfg), "--state-dir", str(state),
         "--metrics-file", str(target), "escalate"],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    parsed = samples(target.read_text())
    assert value(parsed, "gpuheal_fleet_status_code") == 0


def test_rules_off_are_in_the_file_as_in_check(tmp_path):
    """Issue 19: a rule that cannot judge is listed off in the metrics file too (from gpu-health.json's
    rules_off, which check derives); a damaged entry is skipped, never a crash."""
    state = tmp_path / "state"
    doc = health_doc([])
    doc["rules_off"] = [
        {"rule": "circuit-breaker-stuck", "gpus": ["fleet"], "why": "needs LiteLLM circuit breakers", "fix": "x"},
        {"rule": "model-stuck", "gpus": ["gpu-light", 7], "why": "no /metrics", "fix": "y"},
        "garbage", {"rule": None},
    ]
    seed(state, files.GPU_HEALTH, doc, raw=True)
    p = samples(write(state, tmp_path / "gpuheal.prom"))
    off = {k[1] for k in p if k[0] == "gpuheal_rule_off"}
    assert off == {(("gpu", "fleet"), ("rule", "circuit-breaker-stuck")), (("gpu", "gpu-light"), ("rule", "model-stuck"))}


def test_no_rules_off_writes_no_sample(tmp_path):
    state = tmp_path / "state"
    seed(state, files.GPU_HEALTH, health_doc([]), raw=True)
    assert not any(k[0] == "gpuheal_rule_off" for k in samples(write(state, tmp_path / "gpuheal.prom")))
