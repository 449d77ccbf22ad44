"""The thermal power cap (issue 27 item 7): on a fleet whose LiteLLM cannot shed (``config.yaml``, no
database — the spec's own), Rules 1 and 8's ``shed-load`` caps the hot GPU's board power with its own tool
(``nvidia-smi -pl``, ``rocm-smi --setpoweroverdrive``), counted only when a read-back shows it, and
``restore-power-limit`` puts the limit found before back once the GPU stayed cool. Each vendor's tool is
the simulator's look-alike on PATH for the end-to-end runs (real shapes: ``tests/test_sim_smi.py``); bad
answers come from a fake runner. Never a traceback, never a cap that is not seen."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_execute import FakeRunner, Outcome, ok_verify

from gpuheal.actions import power as power_actions
from gpuheal.actions.execute import run_item
from gpuheal.actions.runner import bind
from gpuheal.config import load_config_dict
from gpuheal.core import power
from gpuheal.core.actions import CapPower
from gpuheal.core.heal_state import HealState, Mitigation
from gpuheal.core.issue import Issue
from gpuheal.core.plan import NoRestore, empty_state, plan, restore_actions
from gpuheal.parse.power import PowerLimits, parse_power_limits, parse_rocm_power_cap
from gpuheal.rules import REMEDIES
from tests.lab import Lab, scenario

VALUES = {"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:9"}


def cap_power(step, values, runner, timeout_s, secrets):
    """The cap as ``perform`` runs it: its commands bound to the step's target."""
    return power_actions.cap_power(step, bind(step, values, runner, timeout_s, secrets))
SHED = CapPower("shed-load", "nvidia", None, "ct8", ratio=0.7)


class Board(FakeRunner):
    """One NVIDIA board answering the four-column power query; ``-pl`` changes it unless ``sticks`` is False."""

    def __init__(self, limit=350.0, default=350.0, lo=100.0, hi=400.0, sticks=True, setter=None):
        super().__init__()
        self.values, self.sticks, self.setter = [limit, default, lo, hi], sticks, setter

    def __call__(self, target, argv, timeout_s):
        self.calls.append((target, list(argv)))
        if "-pl" in argv:
            if self.setter is not None:
                return self.setter
            if self.sticks:
                self.values[0] = float(argv[argv.index("-pl") + 1])
            return Outcome(stdout="Power limit for GPU 00000000:01:00.0 was set to X W from Y W.\nAll done.\n")
        return Outcome(stdout=", ".join(f"{v:.2f}" for v in self.values) + "\n")


class Strix(FakeRunner):
    """rocm-smi on one card: ``--showmaxpower --json`` and ``--setpoweroverdrive`` (whole watts)."""

    def __init__(self, cap=120.0, card=0):
        super().__init__()
        self.cap, self.card = cap, card

    def __call__(self, target, argv, timeout_s):
        self.calls.append((target, list(argv)))
        if "--setpoweroverdrive" in argv:
            self.cap = float(int(argv[argv.index("--setpoweroverdrive") + 1]))
            return Outcome(stdout=f"GPU[{self.card}]\t\t: Successfully set power to: {int(self.cap)}W\n")
        return Outcome(stdout=json.dumps({f"card{self.card}": {"Max Graphics Package Power (W)": f"{self.cap:.1f}"}}))


def setters(runner) -> list[list[str]]:
    return [a for _, a in runner.calls if "-pl" in a or "--setpoweroverdrive" in a]


# --------------------------------------------------------------------------- one cap, every answer


def test_a_cap_is_set_read_back_and_leaves_what_to_put_back():
    board = Board()
    res = cap_power(SHED, VALUES, board, 10, ())
    assert res.ok and res.action == "shed-load" and res.target == "ct8"
    assert setters(board) == [["nvidia-smi", "-pl", "245"]] and board.values[0] == 245
    assert res.effect == {"kind": "power-limit", "before_w": 350.0, "after_w": 245.0}
    assert res.check == {"before_w": 350.0, "target_w": 245.0, "after_w": 245.0}
    assert "350 W -> 245 W" in res.note and "read back" in res.note


def test_never_below_the_boards_own_minimum_and_nothing_when_already_there():
    board = Board(limit=350.0, lo=300.0)
    assert cap_power(SHED, VALUES, board, 10, ()).ok and board.values[0] == 300
    again = cap_power(SHED, VALUES, board, 10, ())
    assert again.ok and again.effect is None and "already at the floor" in again.note
    assert len(setters(board)) == 1  # nothing to lower: nothing sent


def test_a_cap_the_board_does_not_show_is_a_failure():
    res = cap_power(SHED, VALUES, Board(sticks=False), 10, ())
    assert not res.ok and "not seen on the board (reads 350 W)" in res.error and res.effect is None


@pytest.mark.parametrize(("reply", "why", "impossible"), [
    (Outcome(rc=127, stderr="sh: nvidia-smi: not found"), "power limits not read", True),
    (Outcome(rc=None, error="not found: nvidia-smi"), "power limits not read", True),
    (Outcome(timed_out=True, rc=None), "power limits not read", False),  # the next run tries again
    (Outcome(stdout="[N/A], [N/A], [N/A], [N/A]\n"), "power limit not known", True),
    (Outcome(stdout="\x1b[31mgarbage\n" * 50), "power limit not known", True),
    (Outcome(stdout="-5, 350, 100, 400\n"), "power limit not known", True),
    (Outcome(stdout="1e999, 350, 100, 400\n"), "power limit not known", True),
    (Outcome(stdout=""), "power limit not known", True),
])
def test_limits_that_cannot_be_read_change_nothing(reply, why, impossible):
    runner = FakeRunner({"nvidia-smi": reply})
    res = cap_power(SHED, VALUES, runner, 10, ())
    assert not res.ok and why in res.error and setters(runner) == [] and res.impossible is impossible


def test_a_refused_setter_fails_with_its_answer_and_hides_secrets():
    board = Board(setter=Outcome(rc=4, stderr="Insufficient Permissions for sk-secret-123\n"))
    res = cap_power(SHED, VALUES, board, 10, ("sk-secret-123",))
    assert not res.ok and res.rc == 4 and "sk-secret-123" not in res.output and res.effect is None


def test_on_a_host_of_several_gpus_only_that_gpu_is_capped():
    board = Board()
    assert cap_power(replace(SHED, gpu_index=2), VALUES, board, 10, ()).ok
    assert [a[:3] for _, a in board.calls] == [["nvidia-smi", "-i", "2"]] * 3


def test_amd_is_capped_in_whole_watts_with_rocm_smi_and_read_back():
    strix = Strix(cap=121.0, card=1)
    res = cap_power(CapPower("shed-load", "amd", 1, "ct15", ratio=0.7), VALUES, strix, 10, ())
    assert res.ok and strix.cap == 84.0
    assert setters(strix) == [["rocm-smi", "-d", "1", "--setpoweroverdrive", "84"]]
    assert res.effect == {"kind": "power-limit", "before_w": 121.0, "after_w": 84.0}
    back = cap_power(CapPower("restore-power-limit", "amd", 1, "ct15", watts=121.0), VALUES, strix, 10, ())
    assert back.ok and strix.cap == 121.0 and back.effect is None


def test_a_put_back_already_in_force_sends_nothing():
    board = Board()
    res = cap_power(CapPower("restore-power-limit", "nvidia", None, "ct8", watts=350.0), VALUES, board, 10, ())
    assert res.ok and "already 350 W" in res.note and setters(board) == []


# --------------------------------------------------------------------------- parsers: bad input is normal input


def test_the_query_is_read_positionally_with_and_without_the_minimum():
    assert parse_power_limits("350.00, 350.00, 100.00, 400.00\n") == PowerLimits(350.0, 350.0, 400.0, 100.0)
    assert parse_power_limits("power.limit [W], x, y, z\n250.00, 250.00, 350.00\n") == PowerLimits(250, 250, 350)
    assert parse_power_limits("Failed to initialize NVML: Driver/library version mismatch\n") is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400), st.one_of(st.none(), st.integers(-3, 5000)))
def test_the_power_parsers_never_raise_and_never_invent_a_limit(text, card):
    got = parse_power_limits(text)
    assert got is None or all(v is None or 0 < v <= 10_000 for v in (got.current_w, got.default_w, got.max_w, got.min_w))
    cap = parse_rocm_power_cap(text, card)
    assert cap is None or cap.current_w is None or 0 < cap.current_w <= 10_000
    plan_ = power.cap_plan("amd", got, 0.7)
    assert plan_.target_w is None or (plan_.before_w is not None and plan_.target_w < plan_.before_w)


@pytest.mark.parametrize("stored", [None, "x", -5, 0, 1e9, float("nan"), True, "350"])
def test_a_damaged_power_restore_is_dropped_never_guessed(stored):
    m = Mitigation.from_json({"actions": ["shed-load"], "issue": "thermal-critical", "power_w": stored})
    assert m is not None and m.power_w is None
    assert Mitigation.from_json(Mitigation(("shed-load",), "thermal-critical", power_w=350.0).to_json()).power_w == 350


def test_the_limit_before_the_first_cap_is_what_is_put_back():
    state = HealState().with_mitigation("gpu-a", Mitigation(("shed-load",), "thermal-critical"))
    state = power.note_restore(state, "gpu-a", [{"kind": "power-limit", "before_w": 350.0, "after_w": 245.0}])
    state = power.note_restore(state, "gpu-a", [{"kind": "power-limit", "before_w": 245.0, "after_w": 171.5}])
    assert state.active["gpu-a"].power_w == 350.0
    assert power.note_restore(state, "gpu-b", [{"kind": "power-limit", "before_w": 1.0}]) == state


# --------------------------------------------------------------------------- planned, performed, undone


def spec_like(**heal):
    return load_config_dict({"heal": heal, "gpus": [
        {"alias": "gpu-dense", "host": "ct8", "endpoint": "http://127.0.0.1:9", "transport": "ssh"},
        {"alias": "strix-moe", "host": "ct15", "endpoint": "http://127.0.0.1:9", "transport": "ssh", "vendor": "amd"}]})


def hot(gpu, issue="thermal-critical"):
    return Issue.from_json({"gpu": gpu, "issue": issue, "state": "firing", "since": "S", "severity": "critical", "detected": {}})


def test_the_undo_puts_the_power_back_first_and_says_when_nothing_is_left():
    c = spec_like()
    [step] = restore_actions("gpu-dense", Mitigation(("shed-load",), "thermal-critical", power_w=350.0), c)
    assert (step.action, step.watts, step.target, step.ratio) == ("restore-power-limit", 350.0, "ct8", None)
    nothing = restore_actions("gpu-dense", Mitigation(("shed-load",), "thermal-critical"), c)
    assert isinstance(nothing, NoRestore) and nothing.result == "resolved"


def test_tier2_applies_rule1_logic_and_on_the_spec_fleet_that_is_the_cap():
    [item] = plan([hot("strix-moe", "thermal-rising")], empty_state(), spec_like(), 1e9, remedies=REMEDIES)
    assert item.decision == "act" and [(s.action, type(s).__name__) for s in item.steps] == [("shed-load", "CapPower")]


def test_a_litellm_that_cannot_shed_caps_the_power_instead_in_the_same_attempt():
    from gpuheal.sources.litellm_admin import AdminOutcome

    c = load_config_dict({"litellm": {"url": "http://127.0.0.1:9/litellm"}, "gpus": [
        {"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:9", "litellm_model_id": "dep-a",
         "redirect_command": "my-redirect {alias}"}]})
    [item] = plan([hot("gpu-a")], empty_state(), c, 1e9, remedies=REMEDIES)
    line = "LiteLLM keeps dep-a in config.yaml (db_model false)"

    def cannot(update, timeout_s):
        return AdminOutcome(rc=1, stderr=line, error="config-model", impossible=True)

    board = Board()
    ex = run_item(item, c, board, ok_verify, (), cannot)
    assert ex.result == "pending" and [s.action for s in ex.steps] == ["shed-load", "redirect-traffic"]
    assert ex.steps[0].ok and line in ex.steps[0].note and board.values[0] == 245
    assert ex.steps[0].effect["kind"] == "power-limit"
    # the cap failing too: the refusal stands, with both reasons, and no operator command for the shed
    c2 = load_config_dict({"litellm": {"url": "http://127.0.0.1:9/litellm"}, "gpus": [
        {"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:9", "litellm_model_id": "dep-a"}]})
    [item2] = plan([hot("gpu-a")], empty_state(), c2, 1e9, remedies=REMEDIES)
    ex2 = run_item(item2, c2, FakeRunner({"nvidia-smi": Outcome(rc=127, stderr="not found")}), ok_verify, (), cannot)
    assert ex2.result == "escalated" and line in ex2.escalate_reason and "the power cap instead failed too" in \
        ex2.escalate_reason


# --------------------------------------------------------------------------- the spec's fleet, end to end


@pytest.fixture
def spec_fleet(tmp_path, monkeypatch):
    """The spec's three GPUs (two NVIDIA, one AMD) on the simulator, LiteLLM from config.yaml (no
    deployment ids, as examples/fleet.yaml), each GPU's vendor tool the simulator's look-alike on PATH."""
    gpus = [{"alias": "gpu-dense", "host": "ct8", "gpu_index": 0, "power_limit_w": 350, "power_default_limit_w": 350,
             "power_max_limit_w": 400},
            {"alias": "gpu-light", "host": "ct110", "gpu_index": 1, "power_limit_w": 250, "power_default_limit_w": 250,
             "power_max_limit_w": 300},
            {"alias": "strix-moe", "host": "ct15", "gpu_index": 2, "vendor": "amd", "power_limit_w": 120,
             "power_max_limit_w": 140}]
    lab = Lab(tmp_path, scenario(gpus), heal={"restore_after_s": 120, "startup_grace_s": 0})
    for g in lab.raw["gpus"]:
        g["transport"] = "local"
        g.pop("litellm_model_id", None)
    lab.write_config()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, module in (("nvidia-smi", "smi"), ("rocm-smi", "rocm_smi")):
        shim = bin_dir / tool
        shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuheal.sim.{module} {lab.fleet.control_url} "$@"\n')
        shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    yield lab
    lab.close()


def board_limit(lab, alias) -> float:
    return float(lab.fleet.state()["gpus"][alias]["power_limit_w"])


@pytest.mark.parametrize(("alias", "before", "capped"), [("gpu-dense", 350.0, 245.0), ("strix-moe", 120.0, 84.0)])
def test_the_spec_fleet_cools_out_of_the_box_and_gets_its_power_back(spec_fleet, alias, before, capped):
    lab = spec_fleet
    lab.fleet.set(alias, {"temp_c": 90})
    docs = [lab.heal() for _ in range(3)]
    shed = [a for d in docs for a in d["actions"] if a["gpu"] == alias and a["action"] == "shed-load"]
    assert shed, [d["actions"] for d in docs]
    assert board_limit(lab, alias) == capped  # the board shows it
    escalated = [a for a in lab.read("alerts.json").get("queue", []) if a["gpu"] == alias and "no command" in
                 a["summary"]]  # fmt: skip
    assert escalated == []
    intent = [r for r in lab.audit() if r["gpu"] == alias and r["phase"] == "intent" and r["action"] == "shed-load"]
    assert intent and intent[0]["result"] == "pending"
    assert lab.read("heal-state.json")["active"][alias]["power_w"] == before
    lab.fleet.set(alias, {"temp_c": 60})
    for _ in range(5):
        lab.heal()
    # one outcome line per attempt (issue 27 item 13): written when fresh data proved the cap cooled it
    outcome = [r for r in lab.audit() if r["gpu"] == alias and r["phase"] != "intent" and r["action"] == "shed-load"]
    assert len(outcome) == 1 and outcome[0]["result"] == "resolved" and outcome[0]["steps"][0]["ok"] is True
    assert board_limit(lab, alias) == before  # put back once it stayed cool, and read back
    undo = [r for r in lab.audit() if r["gpu"] == alias and r["action"] == "restore-power-limit"]
    assert [r["phase"] for r in undo] == ["intent", "outcome"] and undo[1]["result"] == "resolved"
    assert undo[1]["check"]["after_w"] == before
    assert alias not in lab.read("heal-state.json").get("active", {})


# --------------------------------------------------------------------------- doctor proves it, changing nothing


def doctor_rows(lab, tmp_path):
    from pathlib import Path

    from gpuheal.doctor import checks  # noqa: F401  (registers the built-in checks)
    from gpuheal.runtime import Runtime
    from gpuheal.steps import doctor as step

    rt = Runtime(cfg=lab.cfg, state_dir=Path(tmp_path / "doctor-state"), now=None)  # type: ignore[arg-type]
    doc = step.command(rt, environ={}).document
    return {(c["target"], c["check"]): c for c in doc["checks"]}


def test_doctor_proves_the_cap_on_the_spec_fleet_and_changes_nothing(spec_fleet, tmp_path):
    rows = doctor_rows(spec_fleet, tmp_path)
    dense, strix = rows[("gpu-dense", "load shedding (power cap)")], rows[("strix-moe", "load shedding (power cap)")]
    assert dense["status"] == "ok" and "would run nvidia-smi -i 0 -pl 245" in dense["detail"], dense
    assert "350 W -> 245 W" in dense["detail"] and "restore-power-limit" in dense["detail"]
    assert strix["status"] == "ok" and "rocm-smi -d 2 --setpoweroverdrive 84" in strix["detail"], strix
    assert ("gpu-dense", "load shedding") not in rows or rows[("gpu-dense", "load shedding")]["status"] != "warn"
    assert {a: board_limit(spec_fleet, a) for a in ("gpu-dense", "gpu-light", "strix-moe")} == {
        "gpu-dense": 350.0, "gpu-light": 250.0, "strix-moe": 120.0}  # nothing set


def test_doctor_says_when_the_cap_would_fail_or_needs_root(spec_fleet, tmp_path):
    bin_dir = tmp_path / "bin"
    (bin_dir / "id").write_text("#!/bin/sh\necho 1000\n")
    (bin_dir / "id").chmod(0o755)
    (bin_dir / "rocm-smi").write_text("#!/bin/sh\necho 'ERROR: GPU[\x1b[31m2] : not found' >&2\nexit 2\n")
    rows = doctor_rows(spec_fleet, tmp_path)
    root = rows[("gpu-dense", "power cap: root")]
    assert root["status"] == "warn" and "uid 1000" in root["detail"] and "ssh_user" in root["fix"]
    strix = rows[("strix-moe", "load shedding (power cap)")]
    assert strix["status"] == "fail" and "rocm-smi -d 2 --showmaxpower --json" in strix["detail"]
    assert "\x1b" not in strix["detail"] and "shed_load_command" in strix["fix"]


def test_doctor_has_nothing_to_prove_where_a_command_or_litellm_sheds(tmp_path):
    from gpuheal.doctor.power import cap_of

    c = load_config_dict({"litellm": {"url": "http://127.0.0.1:9"}, "gpus": [
        {"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:9", "shed_load_command": "my-shed"},
        {"alias": "b", "host": "h2", "endpoint": "http://127.0.0.1:9", "litellm_model_id": "b"},
        {"alias": "c", "host": "h3", "endpoint": "http://127.0.0.1:9"}], "heal": {"shed_power_ratio": 0.5}})
    assert cap_of(c, "a") is None and cap_of(c, "b") is None and cap_of(c, "c").ratio == 0.5
