"""The AlertSink seam (issue 19 item 3): ``escalate`` and ``report --send`` deliver through
:func:`gpuheal.sinks.open_sink` and read only typed outcomes, so a second sink is a module and a
branch there. Zulip is the one implementation; here a second, in-memory sink takes its place."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest

from gpuheal import sinks, zulip
from gpuheal.sink import SendOutcome, SendStatus, SinkUnavailable
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import escalate, report

try:
    from tests.zulip_server import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike, alert, config_dict, runtime, seed
except ImportError:
    from zulip_server import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike, alert, config_dict, runtime, seed

NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)


@dataclass
class MemorySink:
    """A second sink: what it was sent, and the outcomes to answer with (then ``sent``)."""

    answers: list[SendOutcome] = field(default_factory=list)
    posted: list[tuple[str, str | None]] = field(default_factory=list)
    name: str = "Memory"
    max_chars: int = 10_000
    where: str = "memory"
    credential_hint: str = "MEMORY_TOKEN"

    def send(self, content: str, topic: str | None = None) -> SendOutcome:
        self.posted.append((content, topic))
        if self.answers:
            return self.answers.pop(0)
        return SendOutcome(SendStatus.SENT, message_id=len(self.posted))


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZULIP_EMAIL", DEFAULT_EMAIL)
    monkeypatch.setenv("ZULIP_API_KEY", DEFAULT_KEY)


def use(monkeypatch, memory: MemorySink) -> None:
    monkeypatch.setattr(sinks, "open_sink", lambda cfg, post=None: memory)


def escalate_with(state, site="http://127.0.0.1:9"):
    rt = runtime(config_dict(site), state, NOW)
    with StateDir(state) as store:
        return escalate.command(rt, store)


def test_zulip_is_an_alert_sink_with_typed_outcomes():
    with ZulipLookalike() as srv:
        rt = runtime(config_dict(srv.url), None, NOW)
        zs = sinks.open_sink(rt.cfg)
        assert isinstance(zs, zulip.ZulipSink) and zs.where == "#agent-hub > alerts-gpu"
        ok = zs.send("hello")
        srv.script = ["401"]
        refused = zs.send("hello")
    assert ok.kind is SendStatus.SENT and ok.ok and ok.message_id == srv.messages[0]["id"]
    assert refused.kind is SendStatus.UNAUTHORIZED and not refused.ok
    assert "ZULIP_API_KEY" in zs.credential_hint and DEFAULT_KEY not in repr(zs)


def test_open_sink_says_why_nothing_can_be_sent(monkeypatch):
    with pytest.raises(SinkUnavailable) as exc:
        sinks.open_sink(runtime(config_dict(None), None, NOW).cfg)
    assert exc.value.kind == "not-configured"
    monkeypatch.delenv("ZULIP_API_KEY")
    with pytest.raises(SinkUnavailable) as exc:
        sinks.open_sink(runtime(config_dict("http://127.0.0.1:9"), None, NOW).cfg)
    assert exc.value.kind == "no-credentials" and "ZULIP_API_KEY" in exc.value.detail


def test_escalate_delivers_through_a_second_sink(monkeypatch, tmp_path):
    memory = MemorySink()
    use(monkeypatch, memory)
    state = tmp_path / "state"
    seed(state, files.ALERTS, {"queue": [alert("gpu-dense", "model-stuck")], "sent": {}, "clean_cycles": 0})
    r = escalate_with(state)
    assert r.exit_code == 0 and len(memory.posted) == 1
    assert memory.posted[0][0].startswith("⚠ GPU Self-Heal — gpu-dense needs attention")
    assert r.document["sent"][0]["message_id"] == 1


def test_a_second_sinks_rate_limit_holds_the_queue(monkeypatch, tmp_path):
    memory = MemorySink([SendOutcome(SendStatus.RATE_LIMITED, "slow down", retry_after_s=30.0)])
    use(monkeypatch, memory)
    state = tmp_path / "state"
    seed(state, files.ALERTS, {"queue": [alert("gpu-dense", "model-stuck")], "sent": {}, "clean_cycles": 0})
    r = escalate_with(state)
    assert r.exit_code == 1 and r.document["error"]["kind"] == "rate-limited"
    assert "Memory rate limit" in r.document["error"]["detail"] and len(r.document["queued"]) == 1


def test_report_send_goes_through_the_sink(monkeypatch, tmp_path):
    memory = MemorySink()
    use(monkeypatch, memory)
    rt = runtime(config_dict("http://127.0.0.1:9"), tmp_path / "state", NOW)
    with StateDir(tmp_path / "state") as store:
        r = report.command(rt, store, weekly=True, send=True)
    assert r.exit_code == 0 and memory.posted == [(r.document["markdown"], None)]
