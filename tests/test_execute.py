"""Executing plan items with a hand-written runner fake (our own port): ordering, evidence,
the Rule 2 growth-source decision, redaction, failures that stop the fix."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from gpuheal.actions.execute import run_item
from gpuheal.config import load_config_dict
from gpuheal.core import plan as planner
from gpuheal.core.issue import Issue
from gpuheal.core.plan import empty_state
from gpuheal.rules import REMEDIES
from gpuheal.rules.vram_leak import attribution as va

# Rule 2's onset snapshots, long before the plan's time: its guard lets the leak's fix act
OLD_ONSETS = {"vram-leak": {g: {"since": "2026-07-18T08:00:00Z", "snapshot": {"taken_s": 0.0, "processes": []}}
                            for g in ("gpu-a", "gpu-b")}}
plan = partial(planner.plan, remedies=REMEDIES, records=OLD_ONSETS)  # every rule's remedy, as heal plans

SECRET = "sk-very-secret-key-1234"


@dataclass
class Outcome:
    rc: int | None = 0
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:  # as transport.CommandOutcome.ok
        return self.rc == 0 and self.error is None and not self.timed_out


class FakeRunner:
    def __init__(self, replies=None):
        self.calls = []
        self.replies = replies or {}

    def __call__(self, target, argv, timeout_s):
        self.calls.append((target, list(argv)))
        for key, reply in self.replies.items():
            if key in argv[0] or key in " ".join(argv):
                return reply
        return Outcome()


def cfg(**heal):
    return load_config_dict(
        {
            "litellm": {"api_key": SECRET},
            "heal": heal,
            "gpus": [
                {"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:9", "restart_command": "systemctl restart llama-server"},
            ],
        }
    )


def item_for(issue_id, c):
    return plan([Issue.from_json({"gpu": "gpu-a", "issue": issue_id, "state": "firing", "since": "2026-07-18T08:00:00Z", "severity": "warning", "detected": {}})], empty_state(), c, 1e9)[0]


def ok_verify(alias):
    return {"ok": True, "health": "ok", "gen_tok_s": 70.0}


def test_restart_gathers_evidence_first_over_ssh_and_redacts_secrets():
    c = cfg()
    runner = FakeRunner({"ps": Outcome(stdout=f"PID USER RSS COMMAND\n77 llama 1000 /usr/bin/llama-server --api-key {SECRET}\n")})
    ex = run_item(item_for("model-stuck", c), c, runner, ok_verify, (SECRET,))
    assert [argv[0] for _, argv in runner.calls] == ["journalctl", "ps", "systemctl"]
    assert all(target == "ct8" for target, _ in runner.calls)
    assert ex.result == "pending" and ex.restarted
    assert SECRET not in str(ex.evidence) and "<redacted>" in str(ex.evidence)


def test_failed_restart_command_stops_and_fails():
    c = cfg()
    ex = run_item(item_for("model-stuck", c), c, FakeRunner({"systemctl": Outcome(rc=5, stderr="Unit not found")}), ok_verify, ())
    assert ex.result == "failed" and not ex.verification
    assert ex.steps[-1].error == "exit status 5"


def test_restart_that_does_not_come_back_fails_verification():
    c = cfg()
    ex = run_item(item_for("model-stuck", c), c, FakeRunner(), lambda a: {"ok": False, "health": "refused", "error": "not ready within 15 s"}, ())
    assert ex.result == "failed"


def test_restart_answering_401_escalates_as_l1():
    c = cfg()
    ex = run_item(item_for("model-stuck", c), c, FakeRunner(), lambda a: {"ok": False, "error": "unauthorized"}, ())
    assert ex.result == "escalated" and "L1" in ex.escalate_reason


def test_ssh_unreachable_host_escalates_as_infrastructure():
    c = cfg()
    ex = run_item(item_for("host-unreachable", c), c, FakeRunner({"systemctl": Outcome(rc=None, error="refused")}), ok_verify, ())
    assert ex.result == "escalated" and "infrastructure" in ex.escalate_reason


def smi(lines):
    return Outcome(stdout="\n".join(lines) + "\n")


NOW_S = 1e9


class KillingRunner(FakeRunner):
    """A kill takes effect: the GPU's process list no longer shows the pid (or, ``stubborn``, it does)."""

    def __init__(self, replies=None, stubborn=False):
        super().__init__(replies)
        self.killed, self.stubborn = set(), stubborn

    def __call__(self, target, argv, timeout_s):
        reply = super().__call__(target, argv, timeout_s)
        if argv[0] == "kill":
            self.killed.add(argv[-1])
        if argv[0] == "nvidia-smi" and not self.stubborn:
            lines = [ln for ln in reply.stdout.splitlines() if ln.split(",")[0] not in self.killed]
            return Outcome(stdout="".join(f"{ln}\n" for ln in lines))
        return reply


def onset(lines, age_s=610.0, gpu="gpu-a"):
    """Rule 2's record (``vram-onset.json``) holding the onset snapshot of the GPU, taken ``age_s``
    before the remedy runs."""
    taken = va.Onset("2026-07-18T08:00:00Z", va.from_nvidia("\n".join(lines), NOW_S - age_s))
    return va.onsets_to_json({gpu: taken})


def leak_run(c, runner, before, item=None):
    item = item or item_for("vram-leak", c)
    return run_item(item, c, runner, ok_verify, (), record=onset(before, gpu=item.gpu), now_s=NOW_S)


def test_vram_leak_from_llama_server_restarts_it():
    c = cfg()
    runner = FakeRunner({"nvidia-smi": smi(["1106871, /app/llama-server, 23342", "900, Xorg, 40"])})
    ex = leak_run(c, runner, ["1106871, /app/llama-server, 22000", "900, Xorg, 40"])
    assert any(argv[0] == "systemctl" for _, argv in runner.calls)
    assert ex.evidence["gpu_processes"][0]["name"] == "/app/llama-server"
    assert ex.evidence["attribution"]["pid"] == 1106871 and ex.evidence["attribution"]["decision"] == "restart"


def test_vram_leak_from_unknown_process_is_not_killed_unless_enabled():
    c = cfg()
    runner = FakeRunner({"nvidia-smi": smi(["1106871, /app/llama-server, 2000", "4242, python3 miner.py, 9000"])})
    ex = leak_run(c, runner, ["1106871, /app/llama-server, 2000", "4242, python3 miner.py, 5000"])
    assert ex.result == "escalated" and "kill_unknown_processes is off" in ex.escalate_reason
    assert not any(argv[0] in ("kill", "systemctl") for _, argv in runner.calls)


def test_vram_leak_unknown_process_killed_when_enabled_with_alert():
    c = cfg(kill_unknown_processes=True)
    runner = KillingRunner({"nvidia-smi": smi(["4242, python3 miner.py, 9000"])})
    ex = leak_run(c, runner, ["4242, python3 miner.py, 8000"])
    assert ["kill", "-TERM", "4242"] in [argv for _, argv in runner.calls]
    assert ex.result == "escalated" and ex.escalate_reason.startswith("killed unknown process 'python3 miner.py'")
    # the kill counts when it is seen: the GPU's list no longer shows the pid
    assert ex.verification == {"killed_pid": 4242, "gone_from_gpu": True}
    assert ex.escalate_reason.endswith("gone from the GPU's process list")


def test_a_kill_that_does_not_take_says_so(monkeypatch):
    from gpuheal.rules.vram_leak import remedy

    monkeypatch.setattr(remedy, "KILL_SEEN_WITHIN_S", 0.2)
    monkeypatch.setattr(remedy, "KILL_POLL_S", 0.05)
    c = cfg(kill_unknown_processes=True)
    runner = KillingRunner({"nvidia-smi": smi(["4242, python3 miner.py, 9000"])}, stubborn=True)
    ex = leak_run(c, runner, ["4242, python3 miner.py, 8000"])
    assert ex.verification == {"killed_pid": 4242, "gone_from_gpu": False}
    assert "still listed after" in ex.escalate_reason


def test_protected_process_is_never_killed():
    c = cfg(kill_unknown_processes=True, protect_processes=["miner"])
    runner = FakeRunner({"nvidia-smi": smi(["4242, miner, 9000"])})
    ex = leak_run(c, runner, ["4242, miner, 8000"])
    assert ex.result == "escalated" and "protected process 'miner'" in ex.escalate_reason
    assert not any(argv[0] in ("kill", "systemctl") for _, argv in runner.calls)


def test_largest_process_that_did_not_grow_is_never_blamed():
    """The old rule blamed whoever held the most VRAM: a 20 GB llama-server that stayed flat and a
    small process that grew. The small one is named, and with the kill off nothing is restarted."""
    c = cfg(kill_unknown_processes=True)
    runner = KillingRunner({"nvidia-smi": smi(["77, /app/llama-server, 20000", "4242, leaky.py, 1700"])})
    ex = leak_run(c, runner, ["77, /app/llama-server, 20000", "4242, leaky.py, 300"])
    assert ex.evidence["attribution"]["name"] == "leaky.py" and ex.evidence["attribution"]["grew_mb"] == 1400
    assert ["kill", "-TERM", "4242"] in [argv for _, argv in runner.calls]
    assert not any(argv[0] == "systemctl" or "77" in argv for _, argv in runner.calls)


def test_unattributed_leak_neither_restarts_nor_kills():
    c = cfg(kill_unknown_processes=True)
    runner = FakeRunner({"nvidia-smi": smi(["77, /app/llama-server, 20000", "4242, [Not Found], [N/A]"])})
    ex = leak_run(c, runner, ["77, /app/llama-server, 19000", "4242, [Not Found], [N/A]"])
    assert ex.result == "escalated" and "not attributed" in ex.escalate_reason and "[N/A]" in ex.escalate_reason
    assert ex.evidence["attribution"]["attributed"] is False and "pid" not in ex.evidence["attribution"]
    assert not any(argv[0] in ("kill", "systemctl") for _, argv in runner.calls)


def test_leak_without_an_onset_snapshot_is_not_attributed():
    c = cfg(kill_unknown_processes=True)
    runner = FakeRunner({"nvidia-smi": smi(["4242, miner, 9000"])})
    ex = run_item(item_for("vram-leak", c), c, runner, ok_verify, (), record={}, now_s=NOW_S)
    assert ex.result == "escalated" and "onset" in ex.escalate_reason
    assert not any(argv[0] in ("kill", "systemctl") for _, argv in runner.calls)


def test_hostile_host_value_stays_one_argument():
    c = load_config_dict({"gpus": [{"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:9", "transport": "local", "restart_command": ["echo", "{endpoint}"]}]})
    runner = FakeRunner()
    run_item(item_for("model-stuck", c), c, runner, ok_verify, ())
    assert runner.calls == [("local", ["echo", "http://127.0.0.1:9"])]


def _regression_cfg():
    return load_config_dict({"gpus": [{"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:9", "vendor": "nvidia"}]})


class Board(FakeRunner):
    """nvidia-smi's power query and ``-pl`` on one board whose limit ``-pl`` changes (or not: ``sticks``)."""

    def __init__(self, current_w=250.0, default_w=350.0, max_w=400.0, sticks=True):
        super().__init__()
        self.limits, self.sticks = [current_w, default_w, max_w], sticks

    def __call__(self, target, argv, timeout_s):
        self.calls.append((target, list(argv)))
        if argv[0] == "nvidia-smi" and "-pl" in argv:
            if self.sticks:
                self.limits[0] = float(argv[argv.index("-pl") + 1])
            return Outcome(stdout="Power limit for GPU 00000000:01:00.0 was set to 350.00 W from 250.00 W.\n")
        if any(a.startswith("--query-gpu=power.limit") for a in argv):
            return Outcome(stdout=", ".join(f"{v:.2f}" for v in self.limits) + "\n")
        return Outcome()


def test_builtin_power_limit_is_restored_only_when_lowered():
    c = _regression_cfg()
    runner = Board()
    ex = run_item(item_for("benchmark-regression", c), c, runner, ok_verify, ())
    assert ["nvidia-smi", "-pl", "350"] in [argv for _, argv in runner.calls]
    step = next(s for s in ex.steps if s.action == "restore-power-limit")
    assert step.ok and "250 W is below the default 350 W" in step.note and step.check["after_w"] == 350


def test_builtin_power_limit_left_alone_at_default_or_unreadable():
    c = _regression_cfg()
    for stdout in ("350.00, 350.00, 400.00\n", "[N/A], [N/A], [N/A]\n", "garbage\n"):
        runner = FakeRunner({"--query-gpu=power.limit": Outcome(stdout=stdout)})
        run_item(item_for("benchmark-regression", c), c, runner, ok_verify, ())
        assert not any(argv[:2] == ["nvidia-smi", "-pl"] for _, argv in runner.calls), stdout


def test_unreadable_evidence_is_a_note_never_the_end_of_the_action():
    """Issue 9 point 6: a ``³`` in ps's RSS column (``isdigit()`` says yes, ``int()`` says no) once
    ended ``heal --apply`` after its intent line; evidence is best effort."""
    c = cfg()
    runner = FakeRunner({"ps": Outcome(stdout="PID USER RSS COMMAND\n77 llama ³0 /usr/bin/llama-server\n")})
    ex = run_item(item_for("model-stuck", c), c, runner, ok_verify, ())
    assert ex.result == "pending" and ex.restarted
    assert [argv[0] for _, argv in runner.calls] == ["journalctl", "ps", "systemctl"]
    assert "processes" in ex.evidence or "unreadable" in ex.evidence.get("processes_error", "")


def test_unreadable_smi_snapshot_is_a_note_and_nothing_is_restarted(monkeypatch):
    from gpuheal.actions import execute

    def broken(text):
        raise ValueError("1²234")

    c = cfg()
    before = onset(["1106871, /app/llama-server, 1000"])
    monkeypatch.setattr(execute, "parse_compute_apps", broken)
    monkeypatch.setattr(va, "parse_compute_apps", broken)
    runner = FakeRunner({"nvidia-smi": smi(["1106871, /app/llama-server, 1²234"])})
    ex = run_item(item_for("vram-leak", c), c, runner, ok_verify, (), record=before, now_s=NOW_S)
    assert "unreadable snapshot" in ex.evidence["snapshot_parse_error"]
    # Rule 2 since issue 22: an unreadable fire-time list attributes nothing: no restart on a guess
    assert ex.result == "escalated" and "unreadable snapshot" in ex.escalate_reason
    assert not any(argv[0] == "systemctl" for _, argv in runner.calls)


def test_litellm_update_is_an_http_call_not_a_command():
    from gpuheal.core.actions import LiteLLMUpdate

    c = load_config_dict({
        "litellm": {"url": "http://127.0.0.1:9/litellm"},
        "gpus": [{"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:9", "litellm_model_id": "dep-a",
                  "litellm_rpm": 60}],
    })
    item = plan([Issue.from_json({"gpu": "gpu-a", "issue": "thermal-warning", "state": "firing", "since": "S", "detected": {}})],
                empty_state(), c, 1e9)[0]
    # weight or rpm, and the value, are read from LiteLLM when it runs (issue 11)
    assert item.steps == (LiteLLMUpdate("shed-load", "dep-a", "auto", None, item.steps[0].note,
                                        item.steps[0].instead),)
    assert item.steps[0].instead is not None and item.steps[0].instead.ratio == 0.7  # the cap where LiteLLM cannot
    sent = []

    def litellm(update, timeout_s):
        sent.append(update)
        return Outcome(stdout="dep-a: rpm 60 -> 30 (read back)")

    runner = FakeRunner()
    ex = run_item(item, c, runner, ok_verify, (), litellm)
    assert sent == list(item.steps) and runner.calls == [] and ex.result == "pending"
    assert ex.steps[0].command == (
        "POST http://127.0.0.1:9/litellm/model/update id=dep-a weight|rpm (read from /v1/model/info)"
    )


def test_a_shed_that_litellm_cannot_store_escalates_in_the_same_item():
    from gpuheal.core.actions import LiteLLMUpdate
    from gpuheal.sources.litellm_admin import AdminOutcome

    c = load_config_dict({
        "litellm": {"url": "http://127.0.0.1:9/litellm"},
        "gpus": [{"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:9", "litellm_model_id": "dep-a"}],
    })
    item = plan([Issue.from_json({"gpu": "gpu-a", "issue": "thermal-critical", "state": "firing", "since": "S", "detected": {}})],
                empty_state(), c, 1e9)[0]
    line = "LiteLLM keeps dep-a in config.yaml (db_model false): load shedding needs STORE_MODEL_IN_DB"

    def cannot(update, timeout_s):
        return AdminOutcome(rc=1, stderr=line, error="config-model", impossible=True)

    ex = run_item(item, c, FakeRunner(), ok_verify, (), cannot)
    assert ex.result == "escalated" and line in ex.escalate_reason
    assert not ex.steps[0].ok and ex.steps[0].error == "config-model"

    def down(update, timeout_s):  # the network, not the setup: a failed attempt, retried next run
        return AdminOutcome(rc=None, stderr="LiteLLM refused /v1/model/info", error="refused")

    assert run_item(item, c, FakeRunner(), ok_verify, (), down).result == "failed"

    # with a command of the operator's for the other half, a failed built-in is a plain failure
    c2 = load_config_dict({
        "litellm": {"url": "http://127.0.0.1:9/litellm"},
        "gpus": [{"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:9", "litellm_model_id": "dep-a",
                  "redirect_command": "my-redirect {alias}", "transport": "local"}],
    })
    item2 = plan([Issue.from_json({"gpu": "gpu-a", "issue": "thermal-critical", "state": "firing", "since": "S", "detected": {}})],
                 empty_state(), c2, 1e9)[0]
    assert isinstance(item2.steps[0], LiteLLMUpdate)  # shed-load stays built in
    # (issue 27 item 7: the shed that cannot happen is said, and the operator's redirect still runs; the attempt
    # is judged by fresh data as any other)
    ex2 = run_item(item2, c2, FakeRunner(), ok_verify, (), cannot)
    assert ex2.result == "pending" and [s.ok for s in ex2.steps] == [False, True]
    assert line in ex2.evidence["shed-load_impossible"]




# --------------------------------------------------------------------------- issue 12: per GPU


def _two_gpu_host(**heal):
    gpus = [{"alias": f"gpu-{c}", "host": "ct9", "gpu_index": i, "endpoint": f"http://127.0.0.1:{9 + i}",
             "vendor": "nvidia", "restart_command": f"systemctl restart llama-server@{i}"}
            for i, c in enumerate("ab")]
    return load_config_dict({"heal": heal, "gpus": gpus})


def _item(issue_id, c, gpu):
    issue = Issue.from_json({"gpu": gpu, "issue": issue_id, "state": "firing", "since": "2026-07-18T08:00:00Z",
             "severity": "warning", "detected": {}})
    return plan([issue], empty_state(), c, 1e9)[0]


def test_power_limit_of_the_second_gpu_is_read_and_restored_on_that_gpu():
    c = _two_gpu_host()
    runner = Board()
    run_item(_item("benchmark-regression", c, "gpu-b"), c, runner, ok_verify, ())
    argvs = [argv for _, argv in runner.calls]
    assert ["nvidia-smi", "-i", "1", "--query-gpu=power.limit,power.default_limit,power.max_limit",
            "--format=csv,noheader,nounits"] in argvs
    assert ["nvidia-smi", "-i", "1", "-pl", "350"] in argvs
    assert not any(argv[:2] == ["nvidia-smi", "-pl"] for argv in argvs)  # never the host's GPU 0


def test_vram_snapshot_and_kill_decision_use_that_gpus_processes_only():
    """GPU 0 of the host runs an unknown process that holds more VRAM than anything; the leak is on
    GPU 1, whose own process lists say llama-server grew: restart it, kill nothing."""
    c = _two_gpu_host(kill_unknown_processes=True)

    class PerGpu(FakeRunner):
        def __call__(self, target, argv, timeout_s):
            self.calls.append((target, list(argv)))
            if argv[0] == "nvidia-smi" and "--query-compute-apps=pid,process_name,used_memory" in argv:
                if argv[1:3] == ["-i", "1"]:
                    return Outcome(stdout="1106871, /app/llama-server, 21000\n")
                return Outcome(stdout="4242, python3 miner.py, 23000\n1106871, /app/llama-server, 21000\n")
            return Outcome()

    runner = PerGpu()
    ex = leak_run(c, runner, ["1106871, /app/llama-server, 20000"], _item("vram-leak", c, "gpu-b"))
    argvs = [argv for _, argv in runner.calls]
    snapshots = [argv for argv in argvs if argv[0] == "nvidia-smi"]
    assert snapshots and all(argv[1:3] == ["-i", "1"] for argv in snapshots)
    assert not any(argv[0] == "kill" for argv in argvs)
    assert ["systemctl", "restart", "llama-server@1"] in argvs
    assert [p["name"] for p in ex.evidence["gpu_processes"]] == ["/app/llama-server"]


def test_a_single_gpu_host_keeps_the_plain_commands():
    c = _regression_cfg()
    runner = FakeRunner({"--query-gpu=power.limit": Outcome(stdout="250.00, 350.00, 400.00\n")})
    run_item(item_for("benchmark-regression", c), c, runner, ok_verify, ())
    assert all("-i" not in argv for _, argv in runner.calls)


def test_vram_leak_without_memcap_command_audits_the_restart_as_uncapped():
    c = cfg()
    runner = FakeRunner({"nvidia-smi": smi(["77, llama-server, 9000"])})
    ex = leak_run(c, runner, ["77, llama-server, 8000"])
    restart = [s for s in ex.steps if s.action == "restart-llama-server-memcap"][0]
    assert restart.note.startswith("uncapped: no memcap_restart_command")


PGREP = Outcome(stdout="77 /app/llama-server --port 9 -m a.gguf\n78 /app/llama-server --port 8081 -m b.gguf\n")


def test_this_gpus_llama_server_is_known_by_its_endpoints_port():
    """Two llama-servers on the GPU: the one that grew listens on another endpoint's port, so it is
    not this GPU's llama-server — a protected process: escalated, nothing restarted or killed."""
    c = cfg(kill_unknown_processes=True)
    runner = FakeRunner({"pgrep": PGREP, "nvidia-smi": smi(["77, /app/llama-server, 9000", "78, /app/llama-server, 5000"])})
    ex = leak_run(c, runner, ["77, /app/llama-server, 9000", "78, /app/llama-server, 4000"])
    assert ex.evidence["attribution"]["llama_server_pids"] == [77]
    assert ex.evidence["attribution"]["pid"] == 78 and ex.evidence["attribution"]["is_llama_server"] is False
    assert ex.result == "escalated" and "protected" in ex.escalate_reason
    assert not any(argv[0] in ("kill", "systemctl") for _, argv in runner.calls)


def test_the_endpoints_llama_server_that_grew_is_restarted():
    c = cfg()
    runner = FakeRunner({"pgrep": PGREP, "nvidia-smi": smi(["77, /app/llama-server, 9600", "78, /app/llama-server, 5000"])})
    ex = leak_run(c, runner, ["77, /app/llama-server, 9000", "78, /app/llama-server, 5000"])
    assert ex.evidence["attribution"]["decision"] == "restart"
    assert any(argv[0] == "systemctl" for _, argv in runner.calls)
