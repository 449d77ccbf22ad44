"""gpuheal's LiteLLM paths against the real proxy (litellm[proxy] 1.108.7, models in config.yaml,
no database — the way most fleets run it): liveliness, the admin key, /v1/model/info,
/model/update on a config-file model, on a missing id, with a wrong key, and the proxy killed."""

from __future__ import annotations

import time

import pytest
from litellm_proxy import start_proxy

from gpuheal.sources import litellm_admin as la

from .conftest import GROUP, SOLO, model_list

pytestmark = pytest.mark.reallitellm


def test_liveliness_and_no_database(real_litellm):
    assert la.liveliness(real_litellm.url, 5) is None
    assert la.database_state(real_litellm.url, 5) == "Not connected"


def test_model_info_shows_config_deployments_and_their_routing(real_litellm):
    deps = la.read_deployments(real_litellm.url, real_litellm.master_key, 10)
    assert isinstance(deps, tuple), deps
    dense = la.find(deps, "gpu-dense")
    assert (dense.group, dense.group_size, dense.group_routes_by) == (GROUP, 3, "weight")
    assert (dense.weight, dense.rpm, dense.db_model) == (0.55, 60.0, False)
    solo = la.find(deps, SOLO)
    assert (solo.group_size, solo.group_routes_by, solo.rpm) == (1, "rpm", 30.0)
    one = la.read_deployments(real_litellm.url, real_litellm.master_key, 10, only_id="gpu-light")
    assert [d.model_id for d in one] == ["gpu-light"]


def test_the_builtin_shed_names_the_config_file_problem_before_sending(real_litellm):
    dense = la.read_deployment(real_litellm.url, real_litellm.master_key, "gpu-dense", 10)
    problem = la.target_value(dense, "shed-load", 0.5)
    assert problem.reason == "config-model"
    assert problem.line() == (
        "LiteLLM keeps gpu-dense in config.yaml (db_model false): load shedding needs STORE_MODEL_IN_DB with a "
        "database, or configure a shed_load_command / redirect_command for the GPU"
    )


def test_update_of_a_config_model_is_no_db_and_nothing_changes(real_litellm):
    out = la.apply_update(real_litellm.url, real_litellm.master_key, "gpu-dense", "weight", 0.275, 10, before=0.55)
    assert not out.ok and out.problem.reason == "no-db"
    assert "No DB Connected" in out.describe() and "STORE_MODEL_IN_DB" in out.describe()
    assert la.read_deployment(real_litellm.url, real_litellm.master_key, "gpu-dense", 10).weight == 0.55


def test_update_of_a_missing_id_and_read_of_a_missing_id(real_litellm):
    out = la.apply_update(real_litellm.url, real_litellm.master_key, "gpu-nope", "rpm", 1, 10)
    assert out.problem.reason == "no-db"  # without a database the proxy says so before it looks
    listed = la.read_deployments(real_litellm.url, real_litellm.master_key, 10, only_id="gpu-nope")
    assert listed.reason == "missing-id" and "gpu-nope" in listed.detail
    assert la.read_deployment(real_litellm.url, real_litellm.master_key, "gpu-nope", 10).reason == "missing-id"


def test_a_wrong_admin_key_is_named(real_litellm):
    wrong = "sk-not-the-master-key-42"
    for problem in (
        la.read_deployment(real_litellm.url, wrong, "gpu-dense", 10),
        la.apply_update(real_litellm.url, wrong, "gpu-dense", "rpm", 1, 10).problem,
    ):
        assert problem.reason == "auth", problem
        assert "LITELLM_MASTER_KEY" in problem.fix and wrong not in problem.line()


def test_the_proxy_killed_mid_run(litellm_bin, sim_backends, tmp_path):
    proxy = start_proxy(litellm_bin, tmp_path, model_list(sim_backends.endpoints))
    try:
        assert la.read_deployment(proxy.url, proxy.master_key, "gpu-dense", 10).weight == 0.55
        proxy.kill()
        started = time.monotonic()
        out = la.apply_update(proxy.url, proxy.master_key, "gpu-dense", "weight", 0.275, 3)
        assert out.problem.reason == "refused" and time.monotonic() - started < 3
        assert la.liveliness(proxy.url, 2).reason == "refused"
    finally:
        proxy.stop()


def test_rule6_verify_asks_the_real_proxy_for_one_deployment(real_litellm, sim_backends):
    """Rule 6's "LiteLLM reports model healthy": ``GET /health?model_id=`` on 1.108.7 runs one call
    through that deployment only; its entry carries the api_base gpuheal matches."""
    seen = la.model_health(real_litellm.url, real_litellm.master_key, "gpu-dense", sim_backends.endpoints["gpu-dense"], 30)
    assert seen.verdict == "healthy", seen
    wrong = la.model_health(real_litellm.url, "sk-wrong-key-1", "gpu-dense", sim_backends.endpoints["gpu-dense"], 30)
    assert wrong.verdict == "not known" and "sk-wrong-key-1" not in wrong.detail
    sim_backends.apply({"gpu": SOLO, "fault": "dead"})  # its llama-server refuses: LiteLLM files it unhealthy
    try:
        down = la.model_health(real_litellm.url, real_litellm.master_key, SOLO, sim_backends.endpoints[SOLO], 60)
    finally:
        sim_backends.apply({"gpu": SOLO, "fault": "none"})
    assert down.verdict == "unhealthy" and down.detail, down
