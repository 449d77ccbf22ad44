"""``gpuheal doctor`` (issue 11): every path the config would use, checked without changing
anything — on the simulated fleet (all ✔), on a dead one (bounded), against hostile servers, over
a real sshd, and against the Zulip look-alike."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from lab import Lab, scenario
from servers import Hang, LoopbackServer, Oversized, Reply, closed_url

from gpuheal import doctor
from gpuheal.config import load_config_dict
from gpuheal.doctor import checks  # noqa: F401  (registers the built-in checks)
from gpuheal.runtime import Runtime
from gpuheal.sim.zulip import ZulipLookalike
from gpuheal.steps import doctor as step

ADMIN = "sk-sim-admin-0000"
ZULIP_EMAIL, ZULIP_KEY = "gpuheal-bot@zulip.example.org", "zulip-test-key-0123"
ENV = {"LITELLM_MASTER_KEY": ADMIN, "ZULIP_EMAIL": ZULIP_EMAIL, "ZULIP_API_KEY": ZULIP_KEY}


def run(cfg, state_dir, environ=ENV):
    rt = Runtime(cfg=cfg, state_dir=Path(state_dir), now=None)  # type: ignore[arg-type]
    return step.command(rt, environ=dict(environ))


def rows_of(result):
    return {(c["target"], c["check"]): c for c in result.document["checks"]}


@pytest.fixture
def zulip():
    server = ZulipLookalike(ZULIP_EMAIL, ZULIP_KEY, streams=("agent-hub",)).start()
    yield server
    server.stop()


@pytest.fixture
def lab(tmp_path, zulip):
    gpus = [
        {"alias": a, "host": h, "litellm_group": "qwen", "litellm_weight": w}
        for a, h, w in (("gpu-dense", "ct8", 0.55), ("gpu-light", "ct110", 0.15), ("strix-moe", "ct15", 0.3))
    ]
    lab = Lab(tmp_path, scenario(gpus), zulip={"site": zulip.url, "stream": "agent-hub"})
    for g in lab.raw["gpus"]:
        g["litellm_model_id"] = g["alias"]
        g["memcap_restart_command"] = g["restart_command"]  # the operator's capped restart (the sim has no cap)
    lab.write_config()
    yield lab
    lab.fleet.stop()


def test_no_memcap_restart_command_warns_that_the_leak_restart_is_uncapped():
    from gpuheal.doctor import checks

    c = load_config_dict({"litellm": {"api_key": "k"}, "gpus": [
        {"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:9"},
        {"alias": "b", "host": "h2", "endpoint": "http://127.0.0.1:9", "memcap_restart_command": "restart-capped b"}]})
    warned, ok = (checks.fallback_check(g, "vram-leak", "restart-llama-server-memcap") for g in c.gpus)
    assert warned.status == "warn" and "uncapped" in warned.detail and ok.status == "ok"


def test_doctor_on_the_simulated_fleet_is_all_ok_and_changes_nothing(lab, zulip, tmp_path):
    state = tmp_path / "fresh-state"
    result = run(lab.cfg, state)
    bad = [c for c in result.document["checks"] if c["status"] != "ok"]
    assert result.exit_code == 0 and result.document["status"] == "ok", bad
    rows = rows_of(result)
    for alias in ("gpu-dense", "gpu-light", "strix-moe"):
        for check in (
            "llama-server /health",
            "llama-server /props",
            "llama-server /metrics",
            "load shedding",
            "restart_command",
        ):
            assert rows[(alias, check)]["status"] == "ok"
    assert "shed by weight 0.55 -> 0.275" in rows[("gpu-dense", "load shedding")]["detail"]
    assert {
        ("zulip", "bot"),
        ("zulip", "stream"),
        ("litellm", "admin key accepted"),
        ("monitor", "gpu-monitor"),
        ("state", "state directory"),
        ("state", "config"),
    } <= set(rows)
    # changed nothing: no state directory, no restart, no LiteLLM update, no Zulip message
    assert not state.exists()
    st = lab.fleet.state()
    assert all(n == 0 for n in st["restarts"].values()) if isinstance(st["restarts"], dict) else True
    assert all(g["litellm_updates"] == 0 for g in st["gpus"].values())
    assert zulip.messages == []
    assert set(result.document) == {"status", "checks"}
    assert all(set(c) == {"target", "check", "status", "detail", "fix"} for c in result.document["checks"])


def test_config_file_deployments_without_a_database_are_named(lab, tmp_path):
    from dataclasses import replace

    lab.fleet.world.scenario = replace(lab.fleet.world.scenario, litellm_store="config-no-db")
    result = run(lab.cfg, tmp_path / "s")
    row = rows_of(result)[("gpu-dense", "load shedding")]
    assert result.exit_code == 1 and row["status"] == "fail"
    assert row["detail"] == "LiteLLM keeps gpu-dense in config.yaml (db_model false)"
    assert "STORE_MODEL_IN_DB" in row["fix"] and "shed_load_command" in row["fix"]


def test_missing_credentials_and_wrong_zulip_stream(lab, tmp_path):
    lab.raw["zulip"]["stream"] = "no-such-stream"
    lab.write_config()
    result = run(lab.cfg, tmp_path / "s", environ={"ZULIP_EMAIL": ZULIP_EMAIL, "ZULIP_API_KEY": "wrong"})
    rows = rows_of(result)
    assert rows[("litellm", "admin key present")]["status"] == "fail"
    assert "LITELLM_MASTER_KEY" in rows[("litellm", "admin key present")]["fix"]
    assert (
        rows[("zulip", "bot")]["status"] == "fail"
        and "rejects the bot's credentials" in rows[("zulip", "bot")]["detail"]
    )
    result = run(lab.cfg, tmp_path / "s")
    assert rows_of(result)[("zulip", "stream")]["status"] == "fail"
    assert "Invalid channel name" in rows_of(result)[("zulip", "stream")]["detail"]


def dead_config(url_of, extra_gpus=3):
    return load_config_dict(
        {
            "monitor": {"url": url_of("monitor") + "/gpu-data", "timeout_s": 1},
            "litellm": {"url": url_of("litellm"), "timeout_s": 1},
            "probe": {"timeout_s": 1},
            "zulip": {"site": url_of("zulip"), "timeout_s": 1},
            "gpus": [
                {
                    "alias": f"gpu-{i}",
                    "host": f"ct{i}",
                    "endpoint": url_of(f"gpu{i}"),
                    "litellm_model_id": f"gpu-{i}",
                    "transport": "local",
                    "restart_command": ["definitely-not-a-program-xyz", "{alias}"],
                }
                for i in range(extra_gpus)
            ],
        }
    )


def test_a_dead_fleet_fails_every_check_within_about_one_deadline_per_stage(tmp_path):
    with LoopbackServer(default=Hang()) as hung:

        def url_of(name):
            return hung.url if name in ("monitor", "gpu0", "litellm") else closed_url()

        started = time.monotonic()
        result = run(dead_config(url_of), tmp_path / "s")
        elapsed = time.monotonic() - started
    rows = rows_of(result)
    assert result.exit_code == 1
    assert rows[("monitor", "gpu-monitor")]["status"] == "fail"
    assert rows[("gpu-0", "llama-server /health")]["detail"].startswith(hung.url)
    assert rows[("litellm", "liveliness")]["status"] == "fail"
    assert rows[("gpu-1", "restart_command")]["detail"] == "definitely-not-a-program-xyz: not found"
    assert rows[("zulip", "bot")]["status"] == "fail"
    # every probe here has a 1 s deadline (LiteLLM's covers 3 calls); hung ones cost one, not one each
    assert elapsed < 1 * 3 + 2 * doctor.GRACE_S + 2, elapsed


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (Reply(200, b"<html><body>LiteLLM Admin UI</body></html>", {"Content-Type": "text/html"}), "HTML"),
        (Reply(200, b'{"data": [', {"Content-Type": "application/json"}), "not JSON"),
        (Oversized(size=20 * 1024 * 1024), "larger than 8 MiB"),
        (
            Reply(200, {"data": [{"model_name": "x", "litellm_params": {}, "model_info": {"id": "other"}}]}),
            "no deployment with model_info.id 'gpu-0'",
        ),
    ],
)
def test_hostile_litellm_answers_are_one_line_each(tmp_path, reply, words):
    routes = {
        ("GET", "/health/liveliness"): Reply(200, b'"I\'m alive!"', {"Content-Type": "application/json"}),
        ("GET", "/v1/model/info"): reply,
    }
    with LoopbackServer(routes) as lite:
        cfg = dead_config(lambda n: lite.url if n == "litellm" else closed_url(), extra_gpus=1)
        result = run(cfg, tmp_path / "s")
    rows = rows_of(result)
    line = rows[("litellm", "admin key accepted")]["detail"] + rows[("gpu-0", "load shedding")]["detail"]
    assert words in line and "\n" not in line, rows


def test_network_strings_are_escaped_in_the_table(tmp_path, monkeypatch, capsys):
    from gpuheal.render import human

    monkeypatch.setattr(human, "use_rich", lambda stream=None: True)
    rows = [
        doctor.Check(
            "[bold]gpu[/bold]", "llama-server /props", doctor.FAIL, "model [red]x[/red]\x1b[31m", "fix [b]it[/b]"
        )
    ]
    step.render(rows)
    out = capsys.readouterr().out
    assert "[bold]gpu[/bold]" in out and "model [red]x[/red]" in out and "\x1b[31m" not in out.replace("\x1b[", "", 0)


def test_a_probe_that_never_returns_is_one_failed_row(monkeypatch):
    import threading

    block = threading.Event()
    probes = [
        doctor.Probe("litellm", "stuck", 0.2, lambda: block.wait(30) and None),
        doctor.Probe("state", "fine", 0.2, lambda: doctor.Check("state", "fine", doctor.OK)),
        doctor.Probe("zulip", "bug", 0.2, lambda: 1 / 0),
    ]
    started = time.monotonic()
    rows = doctor.run_stage(probes)
    block.set()
    assert time.monotonic() - started < 0.2 + doctor.GRACE_S + 0.5
    assert [(r.target, r.status) for r in rows] == [("litellm", "fail"), ("state", "ok"), ("zulip", "fail")]
    assert rows[0].detail == "no answer within 0.2 s" and "ZeroDivisionError" in rows[2].detail


def test_exit_codes_and_overall_status():
    ok, warn, fail, skip = (doctor.Check("t", "c", s) for s in ("ok", "warn", "fail", "skip"))
    assert (doctor.exit_code([ok, skip]), doctor.overall([ok, skip])) == (0, "ok")
    assert (doctor.exit_code([ok, warn]), doctor.overall([ok, warn])) == (1, "warn")
    assert (doctor.exit_code([warn, fail]), doctor.overall([warn, fail])) == (1, "fail")


def test_a_locked_state_directory_warns_and_an_unwritable_one_fails(tmp_path):
    from gpuheal.state.store import StateDir

    with StateDir(tmp_path / "st", 0):
        assert checks.state_dir_check(tmp_path / "st").status == "warn"
    assert checks.state_dir_check(tmp_path / "st").status == "ok"
    (tmp_path / "file").write_text("x")
    assert checks.state_dir_check(tmp_path / "file").status == "fail"


@pytest.mark.sshd
def test_ssh_checks_against_a_real_sshd(sshd, tmp_path):
    def cfg_with(known_hosts):
        return load_config_dict(
            {
                "heal": {
                    "known_hosts": known_hosts,
                    "ssh_key": sshd.key_filename,
                    "ssh_user": sshd.user,
                    "ssh_connect_timeout_s": 5,
                },
                "gpus": [
                    {
                        "alias": "gpu-a",
                        "host": sshd.host,
                        "ssh_port": sshd.port,
                        "endpoint": closed_url(),
                        "transport": "ssh",
                        "restart_command": "systemctl restart llama-server",
                        "kill_command": ["sudo", "-n", "kill", "{alias}"],
                        "smi_command": [sys.executable, "-V"],
                    }
                ],
            }
        )

    rows = rows_of(run(cfg_with(sshd.known_hosts), tmp_path / "s"))
    assert rows[("gpu-a", "ssh")]["status"] == "ok" and "host key verified" in rows[("gpu-a", "ssh")]["detail"]
    assert rows[("gpu-a", "smi_command")]["status"] == "ok"
    assert rows[("gpu-a", "restart_command")]["status"] == "fail"
    assert "llama-server" in rows[("gpu-a", "restart_command")]["detail"]
    assert rows[("gpu-a", "sudo -n")]["status"] in ("ok", "fail")  # whatever this host's sudo does, it was asked
    rows = rows_of(run(cfg_with(sshd.empty_known_hosts), tmp_path / "s"))
    row = rows[("gpu-a", "ssh")]
    assert row["status"] == "fail" and row["detail"].startswith("host key unknown")
    assert f"ssh-keyscan -p {sshd.port} {sshd.host} >> {sshd.empty_known_hosts}" in row["fix"]
    assert rows[("gpu-a", "restart_command")]["status"] == "skip"


def test_cli_doctor_json_and_exit(lab, tmp_path, monkeypatch):
    import subprocess

    env = {**__import__("os").environ, **ENV}
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("gpuheal")),
            "--config",
            str(lab.config_path),
            "--state-dir",
            str(tmp_path / "cli-state"),
            "doctor",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["status"] == "ok", doc
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("gpuheal")), "--config", str(tmp_path / "nope.yaml"), "doctor"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("source", ["monitor", "prometheus", "smi"])
def test_metrics_not_enabled_says_what_is_lost_and_how_to_enable_it(source):
    """llama-server without ``--metrics`` answers 501: the line says what that costs with this
    config — without gpu-monitor a stuck model goes undetected, it does not "fall back to
    gpu-monitor" — and how to enable it, in the words ``check``'s ``rules_off`` uses (issue 11)."""
    with LoopbackServer(default=Reply(501, b'{"error": {"code": 501, "message": "This server does not support metrics endpoint."}}')) as srv:  # noqa: E501
        raw = {"gpus": [{"alias": "gpu-a", "host": "ct1", "endpoint": srv.url}]}
        if source == "monitor":
            raw["monitor"] = {"url": "http://127.0.0.1:9/gpu-data"}
        elif source == "prometheus":
            raw["prometheus"] = {"url": "http://127.0.0.1:9"}
        cfg = load_config_dict(raw)
        check = checks.metrics_check(cfg, cfg.gpus[0], 2.0)
    assert check.status == "warn" and check.detail.startswith("not enabled (HTTP 501)"), check
    assert "start llama-server with --metrics" in check.fix
    if source == "monitor":
        assert "gpu-monitor counts failures" in check.detail
    else:
        assert "no gpu-monitor configured" in check.detail and "a stuck model is not detected" in check.detail
        assert "falls back to gpu-monitor" not in check.detail
