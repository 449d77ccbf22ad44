"""Real-LiteLLM test tier (issue 11): gpuheal's LiteLLM paths against the genuine proxy.

``scripts/install-litellm.sh`` installs ``litellm[proxy]`` (pinned) once per machine into
``~/.cache/gpuheal/litellm-<version>`` (~110 s, ~750 MB on 2 cores); ``make test`` and CI run it
before the suite. ``GPUHEAL_SKIP_REALLITELLM=1`` skips this tier when the proxy is not installed
instead of installing it. The proxy runs on 127.0.0.1 with ``LITELLM_LOCAL_MODEL_COST_MAP=True``
(offline) in front of the simulated fleet's llama-servers (see ``tests/litellm_proxy.py``).

Fixtures: ``litellm_bin`` (session), ``sim_backends`` (module: a simulated fleet whose LiteLLM
look-alike runs in the ``config-no-db`` mode, for comparison), ``real_litellm`` (module: the real
proxy in front of those llama-servers, with the same deployments).
"""

from __future__ import annotations

import copy

import pytest
from lab import BASE_GPU
from litellm_proxy import MASTER_KEY, deployment, litellm_binary, start_proxy

from gpuheal.sim import Scenario, SimFleet

pytestmark = pytest.mark.reallitellm

GROUP = "qwen"
WEIGHTS = {"gpu-dense": 0.55, "gpu-light": 0.15, "strix-moe": 0.30}
HOSTS = {"gpu-dense": "ct8", "gpu-light": "ct110", "strix-moe": "ct15"}
SOLO = "gpu-solo"  # the only deployment of its group (rpm-routed)


def scenario_dict(store: str = "config-no-db") -> dict:
    gpus = [
        {**BASE_GPU, "alias": a, "host": HOSTS[a], "litellm_group": GROUP, "litellm_weight": w, "litellm_rpm": 60}
        for a, w in WEIGHTS.items()
    ]
    gpus.append({**BASE_GPU, "alias": SOLO, "host": "ct9", "litellm_group": "solo", "litellm_rpm": 30})
    return {
        "name": "reallitellm",
        "start": "2026-07-18T08:00:00Z",
        "reload_s": 0.3,
        "gpus": gpus,
        "litellm_admin_key": MASTER_KEY,
        "litellm_store": store,
    }


def model_list(endpoints: dict[str, str]) -> list[dict]:
    out = [deployment(GROUP, a, endpoints[a] + "/v1", weight=w, rpm=60) for a, w in WEIGHTS.items()]
    out.append(deployment("solo", SOLO, endpoints[SOLO] + "/v1", rpm=30))
    return out


@pytest.fixture(scope="session")
def litellm_bin() -> str:
    path, why = litellm_binary()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="session")
def sim_backends():
    fleet = SimFleet(Scenario.from_dict(copy.deepcopy(scenario_dict())), ports="ephemeral").start()
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="session")
def real_litellm(litellm_bin, sim_backends, tmp_path_factory):
    proxy = start_proxy(litellm_bin, tmp_path_factory.mktemp("litellm"), model_list(sim_backends.endpoints))
    try:
        yield proxy
    finally:
        proxy.stop()
