"""Rule 2 (issue 22, item 1): the process that GREW between the onset and fire-time per-process VRAM
snapshots is the growth source, never "the largest process"; anything unsafe is "not attributed"
with its reason. Pure functions: values in, values out."""

from __future__ import annotations

import json
import random
import re

import pytest

from gpuheal.parse.llama_process import is_llama_server, read_pgrep
from gpuheal.parse.smi import parse_rocm_pids
from gpuheal.rules.vram_leak import attribution as va
from tests.smi_captures import FIXTURES  # noqa: E402 — the real captures, wherever the checkout is

T0 = 1_784_000_000.0


def snap(lines, t=T0):
    return va.from_nvidia("\n".join(lines) + "\n", t)


def later(lines, dt=617.3):
    return snap(lines, T0 + dt)


# --------------------------------------------------------------------------- who grew


def test_the_small_process_that_grew_is_named_not_the_largest():
    before = snap(["77, /app/llama-server, 20000", "4242, python3 leaky.py, 300"])
    after = later(["77, /app/llama-server, 20000", "4242, python3 leaky.py, 1700"])
    got = va.attribute(before, after)
    assert isinstance(got, va.Culprit)
    assert (got.pid, got.name, got.grew_mb, got.is_llama_server) == (4242, "python3 leaky.py", 1400.0, False)


def test_llama_server_that_grew_is_this_gpus_llama_server():
    got = va.attribute(snap(["77, /app/llama-server, 20000", "900, Xorg, 40"]),
                       later(["77, /app/llama-server, 20600", "900, Xorg, 40"]))
    assert isinstance(got, va.Culprit) and got.is_llama_server and got.share == 1.0


def test_llama_server_by_its_endpoints_pid_when_known():
    before = snap(["77, /app/llama-server, 20000", "78, /app/llama-server, 1000"])
    after = later(["77, /app/llama-server, 20000", "78, /app/llama-server, 3000"])
    # pid 78 is another endpoint's llama-server (its port is not ours): not this GPU's
    got = va.attribute(before, after, llama_pids=frozenset({77}))
    assert isinstance(got, va.Culprit) and got.pid == 78 and not got.is_llama_server
    decision = va.decide(got, kill_unknown=True, protect=("llama-server",))
    assert decision.kind == "escalate" and "protected" in decision.reason


def test_a_new_process_grew_from_zero():
    got = va.attribute(snap(["77, llama-server, 20000"]), later(["77, llama-server, 20010", "5, miner, 900"]))
    assert isinstance(got, va.Culprit) and got.pid == 5 and got.grew_mb == 900


def test_exited_pids_are_ignored():
    got = va.attribute(snap(["77, llama-server, 20000", "6, gone, 5000"]), later(["77, llama-server, 20500"]))
    assert isinstance(got, va.Culprit) and got.pid == 77


def test_pid_reuse_is_another_process_that_grew_from_zero():
    """Same pid, other name: the old process exited and the pid was handed out again."""
    got = va.attribute(snap(["77, llama-server, 20000", "6, trainer, 5000"]),
                       later(["77, llama-server, 20100", "6, miner, 5000"]))
    assert isinstance(got, va.Culprit) and (got.pid, got.name, got.grew_mb) == (6, "miner", 5000)


def test_no_single_process_holding_most_of_the_growth_is_not_attributed():
    got = va.attribute(snap(["1, a, 100", "2, b, 100"]), later(["1, a, 600", "2, b, 600"]))
    assert isinstance(got, va.Unattributed) and "more than 50%" in got.reason


def test_the_share_is_configurable():
    before, after = snap(["1, a, 100", "2, b, 100"]), later(["1, a, 700", "2, b, 500"])
    assert isinstance(va.attribute(before, after, share=0.5), va.Culprit)
    assert isinstance(va.attribute(before, after, share=0.7), va.Unattributed)


def test_nothing_grew_is_not_attributed():
    got = va.attribute(snap(["1, llama-server, 100"]), later(["1, llama-server, 90"]))
    assert isinstance(got, va.Unattributed) and "no process grew" in got.reason


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "before, after, why",
    [
        (None, ["1, llama-server, 100"], "onset"),
        (["1, llama-server, 100"], None, "at fire time"),
        (["1, llama-server, 100"], ["1, llama-server, 900", "2, [Not Found], [N/A]"], "[N/A]"),
        (["1, llama-server, [N/A]"], ["1, llama-server, 900"], "[N/A]"),
        (["1, llama-server, 100"], ["1, llama-server, 900", "2, lla"], "[N/A]"),  # cut mid-line
        (["1, llama-server, 100"], ["1, llama-server, 900", "31"], "unreadable"),  # cut after a pid
        (["1, llama-server, 100"], ["1, llama-server, 900", "garbage \x00 ÿ"], "unreadable"),
        (["1, llama-server, 100"], ["1, llama-server, 900", "1²3, x, 5"], "unreadable"),
        (["1, llama-server, 100"], ["1, llama-server, 9e999"], "[N/A]"),
        (["1, llama-server, 100"], ["1, llama-server, -5"], "[N/A]"),
    ],
)
def test_bad_lists_are_not_attributed_with_the_reason(before, after, why):
    got = va.attribute(snap(before) if before is not None else None, later(after) if after is not None else None)
    assert isinstance(got, va.Unattributed) and why in got.reason, got
    assert va.decide(got, kill_unknown=True, protect=()).kind == "escalate"


def test_a_failed_snapshot_is_never_attributed_from():
    bad = va.VramSnapshot(T0 + 600, (), "snapshot command failed: exit status 9")
    got = va.attribute(snap(["1, llama-server, 100"]), bad)
    assert isinstance(got, va.Unattributed) and "exit status 9" in got.reason


def test_snapshots_out_of_order_are_not_attributed():
    got = va.attribute(later(["1, llama-server, 100"]), snap(["1, llama-server, 900"]))
    assert isinstance(got, va.Unattributed)


def test_a_huge_list_is_cut_and_not_attributed():
    lines = [f"{pid}, proc{pid}, 10" for pid in range(1, va.MAX_PROCESSES + 50)]
    big = later(lines)
    assert big.error and "truncated" in big.error
    assert isinstance(va.attribute(snap(["1, proc1, 5"]), big), va.Unattributed)


def test_a_list_at_the_limit_is_read():
    lines = [f"{pid}, proc{pid}, 10" for pid in range(1, va.MAX_PROCESSES + 1)]
    assert later(lines).error is None and len(later(lines).processes) == va.MAX_PROCESSES


def test_random_garbage_never_crashes_and_never_names_anyone_who_did_not_grow():
    rng = random.Random(22)
    alphabet = "0123456789, []N/A\n\tllama-server³²\x00ÿ-."
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        before, after = snap(["1, llama-server, 100"]), va.from_nvidia(text, T0 + 700)
        got = va.attribute(before, after)
        if isinstance(got, va.Culprit):  # only a process whose figure really went up
            old = {p.pid: p for p in before.processes}.get(got.pid)
            now = next(p for p in after.processes if p.pid == got.pid)
            assert now.used_mb is not None and now.used_mb - (old.used_mb if old else 0.0) == pytest.approx(got.grew_mb)


def test_no_processes_at_all_is_an_empty_list_not_an_error():
    """nvidia-smi with noheader prints nothing when no process uses the GPU (formats.md §2.3)."""
    empty = va.from_nvidia("", T0)
    assert empty.error is None and empty.processes == ()


# --------------------------------------------------------------------------- the decision


def test_decisions():
    culprit = va.Culprit(4242, "miner", 1400.0, 1500.0, False)
    assert va.decide(culprit, kill_unknown=False, protect=()).kind == "escalate"
    kill = va.decide(culprit, kill_unknown=True, protect=("llama-server", "Xorg"))
    assert (kill.kind, kill.pid) == ("kill", 4242)
    assert va.decide(culprit, kill_unknown=True, protect=("MINER",)).kind == "escalate"
    assert va.decide(va.Culprit(77, "/app/llama-server", 900.0, 900.0, True), True, ()).kind == "restart"
    unknown = va.decide(va.Unattributed("why"), kill_unknown=True, protect=())
    assert unknown.kind == "escalate" and unknown.pid is None and "no restart, no kill" in unknown.reason


def test_is_llama_server_by_program_name_only():
    assert is_llama_server("/app/llama-server") and is_llama_server("./build/bin/llama-server")
    assert is_llama_server("C:\\llama\\llama-server")
    assert not is_llama_server("python3 not-llama-server-wrapper.py")
    assert not is_llama_server("llama-server-exporter")
    # one answer for every rule (issue 26): pgrep's program column (Rule 6.1) and Rule 4's owner check agree
    assert read_pgrep("12 /opt/llama-server-exporter --port 8080\n13 /opt/llama-server --port 8080\n", 8080) == (13,)
    from gpuheal.parse.smi import GpuProcess
    from gpuheal.rules.benchmark_regression.checks import is_own

    assert is_own(GpuProcess(12, "/opt/llama-server-exporter", 1.0), frozenset()) is False
    assert is_own(GpuProcess(13, "/opt/llama-server", 1.0), frozenset()) is True


def test_the_record_names_no_culprit_when_unattributed_and_keeps_both_snapshots():
    before, after = snap(["1, a, 100"]), later(["1, a, 100"])
    doc = va.record(va.attribute(before, after), before, after)
    assert doc["attributed"] is False and "pid" not in doc and "name" not in doc
    assert doc["onset"]["processes"] == [{"pid": 1, "name": "a", "used_mb": 100.0}]
    assert doc["fire"]["taken_s"] == pytest.approx(T0 + 617.3)
    json.dumps(doc)


# --------------------------------------------------------------------------- state


def test_onset_book_round_trips_and_survives_damage():
    book = {"gpu-a": va.Onset("2026-07-18T08:00:00Z", snap(["77, llama-server, 20000"]))}
    assert va.onsets_from_json(json.loads(json.dumps(va.onsets_to_json(book)))) == book
    damaged = {
        "gpu-a": {"since": 5, "snapshot": {}},
        "gpu-b": {"since": None, "snapshot": {"taken_s": "x", "processes": []}},
        "gpu-c": {"since": None, "snapshot": {"taken_s": T0, "processes": [{"pid": True, "name": "x"}]}},
        "gpu-d": "junk",
        7: {},
    }
    got = va.onsets_from_json(damaged)
    assert set(got) == {"gpu-c"} and got["gpu-c"].snapshot.error == "stored list damaged"
    assert va.onsets_from_json("garbage") == {} and va.onsets_from_json(None) == {}


def test_onsets_are_taken_once_per_occurrence_and_dropped_when_the_issue_clears():
    leak = {"gpu-a": va.OpenLeak("2026-07-18T08:00:00Z", firing=True)}
    assert va.onsets_due({}, leak) == ["gpu-a"]
    book = {"gpu-a": va.Onset("2026-07-18T08:00:00Z", snap(["1, llama-server, 1"]))}
    assert va.onsets_due(book, leak) == []
    assert va.onsets_due(book, {"gpu-a": va.OpenLeak("2026-07-18T09:00:00Z", True)}) == ["gpu-a"]  # new occurrence
    assert va.onsets_kept(book, {}) == {}
    failed = {"gpu-a": va.Onset("s", va.VramSnapshot(T0, (), "ssh refused"))}
    assert va.onsets_due(failed, {"gpu-a": va.OpenLeak("s", firing=False)}) == ["gpu-a"]  # retried while pending
    assert va.onsets_due(failed, {"gpu-a": va.OpenLeak("s", firing=True)}) == []  # fired: it stands, and says so


def test_the_remedy_waits_for_the_second_snapshot_on_a_jittered_clock():
    rng = random.Random(7)
    onset = va.Onset("s", snap(["1, llama-server, 1"], T0 + rng.uniform(0, 2)))
    t, waited = T0, []
    while True:  # cron: a minute apart, started a second or two late
        t += 60 + rng.uniform(-1.5, 2.5)
        why = va.wait_reason(onset, t, 600.0, 2.0)
        if why is None:
            break
        waited.append(why)
    assert 9 <= len(waited) <= 10 and t - onset.snapshot.taken_s >= 598
    assert va.wait_reason(None, t, 600.0, 2.0) is not None
    assert va.wait_reason(onset, onset.snapshot.taken_s, 0.0, 2.0) is not None  # never the same run's snapshot


# --------------------------------------------------------------------------- AMD


def test_rocm_smi_showpids_real_capture_parses():
    text = (FIXTURES / "rocm-smi__mi100_rocm571.json").read_text()
    rows, unreadable = parse_rocm_pids(text)
    assert [(p.pid, p.name, p.used_mb) for p in rows] == [(104225, "mlir-cpu-runner", 0.0)] and unreadable == 0
    assert va.from_rocm(text, T0, several_gpus=False).error is None


def test_rocm_smi_pids_bad_input():
    assert parse_rocm_pids("no json") is None
    assert va.from_rocm("no json", T0, False).error
    doc = {"system": {"PID12": "llama-server, 1, UNKNOWN, 0, 0", "PIDx": "a, 1, 2, 3, 4", "PID13": 5,
                      "PID14": "a, b, 1, 2, 3, 4", "PID15": "x, 1, 1²3, 0, 0"}}
    rows, unreadable = parse_rocm_pids(json.dumps(doc))
    assert [(p.pid, p.name, p.used_mb) for p in rows] == [(12, "llama-server", None), (14, "a, b", 0.0)]
    assert unreadable == 3
    assert va.from_rocm(json.dumps(doc), T0, False).error


def test_rocm_smi_on_a_host_with_several_gpus_is_not_attributed():
    """rocm-smi sums a process's VRAM over all GPUs and does not say which one."""
    text = json.dumps({"system": {"PID7": f"llama-server, 1, {2**30}, 0, 0"}})
    got = va.from_rocm(text, T0, several_gpus=True)
    assert got.error and "all GPUs" in got.error


# --------------------------------------------------------------------------- the simulator


def _sim_world(vendor):
    from gpuheal.sim import Scenario
    from gpuheal.sim.world import World

    scn = {"name": "t", "start": "2026-07-18T08:00:00Z",
           "gpus": [{"alias": "g", "host": "h", "vendor": vendor, "vram_total_mb": 24576, "vram_used_mb": 9000,
                    "baseline_tok_s": 70.0}]}
    return World(Scenario.from_dict(scn))


def _real_compute_apps_lines():
    """``pid, process_name, used_gpu_memory`` rows of the real nvidia-smi captures (units stripped,
    the leading columns of the wider queries dropped), as ``--format=csv,noheader,nounits`` prints."""
    out = []
    for path in sorted(FIXTURES.glob("linux-*nvidia*.txt")):
        lines = path.read_text(errors="replace").splitlines()
        for n, line in enumerate(lines):
            if line.startswith("# $ nvidia-smi --query-compute-apps="):
                for row in lines[n + 3:]:
                    if not row.strip() or row.startswith("#"):
                        break
                    cols = row.split(", ")
                    out.append(", ".join([*cols[-3:-1], cols[-1].removesuffix(" MiB")]))
    return out


def test_sim_answers_the_per_process_query_as_nvidia_smi_does():
    real = _real_compute_apps_lines()
    assert real, "the real captures hold per-process rows"
    shape = re.compile(r"^\d+, \S.*, \d+$")
    assert all(shape.match(line) for line in real), real
    world = _sim_world("nvidia")
    text = world.smi_processes("g")
    assert text.endswith("\n") and all(shape.match(line) for line in text.splitlines())
    # the parser reads the sim's output and the real rows alike
    assert va.from_nvidia(text, T0).error is None and va.from_nvidia("\n".join(real), T0).error is None
    before = va.from_nvidia(text, T0)
    world.advance(600)
    world.apply_now({"gpu": "g", "set": {"vram_used_mb": 9600}})
    got = va.attribute(before, va.from_nvidia(world.smi_processes("g"), T0 + 600))
    assert isinstance(got, va.Culprit) and got.is_llama_server and got.grew_mb == 600
    world.restart("g")  # a restarted llama-server is a new process with a new pid
    assert va.from_nvidia(world.smi_processes("g"), T0).processes[0].pid != before.processes[0].pid


def test_sim_answers_rocm_smi_showpids_as_the_real_capture_does():
    real = json.loads((FIXTURES / "rocm-smi__mi100_rocm571.json").read_text())["system"]
    sim = json.loads(_sim_world("amd").smi_processes("g"))["system"]
    pid_key = re.compile(r"^PID\d+$")
    for entries in (real, sim):
        procs = {k: v for k, v in entries.items() if k.startswith("PID")}
        assert procs and all(pid_key.match(k) for k in procs)
        assert all(len(v.rsplit(", ", 4)) == 5 and all(x.isdigit() for x in v.rsplit(", ", 4)[1:]) for v in procs.values())
    rows, unreadable = parse_rocm_pids(json.dumps({"system": sim}))
    assert unreadable == 0 and rows[0].name == "llama-server" and rows[0].used_mb == 9000 - 250
