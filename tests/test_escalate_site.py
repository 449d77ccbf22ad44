"""host-unreachable on most of a group's hosts is one "network or site" incident (issue 21 point 2):
the group's one message names the shared cause in its title; under half stays per-host wording."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import escalate

try:
    from tests.zulip_server import DEFAULT_EMAIL, DEFAULT_KEY, FLEET, ZulipLookalike, alert, config_dict, runtime, seed
except ImportError:
    from zulip_server import DEFAULT_EMAIL, DEFAULT_KEY, FLEET, ZulipLookalike, alert, config_dict, runtime, seed

NOW = datetime(2026, 7, 18, 8, 0, 1, 700000, tzinfo=UTC)  # cron starts late: not a whole second


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZULIP_EMAIL", DEFAULT_EMAIL)
    monkeypatch.setenv("ZULIP_API_KEY", DEFAULT_KEY)


def send(tmp_path, down: list[str], **cfg):
    state = tmp_path / "state"
    seed(state, files.ALERTS, {"queue": [alert(g, "host-unreachable") for g in down], "sent": {}, "clean_cycles": 0})
    with ZulipLookalike() as srv:
        rt = runtime(config_dict(srv.url, **cfg), state, NOW)
        with StateDir(state) as store:
            result = escalate.command(rt, store)
        return result, [m["content"] for m in srv.messages]


def test_every_host_unreachable_is_one_network_or_site_message(tmp_path):
    result, messages = send(tmp_path, ["gpu-dense", "gpu-light", "strix-moe"])
    assert result.exit_code == 0 and len(messages) == 1
    first = messages[0].splitlines()[0]
    assert first == "⚠ GPU Self-Heal — network or site: 3 of 3 hosts unreachable"
    assert all(g in messages[0] for g in ("gpu-dense", "gpu-light", "strix-moe"))


def test_two_of_three_hosts_is_most(tmp_path):
    _, messages = send(tmp_path, ["gpu-dense", "gpu-light"])
    assert messages[0].splitlines()[0] == "⚠ GPU Self-Heal — network or site: 2 of 3 hosts unreachable"


def test_half_a_site_or_less_is_not_the_site(tmp_path):
    gpus = [dict(g) for g in FLEET] + [{"alias": "gpu-x", "host": "ct99", "endpoint": "http://127.0.0.1:9"}]
    _, messages = send(tmp_path, ["gpu-dense", "gpu-light"], gpus=gpus)
    assert len(messages) == 1 and "network or site" not in messages[0]
    assert "2 GPUs need attention: host-unreachable" in messages[0].splitlines()[0]


def test_per_site_label(tmp_path):
    """With zulip.group_by: site, the two hosts of site eu1 down is that site; us1's one host of two
    is not."""
    sites = {"gpu-dense": "eu1", "gpu-light": "eu1", "strix-moe": "us1"}
    gpus = [{**g, "labels": {"site": sites[g["alias"]]}} for g in FLEET]
    gpus.append({"alias": "gpu-us2", "host": "us-b", "endpoint": "http://127.0.0.1:9", "labels": {"site": "us1"}})
    gpus.append({"alias": "gpu-us3", "host": "us-c", "endpoint": "http://127.0.0.1:9", "labels": {"site": "us1"}})
    _, messages = send(tmp_path, ["gpu-dense", "gpu-light", "strix-moe"], gpus=gpus, zulip={"group_by": "site"})
    firsts = sorted(m.splitlines()[0] for m in messages)
    assert "⚠ GPU Self-Heal — network or site: 2 of 2 hosts in site eu1 unreachable" in firsts
    assert not any("us1" in f for f in firsts) and len(messages) == 2
