"""gpuheal.zulip: the POST /api/v1/messages exchange against a loopback Zulip look-alike,
credentials (environment, then the L4 ``.env`` fallback), and Zulip's limits."""

from __future__ import annotations

import base64
import logging
import os
import time
from types import SimpleNamespace
from urllib.parse import parse_qs

import pytest

from gpuheal import zulip
from gpuheal.sources.http import HttpFault, HttpResult

try:
    from tests.zulip_server import (
        DEFAULT_EMAIL,
        DEFAULT_KEY,
        ZulipLookalike,
        config_dict,
        free_port,
    )
except ImportError:  # pytest's rootdir-less import mode
    from zulip_server import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike, config_dict, free_port

CREDS = zulip.Credentials(DEFAULT_EMAIL, DEFAULT_KEY, "test")


@pytest.fixture
def server():
    with ZulipLookalike() as srv:
        yield srv


def send(server, content="hello", topic="alerts-gpu", creds=CREDS, timeout_s=2.0):
    return zulip.send_message(server.url, creds, "agent-hub", topic, content, timeout_s)


# --------------------------------------------------------------------------- the exchange


def test_success_posts_the_real_form_with_basic_auth(server):
    out = send(server, "**gpu-dense** restarted")
    assert out.ok and out.kind == "sent" and out.message_id == 101
    req = server.requests[0]
    assert req["path"] == "/api/v1/messages"
    assert req["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert req["headers"]["User-Agent"].startswith("gpuheal/")
    user, _, key = base64.b64decode(req["auth"].split()[1]).decode().partition(":")
    assert (user, key) == (DEFAULT_EMAIL, DEFAULT_KEY)
    form = {k: v[0] for k, v in parse_qs(req["raw"].decode()).items()}
    assert form == {"type": "stream", "to": "agent-hub", "topic": "alerts-gpu", "content": "**gpu-dense** restarted"}
    assert server.messages[0]["content"] == "**gpu-dense** restarted"


def test_429_reads_retry_after_from_body_and_header(server):
    server.script = [("429", 28.7)]
    out = send(server)
    assert out.kind == "rate-limited" and not out.ok
    assert out.retry_after_s == pytest.approx(29.0)  # max(body 28.7, header "29")
    assert out.status == 429 and out.code == "RATE_LIMIT_HIT"


def test_401_wrong_key_is_unauthorized_and_never_echoes_the_key(server):
    bad = zulip.Credentials(DEFAULT_EMAIL, "wrong-key-123456", "test")
    out = send(server, creds=bad)
    assert out.kind == "unauthorized" and out.code == "INVALID_API_KEY" and out.status == 401
    assert "wrong-key-123456" not in out.detail


def test_500_from_a_proxy_is_a_server_error(server):
    server.mode = "500"
    out = send(server)
    assert out.kind == "server-error" and out.status == 500


def test_hang_is_bounded_by_the_deadline(server):
    server.mode = "hang"
    started = time.monotonic()
    out = send(server, timeout_s=0.5)
    assert out.kind == "timeout"
    assert time.monotonic() - started < 2.0


def test_refused_port_is_unreachable():
    port = free_port()
    out = zulip.send_message(f"http://127.0.0.1:{port}", CREDS, "s", "t", "c", 1.0)
    assert out.kind == "unreachable"


def test_missing_stream_is_rejected_with_its_code(server):
    server.mode = "400-stream"
    out = send(server)
    assert out.kind == "rejected" and out.code == "STREAM_DOES_NOT_EXIST"


def test_site_with_trailing_slash(server):
    out = zulip.send_message(server.url + "/", CREDS, "agent-hub", "t", "c", 2.0)
    assert out.ok and server.requests[-1]["path"] == "/api/v1/messages"


# --------------------------------------------------------------------------- limits


def test_long_content_is_cut_by_us_not_by_zulip(server):
    body = "```text\n" + "x" * 50 + "\n" + ("line of journal output\n" * 800)
    assert len(body) > zulip.MAX_CONTENT
    out = send(server, body)
    assert out.ok
    msg = server.messages[0]
    assert not msg["server_truncated"]
    assert len(msg["content"]) <= zulip.MAX_CONTENT
    assert "truncated by gpuheal" in msg["content"]
    assert msg["content"].count("```") % 2 == 0  # the open fence was closed


def test_a_lone_surrogate_in_an_alert_is_sent_as_valid_utf8(server):
    # issue 9 point 5: a string from a source (a GPU name) must never stop the alert
    out = send(server, "gpu-dense (RTX \ud800 3090) at 91 °C", topic="alerts \udfff gpu")
    assert out.ok
    assert server.messages[0]["content"] == "gpu-dense (RTX \ufffd 3090) at 91 °C"


def test_long_topic_is_cut_to_60():
    topic = zulip.fit_topic("gpu-dense " * 20)
    assert len(topic) == 60 and topic.endswith("...")
    assert zulip.fit_topic("alerts-gpu") == "alerts-gpu"


def test_null_bytes_are_removed(server):
    out = send(server, "a\x00b")
    assert out.ok and server.messages[0]["content"] == "ab"


# --------------------------------------------------------------------------- unit cases (injected transport)


def fake(result):
    def post(method, url, **kwargs):
        fake.calls.append((method, url, kwargs))
        return result

    fake.calls = []
    return post


@pytest.mark.parametrize(
    ("result", "kind"),
    [
        (HttpResult(200, b'{"result":"success","msg":"","id":78539}', 0.01, {}), "sent"),
        (HttpResult(200, b"<html>captive portal</html>", 0.01, {}), "invalid"),
        (HttpResult(200, b'{"result":"error","msg":"x"}', 0.01, {}), "invalid"),
        (HttpResult(401, b'{"result":"error","code":"USER_DEACTIVATED","msg":"Account is deactivated"}', 0.01, {}), "unauthorized"),
        (HttpResult(400, b'{"result":"error","code":"BAD_REQUEST","msg":"Message must not be empty"}', 0.01, {}), "rejected"),
        (HttpResult(502, b"bad gateway", 0.01, {}), "server-error"),
        (HttpFault("timeout", "no complete answer within 2 s"), "timeout"),
        (HttpFault("refused", "connection refused"), "unreachable"),
        (HttpFault("oversized", "too big"), "invalid"),
    ],
)
def test_interpret(result, kind):
    out = zulip.send_message("https://zulip.example.org", CREDS, "s", "t", "c", 2.0, post=fake(result))
    assert out.kind == kind
    method, url, kwargs = fake.calls[0]
    assert method == "POST" and url == "https://zulip.example.org/api/v1/messages"
    assert kwargs["deadline_s"] == 2.0 and kwargs["max_bytes"] == zulip.MAX_RESPONSE_BYTES


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        (b'{"result":"error","code":"RATE_LIMIT_HIT","retry-after":28.706807374954224}', {}, 28.706807374954224),
        (b'{"result":"error","code":"RATE_LIMIT_HIT"}', {"retry-after": "12"}, 12.0),
        (b'{"result":"error","code":"RATE_LIMIT_HIT","retry-after":"NaN"}', {"retry-after": "soon"}, 60.0),
        (b"not json", {}, 60.0),
    ],
)
def test_retry_after_parsing(body, headers, expected):
    out = zulip.interpret(HttpResult(429, body, 0.01, headers))
    assert out.kind == "rate-limited" and out.retry_after_s == pytest.approx(expected)


# --------------------------------------------------------------------------- credentials


class _Cfg:
    def __init__(self, path=None, **zulip_cfg):
        self.path = path
        self.zulip = SimpleNamespace(**{"email_env": "ZULIP_EMAIL", "api_key_env": "ZULIP_API_KEY", **zulip_cfg})

        class L:
            api_key = "not-needed"

        self.litellm = L()


def test_credentials_from_named_environment_variables(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    cfg = _Cfg(email_env="BOT_MAIL", api_key_env="BOT_KEY")
    creds = zulip.load_credentials(cfg, environ={"BOT_MAIL": "bot@x.org", "BOT_KEY": "k" * 20})
    assert creds.email == "bot@x.org" and creds.api_key == "k" * 20 and creds.source == "environment"
    assert "k" * 20 not in repr(creds)


def test_missing_key_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(zulip.CredentialsError, match=r"^BOT_KEY is not set \(zulip.api_key_env\)"):
        zulip.load_credentials(_Cfg(api_key_env="BOT_KEY"), environ={"ZULIP_EMAIL": "bot@x.org"})
    with pytest.raises(zulip.CredentialsError, match="ZULIP_EMAIL is not set"):
        zulip.load_credentials(_Cfg(), environ={})


def test_dotenv_fallback_in_working_directory_then_beside_config(monkeypatch, tmp_path):
    work, etc = tmp_path / "work", tmp_path / "etc"
    work.mkdir()
    etc.mkdir()
    monkeypatch.chdir(work)
    (etc / "gpuheal.yaml").write_text("gpus: []\n")
    (etc / ".env").write_text('# bot\nexport ZULIP_EMAIL="bot@etc.org"\nZULIP_API_KEY=\'etc-key-123456\'  \n')
    os.chmod(etc / ".env", 0o600)
    cfg = _Cfg(path=str(etc / "gpuheal.yaml"))
    creds = zulip.load_credentials(cfg, environ={})
    assert (creds.email, creds.api_key) == ("bot@etc.org", "etc-key-123456")
    assert creds.source == str(etc / ".env")
    (work / ".env").write_text("ZULIP_API_KEY=work-key-123456 # comment\n")
    creds = zulip.load_credentials(cfg, environ={})
    assert creds.api_key == "work-key-123456"  # ./.env first
    creds = zulip.load_credentials(cfg, environ={"ZULIP_API_KEY": "env-key-123456", "ZULIP_EMAIL": "e@x"})
    assert creds.api_key == "env-key-123456"  # the environment wins


def test_world_readable_dotenv_warns(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(logging.getLogger("gpuheal"), "propagate", True)  # in case a CLI test ran setup_logging
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("ZULIP_EMAIL=a@b\nZULIP_API_KEY=key-123456789\n")
    os.chmod(tmp_path / ".env", 0o644)
    zulip.load_credentials(_Cfg(), environ={})
    assert "chmod 600" in caplog.text
    assert "key-123456789" not in caplog.text


def test_secrets_for_collects_every_known_secret(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    from gpuheal.config import load_config_dict
    from gpuheal.credentials import secrets_for

    cfg = load_config_dict(config_dict("http://127.0.0.1:1", litellm={"api_key": "sk-litellm-abcdef"}))
    env = {"ZULIP_API_KEY": "zk-123456789", "OTHER_TOKEN": "tok-abcdefgh", "SHORT_TOKEN": "abc", "HOME": "/root"}
    found = secrets_for(cfg, environ=env)
    assert {"zk-123456789", "sk-litellm-abcdef", "tok-abcdefgh"} <= set(found)
    assert "abc" not in found and "/root" not in found

