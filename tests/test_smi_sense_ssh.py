"""GPU readings without gpu-monitor over real SSH (issue 12): a real sshd on 127.0.0.1
(tests/sshd.py) whose sessions find a fake ``nvidia-smi`` first on their PATH, printing real
captured multi-GPU rows (tests/smi_captures.py). Two GPUs of one host: one SSH login, one
nvidia-smi call, each GPU its own row — and the same through ``gpuheal check`` without monitor:."""

from __future__ import annotations

import getpass
import stat
from datetime import UTC, datetime

import pytest

try:
    from tests.smi_captures import NVIDIA_CAPTURES, multi_gpu_csv
    from tests.sshd import SKIP_REASON, find_sshd, start_sshd
except ImportError:
    from smi_captures import NVIDIA_CAPTURES, multi_gpu_csv
    from sshd import SKIP_REASON, find_sshd, start_sshd

from gpuheal.config import load_config_dict

pytestmark = [
    pytest.mark.sshd,
    pytest.mark.skipif(find_sshd() is None, reason=SKIP_REASON),
    pytest.mark.skipif(len(NVIDIA_CAPTURES) < 4, reason="the real smi captures are not here"),
]


@pytest.fixture(scope="module")
def smi_host(tmp_path_factory):
    work = tmp_path_factory.mktemp("smi-sshd")
    bin_dir = work / "bin"
    bin_dir.mkdir()
    rows = work / "rows.csv"
    rows.write_text(multi_gpu_csv([NVIDIA_CAPTURES[3], NVIDIA_CAPTURES[7]]))  # a real H100 and L40S
    calls = work / "calls"
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncat {rows}\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    server = start_sshd(work / "sshd", extra_config=f"SetEnv PATH={bin_dir}:/usr/bin:/bin\n")
    try:
        yield server, calls
    finally:
        server.stop()


def two_gpu_config(server, endpoint="http://127.0.0.1:9"):
    gpus = [
        {"alias": f"gpu-{i}", "host": server.host, "endpoint": endpoint, "gpu_index": i, "transport": "ssh",
         "ssh_port": server.port, "ssh_user": getpass.getuser()}
        for i in (0, 1)
    ]
    return {"heal": {"known_hosts": server.known_hosts, "ssh_key": server.key_filename},
            "probe": {"timeout_s": 5}, "gpus": gpus}


def logins(server) -> int:
    return server.log_path.read_text(errors="replace").count("Accepted publickey")


def test_one_login_and_one_call_per_host_each_gpu_its_row(smi_host):
    from gpuheal.sources.sense import sense

    server, calls = smi_host
    before_logins = logins(server)
    before_calls = len(calls.read_text().splitlines()) if calls.exists() else 0
    cfg = load_config_dict(two_gpu_config(server))
    obs = sense(cfg, datetime(2026, 7, 18, 8, 0, tzinfo=UTC))
    assert obs.source == "smi" and obs.monitor_ok is True
    h100, l40s = obs.gpus["gpu-0"], obs.gpus["gpu-1"]
    assert (h100.name, h100.vram_total_mb, h100.temp_c) == ("NVIDIA H100 80GB HBM3", 81559, 59)
    assert (l40s.name, l40s.vram_total_mb) == ("NVIDIA L40S", 46068)
    assert [f for f in obs.faults if f.source.startswith("gpu-") and "smi" in f.detail] == []
    assert len(calls.read_text().splitlines()) - before_calls == 1
    assert logins(server) - before_logins == 1


def test_an_unknown_host_key_is_a_fault_not_a_reading(smi_host, tmp_path):
    from gpuheal.sources.sense import sense

    server, _ = smi_host
    data = two_gpu_config(server)
    data["heal"]["known_hosts"] = server.empty_known_hosts
    obs = sense(load_config_dict(data), datetime(2026, 7, 18, 8, 0, tzinfo=UTC))
    smi = [f for f in obs.faults if "nvidia-smi" in f.detail]
    assert {(f.source, f.fault) for f in smi} == {("gpu-0", "refused"), ("gpu-1", "refused")}
    assert "host key" in smi[0].detail
    assert obs.gpus["gpu-0"].temp_c is None and obs.monitor_ok is False


def test_heal_shares_one_ssh_connection_per_host_between_sensing_and_acting(smi_host, tmp_path):
    """No gpu-monitor, two GPUs on one SSH host, the second one's decode hung (its /metrics shows a
    request in flight and n_decode_total frozen). At the 3rd poll heal restarts it: the smi
    sensing, the evidence and the restart of that run go through one SSH login."""
    import json
    from pathlib import Path

    from servers import HEALTH_OK, LoopbackServer, Reply, json_reply

    from gpuheal.state.store import StateDir
    from gpuheal.steps.heal import Heal

    server, _ = smi_host
    data = Path(__file__).parent / "data" / "llama"
    hung = (data / "metrics-busy-deferred.txt").read_text()
    completion = {"content": "x", "tokens_predicted": 8,
                  "timings": {"predicted_n": 8, "predicted_ms": 100.0, "predicted_per_second": 80.0}}
    routes = {"/health": HEALTH_OK, "/metrics": Reply(200, hung),
              "/slots": Reply(200, (data / "slots-busy.json").read_text()),
              "/props": json_reply({"is_sleeping": False}), "/completion": json_reply(completion)}
    calm = {"/health": HEALTH_OK, "/metrics": Reply(200, (data / "metrics-after.txt").read_text()),
            "/props": json_reply({"is_sleeping": False})}
    with LoopbackServer(calm) as gpu0, LoopbackServer(routes) as gpu1:
        cfg_data = two_gpu_config(server)
        cfg_data["gpus"][0]["endpoint"] = gpu0.url
        cfg_data["gpus"][1]["endpoint"] = gpu1.url
        for g in cfg_data["gpus"]:
            g["restart_command"] = ["true"]
        cfg_data["heal"]["reload_wait_s"] = 2
        cfg = load_config_dict(cfg_data)
        counts = []
        health = None
        for i in range(3):
            before = logins(server)
            with StateDir(tmp_path / "state") as store:
                now = datetime(2026, 7, 18, 8, i, tzinfo=UTC)
                health = Heal(cfg, store, now, apply=True).run(None, None)
            counts.append(logins(server) - before)
    assert ("gpu-1", "model-stuck") in {(i["gpu"], i["issue"]) for i in health["issues"]}
    acted = [a for a in health["actions"] if a["action"] == "restart-llama-server"]
    assert [a["gpu"] for a in acted] == ["gpu-1"], json.dumps(health["actions"])[:500]
    assert counts == [1, 1, 1], "one SSH login per run: sensing, evidence and the restart share it"
