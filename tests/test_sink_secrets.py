"""Issue 26 item 5: each source and sink declares its secrets, and redaction follows the declarations.

A second sink, registered only for this test as a deployment would register one (its ``SinkKind`` line
in ``gpuheal.sinks.SINKS`` and its module), posts to a webhook whose URL is the secret — kept in ``.env``
under a variable not named like a secret (``PAGER_HOOK``), as a Slack incoming-webhook URL is. The sink
is careless the way real ones are: a failed post's detail names the URL it posted to. With it set up,
``check``, ``heal --apply``, ``escalate``, ``report --weekly --send`` and ``doctor`` run in-process
against the simulated fleet (a GPU at 90 °C, so there is an alert to send), each with
``--metrics-file``; the URL must be in none of the files of the state directory (the alerts file and
the audit trail among them), the knowledge graph, the metrics file, stdout or stderr.

Before the declarations, ``credentials.secrets_for`` knew Zulip's key by name and variables named like
a secret (``*_TOKEN``...): this URL was written to ``alerts.json`` and the audit trail.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from lab import Lab, scenario
from servers import LoopbackServer, Reply

from gpuheal import entry, sinks
from gpuheal.credentials import lookup, secrets_for
from gpuheal.secret import Secret
from gpuheal.sink import Destination, SendOutcome, SendStatus

HOOK_PATH = "/services/T0PAGER9/B0PAGER9/xoxsPagerWebhookPart42"


@dataclass
class WebhookSink:
    """A Slack-like incoming webhook: POST the text as JSON to the secret URL."""

    url: str
    name: str = "Pager"
    max_chars: int = 4000
    where: str = "#ops"
    credential_hint: str = "PAGER_HOOK"

    def send(self, content: str, topic: str | None = None) -> SendOutcome:
        from gpuheal.sources.http import HttpFault, request

        res = request("POST", self.url, deadline_s=2.0, body=json.dumps({"text": content}).encode(),
                      headers={"Content-Type": "application/json"})
        if isinstance(res, HttpFault):
            return SendOutcome(SendStatus.UNREACHABLE, f"POST {self.url}: {res.kind}")
        if res.status != 200:  # the careless part: the URL in the detail
            return SendOutcome(SendStatus.SERVER_ERROR, f"POST {self.url}: HTTP {res.status}", status=res.status)
        return SendOutcome(SendStatus.SENT, message_id=1, status=200)


def open_pager(cfg, post=None) -> WebhookSink:
    url, _ = lookup("PAGER_HOOK", cfg.path)
    return WebhookSink(str(url))


def pager_destination(cfg) -> Destination:
    return Destination("Pager", "ops", "gpu", lambda text: text[:4000], 4000)


@pytest.fixture
def pager(monkeypatch):
    """The second sink, declared ahead of Zulip, its webhook URL a declared secret."""
    mod = types.ModuleType("pager_sink")
    mod.open_sink, mod.destination = open_pager, pager_destination
    monkeypatch.setitem(sys.modules, "pager_sink", mod)
    kind = sinks.SinkKind("Pager", None, None, "pager_sink:destination", "pager_sink:open_sink",
                          secrets=(Secret(env="PAGER_HOOK"),))
    monkeypatch.setattr(sinks, "SINKS", (kind, *sinks.SINKS))
    return kind


@pytest.fixture
def site(tmp_path, monkeypatch, pager):
    hook = LoopbackServer({HOOK_PATH: Reply(500, "internal_error")}).start()  # the webhook refuses: a detail
    lab = Lab(tmp_path, scenario([{"alias": "gpu-hot", "host": "ct1", "temp_c": 90}]))
    url = hook.url + HOOK_PATH
    (tmp_path / ".env").write_text(f"PAGER_HOOK={url}\n")
    (tmp_path / ".env").chmod(0o600)
    monkeypatch.chdir(tmp_path)
    yield lab, url
    lab.fleet.stop()
    hook.stop()


def run(lab: Lab, monkeypatch, capfd, *args: str) -> tuple[int, str, str]:
    """One command line through the console entry point, in this process (the sink is registered here),
    as cron runs it: the virtual clock pinned, the metrics file written."""
    monkeypatch.setenv("GPUHEAL_NOW", lab.fleet.now().strftime("%Y-%m-%dT%H:%M:%SZ"))
    argv = ["--config", str(lab.config_path), "--state-dir", str(lab.state_dir),
            "--metrics-file", str(lab.tmp / "gpuheal.prom"), *args]
    try:
        entry.main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capfd.readouterr()
    return code, out, err


def test_a_second_sinks_webhook_url_is_in_nothing_gpuheal_writes(site, monkeypatch, capfd):
    lab, url = site
    assert url in secrets_for(lab.cfg)  # declared, though PAGER_HOOK is not named like a secret
    printed = []
    for args in (("check", "--json"), ("heal", "--apply", "--json"), ("heal", "--apply", "--json"),
                 ("escalate", "--json"), ("escalate",), ("report", "--weekly", "--send"), ("report", "--json"),
                 ("doctor", "--json"), ("doctor",)):
        lab.fleet.advance(61)
        code, out, err = run(lab, monkeypatch, capfd, *args)
        assert code in (0, 1, 2), (args, code, err)
        printed.append((args, out, err))
    alerts = json.loads((lab.state_dir / "alerts.json").read_text())
    tried = [a.get("delivery", {}).get("last_error") for a in alerts["data"]["queue"]]
    assert any(t and "<redacted>" in t for t in tried), alerts  # the post failed, and said where
    files = [p for p in lab.state_dir.rglob("*") if p.is_file()] + [lab.tmp / "gpuheal.prom"]
    names = {p.name for p in files}
    assert {"alerts.json", "gpu-self-heal-log.jsonl", "knowledge-graph.jsonl", "gpuheal.prom"} <= names, names
    for path in files:
        assert url not in path.read_text(errors="replace"), path
        assert HOOK_PATH.rsplit("/", 1)[1] not in path.read_text(errors="replace"), path
    for args, out, err in printed:
        assert url not in out and url not in err, args


PKG = Path(__file__).resolve().parent.parent / "gpuheal"


def test_redaction_names_no_sink_and_every_declared_secret_is_collected(monkeypatch, tmp_path):
    """``secrets_for`` reads the declarations: no sink or source is named in it, and each declared
    secret — a field naming a variable, a fixed variable, a value in the config — is found."""
    from gpuheal.config import load_config_dict

    code = (PKG / "credentials.py").read_text().split('"""', 2)[2]  # past the docstring
    assert "zulip" not in code.lower()
    monkeypatch.chdir(tmp_path)
    cfg = load_config_dict({"gpus": [{"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:9"}],
                            "zulip": {"api_key_env": "MY_BOT"}, "litellm": {"api_key": "lite-key-123456"}})
    env = {"MY_BOT": "zulip-bot-key-1", "PAGER_HOOK": "http://127.0.0.1:1/hook/abcdef"}
    assert {"zulip-bot-key-1", "lite-key-123456"} <= set(secrets_for(cfg, env))
    assert "http://127.0.0.1:1/hook/abcdef" not in secrets_for(cfg, env)  # no sink declares it yet
    kind = sinks.SinkKind("Pager", None, None, "x:y", "x:z", secrets=(Secret(env="PAGER_HOOK"),))
    monkeypatch.setattr(sinks, "SINKS", (kind, *sinks.SINKS))
    assert "http://127.0.0.1:1/hook/abcdef" in secrets_for(cfg, env)


def test_the_message_limit_is_written_once_the_sinks():
    """Zulip's 10,000 characters: its declaration's ``Destination.max_chars``; the renderers take it."""
    from gpuheal.config import load_config_dict

    written = [p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
               if p.relative_to(PKG).parts[0] != "sim" and ("10_000" in p.read_text() or "= 10000" in p.read_text())]
    assert [w for w in written if "zulip" in w or w.startswith("render/")] == ["zulip.py"]
    cfg = load_config_dict({"gpus": [{"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:9"}]})
    assert sinks.destination(cfg).max_chars == 10_000
