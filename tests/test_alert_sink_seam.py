"""Issue 19 item 3: ``escalate`` and ``report --send`` reach humans through an :class:`AlertSink` and the
sink-neutral ``alerts:`` policy, never through ``cfg.zulip``: a second sink plugs in by its module and
its line in ``gpuheal.sinks.SINKS``. Configs written before ``alerts:`` (``zulip.group_by`` …) still load.
"""

from __future__ import annotations

import re
import sys
import types
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuheal import sinks
from gpuheal.config.load import load_config_dict
from gpuheal.errors import ConfigError
from gpuheal.sink import Destination, SendOutcome, SendStatus, SinkUnavailable
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import escalate

try:
    from tests.zulip_server import alert, config_dict, health_doc, read_state, runtime, seed
except ImportError:
    from zulip_server import alert, config_dict, health_doc, read_state, runtime, seed

PKG = Path(__file__).resolve().parent.parent / "gpuheal"
GPUS = [{"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:9"}]
NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)


def test_alerts_policy_defaults_and_the_old_zulip_keys_still_read():
    assert load_config_dict({"gpus": GPUS}).alerts.max_messages_per_run == 10
    old = load_config_dict({"gpus": GPUS, "zulip": {"group_by": "rack", "max_messages_per_run": 5,
                                                     "repeat_interval_h": 2, "all_clear_every": 7}})
    new = load_config_dict({"gpus": GPUS, "alerts": {"group_by": "rack", "max_messages_per_run": 5,
                                                      "repeat_interval_h": 2, "all_clear_every": 7}})
    assert old.alerts == new.alerts and new.alerts.group_by == "rack" and new.alerts.repeat_interval_h == 2.0


def test_one_key_set_to_two_values_in_alerts_and_zulip_is_one_line_naming_it():
    with pytest.raises(ConfigError) as err:
        load_config_dict({"gpus": GPUS, "alerts": {"group_by": "site"}, "zulip": {"group_by": "rack"}})
    assert "alerts.group_by" in str(err.value) and "zulip.group_by" in str(err.value)
    same = load_config_dict({"gpus": GPUS, "alerts": {"group_by": "rack"}, "zulip": {"group_by": "rack"}})
    assert same.alerts.group_by == "rack"


@pytest.mark.parametrize("bad", [{"max_messages_per_run": 1}, {"group_by": "no spaces"}, {"colour": "red"}])
def test_a_bad_alerts_key_is_refused(bad):
    with pytest.raises(ConfigError):
        load_config_dict({"gpus": GPUS, "alerts": bad})


@pytest.mark.parametrize("module", ["steps/escalate.py", "steps/report.py", "steps/heal.py"])
def test_the_senders_never_name_zulip(module):
    text = (PKG / module).read_text()
    assert not re.search(r"cfg\.zulip\b|gpuheal\.zulip|from gpuheal import [^\n]*\bzulip\b", text)


class _Recorded:
    """A second sink, as a module in SINKS would give it: records what it is asked to send."""

    name, max_chars, where, credential_hint = "Pager", 40, "pager:ops", "PAGER_TOKEN"

    def __init__(self) -> None:
        self.sent: list[tuple[str, str | None]] = []

    def send(self, content: str, topic: str | None = None) -> SendOutcome:
        self.sent.append((content, topic))
        return SendOutcome(SendStatus.SENT, message_id=len(self.sent))


def install_pager(monkeypatch) -> _Recorded:
    """A sink declared in SINKS ahead of Zulip (no config section: it is always set up), its module
    naming where it delivers and how it opens."""
    box = _Recorded()
    mod = types.ModuleType("pager_sink")
    mod.destination = lambda cfg: Destination("Pager", "ops", "gpu", lambda text: text[:40], 40)
    mod.open_sink = lambda cfg, post=None: box
    monkeypatch.setitem(sys.modules, "pager_sink", mod)
    pager = sinks.SinkKind("Pager", None, None, "pager_sink:destination", "pager_sink:open_sink")
    monkeypatch.setattr(sinks, "SINKS", (pager, *sinks.SINKS))
    return box


def test_escalate_sends_through_whichever_sink_is_registered(monkeypatch, tmp_path):
    state = tmp_path / "state"
    seed(state, files.ALERTS, {"queue": [alert("gpu-dense", "model-stuck")], "sent": {}, "clean_cycles": 0})
    seed(state, files.GPU_HEALTH, health_doc([("gpu-dense", "model-stuck")]))
    rt = runtime(config_dict(None), state, NOW)  # zulip.site not set: only the pager is configured
    pager = install_pager(monkeypatch)
    with StateDir(state) as store:
        result = escalate.command(rt, store)
    assert result.exit_code == 0 and len(pager.sent) == 1
    content, topic = pager.sent[0]
    assert len(content) <= 40 and topic == "gpu"  # the sink's own limit and default topic
    assert read_state(state, files.ALERTS)["queue"] == []
    preview = sinks.destination(rt.cfg)
    assert preview.where == "#ops > gpu"


def test_every_sink_section_is_built_by_the_loader_from_its_record():
    cfg = load_config_dict({"gpus": GPUS, "zulip": {"stream": "ops"}})
    for kind in sinks.SINKS:
        assert type(cfg.sections[kind.section]) is kind.record
    assert cfg.zulip.stream == "ops" and cfg.zulip is cfg.sections["zulip"]


def test_without_any_sink_configured_the_first_says_what_is_missing():
    cfg = load_config_dict({"gpus": GPUS})
    with pytest.raises(SinkUnavailable) as err:
        sinks.open_sink(cfg)
    assert err.value.kind == "not-configured" and "zulip.site" in err.value.detail
    assert sinks.destination(cfg).where == "#agent-hub > alerts-gpu"
