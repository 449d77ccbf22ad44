"""Who watches the watcher (issue 21 point 8): examples/prometheus/gpuheal-rules.yml is valid and
each alert fires, and stays silent, on the input series of gpuheal-rules.test.yml, judged by the
real ``promtool`` (Debian's prometheus package, which .ci/run installs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuheal.metrics import __doc__ as METRICS_DOC

RULES_DIR = Path(__file__).resolve().parent.parent / "examples" / "prometheus"
RULES = RULES_DIR / "gpuheal-rules.yml"
RULE_TESTS = RULES_DIR / "gpuheal-rules.test.yml"


def promtool() -> str:
    found = os.environ.get("PROMTOOL_BIN") or shutil.which("promtool")
    if not found and os.access("/usr/bin/promtool", os.X_OK):
        found = "/usr/bin/promtool"
    if not found:
        pytest.skip("promtool not installed (Debian's prometheus package; .ci/run installs it)")
    return found


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=60)


def test_rules_file_is_valid():
    done = _run("check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 rules found" in done.stdout


def test_each_alert_fires_and_stays_silent():
    done = _run("test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_both_ways():
    """Each alert has a case where it fires and one where it stays silent."""
    names = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    fired, silent = set(), set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (fired if check["exp_alerts"] else silent).add(check["alertname"])
    assert fired == names and silent == names


def test_a_wrong_expectation_fails(tmp_path):
    """promtool really judges: the same file expecting the stale-run alert too early fails."""
    shutil.copy(RULES, tmp_path / RULES.name)
    text = RULE_TESTS.read_text().replace("eval_time: 15m\n        alertname: GpuhealNotRunning",
                                          "eval_time: 12m\n        alertname: GpuhealNotRunning")
    assert text != RULE_TESTS.read_text()
    (tmp_path / RULE_TESTS.name).write_text(text)
    done = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0


def test_rules_read_metrics_gpuheal_writes():
    for metric in ("gpuheal_last_run_timestamp_seconds", "gpuheal_health_timestamp_seconds", "gpuheal_issue_active"):
        assert metric in RULES.read_text() and metric in METRICS_DOC
