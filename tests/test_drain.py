"""Drain first (issue 28 item 2): a GPU with a hard fault leaves its LiteLLM model group at the first bad poll
while a healthy twin serves the group, and comes back once the issue cleared and a real completion on it
succeeds — on the simulated fleet, whose LiteLLM look-alike reads its ``config.yaml`` at each restart as the
real proxy does (the real one: ``tests/reallitellm/test_drain_real.py``). The pure decisions, the rules' hooks,
every refusal (the last healthy deployment, the fleet guard, a paused GPU), a blip, a dry run, and a LiteLLM
answering garbage, slowly, 500, or not showing the change: one line, the audit intact, the heal goes on."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from lab import Lab, scenario

from gpuheal.core import drain as core
from gpuheal.core import litellm_config as lc
from gpuheal.core.topology import Route
from gpuheal.rules import REMEDIES

A, B, C = "http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"


def entry(group: str, base: str, mid: str) -> dict:
    return {"model_name": group, "litellm_params": {"model": "openai/x", "api_base": base + "/v1", "api_key": "sk-k"},
            "model_info": {"id": mid}}


DOC = {"model_list": [entry("qwen", A, "a"), entry("qwen", B, "b"), entry("solo", C, "c")],
       "general_settings": {"master_key": "sk-master"}}


# --------------------------------------------------------------------------- pure: the file, the decision
def test_a_drain_takes_the_gpus_entries_out_and_undrain_puts_them_back_in_place():
    out = lc.drain(DOC, A)
    assert isinstance(out, lc.Drain) and out.groups == ("qwen",)
    assert [e["model_info"]["id"] for e in out.doc["model_list"]] == ["b", "c"]
    assert out.doc["general_settings"] == DOC["general_settings"] and len(DOC["model_list"]) == 3  # input kept
    assert lc.undrain(out.doc, DOC, A) == DOC
    # another GPU drained meanwhile (its own copy holds it): only this GPU's entries come back
    both = lc.drain(out.doc, B)
    assert isinstance(both, str) and "only deployment of qwen" in both  # never the last of a group
    doc4 = {"model_list": [*DOC["model_list"], entry("solo", B, "d")]}
    first = lc.drain(doc4, C)
    assert isinstance(first, lc.Drain)
    back = lc.undrain(lc.drain(first.doc, A).doc, doc4, C)
    assert [e["model_info"]["id"] for e in back["model_list"]] == ["b", "c", "d"]


@pytest.mark.parametrize(("doc", "endpoint", "why"), [
    ({}, A, "no model_list"), ({"model_list": "x"}, A, "no model_list"), (DOC, "nope", "not a URL"),
    (DOC, "http://127.0.0.1:9", "no model_list entry"), (DOC, C, "only deployment of solo"),
    ({"model_list": [{}] * (lc.MAX_ENTRIES + 1)}, A, "more than"),
])
def test_a_file_that_cannot_be_drained_says_why(doc, endpoint, why):
    out = lc.drain(doc, endpoint)
    assert isinstance(out, str) and why in out


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
                    max_leaves=30))
def test_drain_undrain_and_the_book_never_raise_on_garbage(doc):
    assert isinstance(lc.drain(doc, A), str | lc.Drain)
    assert isinstance(lc.undrain(doc, doc, A), str | dict)
    assert isinstance(lc.undrain(DOC, doc, A), str | dict)
    assert isinstance(core.Book.from_json(doc), core.Book)
    assert isinstance(core.Book.from_json({"drained": [doc, doc]}), core.Book)


ROUTES = (Route("qwen", "a", A + "/v1"), Route("qwen", "b", B + "/v1"), Route("solo", "c", C + "/v1"))
EPS = {"gpu-a": A, "gpu-b": B, "gpu-c": C}


def hard(gpu: str) -> core.Hard:
    return core.Hard(gpu, "host-unreachable", "t0", "connection refused", {"endpoint": "refused"})


def test_the_decision_needs_a_healthy_twin_for_every_group_and_the_fleet_guard():
    healthy = frozenset({"gpu-b", "gpu-c"})
    go = core.decide(hard("gpu-a"), ROUTES, EPS, healthy, frozenset({"gpu-a"}), core.Book(), 0.5)
    assert go == core.Go(("qwen",), {"qwen": ("gpu-b",)})
    last = core.decide(hard("gpu-c"), ROUTES, EPS, frozenset({"gpu-a", "gpu-b"}), frozenset({"gpu-c"}), core.Book(),
                       0.5)  # fmt: skip
    assert isinstance(last, core.Refuse) and "last healthy deployment of LiteLLM's group 'solo'" in last.why
    sick_twin = core.decide(hard("gpu-a"), ROUTES, EPS, frozenset({"gpu-c"}), frozenset({"gpu-a"}), core.Book(), 0.5)
    assert isinstance(sick_twin, core.Refuse) and "last healthy" in sick_twin.why
    guard = core.decide(hard("gpu-a"), ROUTES, EPS, healthy, frozenset({"gpu-a"}), core.Book(), 0.3)
    assert isinstance(guard, core.Refuse) and "fleet guard" in guard.why
    drained = core.Book({"gpu-x": core.Drained("gpu-x", "model-stuck", None, "f", ("g",), 0.0, "r")})
    many = core.decide(hard("gpu-a"), ROUTES, {**EPS, "gpu-x": "http://127.0.0.1:9004"}, healthy,
                       frozenset({"gpu-a"}), drained, 0.4)  # fmt: skip
    assert isinstance(many, core.Refuse) and "fleet guard: 2 of 4" in many.why
    unrouted = core.decide(hard("gpu-a"), ROUTES[1:], EPS, healthy, frozenset(), core.Book(), 0.5)
    assert isinstance(unrouted, core.Refuse) and "routes nothing" in unrouted.why


def test_the_rules_declare_which_findings_are_hard_faults():
    unreachable, stuck = REMEDIES["host-unreachable"].drain, REMEDIES["model-stuck"].drain
    assert unreachable is not None and stuck is not None
    assert unreachable({"endpoint": "refused"}) == "connection refused"
    assert unreachable({"endpoint": "timeout"}) == "/health timing out"
    assert unreachable({"endpoint": ["garbage"]}) is None and unreachable({}) is None
    assert stuck({"source": "llama-server task loop", "not_answered": ["metrics"]}) == "task loop stalled"
    assert stuck({"source": "llama-server task loop", "not_answered": ["canary"]}) == "canary completion failing"
    assert stuck({"source": "gpu-monitor", "failure_pct": 80}) is None  # a failure ratio is soft: its hold stands
    assert stuck({"source": 5}) is None
    soft = [i for i, r in REMEDIES.items() if r.drain is None]
    assert "thermal-critical" in soft and "vram-leak" in soft


# --------------------------------------------------------------------------- the lab: sim fleet + config.yaml
GPUS = [{"alias": "gpu-a", "host": "ct1"}, {"alias": "gpu-b", "host": "ct2"}, {"alias": "gpu-c", "host": "ct3"}]
GROUPS = {"gpu-a": "qwen", "gpu-b": "qwen", "gpu-c": "solo", "gpu-d": "solo"}


@pytest.fixture
def make_lab(tmp_path, monkeypatch):
    labs = []

    def make(events, gpus=GPUS, restart_litellm=True, drain_first=True, **overrides):
        where = tmp_path / f"lab{len(labs)}"
        where.mkdir()
        lab = Lab(where, scenario(gpus, events), **overrides)
        labs.append(lab)
        monkeypatch.setenv("LITELLM_MASTER_KEY", lab.fleet.litellm_admin_key)
        config = where / "config.yaml"
        config.write_text("# the operator's file\n" + yaml.safe_dump({"model_list": [
            entry(GROUPS[g["alias"]], lab.fleet.endpoints[g["alias"]], g["alias"]) for g in gpus]}, sort_keys=False))
        lab.raw["litellm"]["config_file"] = str(config)
        if drain_first:
            lab.raw.setdefault("heal", {})["drain_first"] = True
        if not restart_litellm:
            lab.raw["litellm"]["restart_command"] = ["true"]
        lab.write_config()
        lab.fleet.use_litellm_config(str(config))
        lab.config = config
        return lab

    yield make
    for lab in labs:
        lab.close()


def routed(lab, group: str) -> set[str]:
    from gpuheal.sources import litellm_admin as la

    payload = la.read_model_info(lab.fleet.litellm_url, lab.fleet.litellm_admin_key, 5)
    return {next(a for a, ep in lab.fleet.endpoints.items() if e["litellm_params"]["api_base"] == ep + "/v1")
            for e in payload["data"] if e["model_name"] == group}


def moves(lab) -> list[dict]:
    return [r for r in lab.audit() if r.get("drain")]


def test_a_refused_gpu_is_drained_at_the_first_bad_poll_and_back_after_its_verified_restart(make_lab):
    lab = make_lab([{"at": 30, "gpu": "gpu-a", "fault": "dead"}])
    original = lab.config.read_bytes()
    health = lab.heal()
    issues = {(i["gpu"], i["issue"]): i["state"] for i in health["issues"]}
    assert issues[("gpu-a", "host-unreachable")] == "pending"  # the first bad poll: the hold is not met
    assert routed(lab, "qwen") == {"gpu-b"} and routed(lab, "solo") == {"gpu-c"}  # LiteLLM itself shows it
    out = moves(lab)
    assert [(r["action"], r["phase"], r["result"]) for r in out] == [
        ("redirect-traffic", "intent", "pending"), ("redirect-traffic", "outcome", "resolved")]
    assert out[0]["run_id"] == out[1]["run_id"] and out[1]["run_id"].startswith("gpu-self-heal-")
    assert out[1]["detected"]["endpoint"] == "refused" and out[1]["detected"]["fault"] == "connection refused"
    assert out[1]["twins"] == {"qwen": ["gpu-b"]} and "read back" in out[1]["verification"]["read_back"]
    assert lab.read("drain.json")["drained"][0]["gpu"] == "gpu-a"
    assert lab.fleet.litellm_admin_key not in (lab.state_dir / "gpu-self-heal-log.jsonl").read_text()
    for _ in range(6):
        lab.heal()
        if not lab.read("drain.json").get("drained"):
            break
    assert lab.restarts("gpu-a") == 1  # the heal's own restart went on as before
    assert routed(lab, "qwen") == {"gpu-a", "gpu-b"}
    assert lab.config.read_bytes() == original  # the operator's file, comments and all
    assert not list(lab.config.parent.glob("config.yaml.gpuheal-*"))
    back = [r for r in moves(lab) if r["action"] == "restore-load"]
    assert [(r["phase"], r["result"]) for r in back] == [("intent", "pending"), ("outcome", "resolved")]
    assert back[1]["drained_by"] == out[1]["run_id"] and back[1]["proof"]["completion_s"] is not None
    resolved = [r for r in lab.audit() if r["gpu"] == "gpu-a" and r["result"] == "resolved" and r["phase"] ==
                "verification"]  # fmt: skip
    assert resolved  # the attempt itself was verified and resolved
    assert lab.restarts("gpu-b") == lab.restarts("gpu-c") == 0


def test_drain_first_is_opt_in_a_config_file_alone_drains_nothing(make_lab):
    """``litellm.config_file`` also serves Rules 1/8's redirect; drain first restarts the proxy at each move,
    which the drill through a real LiteLLM measured costlier than its cooldown: only ``heal.drain_first``."""
    lab = make_lab([{"at": 30, "gpu": "gpu-a", "fault": "dead"}], drain_first=False)
    original = lab.config.read_bytes()
    lab.heal()
    assert routed(lab, "qwen") == {"gpu-a", "gpu-b"} and moves(lab) == []
    assert lab.config.read_bytes() == original and not lab.read("drain.json").get("drained")


def test_the_last_healthy_deployment_of_a_group_is_never_drained(make_lab):
    lab = make_lab([{"at": 30, "gpu": "gpu-c", "fault": "dead"}])
    original = lab.config.read_bytes()
    health = lab.heal()
    [held] = [a for a in health["actions"] if a["action"] == "redirect-traffic"]
    assert held["blocked"] and "last healthy deployment of LiteLLM's group 'solo'" in held["why"]
    assert lab.config.read_bytes() == original and routed(lab, "solo") == {"gpu-c"} and not moves(lab)
    assert lab.restarts("litellm") == 0


def test_a_twin_that_fails_too_keeps_both_in(make_lab):
    lab = make_lab([{"at": 30, "gpu": "gpu-a", "fault": "dead"}, {"at": 30, "gpu": "gpu-b", "fault": "hang"}])
    health = lab.heal()
    held = [a for a in health["actions"] if a["action"] == "redirect-traffic"]
    assert len(held) == 2 and all("last healthy" in a["why"] for a in held)
    assert routed(lab, "qwen") == {"gpu-a", "gpu-b"} and not moves(lab)


def test_the_fleet_guard_holds_the_drain_when_too_much_of_the_fleet_fails(make_lab):
    gpus = [*GPUS, {"alias": "gpu-d", "host": "ct4"}]
    lab = make_lab([{"at": 30, "gpu": "gpu-a", "fault": "dead"}, {"at": 30, "gpu": "gpu-c", "fault": "dead"}],
                   gpus=gpus, heal={"fleet_guard_fraction": 0.3})
    health = lab.heal()
    held = [a for a in health["actions"] if a["action"] == "redirect-traffic"]
    assert len(held) == 2 and all("fleet guard: 2 of 4" in a["why"] for a in held), held
    assert routed(lab, "qwen") == {"gpu-a", "gpu-b"} and routed(lab, "solo") == {"gpu-c", "gpu-d"}
    assert not moves(lab)


def test_a_blip_is_drained_and_put_back_without_a_restart(make_lab):
    lab = make_lab([{"at": 30, "gpu": "gpu-a", "fault": "dead"}, {"at": 90, "gpu": "gpu-a", "fault": "none"}])
    lab.heal()
    assert routed(lab, "qwen") == {"gpu-b"}
    health = lab.heal()
    assert not [i for i in health["issues"] if i["gpu"] == "gpu-a"]
    assert routed(lab, "qwen") == {"gpu-a", "gpu-b"} and not lab.read("drain.json")["drained"]
    assert lab.restarts("gpu-a") == 0
    assert [(r["action"], r["result"]) for r in moves(lab) if r["phase"] == "outcome"] == [
        ("redirect-traffic", "resolved"), ("restore-load", "resolved")]


def test_a_dry_run_shows_the_drain_and_changes_nothing(make_lab):
    lab = make_lab([{"at": 30, "gpu": "gpu-a", "fault": "dead"}])
    original = lab.config.read_bytes()
    health = lab.heal(apply=False)
    [planned] = [a for a in health["actions"] if a["action"] == "redirect-traffic"]
    assert planned["result"] == "planned" and "drain gpu-a" in planned["command"] and "gpu-b" in planned["why"]
    assert lab.config.read_bytes() == original and lab.audit() == [] and lab.read("drain.json") == {}
    assert lab.restarts("litellm") == 0


def test_a_litellm_that_does_not_show_the_drain_counts_as_failed_and_the_file_goes_back(make_lab):
    lab = make_lab([{"at": 30, "gpu": "gpu-a", "fault": "dead"}], restart_litellm=False)  # never re-reads it
    original = lab.config.read_bytes()
    health = lab.heal()
    [failed] = [a for a in health["actions"] if a["action"] == "redirect-traffic"]
    assert failed["result"] == "failed" and "the file was put back" in failed["error"]
    assert lab.config.read_bytes() == original and lab.read("drain.json") == {}
    out = [r for r in moves(lab) if r["phase"] == "outcome"]
    assert [r["result"] for r in out] == ["failed"] and out[0]["detected"]["endpoint"] == "refused"


@pytest.mark.parametrize("mode", ["hang", "http-503"])
def test_a_slow_or_failing_litellm_costs_one_line_and_the_heal_goes_on(make_lab, mode):
    lab = make_lab([{"at": 30, "gpu": "gpu-a", "fault": "dead"}, {"at": 0, "gpu": "fleet", "litellm": mode}],
                   litellm={"timeout_s": 1})
    counts = []
    for _ in range(4):
        health = lab.heal()
        lines = [a for a in health["actions"] if a["action"] == "redirect-traffic"]
        counts.append(len(lines))
        for line in lines:  # one line a poll while the issue is open (pending, pending, firing)
            assert line["result"] == "failed" and "LiteLLM's routing not read" in line["error"]
            assert "\n" not in line["error"]
    assert counts == [1, 1, 1, 0]  # the restart at the third poll cleared it
    assert lab.restarts("gpu-a") == 1  # the restart still happened, at its hold
    for line in (lab.state_dir / "gpu-self-heal-log.jsonl").read_text().splitlines():
        json.loads(line)  # the audit loses nothing and stays readable
    assert not moves(lab)


class Garbage(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 — http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"\x00{not json" * 100)

    def log_message(self, *args):
        pass


def test_a_litellm_answering_garbage_costs_one_line(make_lab):
    srv = HTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        lab = make_lab([{"at": 30, "gpu": "gpu-a", "fault": "dead"}],
                       litellm={"url": f"http://127.0.0.1:{srv.server_port}"})
        health = lab.heal()
        [line] = [a for a in health["actions"] if a["action"] == "redirect-traffic"]
        assert line["result"] == "failed" and "LiteLLM's routing not read" in line["error"]
        assert "\x00" not in json.dumps(health) and not moves(lab)
        assert [i["state"] for i in health["issues"] if i["gpu"] == "gpu-a"] == ["pending"]
    finally:
        srv.shutdown()


def test_a_damaged_drain_book_is_read_as_empty_and_a_quiet_run_reads_no_litellm(make_lab, monkeypatch):
    lab = make_lab([])
    (lab.state_dir).mkdir(exist_ok=True)
    (lab.state_dir / "drain.json").write_text('{"drained": [1, {"gpu": 5}, "x"]}')
    calls = []
    import gpuheal.sources.litellm_admin as la

    real = la.read_model_info
    monkeypatch.setattr(la, "read_model_info", lambda *a, **k: calls.append(a) or real(*a, **k))
    health = lab.heal()
    assert not [a for a in health["actions"] if a["action"] in ("redirect-traffic", "restore-load")]
    assert calls == []  # nothing suspicious: drain first asks LiteLLM nothing
