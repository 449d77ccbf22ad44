"""Built-in load shedding through LiteLLM's ``/model/update`` (Rules 1 and 8): the planned
rpm values, and the admin call against a real loopback server (success, bad key, errors, hang)."""

from __future__ import annotations

import json

import pytest
from servers import Hang, LoopbackServer, Reply, closed_url

from gpuheal.config import load_config_dict
from gpuheal.core.plan import LITELLM_API, _step
from gpuheal.sources.litellm_admin import describe, update_rpm

ADMIN = "sk-admin-test-0123456789"


def cfg(**gpu):
    return load_config_dict(
        {
            "litellm": {"url": "http://127.0.0.1:9/litellm"},
            "gpus": [{"alias": "gpu-a", "host": "ct1", "endpoint": "http://127.0.0.1:9", **gpu}],
        }
    )


def test_builtin_rpm_plan_halves_redirects_and_restores():
    c = cfg(litellm_model_id="dep-a", litellm_rpm=60)
    shed, redirect, restore = (_step(a, "gpu-a", c) for a in ("shed-load", "redirect-traffic", "restore-load"))
    assert shed.target == redirect.target == restore.target == LITELLM_API
    assert shed.argv_template[1:] == ("dep-a", "30")
    assert redirect.argv_template[1:] == ("dep-a", "1")
    assert restore.argv_template[1:] == ("dep-a", "60")
    assert describe("http://lite/litellm", shed.argv_template) == "POST http://lite/litellm/model/update id=dep-a rpm=30"


def test_no_builtin_without_model_id_or_normal_rpm():
    assert _step("shed-load", "gpu-a", cfg()) is None
    assert _step("shed-load", "gpu-a", cfg(litellm_model_id="dep-a")) is None


def test_a_configured_command_wins_over_the_builtin():
    step = _step("shed-load", "gpu-a", cfg(litellm_model_id="dep-a", litellm_rpm=60, shed_load_command="my-shed {alias}"))
    assert step.argv_template == ("my-shed", "{alias}") and step.target == "ct1"


def test_update_rpm_sends_the_litellm_request():
    with LoopbackServer({("POST", "/litellm/model/update"): Reply(200, {"message": "ok"})}) as srv:
        out = update_rpm(srv.url + "/litellm", ADMIN, "dep-a", 30, 2)
        assert out.rc == 0 and out.error is None
        req = srv.requests[-1]
        assert req.headers["authorization"] == f"Bearer {ADMIN}"
        assert json.loads(req.body) == {"model_info": {"id": "dep-a"}, "litellm_params": {"rpm": 30}}
        assert ADMIN not in out.stdout + out.stderr


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (Reply(401, {"error": {"message": "Authentication Error", "type": "auth_error", "code": "401"}}), "auth failed"),
        (Reply(404, {"detail": "model not found: dep-a"}), "http-404"),
        (Reply(500, b"<html>oops</html>"), "http-500"),
    ],
)
def test_update_rpm_failures_are_outcomes(reply, error):
    with LoopbackServer({("POST", "/litellm/model/update"): reply}) as srv:
        out = update_rpm(srv.url + "/litellm", ADMIN, "dep-a", 30, 2)
    assert out.rc == 1 and out.error == error


def test_update_rpm_hang_and_refused_and_missing_key():
    with LoopbackServer(default=Hang()) as srv:
        out = update_rpm(srv.url, ADMIN, "dep-a", 30, 0.5)
    assert out.timed_out and out.error == "timeout"
    assert update_rpm(closed_url(), ADMIN, "dep-a", 30, 1).error == "refused"
    assert "admin key" in update_rpm("http://127.0.0.1:9", None, "dep-a", 30, 1).error
