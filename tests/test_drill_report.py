"""The drill's bookkeeping (benchmarks/drill.py, issues 20 and 28): the cron schedule's jitter and fault
placement, the per-server figures (detection cycles, MTTR, failed requests direct and through LiteLLM,
false actions) worked out from recorded probes, heal polls and audit records, their median and worst
over several runs, and the supervisor's restart kill signal. The real run is benchmarks/drill.py
itself; tests/realserver/test_drill_real.py exercises its supervisor and faults on a real server."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from drill import FAULTS, Run, heal_issues, parse_args, schedule, summarize, table  # noqa: E402
from drill_report import aggregate, group_of, median_worst, proxy_figures, servers, summary_table  # noqa: E402
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
    per = summarize(run, {n: s.restarts for n, s in sup.services.items()}, audit)
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


def test_the_defaults_are_three_runs_at_the_spec_cadence_with_cron_alone():
    a = parse_args([])
    assert (a.runs, a.cadence_s, a.cycles, a.litellm, a.restart_kill_signal) == (3, 60.0, 10, False, "TERM")
    assert parse_args(["--runs", "1", "--litellm", "--restart-kill-signal", "KILL"]).litellm


def test_each_run_has_its_own_jitter():
    one, two = schedule(args(), 20), schedule(args(), 21)
    assert [e for e in one if e[1] == "fault"] == [e for e in two if e[1] == "fault"]  # faults at the same times
    assert [e[0] for e in one if e[1] == "cycle"] != [e[0] for e in two if e[1] == "cycle"]


def test_with_litellm_each_faulted_server_has_a_twin_in_its_group():
    names = servers(litellm=True)
    assert names[:4] == ["hang", "frozen", "kill", "slow-load"] and "hang-twin" in names and len(names) == 11
    assert group_of("hang") == group_of("hang-twin") != group_of("kill")
    assert servers(litellm=False) == list(FAULTS)


def test_median_and_worst_count_never_healed_as_the_worst():
    assert median_worst([60.0, 90.5, 45.0]) == {"median": 60.0, "worst": 90.5, "runs": [60.0, 90.5, 45.0]}
    assert median_worst([60.0, None, 45.0]) == {"median": 60.0, "worst": None, "runs": [60.0, None, 45.0]}
    assert median_worst([None, 30.0]) == {"median": None, "worst": None, "runs": [None, 30.0]}
    assert median_worst([3, 5]) == {"median": 4.0, "worst": 5, "runs": [3, 5]}
    assert median_worst([]) == {"median": None, "worst": None, "runs": []}


def test_failed_requests_through_litellm_count_from_the_fault_to_the_end():
    probes = [{"sent": 80.0, "done": 80.1, "ok": False, "error": "HTTP 500"},  # before the fault: not the fault's
              {"sent": 95.0, "done": 105.0, "ok": False, "error": "TimeoutError"},
              {"sent": 100.0, "done": 100.2, "ok": True, "error": ""},  # the twin served it
              {"sent": 300.0, "done": 300.1, "ok": False, "error": "HTTP 429"}]  # still the fault's, after the restart
    probes.append({"sent": 305.0, "done": 313.5, "ok": True, "error": ""})  # served after a failover
    assert proxy_figures(probes, 90.0) == {"proxy_failed": 2, "proxy_probes": 4, "proxy_slow": 1,
                                           "proxy_errors": ["HTTP 429", "TimeoutError"]}
    assert proxy_figures(probes, None)["proxy_failed"] == 3  # a group with no fault: the whole run


def one_run(mttr, failed, proxy_failed, control_actions):
    run = Run(t0=0.0)
    run.faults["hang"] = 90.0
    run.probes = [{"server": "hang", "via": "direct", "sent": 90.0 + mttr if mttr else 95.0,
                   "done": 90.0 + (mttr or 0), "ok": mttr is not None, "error": ""}]
    run.probes += [{"server": "hang", "via": "direct", "sent": 91.0 + i, "done": 92.0 + i, "ok": False,
                    "error": "TimeoutError"} for i in range(failed)]
    run.probes += [{"server": "hang", "via": "proxy", "sent": 95.0 + i, "done": 96.0, "ok": i >= proxy_failed,
                    "error": "" if i >= proxy_failed else "HTTP 500"} for i in range(4)]
    audit = [{"gpu": "hang-twin", "phase": "intent", "action": "restart-llama-server"}] * control_actions
    return {"servers": summarize(run, {}, audit, servers(litellm=True))}


def test_aggregate_gives_median_worst_and_the_per_run_figures():
    runs = [one_run(60.0, 3, 1, 0), one_run(None, 5, 2, 1), one_run(45.0, 2, 0, 0)]
    summary = aggregate(runs)
    hang = summary["servers"]["hang"]
    assert hang["mttr_s"] == {"median": 60.0, "worst": None, "runs": [60.0, None, 45.0]}
    assert hang["proxy_failed"] == {"median": 1, "worst": 2, "runs": [1, 2, 0]}
    assert summary["quiet_actions_per_run"] == [0, 1, 0]  # the twin's restart in run 2 is a false action
    assert "proxy_failed" not in summary["servers"]["hang-twin"]  # its users are counted with hang's
    text = summary_table(summary, 3)
    assert "60.0 / never" in text and "1 / 2" in text and "per run: 0 1 0 (target 0)" in text


def _deaf(tmp_path: Path, first: signal.Signals) -> Supervisor:
    """A supervised process that ignores SIGTERM, as a frozen llama-server does."""
    sup = Supervisor(tmp_path / "d.sock", 1.0, restart_kill_signal=first)
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    sup.add(Service("deaf", [sys.executable, "-c", ignore], tmp_path / "deaf.log"))
    deadline = time.monotonic() + 10
    while "up" not in (tmp_path / "deaf.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    return sup


@pytest.mark.parametrize("first, how, slow", [(signal.SIGTERM, "killed", True), (signal.SIGKILL, "sigkill", False)])
def test_a_restart_waits_the_stop_timeout_on_a_deaf_process_unless_it_sends_sigkill_first(tmp_path, first, how, slow):
    sup = _deaf(tmp_path, first)
    try:
        rec = sup.restart("deaf")
        assert rec["stop"] == how
        assert (rec["stop_s"] >= 1.0) is slow, rec  # RestartKillSignal=SIGKILL: no stop timeout
    finally:
        sup.stop_all()
        sup.close()
