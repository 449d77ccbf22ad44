"""``make demo`` is the README's first command: it runs here end to end, so a change that stops it
(as doctor's uncapped-restart warning once did, unnoticed until a person ran it) fails the suite.

It runs the demo's whole cycle (doctor, check, 24 simulated minutes of heal --apply and escalate, a
bench, the week, the weekly report) with one benchmark run a simulated day instead of four
(``GPUHEAL_DEMO_WEEK_BENCHES``): the same commands, a quarter of the week's processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_make_demo_runs_the_whole_cycle_and_heals(tmp_path: Path) -> None:
    env = {**os.environ, "GPUHEAL_DEMO_STATE": str(tmp_path / "demo-state"), "NO_COLOR": "1",
           "GPUHEAL_DEMO_WEEK_BENCHES": "7"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "Traceback" not in out + proc.stderr
    assert "[resolved]" in out  # a fix was proven, not only planned
    assert "✉ zulip:" in out  # the humans were told what could not be fixed
    assert "── message " in out  # ...and the Zulip stand-in received it
    assert (tmp_path / "demo-state" / "gpu-self-heal-log.jsonl").stat().st_size > 0
    # the cycle's other ends: what could not be fixed is escalated, and the week ends in its report
    assert "[escalated]" in out and "needs attention" in out
    assert "Weekly Benchmark Report" in out and "**Escalations** — 1" in out
