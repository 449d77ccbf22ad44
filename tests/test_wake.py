"""``gpuheal wake`` (issue 22 item 7; contract "Waking on an event"): bad input is normal input.

Each exchange runs over a real socketpair, the server end given to :func:`serve` as its fds 0 and
1, as systemd's ``Accept=yes`` does. The heal cycle is a counter here (the real one runs in
tests/realalertmanager); the CLI tests at the end run the real ``gpuheal wake`` process.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuheal.core import wake as core
from gpuheal.state.store import StateDir
from gpuheal.steps.wake import Settings, serve

TOKEN = "wake-token-0123456789"
T0 = datetime(2026, 7, 18, 8, 0, 0, 412000, tzinfo=UTC)
GPUHEAL = str(Path(sys.executable).with_name("gpuheal"))


def post(body: bytes = b'{"status": "firing"}', token: str = TOKEN, extra: str = "") -> bytes:
    head = f"POST /wake HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n{extra}"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body


class Cycles:
    def __init__(self, hold_s: float = 0.0) -> None:
        self.runs, self.hold_s, self.lock = 0, hold_s, threading.Lock()

    def __call__(self, store) -> str:
        with self.lock:
            self.runs += 1
        time.sleep(self.hold_s)
        return "fleet healthy"


def exchange(tmp_path, send, now=T0, cycle=None, **over):
    """(outcome, the raw answer the client read). ``send``: bytes, or a function given the socket."""
    settings = Settings(**{"token": TOKEN, "min_interval_s": 15.0, "state_dir": tmp_path / "state", **over})
    client, server = socket.socketpair()

    def sender() -> None:
        try:
            if callable(send):
                send(client)
            else:
                client.sendall(send)
                client.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    threading.Thread(target=sender, daemon=True).start()
    try:
        outcome = serve(server.fileno(), server.fileno(), settings, now, cycle or Cycles())
    finally:
        server.close()
    client.settimeout(10)
    answer = b""
    try:
        while chunk := client.recv(65536):
            answer += chunk
    except OSError:
        pass
    client.close()
    return outcome, answer


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_a_good_request_is_202_and_runs_one_cycle_with_its_cause_audited(tmp_path):
    cycles = Cycles()
    body = json.dumps({"status": "firing", "alerts": [{"labels": {"alertname": "GpuHot"}}] * 3}).encode()
    outcome, answer = exchange(tmp_path, post(body), cycle=cycles)
    assert (outcome.status, outcome.decision, cycles.runs) == (202, "cycle", 1)
    assert status_of(answer) == 202 and b"Connection: close" in answer
    audit = [json.loads(x) for x in (tmp_path / "state" / "gpu-self-heal-log.jsonl").read_text().splitlines()]
    assert audit[-1]["issue"] == "wake" and audit[-1]["detected"]["woken_by"] == "alertmanager firing: 3 alert(s) GpuHot"


@pytest.mark.parametrize(
    "request_bytes",
    [post(token="wrong-token-0123456789"), post(token=""), post(token=TOKEN + "x"),
     post().replace(b"Bearer", b"Basic"), post().replace(b"Authorization: Bearer " + TOKEN.encode() + b"\r\n", b"")],
    ids=["wrong", "empty", "longer", "basic-scheme", "missing"],
)
def test_a_wrong_or_missing_token_is_401_and_nothing_runs(tmp_path, request_bytes):
    cycles = Cycles()
    outcome, answer = exchange(tmp_path, request_bytes, cycle=cycles)
    assert (outcome.status, status_of(answer), cycles.runs) == (401, 401, 0)
    assert not (tmp_path / "state").exists()  # not even the state directory was touched


def test_no_token_configured_refuses_everything(tmp_path):
    outcome, _ = exchange(tmp_path, post(token=""), token=None)
    assert outcome.status == 401


@pytest.mark.parametrize(
    "request_bytes,why",
    [
        (post(b""), "no body"),
        (b"POST /wake HTTP/1.1\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n", "no body"),
        (post(b"not json at all"), "not JSON"),
        (post(b"\xff\xfe{}"), "not JSON"),
        (post(b"[" * 100_000 + b"]" * 100_000), "not JSON"),  # RecursionError in json: still one line
        (b"\x00\x01\x02garbage without a newline" * 50, "connection closed"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.x request"),
        (b"GET / HTTP/1.1\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n", "is not POST"),
        (post(extra="Transfer-Encoding: chunked\r\n"), "Transfer-Encoding"),
        (post(extra="Content-Length: 5\r\n"), "bad Content-Length"),
        (post().replace(b"Content-Length: 20", b"Content-Length: -1"), "bad Content-Length"),
        (post().replace(b"Content-Length: 20", b"Content-Length: 1e3"), "bad Content-Length"),
        (post(extra="X-Evil: " + "A" * 20_000 + "\r\n"), "request head over"),
        (post(extra="no colon here\x1b[31m\r\n"), "malformed header line"),
    ],
)
def test_bad_requests_are_400_or_405_with_one_clear_line(tmp_path, request_bytes, why):
    cycles = Cycles()
    outcome, answer = exchange(tmp_path, request_bytes, cycle=cycles)
    assert outcome.status in (400, 405) and why in outcome.detail, outcome
    assert status_of(answer) == outcome.status and cycles.runs == 0
    detail = json.loads(answer.split(b"\r\n\r\n", 1)[1])["detail"]
    assert detail.isprintable() and len(detail) <= core.SUMMARY_CHARS


def test_a_10_mb_body_is_400_at_once_and_never_read(tmp_path):
    started = time.monotonic()
    outcome, answer = exchange(tmp_path, post(b"{" + b" " * (10 * 1024 * 1024) + b"}"))
    assert outcome.status == 400 and "over 1048576" in outcome.detail
    assert time.monotonic() - started < 3  # judged on Content-Length, before the body


def test_a_slowloris_gets_400_after_5_s(tmp_path):
    def dribble(sock):
        for byte in post():
            sock.send(bytes([byte]))
            time.sleep(0.25)

    started = time.monotonic()
    outcome, _ = exchange(tmp_path, dribble)
    took_s = time.monotonic() - started
    assert outcome.status == 400 and "within 5 s" in outcome.detail and 4.9 <= took_s < 7, (outcome, took_s)


def test_a_slow_body_after_a_good_head_is_400(tmp_path):
    def head_only(sock):
        sock.sendall(post(b'{"a": 1}')[:-3])
        time.sleep(8)

    outcome, _ = exchange(tmp_path, head_only, deadline_s=1.0)
    assert outcome.status == 400 and "not received within 1 s" in outcome.detail


def test_hostile_values_are_escaped_capped_and_the_token_never_recorded(tmp_path):
    name = "\x1b[2J\n" + TOKEN + " rm -rf / " + "x" * 500
    body = json.dumps({"status": "firing", "alerts": [{"labels": {"alertname": name}}]}).encode()
    outcome, _ = exchange(tmp_path, post(body))
    assert outcome.status == 202
    line = (tmp_path / "state" / "gpu-self-heal-log.jsonl").read_text()
    woken_by = json.loads(line)["detected"]["woken_by"]
    assert TOKEN not in line and woken_by.isprintable() and "\\x1b" in woken_by and len(woken_by) <= 200


def test_litellm_and_any_json_are_accepted(tmp_path):
    litellm = {"event": "budget_crossed", "event_message": "deployment down", "token": "hashed", "user_id": "u1"}
    outcome, _ = exchange(tmp_path, post(json.dumps(litellm).encode()))
    assert outcome.status == 202 and "litellm budget_crossed: deployment down" in outcome.detail
    assert "hashed" not in outcome.detail
    assert exchange(tmp_path, post(b"[1, 2]"), now=T0 + timedelta(seconds=60))[0].status == 202
    slack = exchange(tmp_path, post(b'{"text": "Deployment gpu-a down\\nmore"}'), now=T0 + timedelta(seconds=120))[0]
    # a Slack-style text that is not LiteLLM's alert: accepted, its words not kept (they may be anyone's)
    assert slack.status == 202 and "slack-style text (26 characters" in slack.detail and "gpu-a" not in slack.detail


def test_a_held_state_lock_answers_at_once_and_runs_nothing(tmp_path):
    cycles = Cycles()
    with StateDir(tmp_path / "state", 1):
        started = time.monotonic()
        outcome, answer = exchange(tmp_path, post(), cycle=cycles)
    assert (outcome.status, outcome.decision, cycles.runs) == (202, "busy", 0)
    assert time.monotonic() - started < 2


def test_a_run_confirming_between_its_probes_is_busy_and_a_dead_or_stale_mark_is_not(tmp_path):
    """A heal run that let the lock go only while it confirms a fault (issue 28) marks the lock file; a wake
    then starts no cycle, which would only make that run stand down (a burst of LiteLLM alerts: one cycle).
    The mark of a dead process, or one past its time, is no run."""
    from gpuheal.state.store import CONFIRMING, LOCK_FILE

    (tmp_path / "state").mkdir()
    lock = tmp_path / "state" / LOCK_FILE
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(f"{other.pid} abc {CONFIRMING} {time.time() + 30:.3f}\n")
        cycles = Cycles()
        outcome, _ = exchange(tmp_path, post(), cycle=cycles)
        assert (outcome.status, outcome.decision, cycles.runs) == (202, "busy", 0)
        assert "confirming" in outcome.detail
        lock.write_text(f"{other.pid} abc {CONFIRMING} {time.time() - 1:.3f}\n")  # past its time
        assert exchange(tmp_path, post(), cycle=cycles)[0].decision == "cycle"
    finally:
        other.kill()
        other.wait()
    lock.write_text(f"{other.pid} abc {CONFIRMING} {time.time() + 30:.3f}\n")  # its process is gone
    assert exchange(tmp_path, post(), cycle=Cycles(), now=T0 + timedelta(seconds=60))[0].decision == "cycle"


@pytest.mark.parametrize("text", ["", "garbage", "12 tok", "x tok confirming-until 9e99", "1 t confirming-until nan",
                                  "1 t confirming-until 1e400", "1 t other 9e99", "\x00" * 300])
def test_a_lock_file_that_is_not_a_live_mark_is_no_confirming_run(text):
    from gpuheal.state.store import confirming_mark

    assert confirming_mark(text, time.time(), own_pid=-1) is False


def test_release_with_a_mark_resumes_as_its_own(tmp_path):
    """The mark replaces the stamp, and resume still knows it for this run's (nobody held it meanwhile)."""
    store = StateDir(tmp_path / "state", 1)
    store.open()
    store.release(30)
    assert store.confirming(time.time()) is False  # its own mark: not another run
    assert StateDir(tmp_path / "state", 0).confirming(time.time()) is False  # the same process, still
    assert store.resume(1) is True
    store.close()


def test_the_interval_counts_from_the_cycles_end_too(tmp_path):
    """A burst of alerts that outlasts a long cycle (an in-run confirmation and a restart) starts no second
    cycle right after it: 15 s after the booked start but 13 s after the end is still within 15 s."""
    cycles = Cycles(hold_s=2.0)
    assert exchange(tmp_path, post(), cycle=cycles)[0].decision == "cycle"
    later = exchange(tmp_path, post(), cycle=cycles, now=T0 + timedelta(seconds=15.5))[0]
    assert (later.status, later.decision, cycles.runs) == (429, "rate-limited", 1)
    assert exchange(tmp_path, post(), cycle=cycles, now=T0 + timedelta(seconds=17.5))[0].decision == "cycle"


def test_a_flood_of_100_in_a_second_runs_one_cycle_per_min_interval(tmp_path):
    """Jittered clocks: each process reads its own time, up to 1.5 s late, not in order."""
    rng = random.Random(22)
    cycles = Cycles(hold_s=0.3)
    outcomes = []

    def one(i: int) -> None:
        now = T0 + timedelta(seconds=i / 100 + rng.uniform(0, 1.5))
        outcomes.append(exchange(tmp_path, post(), now=now, cycle=cycles)[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
        time.sleep(0.01)
    for t in threads:
        t.join(30)
    assert len(outcomes) == 100 and cycles.runs == 1
    assert {o.status for o in outcomes} <= {202, 429} and sum(o.decision == "cycle" for o in outcomes) == 1
    booked = json.loads((tmp_path / "state" / "wake.json").read_text())["data"]["last_cycle_s"]
    # within the interval (a jittered second late still counts from the booked time): refused
    later = datetime.fromtimestamp(booked, UTC) + timedelta(seconds=14.2 + rng.uniform(0, 0.7))
    assert exchange(tmp_path, post(), now=later, cycle=cycles)[0].status == 429
    past = datetime.fromtimestamp(booked, UTC) + timedelta(seconds=15 + rng.uniform(0, 1.5))
    assert exchange(tmp_path, post(), now=past, cycle=cycles)[0].decision == "cycle" and cycles.runs == 2


@pytest.mark.parametrize(
    "last_s,now_s,due",
    [(None, 100.0, True), (100.0, 114.9, False), (100.0, 115.0, True), (100.0, 99.2, False), (100.0, 80.0, True)],
)
def test_cycle_due_counts_from_the_booked_time(last_s, now_s, due):
    assert core.cycle_due(last_s, now_s, 15.0) is due


# --------------------------------------------------------------------------- the real process


def run_cli(tmp_path, request_bytes: bytes, env_token: str | None = TOKEN, config: str | None = None):
    cfg = tmp_path / "gpuheal.yaml"
    cfg.write_text(config or (
        "monitor: {url: 'http://127.0.0.1:9', timeout_s: 1}\nlitellm: {url: 'http://127.0.0.1:9'}\n"
        "gpus:\n  - {alias: a, host: 127.0.0.1, endpoint: 'http://127.0.0.1:9', vram_total_mb: 24576}\n"
    ))
    # the woken cycle's in-run confirmation of the refused server: its waits counted, not slept (steps/confirm)
    env = {"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "GPUHEAL_CONFIRM_WAIT": "simulated",
           **({"GPUHEAL_WAKE_TOKEN": env_token} if env_token else {}),
           **{k: v for k, v in os.environ.items() if k == "PYTHONPYCACHEPREFIX"}}  # the suite's bytecode (conftest)
    client, server = socket.socketpair()
    client.sendall(request_bytes)
    client.shutdown(socket.SHUT_WR)
    proc = subprocess.run([GPUHEAL, "-c", str(cfg), "--state-dir", str(tmp_path / "st"), "wake"], stdin=server,
                          stdout=server, stderr=subprocess.PIPE, text=True, env=env, timeout=60, cwd=tmp_path)  # fmt: skip
    server.close()
    client.settimeout(5)
    answer = b""
    while chunk := client.recv(65536):
        answer += chunk
    return proc, answer


@pytest.mark.parametrize("request_bytes,status", [(b"\x16\x03\x01\x02\x00garbage\r\n\r\n", 400),
                                                  (post(token="nope-nope-nope"), 401)])  # fmt: skip
def test_the_cli_answers_bad_input_with_one_line_and_exit_1(tmp_path, request_bytes, status):
    proc, answer = run_cli(tmp_path, request_bytes)
    assert status_of(answer) == status and proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_the_cli_answers_500_when_the_config_does_not_load(tmp_path):
    proc, answer = run_cli(tmp_path, post(), config="gpus: 7\n")
    assert status_of(answer) == 500 and proc.returncode == 3 and "Traceback" not in proc.stderr
    assert TOKEN not in proc.stderr and TOKEN.encode() not in answer


def test_the_cli_without_its_token_variable_says_so_and_refuses(tmp_path):
    proc, answer = run_cli(tmp_path, post(), env_token=None)
    assert status_of(answer) == 401 and "$GPUHEAL_WAKE_TOKEN is not set" in proc.stderr


# --------------------------------------------------------------------------- config and doctor

MINIMAL = {"monitor": {"url": "http://127.0.0.1:9"}, "litellm": {"url": "http://127.0.0.1:9"},
           "gpus": [{"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:9", "vram_total_mb": 24576}]}  # fmt: skip


def wake_rows(raw, environ):
    from gpuheal.config import load_config_dict
    from gpuheal.doctor import Context
    from gpuheal.doctor.checks import local_probes

    ctx = Context(load_config_dict(raw), "/nonexistent-state", environ)
    return [p.run() for p in local_probes(ctx) if p.check == "wake token"]


def test_wake_config_defaults_and_keys():
    from gpuheal.config import load_config_dict
    from gpuheal.errors import ConfigError

    cfg = load_config_dict(dict(MINIMAL))
    assert (cfg.wake.token_env, cfg.wake.min_interval_s, cfg.wake.configured) == ("GPUHEAL_WAKE_TOKEN", 15.0, False)
    cfg = load_config_dict({**MINIMAL, "wake": {"token_env": "AM_HOOK", "min_interval_s": 30}})
    assert (cfg.wake.token_env, cfg.wake.min_interval_s, cfg.wake.configured) == ("AM_HOOK", 30.0, True)
    for bad in ({"token_env": "not a name"}, {"min_interval_s": -1}, {"tokn_env": "X"}):
        with pytest.raises(ConfigError, match="wake"):
            load_config_dict({**MINIMAL, "wake": bad})


def test_doctor_checks_the_wake_token_only_when_wake_is_configured():
    assert wake_rows(dict(MINIMAL), {}) == [] or Path("/etc/systemd/system/gpuheal-wake.socket").exists()
    raw = {**MINIMAL, "wake": {"token_env": "AM_HOOK"}}
    (row,) = wake_rows(raw, {})
    assert row.status == "fail" and "$AM_HOOK is not set" in row.detail
    (row,) = wake_rows(raw, {"AM_HOOK": "secret-value-123"})
    assert row.status == "ok" and "secret-value-123" not in row.detail


def test_expect_100_continue_is_answered_before_the_body(tmp_path):
    """curl sends ``Expect: 100-continue`` for a body over 1 KiB and waits for the go-ahead."""
    body = json.dumps({"alerts": [{"labels": {"alertname": f"A{i}"}} for i in range(40)]}).encode()

    def polite(sock):
        whole = post(body, extra="Expect: 100-continue\r\n")
        sock.sendall(whole[: -len(body)])
        sock.settimeout(5)
        assert sock.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        sock.shutdown(socket.SHUT_WR)

    started = time.monotonic()
    outcome, answer = exchange(tmp_path, polite)
    assert outcome.decision == "cycle" and b"HTTP/1.1 202" in answer and time.monotonic() - started < 3


def test_an_unusable_state_directory_is_500_and_one_line(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    outcome, answer = exchange(tmp_path, post(), state_dir=tmp_path / "file" / "state")
    assert outcome.status == 500 and status_of(answer) == 500 and "cannot use state directory" in outcome.detail
