"""Issue 26 item 3, the renderers' slice: an issue as reported is one typed record,
:class:`gpuheal.core.issue.Reported`. The engine's public shape is its ``to_json`` (one writer), and the
human renderers of ``check``, ``heal`` and ``bench`` read its fields, never an issue dict by key. The
JSON documents are unchanged (the golden and CLI tests); the human lines are the same as before."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpuheal.core.issue import IssueRecord, IssueState, Reported
from gpuheal.render import bench as render_bench
from gpuheal.render import human

ROOT = Path(__file__).resolve().parent.parent / "gpuheal"
KEYS = ("gpu", "issue", "severity", "state", "since", "fired_at", "detected", "summary")


def record() -> IssueRecord:
    return IssueRecord("gpu-a", "model-stuck", "critical", IssueState.FIRING, 1_784_361_600.0,
                       fired_at="2026-07-18T08:02:00Z", detected={"polls": 3}, summary="stuck [bold]x")


def test_the_public_shape_is_the_typed_record_in_the_contracts_key_order():
    rec = record()
    public = rec.public()
    assert list(public) == list(KEYS)
    assert public == {"gpu": "gpu-a", "issue": "model-stuck", "severity": "critical", "state": "firing",
                      "since": "2026-07-18T08:00:00Z", "fired_at": "2026-07-18T08:02:00Z",
                      "detected": {"polls": 3}, "summary": "stuck [bold]x"}
    assert public["detected"] is rec.detected  # the same evidence object, as before (no copy)
    assert Reported.from_json(public) == rec.as_reported()


@pytest.mark.parametrize("junk", [None, 5, "x", [1], True])
def test_a_non_object_is_no_issue(junk):
    assert Reported.from_json(junk) is None
    assert Reported.all_of([junk, record().public()]) == [record().as_reported()]
    assert Reported.all_of(junk) == []


def test_damaged_fields_read_as_their_defaults():
    got = Reported.from_json({"gpu": 5, "issue": ["x"], "severity": True, "detected": "x", "summary": {"a": 1}})
    assert got == Reported(gpu="5", issue=None, severity=None, state="firing")


def lines(capsys) -> list[str]:
    out = capsys.readouterr()
    return [line.rstrip() for line in (out.out + out.err).splitlines() if line.strip()]


def test_check_and_heal_issue_lines(monkeypatch, capsys):
    monkeypatch.setattr(human, "use_rich", lambda stream=None: False)
    pending = Reported("gpu-b", "vram-leak", "warning", "pending", "2026-07-18T07:00:00Z", summary="")
    human.render_issues([record().as_reported(), pending])
    assert lines(capsys) == [
        "CRITICAL gpu-a model-stuck (firing, since 2026-07-18T08:00:00Z): stuck [bold]x",
        "WARNING  gpu-b vram-leak (pending, since 2026-07-18T07:00:00Z)",
    ]


def test_bench_issue_lines(monkeypatch, capsys):
    monkeypatch.setattr(human, "use_rich", lambda stream=None: False)
    issue = Reported("gpu-a\x1b[31m", "benchmark-regression", "warning", "firing", summary="slow")
    doc = {"generated_at": "2026-07-18T08:05:00Z", "results": [], "regressions": {}, "issues": [issue.to_json()]}
    render_bench.render_bench(doc)
    assert lines(capsys)[-1] == "WARNING  gpu-a [31m benchmark-regression (firing): slow"


def _issue_key_reads(path: Path) -> list[str]:
    """``issue["gpu"]`` / ``issue.get("severity")`` / ``i[...]`` in a renderer: an issue read as a dict."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        target, key = None, None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target, key = node.value, node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            target, key = node.func.value, node.args[0].value
        if isinstance(target, ast.Name) and target.id in ("issue", "i") and key in KEYS:
            found.append(f"{path.name}:{node.lineno} {target.id}[{key!r}]")
    return found


@pytest.mark.parametrize("module", ["render/human.py", "render/bench.py"])
def test_the_renderers_read_no_issue_by_key(module):
    assert _issue_key_reads(ROOT / module) == []


def test_the_scan_sees_a_key_read(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('for issue in doc["issues"]:\n    print(issue["gpu"], issue.get("state", "firing"))\n')
    assert _issue_key_reads(probe) == ["probe.py:2 issue['gpu']", "probe.py:2 issue['state']"]
