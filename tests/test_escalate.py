"""``gpuheal escalate`` against a loopback Zulip look-alike, across separate runs (each run opens
the state directory anew, as cron does): delivery, dedup, reminders, folding, and every failure
keeping the queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuheal import alerts as alertq
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import escalate

try:
    from tests.zulip_server import (
        DEFAULT_EMAIL,
        DEFAULT_KEY,
        ZulipLookalike,
        alert,
        config_dict,
        health_doc,
        read_state,
        runtime,
        seed,
    )
except ImportError:
    from zulip_server import (
        DEFAULT_EMAIL,
        DEFAULT_KEY,
        ZulipLookalike,
        alert,
        config_dict,
        health_doc,
        read_state,
        runtime,
        seed,
    )

NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
T0 = NOW.timestamp()


@pytest.fixture
def server():
    with ZulipLookalike() as srv:
        yield srv


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no stray .env from the checkout
    monkeypatch.setenv("ZULIP_EMAIL", DEFAULT_EMAIL)
    monkeypatch.setenv("ZULIP_API_KEY", DEFAULT_KEY)


@pytest.fixture
def state(tmp_path):
    return tmp_path / "state"


def run(state, site, now=NOW, dry_run=False, **cfg_sections):
    rt = runtime(config_dict(site, **cfg_sections), state, now)
    with StateDir(state) as store:
        result = escalate.command(rt, store, dry_run=dry_run)
        result.warnings[:0] = store.warnings
    return result


def queue(state, *alerts, sent=None, clean_cycles=0):
    seed(state, files.ALERTS, {"queue": list(alerts), "sent": sent or {}, "clean_cycles": clean_cycles})


def alerts_data(state):
    return alertq.normalise(read_state(state, files.ALERTS))


# --------------------------------------------------------------------------- delivery and dedup


def test_sends_every_queued_alert_once_across_runs(server, state):
    queue(state, alert("gpu-dense", "model-stuck"), alert("gpu-light", "thermal-critical", kind="resolved"))
    r = run(state, server.url)
    assert r.exit_code == 0 and r.document["error"] is None
    assert [m["content"].splitlines()[0] for m in server.messages] == [
        "⚠ GPU Self-Heal — gpu-dense needs attention",
        "🛠 GPU Self-Heal — gpu-light thermal-critical resolved",
    ]
    assert all(m["to"] == "agent-hub" and m["topic"] == "alerts-gpu" and m["type"] == "stream" for m in server.messages)
    data = alerts_data(state)
    assert data["queue"] == []
    assert data["sent"]["gpu-dense/model-stuck"]["state_key"] == "escalated:2026-07-18T06:00:00Z"
    assert data["sent"]["gpu-dense/model-stuck"]["message_id"] == server.messages[0]["id"]

    r2 = run(state, server.url, now=NOW + timedelta(minutes=1))  # the next cron minute
    assert r2.exit_code == 0 and r2.document["sent"] == []
    assert len(server.messages) == 2

    # heal queueing the same (gpu, issue) in the same state again is refused by the queue...
    data = alerts_data(state)
    assert alertq.enqueue(data, alert("gpu-dense", "model-stuck")) is False
    # ...and if it slipped in anyway, escalate drops it as a duplicate.
    data["queue"].append(alert("gpu-dense", "model-stuck"))
    seed(state, files.ALERTS, data)
    r3 = run(state, server.url)
    assert r3.document["dropped"] == [{"fingerprint": "gpu-dense/model-stuck", "reason": "already sent in this state"}]
    assert len(server.messages) == 2 and alerts_data(state)["queue"] == []


def test_a_changed_state_is_sent_again(server, state):
    queue(state, alert("gpu-dense", "model-stuck"))
    run(state, server.url)
    data = alerts_data(state)
    assert alertq.enqueue(data, alert("gpu-dense", "model-stuck", kind="resolved", created_at=T0)) is True
    seed(state, files.ALERTS, data)
    run(state, server.url)
    assert [m["content"].splitlines()[0] for m in server.messages][-1] == "🛠 GPU Self-Heal — gpu-dense model-stuck resolved"
    assert alerts_data(state)["sent"]["gpu-dense/model-stuck"]["kind"] == "resolved"


def test_all_clear_title(server, state):
    queue(state, alert("fleet", None, kind="all-clear", detected={"clean_cycles": 100}, tried=[], attempts=0, since=None))
    assert run(state, server.url).exit_code == 0
    assert server.messages[0]["content"].splitlines()[0] == "✅ GPU Fleet: All Clear"
    assert "100 clean heal cycles" in server.messages[0]["content"]


# --------------------------------------------------------------------------- failures keep the queue


def test_500_keeps_the_alert_queued_until_a_later_run_delivers_it(server, state):
    queue(state, alert("gpu-dense", "model-stuck"))
    server.mode = "500"
    r = run(state, server.url)
    assert r.exit_code == 1 and r.document["error"]["kind"] == "server-error"
    q = alerts_data(state)["queue"]
    assert len(q) == 1 and q[0]["delivery"]["tries"] == 1 and "HTTP 500" in q[0]["delivery"]["last_error"]
    assert server.messages == []

    server.mode = "ok"
    r = run(state, server.url, now=NOW + timedelta(minutes=1))
    assert r.exit_code == 0 and len(server.messages) == 1
    assert alerts_data(state)["queue"] == []


def test_a_hanging_zulip_is_bounded_and_keeps_the_queue(server, state):
    queue(state, alert("gpu-dense", "model-stuck"), alert("gpu-light", "vram-leak"))
    server.mode = "hang"
    started = time.monotonic()
    r = run(state, server.url, zulip={"timeout_s": 0.5})
    assert time.monotonic() - started < 3.0  # one deadline, not one per alert
    assert r.exit_code == 1 and r.document["error"]["kind"] == "timeout"
    assert len(server.requests) == 1
    assert [a["fingerprint"] for a in alerts_data(state)["queue"]] == ["gpu-dense/model-stuck", "gpu-light/vram-leak"]


def test_401_is_reported_once_and_nothing_else_is_tried(server, state):
    queue(state, alert("gpu-dense", "model-stuck"), alert("gpu-light", "vram-leak"), alert("strix-moe", "thermal-critical"))
    server.mode = "401"
    r = run(state, server.url)
    assert r.exit_code == 1
    assert len(server.requests) == 1
    err = r.document["error"]
    assert err["kind"] == "unauthorized"
    assert "ZULIP_EMAIL/ZULIP_API_KEY" in err["detail"] and "INVALID_API_KEY" in err["detail"]
    assert DEFAULT_KEY not in json.dumps(r.document)
    assert len(alerts_data(state)["queue"]) == 3


def test_long_429_records_not_before_and_waits_for_it(server, state):
    queue(state, alert("gpu-dense", "model-stuck"), alert("gpu-light", "vram-leak"))
    server.script = [("429", 30)]
    r = run(state, server.url)
    assert r.exit_code == 1 and r.document["error"]["kind"] == "rate-limited"
    assert len(server.requests) == 1
    q = alerts_data(state)["queue"]
    assert all(a["delivery"]["not_before"] == T0 + 30 for a in q)
    assert r.document["queued"][0]["not_before"] == "2026-07-18T08:00:30Z"

    r = run(state, server.url, now=NOW + timedelta(seconds=10))  # too early: not even tried
    assert r.exit_code == 1 and len(server.requests) == 1

    r = run(state, server.url, now=NOW + timedelta(seconds=31))
    assert r.exit_code == 0 and len(server.messages) == 2


def test_short_429_is_waited_out_once_inside_the_run(server, state, monkeypatch):
    slept = []
    from gpuheal.actions import deliver

    monkeypatch.setattr(deliver, "_sleep", slept.append)
    queue(state, alert("gpu-dense", "model-stuck"))
    server.script = [("429", 0.4)]
    r = run(state, server.url)
    assert r.exit_code == 0 and len(server.messages) == 1
    assert slept == [pytest.approx(1.0)]  # max(body 0.4, header "1")


def test_missing_credentials_name_the_variable_and_keep_the_queue(server, state, monkeypatch):
    monkeypatch.delenv("ZULIP_API_KEY")
    queue(state, alert("gpu-dense", "model-stuck"))
    r = run(state, server.url)
    assert r.exit_code == 1
    assert r.document["error"] == {
        "kind": "no-credentials",
        "detail": "ZULIP_API_KEY is not set (zulip.api_key_env): the Zulip bot's API key is needed",
    }
    assert server.requests == [] and len(alerts_data(state)["queue"]) == 1


def test_custom_credential_variables_are_used(server, state, monkeypatch):
    monkeypatch.delenv("ZULIP_EMAIL")
    monkeypatch.delenv("ZULIP_API_KEY")
    monkeypatch.setenv("GPU_BOT_EMAIL", DEFAULT_EMAIL)
    monkeypatch.setenv("GPU_BOT_KEY", DEFAULT_KEY)
    queue(state, alert("gpu-dense", "model-stuck"))
    r = run(state, server.url, zulip={"email_env": "GPU_BOT_EMAIL", "api_key_env": "GPU_BOT_KEY"})
    assert r.exit_code == 0 and len(server.messages) == 1


def test_no_site_configured_keeps_the_queue(state):
    queue(state, alert("gpu-dense", "model-stuck"))
    r = run(state, None)
    assert r.exit_code == 1 and r.document["error"]["kind"] == "not-configured"


def test_nothing_queued_is_quiet_even_without_zulip(state, monkeypatch):
    monkeypatch.delenv("ZULIP_API_KEY")
    r = run(state, None)
    assert r.exit_code == 0 and r.document["error"] is None and r.document["sent"] == []


# --------------------------------------------------------------------------- dry run


def test_dry_run_prints_and_changes_nothing(server, state, capsys):
    queue(state, alert("gpu-dense", "model-stuck"))
    before = (state / files.ALERTS).read_bytes()
    r = run(state, server.url, dry_run=True)
    assert r.exit_code == 0 and server.requests == []
    assert (state / files.ALERTS).read_bytes() == before
    assert not (state / "kg-state.json").exists()
    [m] = r.document["would_send"]
    assert m["title"] == "⚠ GPU Self-Heal — gpu-dense needs attention"
    assert m["topic"] == "alerts-gpu" and m["stream"] == "agent-hub"
    assert m["content"].startswith("⚠ GPU Self-Heal — gpu-dense needs attention\n")
    r.render()
    out = capsys.readouterr().out
    assert "would send to #agent-hub > alerts-gpu" in out and "nothing sent, queue untouched" in out


# --------------------------------------------------------------------------- reminders


def sent_entry(a, at):
    return {"kind": a["kind"], "sent_at": at, "state_key": a["state_key"], "message_id": 7, "reminders": 0, "alert": a}


def test_reminder_after_the_interval_while_still_open(server, state):
    a = alert("gpu-dense", "model-stuck")
    queue(state, sent={a["fingerprint"]: sent_entry(a, T0 - 3 * 3600)})
    seed(state, files.GPU_HEALTH, health_doc([("gpu-dense", "model-stuck")]), raw=True)
    assert run(state, server.url).document["sent"] == []  # 3 h < 4 h

    later = NOW + timedelta(hours=1, seconds=1)
    r = run(state, server.url, now=later)
    assert [m["reminder"] for m in r.document["sent"]] == [1]
    content = server.messages[0]["content"]
    assert content.splitlines()[0] == "⚠ GPU Self-Heal — gpu-dense needs attention"
    assert "Reminder 1" in content
    entry = alerts_data(state)["sent"]["gpu-dense/model-stuck"]
    assert entry["reminders"] == 1 and entry["sent_at"] == later.timestamp()

    assert run(state, server.url, now=later + timedelta(hours=2)).document["sent"] == []
    r = run(state, server.url, now=later + timedelta(hours=4))
    assert [m["reminder"] for m in r.document["sent"]] == [2]


def test_no_reminder_once_resolved_or_when_health_is_unknown(server, state):
    a = alert("gpu-dense", "model-stuck")
    queue(state, sent={a["fingerprint"]: sent_entry(a, T0 - 5 * 3600)})
    assert run(state, server.url).document["sent"] == []  # no gpu-health.json: nothing known
    seed(state, files.GPU_HEALTH, health_doc([]), raw=True)
    assert run(state, server.url).document["sent"] == []  # cleared
    assert server.requests == []


def test_custom_repeat_interval(server, state):
    a = alert("gpu-dense", "model-stuck")
    queue(state, sent={a["fingerprint"]: sent_entry(a, T0 - 3600 - 1)})
    seed(state, files.GPU_HEALTH, health_doc([("gpu-dense", "model-stuck")]), raw=True)
    r = run(state, server.url, zulip={"repeat_interval_h": 1})
    assert len(r.document["sent"]) == 1
    assert "repeated every 1 h" in server.messages[0]["content"]


def test_a_failed_reminder_stays_queued(server, state):
    a = alert("gpu-dense", "model-stuck")
    queue(state, sent={a["fingerprint"]: sent_entry(a, T0 - 5 * 3600)})
    seed(state, files.GPU_HEALTH, health_doc([("gpu-dense", "model-stuck")]), raw=True)
    server.mode = "500"
    assert run(state, server.url).exit_code == 1
    [q] = alerts_data(state)["queue"]
    assert q["reminder"] == 1
    server.mode = "ok"
    assert run(state, server.url).exit_code == 0
    assert len(server.messages) == 1 and alerts_data(state)["queue"] == []


# --------------------------------------------------------------------------- folding


def test_host_unreachable_absorbs_the_hosts_other_escalations(server, state):
    queue(
        state,
        alert("gpu-dense", "model-stuck"),
        alert("gpu-dense", "host-unreachable", summary="llama-server refused 3 polls"),
        alert("gpu-light", "vram-leak"),
        alert("gpu-dense", "vram-leak"),
    )
    r = run(state, server.url)
    assert r.exit_code == 0
    assert [(m["fingerprint"], m["folded"]) for m in r.document["sent"]] == [
        ("gpu-dense/host-unreachable", ["gpu-dense/model-stuck", "gpu-dense/vram-leak"]),
        ("gpu-light/vram-leak", []),
    ]
    content = server.messages[0]["content"]
    assert "Also open on gpu-dense" in content and "**model-stuck**" in content and "**vram-leak**" in content
    sent = alerts_data(state)["sent"]
    assert sent["gpu-dense/model-stuck"]["folded_into"] == "gpu-dense/host-unreachable"


def test_later_escalations_of_an_unreachable_host_are_absorbed_then_resent_when_it_returns(server, state):
    hu = alert("gpu-dense", "host-unreachable")
    queue(state, hu)
    seed(state, files.GPU_HEALTH, health_doc([("gpu-dense", "host-unreachable")]), raw=True)
    run(state, server.url)
    assert len(server.messages) == 1

    data = alerts_data(state)
    alertq.enqueue(data, alert("gpu-dense", "model-stuck"))
    seed(state, files.ALERTS, data)
    seed(state, files.GPU_HEALTH, health_doc([("gpu-dense", "host-unreachable"), ("gpu-dense", "model-stuck")]), raw=True)
    r = run(state, server.url, now=NOW + timedelta(minutes=1))
    assert r.document["absorbed"] == [{"fingerprint": "gpu-dense/model-stuck", "folded_into": "gpu-dense/host-unreachable"}]
    assert len(server.messages) == 1 and r.exit_code == 0

    r = run(state, server.url, now=NOW + timedelta(hours=4, minutes=1))  # the reminder lists it
    assert [m["fingerprint"] for m in r.document["sent"]] == ["gpu-dense/host-unreachable"]
    assert "Also open on gpu-dense" in server.messages[-1]["content"]
    assert "**model-stuck**" in server.messages[-1]["content"]

    data = alerts_data(state)  # the host comes back; model-stuck stays open
    alertq.enqueue(data, alert("gpu-dense", "host-unreachable", kind="resolved", created_at=T0 + 5 * 3600))
    seed(state, files.ALERTS, data)
    seed(state, files.GPU_HEALTH, health_doc([("gpu-dense", "model-stuck")]), raw=True)
    r = run(state, server.url, now=NOW + timedelta(hours=5))
    assert [(m["fingerprint"], m["kind"]) for m in r.document["sent"]] == [
        ("gpu-dense/host-unreachable", "resolved"),
        ("gpu-dense/model-stuck", "escalated"),
    ]
    assert "folded_into" not in alerts_data(state)["sent"]["gpu-dense/model-stuck"]
    assert alerts_data(state)["queue"] == []


# --------------------------------------------------------------------------- bad input and limits


def test_corrupt_alerts_file_is_set_aside_not_a_crash(server, state):
    state.mkdir()
    (state / files.ALERTS).write_text('{"schema_version": 1, "data": {"queue": [')
    r = run(state, server.url)
    assert r.exit_code == 0
    assert any("alerts.json" in w and "set aside" in w for w in r.warnings)
    assert list(state.glob("alerts.json.corrupt-*"))


def test_malformed_queue_entries_are_skipped(server, state):
    seed(state, files.ALERTS, {"queue": ["junk", {"no": "fingerprint"}, alert("gpu-dense", "model-stuck")], "sent": [], "clean_cycles": "x"})
    r = run(state, server.url)
    assert r.exit_code == 0 and len(server.messages) == 1


def test_huge_evidence_fits_zulips_limit(server, state):
    a = alert("gpu-dense", "vram-leak", detected={"journal": "\n".join(f"line {i} " + "x" * 200 for i in range(400))},
              tried=[f"attempt {i}: restart → failed {'y' * 150}" for i in range(200)])
    queue(state, a)
    assert run(state, server.url).exit_code == 0
    msg = server.messages[0]
    assert not msg["server_truncated"] and len(msg["content"]) <= 10_000


def test_weekly_report_queued_by_report_is_delivered_verbatim(server, state):
    queue(state, {"fingerprint": "fleet/weekly-report", "gpu": "fleet", "issue": None, "kind": "report", "state_key": "weekly:x",
                  "created_at": T0, "title": "**📊 GPU Fleet — Weekly Benchmark Report**", "content": "**📊 GPU Fleet — Weekly Benchmark Report**\nbody\n"})
    assert run(state, server.url).exit_code == 0
    assert server.messages[0]["content"] == "**📊 GPU Fleet — Weekly Benchmark Report**\nbody"


# --------------------------------------------------------------------------- the real CLI, as cron runs it


def gpuheal_bin() -> str:
    return str(Path(sys.executable).with_name("gpuheal"))


def cli(tmp_path, state, site, *args, env_extra=None, now="2026-07-18T08:00:00Z"):
    import yaml

    cfg = tmp_path / "gpuheal.yaml"
    cfg.write_text(yaml.safe_dump(config_dict(site)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZULIP_", "GPUHEAL_"))}
    env.update({"GPUHEAL_NOW": now, "ZULIP_EMAIL": DEFAULT_EMAIL, "ZULIP_API_KEY": DEFAULT_KEY})
    env.update(env_extra or {})
    return subprocess.run(
        [gpuheal_bin(), "--config", str(cfg), "--state-dir", str(state), *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )


def test_cli_escalate_delivers_then_dedups(server, state, tmp_path):
    queue(state, alert("gpu-dense", "model-stuck"))
    p = cli(tmp_path, state, server.url, "escalate")
    assert p.returncode == 0, p.stderr
    assert "sent     ⚠ GPU Self-Heal — gpu-dense needs attention" in p.stdout
    assert len(server.messages) == 1
    p = cli(tmp_path, state, server.url, "escalate", "--json", now="2026-07-18T08:01:00Z")
    assert p.returncode == 0
    assert json.loads(p.stdout)["sent"] == []
    assert len(server.messages) == 1


def test_cli_escalate_401_is_one_line_on_stderr_and_exit_1(server, state, tmp_path):
    queue(state, alert("gpu-dense", "model-stuck"), alert("gpu-light", "vram-leak"))
    p = cli(tmp_path, state, server.url, "escalate", env_extra={"ZULIP_API_KEY": "wrong-key-0123456789"})
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "Zulip rejected the bot credentials" in lines[0] and "2 alert(s) stay queued" in lines[0]
    assert "wrong-key-0123456789" not in p.stderr + p.stdout
    assert len(alerts_data(state)["queue"]) == 2


def test_cli_escalate_missing_key(server, state, tmp_path):
    queue(state, alert("gpu-dense", "model-stuck"))
    p = cli(tmp_path, state, server.url, "escalate", "--json", env_extra={"ZULIP_API_KEY": ""})
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [
        "gpuheal: ERROR: escalate: ZULIP_API_KEY is not set (zulip.api_key_env): the Zulip bot's API key is needed; 1 alert(s) stay queued"
    ]
    assert json.loads(p.stdout)["error"]["kind"] == "no-credentials"


def test_cli_escalate_dry_run(server, state, tmp_path):
    queue(state, alert("gpu-dense", "model-stuck"))
    p = cli(tmp_path, state, server.url, "escalate", "--dry-run")
    assert p.returncode == 0 and server.requests == []
    assert "⚠ GPU Self-Heal — gpu-dense needs attention" in p.stdout


@pytest.mark.parametrize(
    "junk",
    [
        {"gpu": 7, "issue": ["x"], "kind": None, "detected": "text", "tried": {"a": 1}, "attempts": "three",
         "since": 12345, "summary": None, "reminder": "x", "delivery": "broken", "created_at": "yesterday"},
        {"gpu": None, "issue": None, "kind": "escalated", "detected": {"nested": {"deep": [1, 2, {"x": None}]}},
         "tried": [None, 3, {"action": None}], "since": "not a time", "delivery": {"tries": "many", "not_before": "soon"}},
        {"kind": "all-clear", "detected": {"clean_cycles": True}},
    ],
)
def test_junk_fields_in_a_queued_alert_never_crash(server, state, junk):
    a = {"fingerprint": "x/y", "state_key": "k", **junk}
    queue(state, a)
    r = run(state, server.url)
    assert r.exit_code == 0 and len(server.messages) == 1
    r = run(state, server.url, dry_run=True)
    assert r.exit_code == 0


def test_junk_sent_entries_never_crash(server, state):
    seed(state, files.GPU_HEALTH, health_doc([("gpu-dense", "model-stuck")]), raw=True)
    queue(state, alert("gpu-dense", "host-unreachable"), sent={
        "gpu-dense/model-stuck": {"kind": "escalated", "sent_at": "x", "alert": "nope"},
        "gpu-dense/vram-leak": {"kind": "escalated", "sent_at": None, "folded_into": "gpu-dense/host-unreachable", "alert": {"gpu": 1}},
        "a/b": {"kind": "escalated", "sent_at": 0, "reminders": "x", "alert": {"gpu": "gpu-dense", "issue": "model-stuck"}},
    })
    r = run(state, server.url)
    assert r.exit_code == 0
