"""Rule 10 against the real LiteLLM 1.108.7 proxy (issue 22 item 6): what ``/spend/logs`` answers
without LiteLLM's database (there is none here: the proxy needs Postgres and prisma's engines, which
its install cannot fetch offline), that gpuheal reads that answer as "spend logs need LiteLLM's
database" — one doctor line, never a fault of every poll — and that Rule 10 then judges the GPUs'
roles from LiteLLM's own per-deployment counters, saying so in each reading."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml
from litellm_proxy import MASTER_KEY, deployment, start_proxy

from gpuheal.model import DataFault
from gpuheal.sim import Scenario, SimFleet
from gpuheal.sources.litellm_spend import NO_DATABASE, fetch_spend

pytestmark = pytest.mark.reallitellm

http = requests.Session()
http.trust_env = False
ROLES = {"gpu-dense": {"name": "heavy reasoning", "model_groups": ["heavy"]},
         "gpu-light": {"name": "vision, light tasks", "model_groups": ["light"], "request_tags": ["vision"]}}


@pytest.fixture(scope="module")
def routed(litellm_bin, tmp_path_factory):
    """gpu-light is (wrongly) the deployment of the ``code`` group; gpu-dense serves ``heavy``."""
    from lab import BASE_GPU

    fleet = SimFleet(Scenario.from_dict(copy.deepcopy({
        "name": "spend-logs", "start": "2026-07-18T08:00:00Z", "reload_s": 0.3,
        "gpus": [{**BASE_GPU, "alias": a, "host": h} for a, h in (("gpu-dense", "ct8"), ("gpu-light", "ct110"))],
        "litellm_admin_key": MASTER_KEY, "litellm_store": "config-no-db"})), ports="ephemeral").start()
    models = [deployment("heavy", "gpu-dense", fleet.endpoints["gpu-dense"] + "/v1", weight=0.5),
              deployment("code", "gpu-light", fleet.endpoints["gpu-light"] + "/v1", weight=0.5)]
    proxy = start_proxy(litellm_bin, tmp_path_factory.mktemp("litellm-spend"), models,
                        router_settings={"num_retries": 0}, litellm_settings={"callbacks": ["prometheus"]})
    try:
        yield proxy, fleet
    finally:
        proxy.stop()
        fleet.stop()


def ask(proxy, n: int) -> None:
    for group in ("heavy", "code") * n:
        r = http.post(proxy.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {MASTER_KEY}"},
                      json={"model": group, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                      timeout=60)
        assert r.status_code == 200, r.text[:200]


def test_without_a_database_the_real_proxy_refuses_the_spend_logs_and_gpuheal_says_why(routed):
    proxy, _fleet = routed
    auth = {"Authorization": f"Bearer {MASTER_KEY}"}
    v2 = http.get(proxy.url + "/spend/logs/v2", params={"start_date": "2026-07-18 07:00:00",
                  "end_date": "2026-07-18 08:00:00", "page": 1, "page_size": 1000}, headers=auth, timeout=10)
    assert v2.status_code == 401 and "Prisma Client is not initialized" in v2.text, (v2.status_code, v2.text[:300])
    v1 = http.get(proxy.url + "/spend/logs", headers=auth, timeout=10)
    assert v1.status_code == 500 and "Database not connected" in v1.text, (v1.status_code, v1.text[:300])
    got = fetch_spend(proxy.url, MASTER_KEY, 1784358000.0, 1784361600.0, deadline_s=10, max_rows=1000)
    assert isinstance(got, DataFault) and got.fault == NO_DATABASE, got
    assert "spend logs need LiteLLM's database" in got.detail and MASTER_KEY not in got.detail


def gpuheal(config: Path, state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LITELLM_MASTER_KEY": MASTER_KEY}
    return subprocess.run([str(Path(sys.executable).with_name("gpuheal")), "--config", str(config), "--state-dir",
                           str(state), *args, "--json"], capture_output=True, text=True, env=env, timeout=120)


def test_doctor_says_it_in_one_line_and_rule10_falls_back_to_litellms_counters(routed, tmp_path):
    proxy, fleet = routed
    raw = fleet.config_dict()
    raw.pop("monitor")  # no gpu-monitor: the request counts can only come from LiteLLM
    raw["litellm"] = {"url": proxy.url, "api_key": MASTER_KEY, "timeout_s": 10, "read_metrics": True,
                      "read_spend_logs": True}
    raw["rules"] = {"workload-misrouted": {"hold_s": 0, "min_requests": 2}}
    for g in raw["gpus"]:
        g.update(role=ROLES[g["alias"]], weight=0.5)
    config = tmp_path / "gpuheal.yaml"
    config.write_text(yaml.safe_dump(raw))
    proc = gpuheal(config, tmp_path / "doctor-state", "doctor")
    rows = {(c["target"], c["check"]): c for c in json.loads(proc.stdout)["checks"]}
    spend = rows[("litellm", "spend logs")]
    assert (spend["status"], spend["detail"]) == ("warn", "spend logs need LiteLLM's database; using LiteLLM's counters")
    assert "request tags" in rows[("gpu-light", "role")]["detail"]
    assert ("rules", "rule workload-misrouted") not in rows  # LiteLLM's counters give it request counts

    state = tmp_path / "state"
    ask(proxy, 1)  # the counters exist once a deployment served a request
    first = json.loads(gpuheal(config, state, "check").stdout)
    assert not [f for f in first["faults"] if "spend" in f.get("detail", "")], first["faults"]  # not a poll's fault
    assert "workload-misrouted" not in {o["rule"] for o in first["rules_off"]}
    ask(proxy, 3)
    second = json.loads(gpuheal(config, state, "check").stdout)
    issues = {(i["gpu"], i["issue"]): i for i in second["issues"]}
    light = issues[("gpu-light", "workload-misrouted")]
    assert light["detected"]["source"] == "litellm-counters"
    assert light["detected"]["outside_role_pct"] == 100 and light["detected"]["not_judged"] == ["request tags"]
    assert light["detected"]["requests"] == 3 and light["detected"]["share_pct"] == 50
    assert ("gpu-dense", "workload-misrouted") not in issues  # "heavy" is its role, at its weight
