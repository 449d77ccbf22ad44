"""``benchmarks/equivalence.py`` (issue 26's "behaviour does not change", shown by a replay): one tree
against itself is all identical, a planted behaviour change is caught and shown as a diff, a bad ref is
exit 3. Kept small (one trace) so it runs in a few seconds; the full comparison is benchmarks/README.md's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import equivalence  # noqa: E402

TRACE = "rule6_rule7_dead_host_and_monitor_outage"
ONE_TRACE = ["--inputs", "replay", "--traces", TRACE]


@pytest.fixture(scope="module")
def head_tree(tmp_path_factory) -> Path:
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    tree = tmp_path_factory.mktemp("equiv") / "head"
    equivalence.materialise("HEAD", tree)
    return tree


def test_a_tree_against_itself_is_all_identical(head_tree, capsys):
    assert equivalence.main(["--before", str(head_tree), "--after", str(head_tree), *ONE_TRACE]) == 0
    out = capsys.readouterr().out
    assert "inputs compared: 1   identical: 1   differing: 0" in out
    assert "=== differs" not in out


def test_a_planted_behaviour_change_is_caught(head_tree, tmp_path, capsys):
    """Rule 6 held for 2 polls instead of 3: the replay fires a poll earlier, and the diff shows it."""
    planted = tmp_path / "planted"
    equivalence.materialise(str(head_tree), planted)
    defaults = planted / "gpuheal" / "config" / "defaults.yaml"
    text = defaults.read_text()
    assert "host-unreachable:       {hold_polls: 3," in text
    defaults.write_text(text.replace("host-unreachable:       {hold_polls: 3,", "host-unreachable:       {hold_polls: 2,"))
    assert equivalence.main(["--before", str(head_tree), "--after", str(planted), *ONE_TRACE]) == 1
    out = capsys.readouterr().out
    assert "inputs compared: 1   identical: 0   differing: 1" in out
    assert f"=== differs: replay/{TRACE}" in out
    assert "\n-" in out and "\n+" in out and "host-unreachable" in out


def test_a_ref_that_is_not_a_commit_is_exit_3(capsys):
    assert equivalence.main(["--before", "no-such-ref-xyz", *ONE_TRACE]) == 3
    assert "could not run" in capsys.readouterr().err
