"""Rule 1.2's redirect to a cooler GPU through LiteLLM's ``config.yaml`` (issue 27 item 7), without the real
proxy: the pure rewrite (fuzzed), the planner's choice of the cooler GPU, the action's every failure — each
one line, the operator's file never left half-changed — and the doctor's read-only proof. The real proxy
restarted on its rewritten file: ``tests/reallitellm/test_config_redirect_real.py``."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_execute import Outcome

from gpuheal.actions.litellm_config import rewrite
from gpuheal.config import load_config_dict
from gpuheal.core import litellm_config as lc
from gpuheal.core.actions import LiteLLMUpdate, RewriteLiteLLM
from gpuheal.core.heal_state import HealState, Mitigation, Pause
from gpuheal.core.issue import Issue
from gpuheal.core.plan import NoRestore, empty_state, plan, restore_actions
from gpuheal.rules import REMEDIES

DENSE, LIGHT, STRIX = "http://ct8:8080", "http://ct110:8080", "http://ct15:8080"
DOC = {"model_list": [
    {"model_name": "gpu-dense", "litellm_params": {"model": "openai/q", "api_base": DENSE + "/v1", "api_key": "sk-x"}},
    {"model_name": "gpu-light", "litellm_params": {"model": "openai/g", "api_base": LIGHT + "/v1"}},
    {"model_name": "fast", "litellm_params": {"model": "openai/q", "api_base": "http://CT8:8080/v1/"}},
], "general_settings": {"master_key": "sk-master"}}


def test_the_hot_gpus_groups_are_served_by_the_cooler_gpu_and_nothing_else_changes():
    out = lc.redirect(DOC, DENSE, LIGHT)
    assert isinstance(out, lc.Redirect) and out.groups == ("gpu-dense", "fast") and out.to_base == LIGHT + "/v1"
    bases = [e["litellm_params"]["api_base"] for e in out.doc["model_list"]]
    assert bases == [LIGHT + "/v1", LIGHT + "/v1", LIGHT + "/v1"]
    assert out.doc["model_list"][0]["litellm_params"]["api_key"] == "sk-x"  # the rest of the entry kept
    assert out.doc["general_settings"] == DOC["general_settings"] and DOC["model_list"][0]["litellm_params"][
        "api_base"] == DENSE + "/v1"  # the input is not changed in place
    assert lc.redirect(DOC, DENSE, STRIX).to_base == STRIX + "/v1"  # a GPU without an entry: its endpoint


@pytest.mark.parametrize(("doc", "hot", "cool", "why"), [
    ({}, DENSE, LIGHT, "no model_list"),
    ({"model_list": "x"}, DENSE, LIGHT, "no model_list"),
    ({"model_list": [1, None, "x"]}, DENSE, LIGHT, "no model_list entry has the api_base"),
    (DOC, STRIX, LIGHT, "no model_list entry"),
    (DOC, DENSE, DENSE, "not two URLs"),
    (DOC, "not a url", LIGHT, "not two URLs"),
    ({"model_list": [{"model_name": 5, "litellm_params": {"api_base": DENSE}}]}, DENSE, LIGHT, "no model_list entry"),
    ({"model_list": [{}] * (lc.MAX_ENTRIES + 1)}, DENSE, LIGHT, "more than"),
])
def test_a_file_that_cannot_be_redirected_says_why(doc, hot, cool, why):
    out = lc.redirect(doc, hot, cool)
    assert isinstance(out, str) and why in out


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
                    max_leaves=30))
def test_the_rewrite_and_the_read_back_never_raise(doc):
    out = lc.redirect(doc, DENSE, LIGHT)
    assert isinstance(out, str | lc.Redirect)
    assert lc.routes(doc, ("gpu-dense",), DENSE) in (True, False, None)
    assert lc.serves(doc, DENSE) in (True, False)


def test_the_read_back_says_what_litellm_routes():
    info = {"data": [{"model_name": "gpu-dense", "litellm_params": {"api_base": LIGHT + "/v1"}}]}
    assert lc.routes(info, ("gpu-dense",), LIGHT) is True and lc.routes(info, ("gpu-dense",), DENSE) is False
    assert lc.routes(info, ("other",), LIGHT) is None and lc.serves(info, LIGHT) and not lc.serves(info, DENSE)


# --------------------------------------------------------------------------- planned: to which GPU


def fleet(**litellm):
    return load_config_dict({"litellm": {"url": "http://127.0.0.1:4000", "restart_command": "docker restart litellm",
                                         "config_file": "/etc/litellm/config.yaml", **litellm},
                             "gpus": [{"alias": a, "host": h, "endpoint": e, "transport": "ssh"} for a, h, e in
                                      (("gpu-dense", "ct8", DENSE), ("gpu-light", "ct110", LIGHT),
                                       ("strix-moe", "ct15", STRIX))]})


def hot(gpu, issue="thermal-critical"):
    return Issue.from_json({"gpu": gpu, "issue": issue, "state": "firing", "since": "S", "severity": "critical", "detected": {}})


def redirect_of(items, gpu="gpu-dense"):
    item = next(i for i in items if i.gpu == gpu)
    step = next(s for s in item.steps if s.action == "redirect-traffic")
    return step.instead if isinstance(step, LiteLLMUpdate) else step


def test_the_redirect_goes_to_the_first_gpu_with_no_load_shedding_issue_open():
    c = fleet()
    step = redirect_of(plan([hot("gpu-dense")], empty_state(), c, 1e9, remedies=REMEDIES))
    assert isinstance(step, RewriteLiteLLM) and (step.to_alias, step.to_endpoint) == ("gpu-light", LIGHT)
    assert (step.path, step.target, step.restart_argv) == ("/etc/litellm/config.yaml", "local",
                                                           ("docker", "restart", "litellm"))
    also_hot = [hot("gpu-dense"), hot("gpu-light", "thermal-warning")]
    assert redirect_of(plan(also_hot, empty_state(), c, 1e9, remedies=REMEDIES)).to_alias == "strix-moe"
    paused = HealState(paused_gpus={"strix-moe": Pause("maintenance", 0.0)})
    everyone = [*also_hot, hot("strix-moe", "vram-leak")]
    assert redirect_of(plan(everyone[:2], paused, c, 1e9, remedies=REMEDIES)).to_alias is None  # none cooler


@pytest.mark.parametrize("missing", [{"config_file": None}, {"restart_command": None}, {"url": None}])
def test_without_a_config_file_a_restart_command_or_a_url_there_is_no_config_redirect(missing):
    items = plan([hot("gpu-dense")], empty_state(), fleet(**missing), 1e9, remedies=REMEDIES)
    assert [s.action for s in items[0].steps] == ["shed-load"]  # the power cap only


# --------------------------------------------------------------------------- performed: every failure


class Host:
    """Where LiteLLM runs: its config file (``files``), ``cat/test/cp/tee/mv/rm`` and the restart."""

    def __init__(self, text: str, restart=Outcome(), can_write=True):
        self.files = {"/etc/litellm/config.yaml": text}
        self.restart, self.can_write, self.calls = restart, can_write, []

    def __call__(self, target, argv, timeout_s, input=None):
        self.calls.append(list(argv))
        cmd, args = argv[0], [a for a in argv[1:] if a not in ("--", "-p", "-f")]
        if cmd == "cat":
            return Outcome(stdout=self.files[args[0]]) if args[0] in self.files else Outcome(rc=1, stderr="No such")
        if cmd == "test":
            return Outcome() if args[-1] in self.files else Outcome(rc=1)
        if cmd == "cp":
            self.files[args[1]] = self.files[args[0]]
            return Outcome()
        if cmd == "tee":
            if not self.can_write:
                return Outcome(rc=1, stderr="Permission denied")
            self.files[args[0]] = input
            return Outcome(stdout=input)
        if cmd == "mv":
            self.files[args[1]] = self.files.pop(args[0])
            return Outcome()
        if cmd == "rm":
            self.files.pop(args[0], None)
            return Outcome()
        return self.restart


STEP = RewriteLiteLLM("redirect-traffic", "/etc/litellm/config.yaml", "local", ("docker", "restart", "litellm"),
                      DENSE, "gpu-light", LIGHT)


@pytest.fixture
def litellm_answers(monkeypatch):
    """LiteLLM alive at once, its /v1/model/info what the file on the host says (as the real one after a
    restart), unless the test says otherwise."""
    from gpuheal.sources import litellm_admin as la

    monkeypatch.setenv("LITELLM_MASTER_KEY", "sk-master")
    state = {"host": None, "info": None}
    monkeypatch.setattr(la, "liveliness", lambda url, t: None)

    def info(url, key, t):
        if state["info"] is not None:
            return state["info"]
        return {"data": yaml.safe_load(state["host"].files["/etc/litellm/config.yaml"])["model_list"]}

    monkeypatch.setattr(la, "read_model_info", info)
    return state


ORIGINAL = "# mine\n" + yaml.safe_dump(DOC, sort_keys=False)


def test_redirect_then_put_back_leaves_the_operators_file_as_it_was(litellm_answers):
    host = litellm_answers["host"] = Host(ORIGINAL)
    res = rewrite(STEP, host, 10, ("sk-x", "sk-master"), fleet())
    assert res.ok and res.effect == {"kind": "litellm-config", "path": STEP.path, "groups": ["gpu-dense", "fast"],
                                     "to": "gpu-light"}
    assert host.files[STEP.path + ".gpuheal-orig"] == ORIGINAL and ["docker", "restart", "litellm"] in host.calls
    assert "sk-x" not in json.dumps(res.__dict__, default=str)  # the file's keys never in the step
    back = rewrite(RewriteLiteLLM("restore-load", STEP.path, "local", STEP.restart_argv, DENSE, restore=True), host,
                   10, (), fleet())
    assert back.ok and host.files == {STEP.path: ORIGINAL}


@pytest.mark.parametrize(("host", "why", "impossible"), [
    (Host("model_list: [\n"), "cannot be read as YAML", True),
    (Host("a: 1\n"), "has no model_list", True),
    (Host(ORIGINAL, can_write=False), "cannot write", True),
    (Host(ORIGINAL, restart=Outcome(rc=1, stderr="no such container")), "restart_command failed", True),
    (Host(ORIGINAL, restart=Outcome(rc=None, timed_out=True)), "restart_command failed", False),
])
def test_each_failure_is_one_line(litellm_answers, host, why, impossible):
    litellm_answers["host"] = host
    res = rewrite(STEP, host, 10, (), fleet())
    assert not res.ok and why in res.error and res.impossible is impossible and "\n" not in res.error


def test_a_missing_file_no_cooler_gpu_or_no_admin_key_changes_nothing(litellm_answers, monkeypatch):
    host = litellm_answers["host"] = Host(ORIGINAL)
    host.files.clear()
    assert "cannot read" in rewrite(STEP, host, 10, (), fleet()).error
    host = Host(ORIGINAL)
    from dataclasses import replace

    assert "no cooler GPU" in rewrite(replace(STEP, to_alias=None), host, 10, (), fleet()).error and host.calls == []
    monkeypatch.delenv("LITELLM_MASTER_KEY")
    assert "no LiteLLM admin key" in rewrite(STEP, host, 10, (), fleet(admin_key_env="NOPE_X")).error
    assert host.files == {STEP.path: ORIGINAL}


def test_a_read_back_that_does_not_show_it_puts_the_original_back_at_once(litellm_answers):
    host = litellm_answers["host"] = Host(ORIGINAL)
    litellm_answers["info"] = {"data": [{"model_name": "gpu-dense", "litellm_params": {"api_base": DENSE}}]}
    res = rewrite(STEP, host, 10, (), fleet())
    assert not res.ok and "the original file was put back" in res.error and not res.impossible
    assert host.files[STEP.path] == ORIGINAL and host.calls.count(["docker", "restart", "litellm"]) == 2


def test_a_put_back_without_the_original_says_so(litellm_answers):
    host = litellm_answers["host"] = Host(ORIGINAL)
    res = rewrite(RewriteLiteLLM("restore-load", STEP.path, "local", STEP.restart_argv, DENSE, restore=True), host,
                  10, (), fleet())
    assert not res.ok and "is not there" in res.error


def test_a_runner_that_cannot_write_is_said_not_a_crash(litellm_answers):
    host = Host(ORIGINAL)
    litellm_answers["host"] = host

    def three(target, argv, timeout_s):
        return host(target, argv, timeout_s)

    res = rewrite(STEP, three, 10, (), fleet())
    assert not res.ok and "cannot write a file" in res.error and host.files[STEP.path] == ORIGINAL


# --------------------------------------------------------------------------- remembered and undone


@pytest.mark.parametrize("stored", [None, 5, "relative/path", "/x\x00y", "/" + "a" * 5000])
def test_a_damaged_config_path_is_dropped(stored):
    assert Mitigation.from_json({"actions": ["redirect-traffic"], "litellm_config": stored}).litellm_config is None


def test_the_undo_copies_the_original_back_or_says_how_when_it_cannot():
    m = Mitigation(("shed-load", "redirect-traffic"), "thermal-critical", litellm_config="/etc/litellm/config.yaml")
    [step] = restore_actions("gpu-dense", m, fleet())
    assert isinstance(step, RewriteLiteLLM) and step.restore and step.path == "/etc/litellm/config.yaml"
    gone = restore_actions("gpu-dense", m, fleet(config_file=None))
    assert isinstance(gone, NoRestore) and gone.result == "planned" and ".gpuheal-orig back" in gone.why
    state = HealState().with_mitigation("gpu-dense", Mitigation(("redirect-traffic",), "thermal-critical"))
    state = lc.note_restore(state, "gpu-dense", [{"kind": "litellm-config", "path": "/etc/litellm/config.yaml"}])
    assert state.active["gpu-dense"].litellm_config == "/etc/litellm/config.yaml"


# --------------------------------------------------------------------------- the doctor's proof


class Ro:
    def __init__(self, files, writable=True):
        self.files, self.writable, self.calls = files, writable, []

    def run(self, argv, timeout_s):
        self.calls.append(list(argv))
        if argv[0] == "cat":
            return Outcome(stdout=self.files[argv[-1]]) if argv[-1] in self.files else Outcome(rc=1, stderr="No such")
        return Outcome() if self.writable else Outcome(rc=1)


def test_doctor_proves_the_config_redirect_read_only():
    from gpuheal.doctor.power import config_redirect_checks

    rows = {(r.target, r.status): r for r in config_redirect_checks(Ro({"/etc/litellm/config.yaml": ORIGINAL}),
                                                                    fleet(), 5)}
    assert rows[("gpu-dense", "ok")].detail.startswith("/etc/litellm/config.yaml sends gpu-dense, fast here")
    assert "no model_list entry" in rows[("strix-moe", "warn")].detail
    bad = config_redirect_checks(Ro({"/etc/litellm/config.yaml": "{{{"}), fleet(), 5)
    assert [r.status for r in bad] == ["fail"]
    ro = Ro({"/etc/litellm/config.yaml": ORIGINAL}, writable=False)
    assert config_redirect_checks(ro, fleet(), 5)[-1].status == "fail"
    assert all(a[0] in ("cat", "test") for a in ro.calls)  # changes nothing
    assert config_redirect_checks(Ro({}), fleet(config_file=None), 5) == []
