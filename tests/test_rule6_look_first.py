"""Rule 6 as the spec writes it: "check llama-server process, restart if not running" (looked at
over the transport first: hung or down, the restart is right either way, and ``detected`` says
which) and "Verify: direct health probe returns 200, LiteLLM reports model healthy"."""

from __future__ import annotations

import json
import threading
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuheal.actions.execute import run_item
from gpuheal.config import load_config_dict
from gpuheal.core import plan as planner
from gpuheal.core.issue import Issue
from gpuheal.core.plan import empty_state
from gpuheal.rules import REMEDIES
from gpuheal.rules.host_unreachable import look as pc
from gpuheal.rules.host_unreachable import remedy as rule6
from gpuheal.sources.litellm_admin import model_health, read_model_health
from tests.test_execute import FakeRunner, Outcome, ok_verify

plan = partial(planner.plan, remedies=REMEDIES)  # every rule's remedy, as heal plans


def cfg(restart="systemctl restart llama-server", endpoint="http://127.0.0.1:8081"):
    return load_config_dict(
        {"litellm": {"api_key": "k"},
         "gpus": [{"alias": "gpu-a", "host": "ct8", "endpoint": endpoint, "restart_command": restart}]}
    )  # fmt: skip


def unreachable(c):
    issue = Issue.from_json({"gpu": "gpu-a", "issue": "host-unreachable", "state": "firing", "since": "2026-07-18T08:00:00Z",
             "severity": "critical", "detected": {}})  # fmt: skip
    return plan([issue], empty_state(), c, 1e9)[0]


@pytest.mark.parametrize(
    ("said", "rc", "state"),
    [("active\n", 0, pc.RUNNING), ("inactive\n", 3, pc.NOT_RUNNING), ("failed\n", 3, pc.NOT_RUNNING),
     ("activating\n", 3, pc.RUNNING), ("", 4, pc.NOT_KNOWN), ("\x1b[31mgarbage\n", 1, pc.NOT_KNOWN)],
)  # fmt: skip
def test_unit_restart_is_looked_at_with_systemctl_is_active(said, rc, state):
    c = cfg()
    runner = FakeRunner({"is-active": Outcome(rc=rc, stdout=said)})
    ex = run_item(unreachable(c), c, runner, ok_verify, ())
    argvs = [argv for _, argv in runner.calls]
    ran = "start" if state == pc.NOT_RUNNING else "restart"  # down: started; hung or not known: restarted
    assert ["systemctl", "is-active", "llama-server"] in argvs
    assert argvs.index(["systemctl", "is-active", "llama-server"]) < argvs.index(["systemctl", ran, "llama-server"])
    assert ["systemctl", "start" if ran == "restart" else "restart", "llama-server"] not in argvs
    assert ex.evidence["process"]["state"] == state and ex.evidence["process"]["ran"] == ran
    assert ex.steps[-1].action == "restart-llama-server" and ex.found["process"].endswith(f"{ran}ed")
    assert ex.restarted and ex.result == "pending"


PGREP = (
    "4100 sh -c pgrep -af llama-server\n"  # the SSH wrapper: its program is sh, never counted
    "4200 /opt/llama/llama-server -m /m/a.gguf --port 8081 --ctx-size 4096\n"
    "4300 /opt/llama/llama-server -m /m/b.gguf --port=8082\n"
    "4400 /usr/bin/python3 llama-server-exporter --port 8081\n"
)


@pytest.mark.parametrize(
    ("stdout", "rc", "port", "state", "pids"),
    [(PGREP, 0, 8081, pc.RUNNING, [4200]), (PGREP, 0, 8082, pc.RUNNING, [4300]),
     (PGREP, 0, 8083, pc.NOT_RUNNING, []), ("", 1, 8081, pc.NOT_RUNNING, []),
     ("4500 llama-server -m x\n", 0, 8080, pc.RUNNING, [4500]), ("", 2, 8081, pc.NOT_KNOWN, [])],
)  # fmt: skip
def test_other_restart_commands_are_looked_at_with_pgrep_on_the_endpoint_port(stdout, rc, port, state, pids):
    c = cfg(restart="/usr/local/bin/restart-llama {alias}", endpoint=f"http://127.0.0.1:{port}")
    runner = FakeRunner({"pgrep": Outcome(rc=rc, stdout=stdout)})
    ex = run_item(unreachable(c), c, runner, ok_verify, ())
    assert ("ct8", list(pc.PGREP_ARGV)) in runner.calls
    assert ex.evidence["process"]["state"] == state and ex.evidence["process"]["pids"] == pids
    # no start_command and a restart command of the operator's own: a down server gets that command too
    assert runner.calls[-1] == ("ct8", ["/usr/local/bin/restart-llama", "gpu-a"])
    assert ex.restarted


@pytest.mark.parametrize(
    ("start", "restart", "argv", "source"),
    [(None, ("systemctl", "restart", "llama-server"), ("systemctl", "start", "llama-server"), "systemctl start"),
     (None, ("sudo", "-n", "systemctl", "restart", "ll@{alias}"), ("sudo", "-n", "systemctl", "start", "ll@{alias}"),
      "systemctl start"),
     (("/opt/up", "{alias}"), ("systemctl", "restart", "x"), ("/opt/up", "{alias}"), "start_command"),
     (None, ("/bin/restart", "restart"), ("/bin/restart", "restart"), "the restart command"),
     (None, ("systemctl", "restart", "a", "b"), ("systemctl", "restart", "a", "b"), "the restart command")],
)  # fmt: skip
def test_the_start_command_is_configured_or_the_restart_units_start(start, restart, argv, source):
    got, how = pc.start_argv(start, restart)
    assert got == argv and how.startswith(source)


def test_a_configured_start_command_starts_a_down_server_with_its_placeholders_filled():
    c = load_config_dict(
        {"litellm": {"api_key": "k"},
         "gpus": [{"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:8081",
                   "restart_command": "systemctl restart llama-server",
                   "start_command": ["/usr/local/bin/up", "{alias}", "{endpoint}"]}]}
    )  # fmt: skip
    runner = FakeRunner({"is-active": Outcome(rc=3, stdout="inactive\n")})
    ex = run_item(unreachable(c), c, runner, ok_verify, ())
    assert runner.calls[-1] == ("ct8", ["/usr/local/bin/up", "gpu-a", "http://127.0.0.1:8081"])
    assert ex.steps[-1].note.startswith("start: llama-server is not running (start_command)")
    assert ex.found["process"] == "down: llama-server is not running → started" and ex.result == "pending"


@pytest.mark.parametrize("bad", [[], "", 7, {"argv": "x"}, ["up", 3]])
def test_a_bad_start_command_is_one_config_error(bad):
    from gpuheal.errors import ConfigError

    with pytest.raises(ConfigError, match="start_command"):
        load_config_dict({"gpus": [{"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:8081",
                                    "start_command": bad}]})  # fmt: skip


def test_case_lines_say_hung_down_or_not_known():
    assert pc.ProcessCheck(pc.RUNNING, "x", (7,)).case() == "hung: llama-server runs (pid 7) but does not answer"
    assert pc.ProcessCheck(pc.NOT_RUNNING, "x").case() == "down: llama-server is not running"
    assert pc.ProcessCheck(pc.NOT_KNOWN, "x", detail="refused").case().startswith("not known")


def test_ssh_that_fails_the_look_is_not_known_and_the_restart_still_escalates():
    c = cfg()
    runner = FakeRunner({"systemctl": Outcome(rc=None, error="refused")})
    ex = run_item(unreachable(c), c, runner, ok_verify, ())
    assert ex.evidence["process"]["state"] == pc.NOT_KNOWN and "refused" in ex.evidence["process"]["case"]
    assert ex.result == "escalated" and "infrastructure" in ex.escalate_reason


@pytest.mark.parametrize(
    ("argv", "unit"),
    [(("systemctl", "restart", "llama-server"), "llama-server"), (("sudo", "-n", "systemctl", "restart", "ll@{alias}"),
     "ll@{alias}"), (("systemctl", "restart", "a", "b"), None), (("/bin/restart",), None), (None, None),
     (("systemctl", "start", "x"), None)],
)  # fmt: skip
def test_systemd_unit_only_from_a_plain_systemctl_restart(argv, unit):
    assert pc.systemd_unit(argv) == unit


def test_litellm_unhealthy_fails_the_verify_and_healthy_passes():
    c = cfg()
    bad = run_item(unreachable(c), c, FakeRunner(), ok_verify, (), None,
                   lambda a: {"litellm": "unhealthy", "litellm_detail": "Connection error"})  # fmt: skip
    assert bad.result == "failed" and "unhealthy" in bad.verification["error"]
    good = run_item(unreachable(c), c, FakeRunner(), ok_verify, (), None, lambda a: {"litellm": "healthy"})
    assert good.result == "pending" and good.verification["litellm"] == "healthy" and good.verification["ok"]
    assert "litellm_means" not in good.verification
    unknown = run_item(unreachable(c), c, FakeRunner(), ok_verify, (), None, lambda a: {"litellm": "not known"})
    assert unknown.result == "pending"  # LiteLLM's own fault is Rule 5's business, recorded, not a failed fix
    assert unknown.verification["litellm_means"] == rule6.NOT_KNOWN_MEANS  # ... and never a pass
    for said in ({"litellm": "not configured"}, {}, {"litellm": 7}, {"litellm": "HEALTHY"}):
        odd = run_item(unreachable(c), c, FakeRunner(), ok_verify, (), None, lambda a, said=said: said)
        assert odd.result == "pending" and odd.verification["litellm_means"] == rule6.NOT_KNOWN_MEANS, said


def model_info(*entries):
    return {"data": [{"model_name": "g", "model_info": {"id": mid}, "litellm_params": {"api_base": base}}
                     for mid, base in entries]}  # fmt: skip


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [(200, b"<html>not litellm</html>", "not known"), (401, {"error": {"message": "bad key"}}, "not known"),
     (200, {"data": "x"}, "not known"), (200, [], "not known"), (200, model_info(("d", "http://[::1")), "not known"),
     (200, model_info(("d", "http://127.0.0.1:9999/v1")), "not known"),
     (200, model_info((None, "http://127.0.0.1:8081/v1")), "not known"),
     (200, {"data": [None, 7, {"model_name": "g"}, *model_info(("d", "http://127.0.0.1:8081/v1"))["data"]]},
      "asked")],
)  # fmt: skip
def test_deployments_found_by_api_base_and_a_litellm_that_answers_garbage(monkeypatch, status, body, said):
    from gpuheal.actions.effects import Effects

    srv, seen = serve(status, body)
    monkeypatch.setenv("LITELLM_MASTER_KEY", "sk-admin")
    c = load_config_dict({"litellm": {"url": f"http://127.0.0.1:{srv.server_port}", "timeout_s": 2},
                          "gpus": [{"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:8081"}]})  # fmt: skip
    try:
        got = Effects(c).model_health("gpu-a")
    finally:
        srv.shutdown()
    assert seen[0] == ("/v1/model/info", "Bearer sk-admin")
    if said == "asked":  # the deployment on the GPU's endpoint is asked by its id (this server answers garbage)
        assert seen[1][0] == "/health?model_id=d" and got["litellm_model_ids"] == ["d"]
    assert got["litellm"] == "not known" and got["litellm_detail"] and "sk-admin" not in str(got), got


def test_a_litellm_that_is_too_slow_is_not_known(monkeypatch):
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from gpuheal.actions.effects import Effects

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(3)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("LITELLM_MASTER_KEY", "sk-admin")
    c = load_config_dict({"litellm": {"url": f"http://127.0.0.1:{srv.server_port}", "timeout_s": 1},
                          "gpus": [{"alias": "gpu-a", "host": "ct8", "endpoint": "http://127.0.0.1:8081"}]})  # fmt: skip
    try:
        started = time.monotonic()
        got = Effects(c).model_health("gpu-a")
        took = time.monotonic() - started
    finally:
        srv.shutdown()
    assert got["litellm"] == "not known" and took < 2.9, (got, took)


def test_model_stuck_restart_does_not_ask_litellm():
    c = cfg()
    asked = []
    item = plan([Issue.from_json({"gpu": "gpu-a", "issue": "model-stuck", "state": "firing", "since": "2026-07-18T08:00:00Z",
                  "severity": "warning", "detected": {}})], empty_state(), c, 1e9)[0]  # fmt: skip
    run_item(item, c, FakeRunner(), ok_verify, (), None, asked.append)
    assert asked == []


# The answer shape of 1.108.7's GET /health?model_id=ID (litellm/proxy/health_endpoints)
HEALTHY = {"healthy_endpoints": [{"api_base": "http://127.0.0.1:8081/v1", "model": "openai/m", "model_id": "dep-a"}],
           "unhealthy_endpoints": [], "healthy_count": 1, "unhealthy_count": 0}  # fmt: skip
UNHEALTHY = {"healthy_endpoints": [], "unhealthy_endpoints": [
    {"api_base": "http://127.0.0.1:8081/v1", "model": "openai/m", "error": "litellm.APIConnectionError: refused\n"}]}


@pytest.mark.parametrize(
    ("payload", "verdict"),
    [(HEALTHY, "healthy"), (UNHEALTHY, "unhealthy"), ({"healthy_endpoints": "x"}, "not known"), ([], "not known"),
     ({"healthy_endpoints": [{"api_base": "http://127.0.0.1:9999"}]}, "not known"), (None, "not known"),
     ({"healthy_endpoints": [{"api_base": "http://[::1"}]}, "not known")],
)  # fmt: skip
def test_read_model_health(payload, verdict):
    assert read_model_health(payload, "dep-a", "http://127.0.0.1:8081").verdict == verdict


def serve(status, body):
    seen = []

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen


@pytest.mark.parametrize(
    ("status", "body", "verdict"),
    [(200, HEALTHY, "healthy"), (503, UNHEALTHY, "unhealthy"), (503, {"detail": "x"}, "not known"), (401, {"error": {"message": "bad key"}}, "not known"),
     (200, b"<html>proxy</html>", "not known")],
)  # fmt: skip
def test_model_health_over_http(status, body, verdict):
    srv, seen = serve(status, body)
    try:
        got = model_health(f"http://127.0.0.1:{srv.server_port}", "sk-admin", "dep a", "http://127.0.0.1:8081", 3.0)
    finally:
        srv.shutdown()
    assert got.verdict == verdict and "sk-admin" not in got.detail
    assert seen == [("/health?model_id=dep%20a", "Bearer sk-admin")]


def test_model_health_without_key_or_proxy_is_not_known():
    assert model_health("http://127.0.0.1:9", None, "d", "http://127.0.0.1:8081", 1.0).verdict == "not known"
    assert model_health("http://127.0.0.1:9", "k", "d", "http://127.0.0.1:8081", 1.0).verdict == "not known"


def test_on_the_simulator_the_audit_says_down_and_what_the_verify_saw(tmp_path):
    """The whole path: a dead llama-server fires at the 3rd poll, gpuheal looks (no llama-server
    process on the endpoint's port: the simulator is one Python process), restarts, verifies; the
    outcome line's ``detected`` says "down" and its verification what LiteLLM was asked."""
    from tests.lab import Lab, scenario

    lab = Lab(tmp_path, scenario([{"alias": "gpu-a", "host": "ct1"}], [{"at": 30, "gpu": "gpu-a", "fault": "dead"}]))
    try:
        for _ in range(4):
            lab.heal()
        assert lab.restarts("gpu-a") == 1
        lab.heal()  # past the startup grace: judged
        lines = [r for r in lab.audit() if r["issue"] == "host-unreachable"]
    finally:
        lab.close()
    assert [(r["phase"], r["result"]) for r in lines] == [("intent", "pending"), ("verification", "resolved")]
    outcome = lines[-1]  # the attempt's one outcome line (issue 27 item 13)
    assert outcome["detected"]["process"] == "down: llama-server is not running → started"
    assert outcome["evidence"]["process"]["check"].startswith("pgrep -af llama-server")
    assert outcome["evidence"]["process"]["ran"] == "start"
    assert outcome["checked"]["ok"] and outcome["verification"]["completion_s"] is not None

