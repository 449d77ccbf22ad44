"""gpuheal's LiteLLM admin client (issue 11): read a deployment, choose weight or rpm, update,
read back; every way the proxy can fail is one classified line, never an exception.

The answers scripted here are copied from the real proxy (litellm[proxy] 1.108.7; the same cases
run against it in tests/reallitellm) and from its source for the database-backed cases.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import Hang, LoopbackServer, Oversized, Reply, closed_url

from gpuheal.actions.perform import describe
from gpuheal.config import load_config_dict
from gpuheal.core.actions import LITELLM_API, LiteLLMUpdate
from gpuheal.core.plan import resolve_action as _step
from gpuheal.sources import litellm_admin as la

ADMIN = "sk-admin-test-0123456789"
NO_DB = {
    "error": {
        "message": "{'error': \"No DB Connected. Here's how to do it - https://docs.litellm.ai/docs/proxy/"
        'virtual_keys"}',
        "type": "auth_error",
        "param": "None",
        "code": "500",
    }
}
IN_CONFIG = {
    "error": {
        "message": "{'error': \"Can't edit model. Model in config. Store model in db via `/model/new`. to edit.\"}",
        "type": "auth_error",
        "param": "None",
        "code": "400",
    }
}
NOT_MASTER = {"error": {"message": "No connected db.", "type": "no_db_connection", "param": None, "code": "400"}}
BAD_KEY = {
    "error": {
        "message": "Authentication Error, Invalid proxy server token passed. Received API Key = sk-...1234",
        "type": "auth_error",
        "param": "None",
        "code": "401",
    }
}
NOT_FOUND = {
    "error": {"message": "Authentication Error, model not found", "type": "auth_error", "param": "None", "code": "400"}
}


def dep(model_id, group="qwen", db_model=True, **params):
    return {
        "model_name": group,
        "litellm_params": {"model": f"openai/{model_id}", **params},
        "model_info": {"id": model_id, "db_model": db_model},
    }


WEIGHTED = {"data": [dep("gpu-dense", weight=0.55, rpm=60), dep("gpu-light", weight=0.15), dep("strix", weight=0.3)]}


def cfg(**gpu):
    return load_config_dict(
        {
            "litellm": {"url": "http://127.0.0.1:9/litellm"},
            "gpus": [{"alias": "gpu-a", "host": "ct1", "endpoint": "http://127.0.0.1:9", **gpu}],
        }
    )


# --------------------------------------------------------------------------- deciding (pure)


def test_a_weighted_group_is_shed_by_weight_not_rpm():
    deps = la.parse_deployments(WEIGHTED)
    dense = la.find(deps, "gpu-dense")
    assert (dense.group, dense.group_size, dense.group_routes_by, dense.field) == ("qwen", 3, "weight", "weight")
    assert la.target_value(dense, "shed-load", 0.5) == ("weight", 0.275)
    assert la.target_value(dense, "redirect-traffic", 0.5) == ("weight", 0.0)


def test_an_rpm_group_is_shed_by_rpm_and_redirect_keeps_one_rpm():
    deps = la.parse_deployments({"data": [dep("a", rpm=60), dep("b", rpm=30)]})
    a = la.find(deps, "a")
    assert a.field == "rpm"
    assert la.target_value(a, "shed-load", 0.5) == ("rpm", 30.0)
    assert la.target_value(a, "redirect-traffic", 0.5, redirect_rpm=1) == ("rpm", 1.0)
    assert la.target_value(
        la.find(la.parse_deployments({"data": [dep("a", rpm=1), dep("b", rpm=1)]}), "a"), "shed-load", 0.5
    ) == ("rpm", 1.0)  # never 0: rpm 0 is not "less"


@pytest.mark.parametrize(
    ("data", "reason", "words"),
    [
        (
            {"data": [dep("a", db_model=False, weight=1), dep("b", weight=1)]},
            "config-model",
            "LiteLLM keeps a in config.yaml (db_model false)",
        ),
        ({"data": [dep("a", rpm=60)]}, "single-deployment", "only deployment of model group 'qwen'"),
        ({"data": [dep("a"), dep("b")]}, "unrouted", "picks at random"),
    ],
)
def test_where_one_deployment_cannot_move_load_it_says_why(data, reason, words):
    problem = la.target_value(la.find(la.parse_deployments(data), "a"), "shed-load", 0.5)
    assert isinstance(problem, la.AdminProblem) and problem.reason == reason
    assert words in problem.detail and "shed_load_command" in problem.fix


def test_a_deployment_that_already_gets_no_share_has_nothing_to_lower():
    a = la.find(la.parse_deployments({"data": [dep("a", weight=0), dep("b", weight=1)]}), "a")
    assert la.target_value(a, "shed-load", 0.5) == ("weight", 0.0)
    assert la.target_value(a, "redirect-traffic", 0.5) == ("weight", 0.0)


def test_a_list_without_our_id_names_the_fix():
    problem = la.find(la.parse_deployments(WEIGHTED), "gpu-nope")
    assert problem.reason == "missing-id" and "gpus[].litellm_model_id" in problem.fix


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=4),
        max_leaves=30,
    )
)
@settings(max_examples=300, deadline=None)
def test_parse_deployments_never_raises_on_garbage(payload):
    out = la.parse_deployments(payload if not isinstance(payload, dict) else {"data": [payload, *WEIGHTED["data"]]})
    assert isinstance(out, la.AdminProblem | tuple)
    if isinstance(out, tuple):
        assert la.find(out, "gpu-dense").field in ("weight", None)


def test_nan_negative_and_bool_values_are_not_routing_values():
    deps = la.parse_deployments({"data": [dep("a", weight=float("nan"), rpm=True), dep("b", weight=-1, rpm=-5)]})
    assert la.find(deps, "a").group_routes_by is None and la.find(deps, "a").weight is None


def test_hostile_routing_values_and_error_bodies_are_not_known_never_a_crash():
    # issue 9 points 2 and 5: a 400-digit weight made math.isfinite raise OverflowError; a string
    # "5" is the wrong JSON type, not an rpm of 5
    deps = la.parse_deployments({"data": [dep("a", weight=10**400, rpm="5"), dep("b", weight=0.5, rpm=10)]})
    assert la.find(deps, "a").weight is None and la.find(deps, "a").rpm is None
    deep: object = "x"
    for _ in range(5000):
        deep = {"detail": deep}
    assert la._message(deep) == "a JSON object"
    assert la._message({"detail": "bad \ud800 key"}) == "bad \ufffd key"


@pytest.mark.parametrize("body", [b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                                  b'{"detail": ' + b"[" * 900 + b"]" * 900 + b"}"])
def test_a_deeply_nested_answer_is_a_classified_problem(body):
    with lite({("GET", "/v1/model/info"): Reply(200, body, {"Content-Type": "application/json"}),
               ("POST", "/model/update"): Reply(500, body, {"Content-Type": "application/json"})}) as srv:
        read = la.read_deployment(srv.url + "/litellm", ADMIN, "gpu-dense", 5)
        update = la.apply_update(srv.url + "/litellm", ADMIN, "gpu-dense", "rpm", 30, 5)
    assert isinstance(read, la.AdminProblem)
    assert not update.ok and "\n" not in update.describe()


# --------------------------------------------------------------------------- the wire


def lite(routes, **kw):
    return LoopbackServer({(m, "/litellm" + p): r for (m, p), r in routes.items()}, **kw)


def test_read_update_and_read_back_on_a_database_backed_proxy():
    after = {"data": [dep("gpu-dense", weight=0.275, rpm=60)]}
    with lite(
        {
            ("GET", "/v1/model/info"): Reply(200, WEIGHTED),
            ("POST", "/model/update"): Reply(200, {"model_id": "gpu-dense"}),
        }
    ) as srv:
        base = srv.url + "/litellm"
        dense = la.read_deployment(base, ADMIN, "gpu-dense", 2)
        assert dense.weight == 0.55
        srv.set(("GET", "/litellm/v1/model/info"), Reply(200, after))
        out = la.apply_update(base, ADMIN, "gpu-dense", "weight", 0.275, 2, before=0.55)
        assert out.ok and out.after == 0.275
        assert out.describe() == "LiteLLM gpu-dense: weight 0.55 -> 0.275 (read back)"
        post = next(r for r in srv.requests if r.method == "POST")
        assert post.headers["authorization"] == f"Bearer {ADMIN}"
        assert json.loads(post.body) == {"model_info": {"id": "gpu-dense"}, "litellm_params": {"weight": 0.275}}
        assert (srv.requests[-1].path, srv.requests[-1].query) == (
            "/litellm/v1/model/info",
            "litellm_model_id=gpu-dense",
        )
        assert ADMIN not in out.describe()


def test_an_update_that_the_read_back_does_not_show_is_not_done():
    with lite(
        {("GET", "/v1/model/info"): Reply(200, WEIGHTED), ("POST", "/model/update"): Reply(200, {"ok": 1})}
    ) as srv:
        out = la.apply_update(srv.url + "/litellm", ADMIN, "gpu-dense", "weight", 0.275, 2)
    assert not out.ok and out.problem.reason == "not-applied" and "reads 0.55, not 0.275" in out.problem.detail


@pytest.mark.parametrize(
    ("reply", "reason", "words"),
    [
        (Reply(200, b"null", {"Content-Type": "application/json"}), "not-stored", "200 null"),
        (Reply(500, NO_DB), "no-db", "No DB Connected"),
        (Reply(400, IN_CONFIG), "config-model", "Model in config"),
        (Reply(400, NOT_MASTER), "auth", "admin key"),
        (Reply(401, BAD_KEY), "auth", "admin key"),
        (Reply(403, {"detail": "Forbidden"}), "auth", "admin key"),
        (Reply(400, NOT_FOUND), "missing-id", "no deployment"),
        (
            Reply(502, b"<html><body><h1>502 Bad Gateway</h1></body></html>", {"Content-Type": "text/html"}),
            "not-json",
            "HTML",
        ),
        (Reply(200, b'{"data": [1, 2', {"Content-Type": "application/json"}), "not-json", "not JSON"),
        (Reply(500, b"Internal Server Error"), "not-json", "HTTP 500"),
        (Oversized(size=20 * 1024 * 1024), "oversized", "larger than 8 MiB"),
        (Oversized(size=20 * 1024 * 1024, content_length=False), "oversized", "larger than 8 MiB"),
    ],
)
def test_every_failed_update_is_one_classified_line(reply, reason, words):
    with lite({("POST", "/model/update"): reply}) as srv:
        out = la.apply_update(srv.url + "/litellm", ADMIN, "gpu-dense", "rpm", 30, 5)
    assert not out.ok and out.problem.reason == reason, out.problem
    line = out.describe()
    assert words in line and "\n" not in line and ADMIN not in line


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(400, NOT_MASTER), "auth"),
        (Reply(401, BAD_KEY), "auth"),
        (Reply(200, b"<!doctype html><title>LiteLLM UI</title>", {"Content-Type": "text/html"}), "not-json"),
        (Reply(200, {"detail": "no data here"}), "bad-answer"),
        (Oversized(size=20 * 1024 * 1024), "oversized"),
    ],
)
def test_failed_reads_are_classified(reply, reason):
    with lite({("GET", "/v1/model/info"): reply}) as srv:
        out = la.read_deployment(srv.url + "/litellm", ADMIN, "gpu-dense", 5)
    assert isinstance(out, la.AdminProblem) and out.reason == reason


def test_a_hung_or_absent_proxy_fails_within_its_deadline():
    import time

    with LoopbackServer(default=Hang()) as srv:
        started = time.monotonic()
        out = la.apply_update(srv.url, ADMIN, "gpu-dense", "rpm", 30, 0.5)
        assert time.monotonic() - started < 2
        assert out.problem.reason == "timeout" and "within 0.5 s" in out.describe()
        assert la.liveliness(srv.url, 0.5).reason == "timeout"
        assert la.database_state(srv.url, 0.5) is None
    assert la.read_deployment(closed_url(), ADMIN, "gpu-dense", 1).reason == "refused"
    assert la.apply_update("http://127.0.0.1:9", None, "gpu-dense", "rpm", 30, 1).problem.reason == "no-admin-key"


def test_liveliness_and_database_state():
    with LoopbackServer(
        {
            ("GET", "/health/liveliness"): Reply(200, b'"I\'m alive!"'),
            ("GET", "/health/readiness"): Reply(200, {"status": "healthy", "db": "Not connected"}),
        }
    ) as srv:
        assert la.liveliness(srv.url, 2) is None
        assert la.database_state(srv.url, 2) == "Not connected"
    with LoopbackServer({("GET", "/health/liveliness"): Reply(200, b"<html>login</html>")}) as srv:
        assert la.liveliness(srv.url, 2).reason == "not-json"


# --------------------------------------------------------------------------- the plan


def test_builtin_plan_targets_the_litellm_api_and_decides_at_run_time():
    c = cfg(litellm_model_id="dep-a")  # no litellm_rpm needed: the value is read from LiteLLM
    shed = _step("shed-load", "gpu-a", c)
    assert shed.target == LITELLM_API
    assert isinstance(shed, LiteLLMUpdate) and (shed.model_id, shed.field, shed.value) == ("dep-a", "auto", None)
    assert describe(shed, "gpu-a", c) == (
        "POST http://127.0.0.1:9/litellm/model/update id=dep-a weight|rpm (read from /v1/model/info); else ssh ct1: "
        "nvidia-smi --query-gpu=power.limit,power.default_limit,power.min_limit,power.max_limit "
        "--format=csv,noheader,nounits; nvidia-smi -pl 'LIMIT*0.7'; read back"
    )  # issue 27 item 7: a LiteLLM that cannot shed (no database) falls back to the power cap
    # no deployment id: the power cap alone (issue 27 item 7; before it there was no built-in)
    assert type(_step("shed-load", "gpu-a", cfg())).__name__ == "CapPower"


def test_a_configured_command_wins_over_the_builtin():
    step = _step(
        "shed-load", "gpu-a", cfg(litellm_model_id="dep-a", litellm_rpm=60, shed_load_command="my-shed {alias}")
    )
    assert step.argv == ("my-shed", "{alias}") and step.target == "ct1"


# --------------------------------------------------------------------------- the look-alike's setups


def sim_fleet(store):
    from lab import BASE_GPU

    from gpuheal.sim import Scenario, SimFleet

    gpus = [
        {**BASE_GPU, "alias": a, "host": h, "litellm_group": "qwen", "litellm_weight": w}
        for a, h, w in (("gpu-dense", "ct8", 0.55), ("gpu-light", "ct110", 0.15))
    ]
    scn = {"name": "t", "start": "2026-07-18T08:00:00Z", "gpus": gpus, "litellm_store": store}
    return SimFleet(Scenario.from_dict(scn), ports="ephemeral").start()


@pytest.mark.parametrize(
    ("store", "reason"),
    [("config-no-db", "no-db"), ("config-with-db", "config-model"), ("db-store-off", "not-stored")],
)
def test_each_litellm_setup_that_cannot_store_is_named(store, reason):
    fleet = sim_fleet(store)
    try:
        out = la.apply_update(fleet.litellm_url, fleet.litellm_admin_key, "gpu-dense", "weight", 0.275, 2)
        assert out.problem.reason == reason, out.problem
        assert fleet.state()["gpus"]["gpu-dense"]["litellm_weight"] == 0.55  # nothing changed
    finally:
        fleet.stop()


def test_shed_verify_restore_round_trip_on_a_database_backed_litellm():
    """The working path: read, shed by weight, read back, restore exactly the value found."""
    fleet = sim_fleet("db")
    try:
        url, key = fleet.litellm_url, fleet.litellm_admin_key
        dense = la.read_deployment(url, key, "gpu-dense", 2)
        assert (dense.db_model, dense.field, dense.weight) == (True, "weight", 0.55)
        field, value = la.target_value(dense, "shed-load", 0.5)
        shed = la.apply_update(url, key, "gpu-dense", field, value, 2, before=dense.value(field))
        assert shed.ok and (shed.before, shed.after) == (0.55, 0.275)
        st = fleet.state()["gpus"]["gpu-dense"]
        assert st["shed"] is True and st["litellm_weight"] == 0.275
        back = la.apply_update(url, key, "gpu-dense", field, shed.before, 2)
        assert back.ok and back.after == 0.55
        assert fleet.state()["gpus"]["gpu-dense"]["shed"] is False
        # an rpm change in a weighted group moves nothing (LiteLLM's simple-shuffle)
        assert la.apply_update(url, key, "gpu-dense", "rpm", 1, 2).ok
        assert fleet.state()["gpus"]["gpu-dense"]["shed"] is False
    finally:
        fleet.stop()


def test_run_update_decides_applies_and_reports_what_restore_needs():
    fleet = sim_fleet("db")
    try:
        url, key = fleet.litellm_url, fleet.litellm_admin_key
        kw = {"shed_ratio": 0.5, "redirect_rpm": 1, "deadline_s": 2}
        out = la.run_update(url, key, "shed-load", "gpu-dense", "auto", None, **kw)
        assert out.rc == 0 and out.effect == {
            "model_id": "gpu-dense",
            "field": "weight",
            "before": 0.55,
            "after": 0.275,
        }
        out = la.run_update(url, key, "redirect-traffic", "gpu-dense", "auto", None, **kw)
        assert out.effect["after"] == 0.0 and out.effect["before"] == 0.275
        out = la.run_update(url, key, "restore-load", "gpu-dense", "weight", 0.55, **kw)
        assert out.rc == 0 and fleet.state()["gpus"]["gpu-dense"]["litellm_weight"] == 0.55
    finally:
        fleet.stop()
    fleet = sim_fleet("config-no-db")
    try:
        out = la.run_update(fleet.litellm_url, fleet.litellm_admin_key, "shed-load", "gpu-dense", "auto", None, **kw)
        assert out.rc == 1 and out.impossible and out.error == "config-model" and out.effect is None
        assert "config.yaml (db_model false)" in out.stderr
    finally:
        fleet.stop()
    out = la.run_update(closed_url(), ADMIN, "shed-load", "gpu-dense", "auto", None, **kw)
    assert out.rc is None and not out.impossible and out.error == "refused"
