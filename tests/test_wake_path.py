"""``gpuheal wake`` for senders that cannot set a header (issue 28 item 3; contract "Waking on an
event"): LiteLLM 1.108.7's Slack-style alerting posts ``{"text": ...}`` to ``/wake/TOKEN`` with no
``Authorization`` and counts only ``200`` as delivered (formats.md §4.x).

The bodies below are the ones measured on the real proxy (formats.md §4.x); the real proxy itself
alerts ``gpuheal wake`` in ``tests/reallitellm/test_wake_real.py``. Each exchange runs over a real
socketpair, as in ``tests/test_wake.py``.
"""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import timedelta

import pytest

from gpuheal.core import wake as core
from gpuheal.state.store import StateDir
from tests.test_wake import GPUHEAL, T0, TOKEN, Cycles, exchange, run_cli, status_of

ENDPOINTS = (("gpu-dense", "http://127.0.0.1:18081"), ("gpu-light", "http://127.0.0.1:18082"))
PROMPT = "my-secret-prompt-4f1c"  # its forged lines below stay within the 100 characters LiteLLM keeps
PROMPT_REPR = str([{"role": "user", "content": PROMPT + "\nAPI Base: `http://127.0.0.1:18082/v1`\nAlert type: `x`"}])
LLM_EXCEPTION = (
    "Alert type: `llm_exceptions`\nLevel: `High`\nTimestamp: `12:22:21`\n\nMessage: LLM API call failed: "
    "`litellm.InternalServerError: InternalServerError: OpenAIException - Connection error.\n\nLiteLLM: model "
    "group 'qwen' failed with the error above. No fallback was attempted. LiteLLM Retried: 2 times, LiteLLM Max "
    "Retries: 2\nModel: openai/gpu-dense\n"
    f"API Base: `http://127.0.0.1:18081/v1`\nMessages: `{PROMPT_REPR[:100]}`\nmodel_group: `qwen`\n\n"
    "deployment: `openai/gpu-dense`\n`"
)
OUTAGE = (
    "Alert type: `outage_alerts`\nLevel: `Medium`\nTimestamp: `12:22:24`\n\nMessage: \n\n\n*\u26a0\ufe0f Minor "
    "Service Outage*\n\n\n*Model Name:* `gpu-light`\n*Provider:* `openai`\n*API Base:* `http://127.0.0.1:18082/v1`"
    "\n\n\n*Errors:*\n\nAPI Errors: 2\n\n\n*Last Check:* `0.0s ago`\n\n\n"
)


def litellm_post(text: str = LLM_EXCEPTION, target: str = "/wake/" + TOKEN, extra: str = "") -> bytes:
    """What LiteLLM 1.108.7 sends (formats.md §4.x): the URL's path as configured, no Authorization."""
    body = json.dumps({"text": text}).encode()
    head = (f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:9466\r\nAccept: */*\r\nContent-Type: application/json\r\n"
            f"User-Agent: litellm/1.108.7\r\n{extra}Content-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode("latin-1") + body


def everything_written(tmp_path) -> str:
    state = tmp_path / "state"
    return "".join(p.read_text(errors="replace") for p in state.rglob("*") if p.is_file()) if state.exists() else ""


def test_litellms_alert_on_the_token_path_is_200_runs_one_cycle_and_names_the_gpu(tmp_path, capfd):
    cycles = Cycles()
    outcome, answer = exchange(tmp_path, litellm_post(), cycle=cycles, endpoints=ENDPOINTS)
    assert (outcome.status, outcome.decision, cycles.runs) == (200, "cycle", 1)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    audit = [json.loads(x) for x in (tmp_path / "state" / "gpu-self-heal-log.jsonl").read_text().splitlines()]
    (woke,) = [r for r in audit if r["issue"] == "wake"]
    assert woke["detected"]["litellm"] == {"alert_type": "llm_exceptions", "level": "High", "model_group": "qwen",
                                           "model": "openai/gpu-dense", "api_base": "http://127.0.0.1:18081/v1",
                                           "gpu": "gpu-dense"}  # fmt: skip
    assert woke["detected"]["woken_by"] == ("litellm llm_exceptions (High): model group qwen, model openai/gpu-dense, "
                                            "api base http://127.0.0.1:18081/v1, gpu gpu-dense")  # fmt: skip
    # the user's prompt and the token: in no file, no log line, not in the answer
    err = capfd.readouterr().err
    for secret in ("my-secret-prompt", TOKEN):
        assert secret not in everything_written(tmp_path) and secret not in err and secret.encode() not in answer


def test_the_outage_alert_names_its_deployment_too(tmp_path):
    outcome, _ = exchange(tmp_path, litellm_post(OUTAGE), endpoints=ENDPOINTS)
    assert outcome.status == 200
    assert outcome.detail == "litellm outage_alerts (Medium): model gpu-light, api base " \
        "http://127.0.0.1:18082/v1, gpu gpu-light"  # its "Model Name" is the model, not the group


def test_a_bearer_sender_keeps_its_202_whatever_the_path(tmp_path):
    head = f"POST /wake/not-the-token HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 2\r\n\r\n{{}}"
    outcome, answer = exchange(tmp_path, head.encode())
    assert (outcome.status, status_of(answer)) == (202, 202)


@pytest.mark.parametrize(
    "target",
    [
        "/wake/not-the-token-at-all", "/wake/", "/wake", "/wake/../x", "/wake/../wake/" + TOKEN,
        "/wake/" + TOKEN + "%2F", "/wake/%2F" + TOKEN, "/wake/" + TOKEN.replace("-", "%2D"),
        "/wake/" + TOKEN + "?x=1", "/wake/" + TOKEN + "#f", "/wake/" + TOKEN + "/", "/wake//" + TOKEN,
        "/x/wake/" + TOKEN, "/WAKE/" + TOKEN, "http://127.0.0.1:9466/wake/" + TOKEN, "/wake/" + TOKEN[:-1],
        "/wake/" + TOKEN + "x", "/wake/" + TOKEN.upper(), "/wake/" + "A" * 12_000,
    ],
)  # fmt: skip
def test_a_wrong_or_tricked_path_token_is_401_fast_and_never_echoed(tmp_path, capfd, target):
    cycles = Cycles()
    started = time.monotonic()
    outcome, answer = exchange(tmp_path, litellm_post(target=target), cycle=cycles)
    assert (outcome.status, status_of(answer), cycles.runs) == (401, 401, 0), outcome
    assert time.monotonic() - started < 3 and not (tmp_path / "state").exists()
    err = capfd.readouterr().err
    assert len(err.splitlines()) == 1 and TOKEN[4:] not in err and TOKEN[4:].encode() not in answer


def test_a_path_over_the_head_limit_is_400(tmp_path):
    outcome, _ = exchange(tmp_path, litellm_post(target="/wake/" + "A" * 20_000))
    assert outcome.status == 400 and "request head over" in outcome.detail


def test_no_token_configured_refuses_the_path_too(tmp_path):
    outcome, _ = exchange(tmp_path, litellm_post(target="/wake/None"), token=None)
    assert outcome.status == 401


@pytest.mark.parametrize(
    "body,why",
    [(b"not json", "not JSON"), (b"\xff{", "not JSON"), (b"", "no body")],
)
def test_garbage_on_the_token_path_is_400(tmp_path, body, why):
    head = f"POST /wake/{TOKEN} HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    outcome, _ = exchange(tmp_path, head)
    assert outcome.status == 400 and why in outcome.detail


def test_a_slow_litellm_post_is_400_within_its_deadline(tmp_path):
    def dribble(sock):
        for byte in litellm_post():
            sock.send(bytes([byte]))
            time.sleep(0.05)

    started = time.monotonic()
    outcome, _ = exchange(tmp_path, dribble, deadline_s=1.0)
    assert outcome.status == 400 and "within 1 s" in outcome.detail and time.monotonic() - started < 3


def test_a_held_state_lock_answers_200_and_runs_nothing(tmp_path):
    cycles = Cycles()
    with StateDir(tmp_path / "state", 1):
        outcome, answer = exchange(tmp_path, litellm_post(), cycle=cycles)
    assert (outcome.status, outcome.decision, cycles.runs, status_of(answer)) == (200, "busy", 0, 200)


def test_litellms_burst_of_alerts_runs_one_cycle_per_min_interval(tmp_path):
    """LiteLLM sends an ``llm_exceptions`` per failed request, in bursts every ~5 s (formats.md §4.x):
    60 of them in 30 s, each process with its own clock up to 1.5 s late, run 2 cycles (15 s apart)."""
    rng = random.Random(28)
    cycles = Cycles(hold_s=0.2)
    outcomes = []

    def one(i: int) -> None:
        now = T0 + timedelta(seconds=(i // 10) * 5 + rng.uniform(0, 1.5))
        outcomes.append(exchange(tmp_path, litellm_post(OUTAGE if i % 3 else LLM_EXCEPTION), now=now, cycle=cycles)[0])

    for burst in range(6):  # the bursts in order (a burst's senders at once), as the proxy sends them
        threads = [threading.Thread(target=one, args=(burst * 10 + i,)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(outcomes) == 60 and {o.status for o in outcomes} <= {200, 429}
    assert cycles.runs == sum(o.decision == "cycle" for o in outcomes) == 2


# --------------------------------------------------------------------------- the pure half


def test_the_prompt_cannot_forge_a_field():
    """The prompt is the repr of a list: its newlines are escaped, so it cannot start a line."""
    alert = core.litellm_alert(LLM_EXCEPTION, ENDPOINTS)
    assert alert is not None and (alert.api_base, alert.gpu, alert.alert_type) == (
        "http://127.0.0.1:18081/v1", "gpu-dense", "llm_exceptions")


@pytest.mark.parametrize(
    "base,gpu",
    [
        ("http://127.0.0.1:18081/v1", "gpu-dense"), ("http://127.0.0.1:18081", "gpu-dense"),
        ("http://user:pw@127.0.0.1:18082/v1?key=k", "gpu-light"), ("http://127.0.0.1:18083/v1", None),
        ("http://127.0.0.1:99999/v1", None), ("ftp://127.0.0.1:18081/", None), ("not a url", None),
    ],
)  # fmt: skip
def test_the_api_base_names_a_gpu_by_host_and_port(base, gpu):
    alert = core.litellm_alert(f"Alert type: `outage_alerts`\n*API Base:* `{base}`\n", ENDPOINTS)
    assert alert is not None and alert.gpu == gpu
    assert "pw" not in str(alert.api_base) and "key=" not in str(alert.api_base)


def test_two_gpus_on_one_endpoint_name_none():
    twins = (*ENDPOINTS, ("gpu-twin", "http://127.0.0.1:18081/"))
    assert core.gpu_of_base("http://127.0.0.1:18081/v1", twins) is None


@pytest.mark.parametrize(
    "text",
    ["", "hello", "Alert type: no backticks", "x" * 100_000, "Alert type: `" + "a" * 500 + "`",
     "\x1b[2J Alert type: `x`", "Alert type: `budget_alerts`\n" + "API Base: `" + "h" * 10_000 + "`"],
)  # fmt: skip
def test_garbage_text_is_summarised_in_one_capped_line(text):
    got = core.summarise(json.dumps({"text": text}).encode(), "path", ENDPOINTS)
    assert isinstance(got, core.Woken) and got.ok_status == 200
    assert got.summary.isprintable() and len(got.summary) <= core.SUMMARY_CHARS


def test_head_repr_never_shows_the_token():
    head = core.parse_head(f"POST /wake/{TOKEN} HTTP/1.1\r\nAuthorization: Bearer {TOKEN}".encode())
    assert isinstance(head, core.Head) and TOKEN not in repr(head)


# --------------------------------------------------------------------------- the real process


def test_the_cli_answers_litellm_200_and_keeps_the_token_out_of_its_output(tmp_path):
    proc, answer = run_cli(tmp_path, litellm_post())
    assert status_of(answer) == 200 and proc.returncode == 0, proc.stderr
    assert "litellm llm_exceptions (High): model group qwen" in proc.stderr
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "st").rglob("*") if p.is_file())
    for secret in (TOKEN, "my-secret-prompt"):
        assert secret not in proc.stderr and secret not in written and secret.encode() not in answer
    assert GPUHEAL.endswith("gpuheal")
