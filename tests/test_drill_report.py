"""The drill's bookkeeping (benchmarks/drill.py, issue 20): the cron schedule's jitter and fault
placement, and the per-server figures (detection cycles, MTTR, failed requests, false actions) worked
out from recorded probes, heal polls and audit records. The real run is benchmarks/drill.py itself;
tests/realserver/test_drill_real.py exercises its supervisor and faults on a real server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from drill import FAULTS, Run, heal_issues, schedule, summarize, table  # noqa: E402
from drill_supervisor import Service, Supervisor  # noqa: E402


def args(**kw) -> argparse.Namespace:
    base = {"cycles": 10, "cadence_s": 60.0, "fault_cycle": 2, "fault_offset_s": 2.5, "slow_load_after": 3.0,
            "seed": 1}
    return argparse.Namespace(**{**base, **kw})


def test_cycles_start_with_cron_jitter_and_faults_fall_between_polls():
    events = schedule(args())
    starts = [(at, k) for at, kind, k in events if kind == "cycle"]
    assert [k for _, k in starts] == list(range(10))
    assert all(0.3 <= at - k * 60 <= 1.7 for at, k in starts)
    assert len({round(at - k * 60, 3) for at, k in starts}) > 1  # not one fixed offset
    faults = {what: at for at, kind, what in events if kind == "fault"}
    assert faults == {"hang": 92.5, "frozen": 92.5, "kill": 92.5, "slow-load": 272.5}  # between 5 s probes


def test_heal_issues_reads_the_poll_and_tolerates_garbage():
    out = '{"status": "degraded", "issues": [{"gpu": "hang", "issue": "host-unreachable", "state": "pending"}]}'
    assert heal_issues(out) == [{"gpu": "hang", "issue": "host-unreachable", "state": "pending"}]
    assert heal_issues("Traceback ...") is None
    assert heal_issues('["not", "a", "poll"]') is None


def _supervisor(tmp_path: Path) -> Supervisor:
    sup = Supervisor(tmp_path / "s.sock")
    for name in FAULTS:
        sup.services[name] = Service(name, ["true"], tmp_path / f"{name}.log")
    return sup


def test_mttr_failed_requests_detection_and_false_actions(tmp_path):
    run = Run(t0=1000.0)
    run.faults["kill"] = 90.0
    run.probes = [
        {"server": "kill", "sent": 85.0, "done": 85.1, "ok": True, "error": ""},
        {"server": "kill", "sent": 95.0, "done": 95.0, "ok": False, "error": "ConnectionRefusedError"},
        {"server": "kill", "sent": 100.0, "done": 100.0, "ok": False, "error": "ConnectionRefusedError"},
        {"server": "kill", "sent": 270.0, "done": 270.4, "ok": True, "error": ""},
        {"server": "kill", "sent": 275.0, "done": 275.1, "ok": False, "error": "TimeoutError"},
        {"server": "control-1", "sent": 95.0, "done": 95.1, "ok": True, "error": ""},
    ]
    run.cycles = [
        {"cycle": 3, "issues": [{"gpu": "kill", "issue": "host-unreachable", "state": "verifying"}]},
        {"cycle": 2, "issues": [{"gpu": "kill", "issue": "host-unreachable", "state": "pending"}]},
        {"cycle": 1, "issues": None},  # a heal whose output could not be read
    ]
    sup = _supervisor(tmp_path)
    sup.services["kill"].restarts.append({"t": 1210.0, "stop": "gone", "took_s": 0.2})
    audit = [{"gpu": "control-1", "phase": "intent", "action": "restart-llama-server", "issue": "model-stuck"},
             {"gpu": "control-1", "phase": "outcome", "action": "restart-llama-server"},
             {"gpu": "kill", "phase": "intent", "action": "restart-llama-server", "issue": "host-unreachable"}]
    per = summarize(run, sup, audit)
    kill = per["kill"]
    assert (kill["pending_cycle"], kill["fired_cycle"]) == (2, 3)
    assert kill["mttr_s"] == 180.4  # fault -> the first good completion sent after it
    assert kill["failed_after_fault"] == 2  # the failures before recovery, not the one after
    assert kill["restarts"] == [{"t": 210.0, "stop": "gone", "took_s": 0.2}]
    assert (kill["probes_ok"], kill["probes"]) == (2, 5)
    assert len(per["control-1"]["actions"]) == 1 and per["control-2"]["actions"] == []
    assert per["frozen"]["mttr_s"] is None and per["frozen"]["pending_cycle"] is None
    result = {"mode": "heal --apply", "cycles": 10, "cadence_s": 60, "fault_cycle": 2, "stop_timeout_s": 15,
              "servers": per}
    text = table(result)
    assert "180.4" in text and text.count("\n") == len(FAULTS) + 1
