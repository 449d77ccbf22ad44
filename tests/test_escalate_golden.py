"""Golden alert texts (contract "Alerts": the three titles, exactly), with the evidence an operator
needs: what was detected, what was tried, how often, since when. ``GPUHEAL_UPDATE_GOLDEN=1``
rewrites the files in tests/golden/."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuheal.render.report import alert_content, alert_title, fmt_duration, md

try:
    from tests.zulip_server import alert
except ImportError:
    from zulip_server import alert

NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
GOLDEN = Path(__file__).parent / "golden"


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("GPUHEAL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"golden file {path} missing (run with GPUHEAL_UPDATE_GOLDEN=1)"
    assert text == path.read_text(encoding="utf-8")


def test_titles_are_the_contracts():
    assert alert_title(alert("gpu-dense", "model-stuck", kind="resolved")) == "🛠 GPU Self-Heal — gpu-dense model-stuck resolved"
    assert alert_title(alert("gpu-dense", "model-stuck")) == "⚠ GPU Self-Heal — gpu-dense needs attention"
    assert alert_title(alert("fleet", None, kind="all-clear")) == "✅ GPU Fleet: All Clear"
    assert alert_title(alert("fleet", "cooling-infrastructure")) == "⚠ GPU Self-Heal — fleet needs attention"


def test_escalated_golden():
    a = alert(
        "gpu-dense",
        "model-stuck",
        severity="critical",
        detected={"failures_60s": 12, "requests_60s": 14, "failure_ratio": 0.857, "hostname": "ct8",
                  "journal": "Jul 18 07:58:01 ct8 llama-server[4121]: slot 0 | task 388 | stuck\nJul 18 07:59:01 ct8 systemd[1]: llama-server.service: Main process exited"},
    )
    text = alert_content(a, NOW, host_aliases={"ct8": "gpu-dense", "ct110": "gpu-light"})
    assert "hostname" not in text and "ct8" not in text  # L6: aliases only
    golden("alert-escalated.md", text)


def test_resolved_golden():
    a = alert(
        "gpu-dense",
        "model-stuck",
        kind="resolved",
        since="2026-07-18T07:46:00Z",
        created_at=NOW.timestamp(),
        tried=["restart-llama-server"],
        attempts=1,
        summary="resolved after restart-llama-server (attempt 1)",
        verification={"resolved_after_s": 120, "completion_s": 1.9},
    )
    golden("alert-resolved.md", alert_content(a, NOW))


def test_all_clear_golden():
    a = alert("fleet", None, kind="all-clear", detected={"clean_cycles": 100}, tried=[], attempts=0, since=None, run_id=None,
              summary="100 clean cycles in a row")
    golden("alert-all-clear.md", alert_content(a, NOW))


def test_folded_host_unreachable_golden():
    hu = alert("gpu-light", "host-unreachable", detected={"endpoint": "refused", "polls": 3}, since="2026-07-18T07:40:00Z",
               summary="llama-server refused 3 consecutive probes", tried=[], attempts=0)
    folded = [
        alert("gpu-light", "model-stuck", since="2026-07-18T07:30:00Z", summary="failure rate 100 % over 60 s"),
        alert("gpu-light", "vram-leak", since="2026-07-18T05:00:00Z", summary="+410 MB/h over 6 h", tried=[]),
    ]
    golden("alert-folded.md", alert_content(hu, NOW, folded=folded))


def test_reminder_golden():
    a = alert("strix-moe", "thermal-critical", reminder=2, since="2026-07-18T00:00:00Z",
              detected={"temp_c": 88, "duration_s": 28800},
              tried=[{"action": "shed-load", "result": "failed"}, {"action": "redirect-traffic", "result": "failed"}])
    golden("alert-reminder.md", alert_content(a, NOW, repeat_interval_h=4))


def test_hostile_text_cannot_mention_everyone_or_repaint_a_terminal():
    a = alert("gpu-dense", "model-stuck", summary="@**all** look \x1b[31mred\x1b[0m | `x`",
              detected={"note": "[click](http://evil)"})
    text = alert_content(a, NOW)
    assert "@**all**" not in text and "\x1b" not in text
    assert r"\@\*\*all\*\*" in text and r"\[click\](http://evil)" in text


@pytest.mark.parametrize(("s", "out"), [(5, "5 s"), (600, "10 min"), (7500, "2 h 5 min"), (7200, "2 h"), (273600, "3 d 4 h"), (None, "?")])
def test_fmt_duration(s, out):
    assert fmt_duration(s) == out


def test_md_is_bounded():
    assert len(md("x" * 1000, 50)) == 50
