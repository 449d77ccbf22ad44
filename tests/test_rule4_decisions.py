"""Rule 4's three checks as decisions (issue 22, item 2): competing process, throttled power limit,
heat — each yes / no / not known from real tool output (../shared/fixtures/smi), what the attempt
then does, the verifying re-benchmark and its audit line. Bad input never acts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import partial

import pytest
from smi_captures import FIXTURES, NVIDIA_CAPTURES, ROCM_CAPTURES
from test_bench_step import config as bench_config
from test_bench_step import (
    fakes,  # noqa: F401 — the loopback llama-server fake fixture
    run_bench,
    speed_routes,
)
from test_execute import Board, Outcome, ok_verify
from test_execute import FakeRunner as FakeRunnerFor

from gpuheal.actions.execute import run_item
from gpuheal.config import load_config_dict
from gpuheal.core import plan as planner
from gpuheal.core import rebench
from gpuheal.core.alert import Alert
from gpuheal.core.alerts import AlertPolicy, Message, group
from gpuheal.core.issue import Issue
from gpuheal.core.plan import empty_state
from gpuheal.parse.smi import GpuProcess, parse_rocm_pids
from gpuheal.rules import ALL, REMEDIES
from gpuheal.rules.benchmark_regression import checks as rule4
from gpuheal.rules.benchmark_regression.parse import PowerLimits, parse_power_limits, parse_rocm_power_cap
from gpuheal.state import files
from gpuheal.state.store import StateDir

plan = partial(planner.plan, remedies=REMEDIES)  # every rule's remedy, as heal plans
Y, N, U = rule4.Verdict.YES, rule4.Verdict.NO, rule4.Verdict.NOT_KNOWN
LLAMA = GpuProcess(1106871, "/app/llama-server", 21000.0)
MINER = GpuProcess(4242, "python3 miner.py", 2300.0)


def power_row(capture: str) -> str:
    """The capture's real power.limit, power.default_limit, power.max_limit, as gpuheal's query
    prints them (``nounits``): taken by header name from the full ``--query-gpu --format=csv``."""
    lines = (FIXTURES / capture).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("timestamp, ") and "power.default_limit [W]" in line:
            header, values = line.split(", "), lines[i + 1].split(", ")
            row = dict(zip([h.strip() for h in header], [v.strip() for v in values], strict=False))
            names = ("power.limit [W]", "power.default_limit [W]", "power.max_limit [W]")
            return ", ".join(row[n].removesuffix(" W") for n in names) + "\n"
    raise LookupError(capture)


# ----------------------------------------------------------------------------- parsing real output


@pytest.mark.skipif(len(NVIDIA_CAPTURES) < 4, reason="the real smi captures are not here")
def test_power_limits_of_every_real_capture_parse_and_none_is_throttled():
    for capture in NVIDIA_CAPTURES:
        limits = parse_power_limits(power_row(capture))
        assert limits is not None and limits.current_w and limits.default_w and limits.max_w, capture
        assert rule4.judge_power(limits, "default").throttled is N, capture
    rtx = parse_power_limits(power_row("linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt"))
    assert rtx == PowerLimits(250.0, 250.0, 350.0)
    # the spec's "restore to max": the same board is 100 W below its max
    check = rule4.judge_power(rtx, "max")
    assert check.throttled is Y and check.target_w == 350.0


@pytest.mark.parametrize(
    "text",
    ["[N/A], [N/A], [N/A]\n", "garbage\n", "", "NVIDIA-SMI has failed because it couldn't communicate\n",
     "250.00, 350.00\n", "-5, 350.00, 400.00\n", "1e9, 350, 400\n", "nan, inf, 400\n"],
)
def test_bad_power_answers_are_not_known_never_throttled(text):
    check = rule4.judge_power(parse_power_limits(text), "default")
    assert check.throttled is U and check.target_w is None


def test_contradicting_limits_are_not_known():
    assert rule4.judge_power(PowerLimits(450.0, 350.0, 400.0), "default").throttled is U  # above the max
    assert rule4.judge_power(PowerLimits(250.0, 500.0, 400.0), "default").throttled is U  # default above max
    assert rule4.judge_power(PowerLimits(250.0, 350.0, None), "max").throttled is U  # max asked, not known
    assert rule4.judge_power(PowerLimits(349.5, 350.0, 400.0), "default").throttled is N  # within the tolerance


@pytest.mark.skipif(not ROCM_CAPTURES, reason="the real rocm-smi captures are not here")
def test_rocm_pids_and_power_cap_from_real_captures():
    text = (FIXTURES / "rocm-smi__mi100_rocm571.json").read_text()
    assert parse_rocm_pids(text) == ([GpuProcess(104225, "mlir-cpu-runner", 0.0)], 0)
    assert parse_rocm_power_cap(text, None) == PowerLimits(290.0)
    assert rule4.judge_power(parse_rocm_power_cap(text, None), "default").throttled is U  # no default from rocm-smi
    for bad in ("", "[]", '{"system": "x"}', '{"system": {"PIDx": "a, 1", "PID7": 3, "PID0": "b, 1, 2"}}'):
        found = parse_rocm_pids(bad)
        assert found is None or found[0] == []


# ----------------------------------------------------------------------------- the competing process


def test_competing_process_is_named_only_when_the_gpu_is_busy():
    busy = rule4.judge_competition(97.0, 90.0, [LLAMA, MINER])
    assert busy.competing is Y and busy.others == (MINER,)
    assert busy.named() == "python3 miner.py (pid 4242, 2300 MB VRAM)"
    assert rule4.judge_competition(40.0, 90.0, [LLAMA, MINER]).competing is N  # not busy: nothing competes
    assert rule4.judge_competition(97.0, 90.0, [LLAMA]).competing is N  # its own load


def test_own_pid_decides_over_the_name():
    """Another GPU's llama-server on this GPU competes; this GPU's is known by the pid on its port."""
    other_llama = GpuProcess(777, "/opt/llama/llama-server", 9000.0)
    found = rule4.judge_competition(97.0, 90.0, [LLAMA, other_llama], own_pids=frozenset({LLAMA.pid}))
    assert found.competing is Y and found.others == (other_llama,)
    # a pid on the port that the GPU's list does not show (another pid namespace): the names decide
    assert rule4.judge_competition(97.0, 90.0, [LLAMA], own_pids=frozenset({99})).competing is N


@pytest.mark.parametrize(
    ("util", "procs"),
    [(97.0, None), (None, [LLAMA, MINER]), (97.0, []), (97.0, [LLAMA, GpuProcess(312710, "[Not Found]", None)])],
)
def test_competition_not_known(util, procs):
    assert rule4.judge_competition(util, 90.0, procs).competing is U


# ----------------------------------------------------------------------------- the attempt decides


def _cfg(**heal):
    gpu = {"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:9", "vendor": "nvidia"}
    return load_config_dict({"heal": heal, "gpus": [gpu]})


def _item(c, util=97.0, temp=60.0, firing=()):
    issue = Issue.from_json({"gpu": "gpu-a", "issue": "benchmark-regression", "state": "firing", "since": "2026-07-18T08:00:00Z",
             "severity": "warning", "detected": {"util_pct": util, "temp_c": temp}})
    return plan([issue, *firing], empty_state(), c, 1e9)


class Gpu(Board):
    """The board, plus the GPU's compute apps and pgrep's view of llama-server on port 9."""

    def __init__(self, apps: str, **kw):
        super().__init__(**kw)
        self.apps = apps

    def __call__(self, target, argv, timeout_s):
        if argv[0] == "pgrep":
            self.calls.append((target, list(argv)))
            return Outcome(stdout="1106871 /app/llama-server --port 9 -m m.gguf\n")
        if any(a.startswith("--query-compute-apps") for a in argv):
            self.calls.append((target, list(argv)))
            return Outcome(stdout=self.apps)
        return super().__call__(target, argv, timeout_s)


APPS = "1106871, /app/llama-server, 21000\n4242, python3 miner.py, 2300\n"


def test_throttled_power_is_restored_read_back_and_a_rebench_is_due():
    c = _cfg()
    runner = Gpu("1106871, /app/llama-server, 21000\n")
    ex = run_item(_item(c)[0], c, runner, ok_verify, ())
    assert ex.result == "pending" and ex.verification["rebench"].startswith("due")
    assert ex.evidence["rule4"]["power"]["throttled"] == "yes"
    assert ex.evidence["rule4"]["competition"]["competing"] == "no" and ex.evidence["rule4"]["own_pids"] == [1106871]
    assert runner.limits[0] == 350.0


def test_restore_max_when_configured():
    c = _cfg(power_restore="max")
    runner = Gpu("1106871, /app/llama-server, 21000\n", current_w=350.0)
    ex = run_item(_item(c)[0], c, runner, ok_verify, ())
    assert ["nvidia-smi", "-pl", "400"] in [a for _, a in runner.calls] and ex.result == "pending"


def test_a_limit_that_does_not_stick_fails_the_step():
    c = _cfg()
    ex = run_item(_item(c)[0], c, Gpu("1106871, /app/llama-server, 21000\n", sticks=False), ok_verify, ())
    step = next(s for s in ex.steps if s.action == "restore-power-limit")
    assert ex.result == "failed" and step.error == "the new power limit is not seen on the board"


def test_a_competing_process_is_named_and_escalated():
    c = _cfg()
    ex = run_item(_item(c)[0], c, Gpu(APPS, current_w=350.0), ok_verify, ())
    assert ex.result == "escalated" and "python3 miner.py (pid 4242, 2300 MB VRAM)" in ex.escalate_reason
    assert ex.evidence["rule4"]["competition"]["processes"] == [{"pid": 4242, "name": "python3 miner.py",
                                                                 "vram_mb": 2300.0}]


def test_nothing_found_escalates_at_once_and_unknown_says_so():
    c = _cfg()
    ex = run_item(_item(c, util=40.0)[0], c, Gpu(APPS, current_w=350.0), ok_verify, ())
    assert ex.result == "escalated" and "possible hardware degradation" in ex.escalate_reason

    class NA(Gpu):
        def __call__(self, target, argv, timeout_s):
            if any(a.startswith("--query-gpu=power.limit") for a in argv):
                return Outcome(stdout="[N/A], [N/A], [N/A]\n")
            return super().__call__(target, argv, timeout_s)

    na = NA("")
    ex = run_item(_item(c)[0], c, na, ok_verify, ())
    assert ex.result == "escalated" and "not known" in ex.escalate_reason
    assert not any("-pl" in argv for _, argv in na.calls)


# ----------------------------------------------------------------------------- heat joins Rule 1


def test_hot_gpu_regression_joins_the_thermal_incident():
    c = _cfg()
    hot = Issue.from_json({"gpu": "gpu-a", "issue": "thermal-critical", "state": "firing", "since": "2026-07-18T08:00:00Z",
           "severity": "critical", "detected": {"temp_c": 88}})
    items = {i.issue: i for i in _item(c, temp=88.0, firing=(hot,))}
    assert items["thermal-critical"].decision in ("act", "escalate")  # Rule 1's own fix (or its escalation)
    reg = items["benchmark-regression"]
    assert reg.decision == "blocked" and "thermal-critical is open" in reg.reason and not reg.steps
    assert reg.detected["heat"] == {"hot": "yes", "temp_c": 88.0, "thermal_issue": "thermal-critical"}
    cool = _item(c)[0]
    assert cool.decision == "act" and cool.detected["heat"]["hot"] == "no"


def test_one_message_for_a_hot_gpus_regression_and_its_thermal_critical():
    def alert(issue):
        return Alert(f"gpu-a/{issue}", "gpu-a", issue, "escalated", "k", 1.0, issue)

    msgs = group([Message(alert("thermal-critical")), Message(alert("benchmark-regression"))], lambda g: "", 10,
                 AlertPolicy.of(ALL))
    assert len(msgs) == 1 and [a.issue for a in msgs[0].members] == ["thermal-critical", "benchmark-regression"]


# ----------------------------------------------------------------------------- the verifying re-benchmark


def test_rebench_marks_are_tolerant():
    assert rebench.Asks.load(None).asks == () and rebench.Asks.load({"due": {"a": 3, "b": {"issue": 1}}}).asks == ()
    ask = rebench.RebenchAsk("gpu-a", "benchmark-regression", "why", 5.0, attempt="run-1", action="restore-power-limit")
    doc = rebench.Asks().with_ask(ask)
    assert rebench.answering(ask, [], None) is None  # another GPU benchmarked: not this one's answer
    assert rebench.Asks.load(doc.to_json()) == doc


@pytest.mark.parametrize(("gen", "verdict"), [(72.0, "resolved"), (50.0, "failed")])
def test_next_bench_takes_the_mark_and_audits_what_proved_it(tmp_path, fakes, gen, verdict):  # noqa: F811
    srv = fakes(speed_routes(gen))
    c = bench_config({"gpu-dense": srv.url})
    mark = rebench.RebenchAsk("gpu-dense", "benchmark-regression", "power limit 250 W is below the default 350 W",
                              0.0, attempt="gpu-self-heal-20260718-004", action="restore-power-limit")  # fmt: skip
    with StateDir(tmp_path) as store:
        store.write(files.REBENCH, rebench.Asks().with_ask(mark).to_json())
    res = run_bench(c, tmp_path, now=datetime(2026, 7, 18, 9, 0, 3, tzinfo=UTC))
    proof = res.document["rebench"]["gpu-dense"]
    assert proof["recovered_tok_s"] == pytest.approx(74.8 * 0.9) and proof["within_threshold"] is (verdict == "resolved")
    lines = [json.loads(x) for x in (tmp_path / files.AUDIT_LOG).read_text().splitlines()]
    assert [(x["phase"], x["result"], x["run_id"], x["action"]) for x in lines] == [
        ("rebench", verdict, "gpu-self-heal-20260718-004", "restore-power-limit")]
    with StateDir(tmp_path) as store:
        assert rebench.Asks.load(store.read(files.REBENCH, {})).asks == ()
    again = run_bench(c, tmp_path, now=datetime(2026, 7, 18, 9, 7, 1, tzinfo=UTC))  # taken once, never twice
    assert "rebench" not in again.document


# ----------------------------------------------------------------------------- end to end on the simulator


@pytest.fixture
def sim_lab(tmp_path, monkeypatch):
    """A simulated GPU whose board is throttled (250 W of its default 350 W: it generates at 250/350
    of 75 tok/s), with the simulator's nvidia-smi look-alike on PATH; nothing else is faked."""
    import os
    import stat
    import sys

    from lab import Lab, scenario

    gpu = {"alias": "gpu-a", "host": "ct1", "power_limit_w": 250, "power_default_limit_w": 350,
           "power_max_limit_w": 400}  # fmt: skip
    lab = Lab(tmp_path, scenario([gpu]))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "nvidia-smi"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuheal.sim.smi {lab.fleet.control_url} --sim-gpu gpu-a "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    yield lab
    lab.close()


def _bench(lab, advance_s=600):
    from gpuheal.steps import bench

    lab.fleet.advance(advance_s)
    with StateDir(lab.state_dir) as store:
        return bench.run(lab.cfg, store, lab.fleet.now()).document()


def test_sim_throttled_board_restored_rebench_proves_it_and_heal_resolves(sim_lab):
    """Three slow benchmarks; heal --apply reads the board's limits through nvidia-smi, sets the
    default, sees it; the next bench (at full speed now) writes what proved it; the next heal
    resolves the attempt."""
    lab = sim_lab
    for _ in range(3):
        _bench(lab)
    lab.heal()
    assert lab.fleet.state()["gpus"]["gpu-a"]["power_limit_w"] == 350
    intent = [x for x in lab.audit() if x["issue"] == "benchmark-regression" and x["phase"] == "intent"]
    assert intent and lab.read(files.HEAL)["attempts"]  # awaiting its re-benchmark: one outcome line later
    assert {a.gpu for a in rebench.Asks.load(lab.read(files.REBENCH)).asks} == {"gpu-a"}

    doc = _bench(lab)
    assert doc["rebench"]["gpu-a"]["within_threshold"] is True and doc["results"][0]["gen_tok_s"] > 70
    proof = [x for x in lab.audit() if x["phase"] == "rebench"]
    assert proof[-1]["result"] == "resolved" and proof[-1]["run_id"] == intent[-1]["run_id"]
    lab.heal()
    resolved = [x for x in lab.audit() if x["issue"] == "benchmark-regression" and x["result"] == "resolved"]
    outcome = [x for x in resolved if x["phase"] == "verification"]
    assert outcome and outcome[-1]["run_id"] == intent[-1]["run_id"]
    assert outcome[-1]["detected"]["power_throttled"] == "yes" and outcome[-1]["detected"]["competing"] == "no"


def test_sim_competing_process_is_named_in_the_audit_and_the_alert(sim_lab):
    lab = sim_lab
    lab.fleet.set("gpu-a", {"util_pct": 97, "competing_pid": 4242, "competing_vram_mb": 2300})
    for _ in range(3):
        _bench(lab)
    lab.heal()
    esc = [x for x in lab.audit() if x["issue"] == "benchmark-regression" and x["result"] == "escalated"]
    assert esc and "python3 (pid 4242, 2300 MB VRAM)" in json.dumps(esc[-1])
    assert esc[-1]["detected"]["competing_processes"] == [{"pid": 4242, "name": "python3", "vram_mb": 2300.0}]
    assert lab.fleet.state()["gpus"]["gpu-a"]["power_limit_w"] == 350  # the throttled limit restored too
    queued = json.dumps(lab.read(files.ALERTS))
    assert "python3 (pid 4242, 2300 MB VRAM)" in queued


@pytest.mark.skipif(not ROCM_CAPTURES, reason="the real rocm-smi captures are not here")
def test_amd_resets_the_cap_to_the_boards_default_reads_it_back_and_reads_the_pids():
    """rocm-smi prints the cap in force but no default (issue 27 item 12): the cap is reset to the board's
    own default and read back — here the same cap, so it was not throttled; the KFD process list
    (host-wide, one GPU here) names the competing process."""
    c = load_config_dict({"gpus": [{"alias": "gpu-a", "host": "ct15", "endpoint": "http://127.0.0.1:9",
                                    "vendor": "amd"}]})  # fmt: skip
    real = (FIXTURES / "rocm-smi__mi100_rocm571.json").read_text()
    doc = json.loads(real)  # what --showmaxpower alone prints: each card's cap, as captured
    caps = {k: {"Max Graphics Package Power (W)": v["Max Graphics Package Power (W)"]} for k, v in doc.items()
            if k.startswith("card")}  # fmt: skip
    # the snapshot of a one-GPU host: card0's captured readings, then the captured KFD process list
    snapshot = {"card0": {k: v for k, v in doc["card0"].items() if "Temperature" in k or "Power" in k or "use" in k},
                "system": {k: v for k, v in doc["system"].items() if k.startswith("PID")}}  # fmt: skip
    runner = FakeRunnerFor({"--showmaxpower": Outcome(stdout=json.dumps(caps, indent=4)),
                            "--showpids": Outcome(stdout=json.dumps(snapshot, indent=4))})  # fmt: skip
    ex = run_item(_item(c)[0], c, runner, ok_verify, ())
    assert ex.evidence["rule4"]["power"]["throttled"] == "no"
    assert ex.evidence["rule4"]["power"]["why"] == "power cap 290 W is the board's default (the reset changed nothing)"
    assert ex.evidence["rule4"]["competition"]["processes"] == [{"pid": 104225, "name": "mlir-cpu-runner",
                                                                 "vram_mb": 0.0}]  # fmt: skip
    assert ex.result == "escalated" and "mlir-cpu-runner (pid 104225" in ex.escalate_reason
    assert ["rocm-smi", "--resetpoweroverdrive"] in [argv for _, argv in runner.calls]
    assert not any("--setpoweroverdrive" in argv or "-pl" in argv for _, argv in runner.calls)


def test_a_failing_power_query_is_not_known_not_a_failed_fix():
    c = _cfg()
    runner = FakeRunnerFor({"--query-gpu=power.limit": Outcome(rc=127, stderr="nvidia-smi: not found")})
    ex = run_item(_item(c, util=40.0)[0], c, runner, ok_verify, ())
    assert ex.result == "escalated" and "power limits not read (exit status 127)" in ex.escalate_reason
    assert not any("-pl" in argv for _, argv in runner.calls)


def test_sim_a_rebench_that_stays_slow_fails_the_attempt_and_escalates_at_once(sim_lab):
    """The board was throttled, but the GPU stays slow once restored (50 tok/s of 75): the re-benchmark
    disproves the fix, and the next heal fails the attempt and escalates, not a day later."""
    lab = sim_lab
    lab.fleet.set("gpu-a", {"tok_s": 50.0})
    for _ in range(3):
        _bench(lab)
    lab.heal()
    assert lab.fleet.state()["gpus"]["gpu-a"]["power_limit_w"] == 350
    doc = _bench(lab)
    assert doc["rebench"]["gpu-a"]["within_threshold"] is False
    lab.heal()
    lab.heal()
    reg = [x for x in lab.audit() if x["issue"] == "benchmark-regression"]
    assert any(x["result"] == "failed" and x["phase"] == "verification" for x in reg), reg
    esc = [x for x in reg if x["result"] == "escalated"]
    assert esc and "persistent regression" in json.dumps(esc[-1])


def test_sim_hot_gpu_regression_waits_for_rule_1_and_changes_nothing_of_its_own(sim_lab):
    """Slow and hot (88 °C): thermal-critical fires at its 2nd poll and its fix runs; the regression is
    blocked behind it with the same poll's heat, and its own power restore is never run."""
    lab = sim_lab
    lab.fleet.set("gpu-a", {"temp_c": 88})
    for _ in range(3):
        _bench(lab)
    health = lab.heal()
    health = lab.heal()
    states = {(i["gpu"], i["issue"]) for i in health["issues"]}
    assert ("gpu-a", "thermal-critical") in states and ("gpu-a", "benchmark-regression") in states
    blocked = [a for a in health["actions"] if a["issue"] == "benchmark-regression"]
    assert blocked and all("thermal-critical is open" in a["why"] for a in blocked), blocked
    # Rule 1 first (its shed: the thermal power cap, 70 % of 250 W, issue 27 item 7); nothing of Rule 4's own
    assert lab.fleet.state()["gpus"]["gpu-a"]["power_limit_w"] == 175


def test_sim_amd_gpu_names_the_competing_process_and_its_cap_is_its_default(tmp_path, monkeypatch):
    """An AMD GPU read through the simulator's rocm-smi look-alike: the cap is reset to the board's default
    and read back (here: unchanged, not throttled), the KFD process list names the competing process."""
    import os
    import stat
    import sys

    from lab import Lab, scenario

    gpu = {"alias": "gpu-a", "host": "ct15", "vendor": "amd", "power_limit_w": 120, "util_pct": 97,
           "competing_pid": 4242, "competing_vram_mb": 2300, "tok_s": 50.0}  # fmt: skip
    lab = Lab(tmp_path, scenario([gpu]))
    try:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "rocm-smi"
        url = lab.fleet.control_url
        shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuheal.sim.rocm_smi {url} --sim-gpu gpu-a "$@"\n')
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        for _ in range(3):
            _bench(lab)
        lab.heal()
        esc = [x for x in lab.audit() if x["issue"] == "benchmark-regression" and x["result"] == "escalated"]
        assert esc and esc[-1]["detected"]["competing_processes"] == [
            {"pid": 4242, "name": "python3", "vram_mb": 2300.0}]  # fmt: skip
        assert esc[-1]["detected"]["power_throttled"] == "no"  # reset to its default and read back: the same
        assert esc[-1]["detected"]["power_check"].startswith("power cap 120 W is the board's default")
        assert lab.fleet.state()["gpus"]["gpu-a"]["power_limit_w"] == 120
    finally:
        lab.close()


def test_an_amd_process_list_with_unreadable_entries_is_not_known():
    """One of rocm-smi's ``PID`` entries cannot be read: that one could be the competing process, so
    the list is not known (with the reason), never a list without it."""
    from types import SimpleNamespace

    from gpuheal.rules.benchmark_regression.remedy import processes_of as _processes

    amd = SimpleNamespace(vendor="amd", gpu_index=None)
    good = '{"system": {"PID40000": "llama-server, 1, 1048576, 0, 0"}}'
    assert _processes({"snapshot": good}, amd) == ([GpuProcess(40000, "llama-server", 1.0)], "")
    procs, why = _processes({"snapshot": good.replace("}}", ', "PID4242": "python3, 1"}}')}, amd)
    assert procs is None and why == "rocm-smi --showpids: 1 entries unreadable"
    assert _processes({"snapshot": "no json"}, amd) == (None, "rocm-smi --showpids gave no process list")
