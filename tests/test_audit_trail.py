"""The audit trail as a whole (contract "Audit trail", issue 27 item 2): every command that writes to it
— ``check``, ``heal --apply``, ``bench``, ``wake`` — and those that only read it (``escalate``,
``report``, ``report --send``, ``pause``) run as cron runs them, on the simulated fleet; then the whole trail is read.
Every line carries ``timestamp, gpu, issue, action, result, run_id`` in the contract's form, every
``escalated`` line matches a message queued for the humans, and the knowledge graph has no
``unknown-run`` node. The one place lines are appended refuses a line that is not in that form."""

from __future__ import annotations

import json
import re
import socket
from datetime import UTC, datetime

import pytest

from gpuheal.actions.record import old_run_counter
from gpuheal.state import files
from gpuheal.state.store import AuditLineError, StateDir, audit_problem
from tests.lab import GPUHEAL, Lab, scenario

RUN_ID = re.compile(r"gpu-self-heal-\d{8}-\d{3,}")
ISO_WITH_ZONE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")
TOKEN = "wake-token-0123456789abcdef"
NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)


def good(**over):
    return {"run_id": "gpu-self-heal-20260718-001", "timestamp": "2026-07-18T08:00:00Z", "gpu": "gpu-a",
            "issue": "model-stuck", "action": "restart-llama-server", "result": "pending", **over}  # fmt: skip


@pytest.mark.parametrize(
    ("over", "says"),
    [({"run_id": None}, "run_id"), ({"run_id": "run-7"}, "gpu-self-heal-YYYYMMDD-NNN"),
     ({"run_id": "gpu-self-heal-2026-07-18-001"}, "gpu-self-heal"), ({"run_id": 7}, "run_id"),
     ({"timestamp": "2026-07-18 08:00:00"}, "zone"), ({"timestamp": 1.5e9}, "timestamp"),
     ({"gpu": ""}, "gpu"), ({"issue": None}, "issue"), ({"action": ["x"]}, "action"),
     ({"result": "done"}, "result"), ({"result": "x" * 10_000}, "result")],
)  # fmt: skip
def test_the_append_path_refuses_a_line_out_of_the_contract_form_and_writes_nothing(tmp_path, over, says):
    with StateDir(tmp_path) as store:
        store.append_lines(files.AUDIT_LOG, [good()])
        with pytest.raises(AuditLineError, match=says):
            store.append_lines(files.AUDIT_LOG, [good(), good(**over)])
        assert len(store.read_lines(files.AUDIT_LOG)) == 1  # the good line of the refused batch is not written
    assert audit_problem(good()) is None and audit_problem(["a list"]) is not None


def test_run_ids_are_numbered_per_utc_day_across_commands_and_carry_on_from_the_old_counter(tmp_path):
    with StateDir(tmp_path) as store:  # a state directory of the release before: the counter in heal-state.json
        store.write(files.HEAL, {"run_seq": {"day": "20260718", "n": 41}})
        once = store.run_id(NOW, old_run_counter)
        assert once == store.run_id(NOW, old_run_counter) == "gpu-self-heal-20260718-042"  # one per run ...
        assert store.next_run_id(NOW, old_run_counter) == "gpu-self-heal-20260718-043"  # ... and a fresh one per attempt
    with StateDir(tmp_path) as store:  # the next command carries on
        assert store.run_id(NOW, old_run_counter) == "gpu-self-heal-20260718-044"
        next_day = datetime(2026, 7, 19, 0, 0, 1, tzinfo=UTC)
        assert store.next_run_id(next_day, old_run_counter) == "gpu-self-heal-20260719-001"


@pytest.mark.parametrize("damaged", [{"day": "20260718", "n": -4}, {"day": 20260718, "n": 3}, {"day": "x", "n": 3},
                                     {"day": "20260718", "n": 10**400}, {"day": "20260718", "n": True}, [1], "x"])
def test_a_damaged_counter_starts_the_day_over_and_never_crashes(tmp_path, damaged):
    with StateDir(tmp_path) as store:
        store.write(files.RUN_IDS, damaged)
        assert store.next_run_id(NOW, old_run_counter) == "gpu-self-heal-20260718-001"
    (tmp_path / files.RUN_IDS).write_bytes(b"\x00garbage{")
    with StateDir(tmp_path) as store:
        assert store.next_run_id(NOW, old_run_counter) == "gpu-self-heal-20260718-001"
        assert any("set aside" in w for w in store.warnings)


def wake(lab: Lab) -> bytes:
    """``gpuheal wake`` as socket activation runs it: one connection on stdin/stdout."""
    import os
    import subprocess

    body = b'{"status": "firing", "alerts": [{"labels": {"alertname": "GpuHot"}}]}'
    request = (f"POST /wake HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip
    client, server = socket.socketpair()
    client.sendall(request)
    client.shutdown(socket.SHUT_WR)
    env = {**os.environ, "GPUHEAL_NOW": lab.fleet.now().strftime("%Y-%m-%dT%H:%M:%SZ"), "NO_COLOR": "1",
           "GPUHEAL_WAKE_TOKEN": TOKEN}  # fmt: skip
    proc = subprocess.run([GPUHEAL, "--config", str(lab.config_path), "--state-dir", str(lab.state_dir), "wake"],
                          stdin=server, stdout=server, stderr=subprocess.PIPE, env=env, timeout=120, cwd=lab.tmp)  # fmt: skip
    server.close()
    client.settimeout(10)
    answer = b""
    while chunk := client.recv(65536):
        answer += chunk
    assert proc.returncode == 0, proc.stderr
    return answer


def test_every_command_that_writes_the_trail_writes_run_ids_and_the_kg_has_no_unknown_run(tmp_path):
    gpus = [{"alias": "gpu-a", "host": "ct1"}, {"alias": "gpu-b", "host": "ct2"},
            {"alias": "gpu-c", "host": "ct3", "n_ctx": 131072}, {"alias": "gpu-d", "host": "ct4"}]
    events = [{"at": 30, "gpu": "gpu-a", "fault": "stuck", "heals_on_restart": True},  # restarted, resolved
              {"at": 30, "gpu": "gpu-b", "fault": "wrong-key", "api_key": "sk-other-5678"},  # escalated at once
              {"at": 200, "gpu": "gpu-c", "set": {"n_ctx": 65536}}]  # Rule 9: a context change, re-benchmarked
    lab = Lab(tmp_path, scenario(gpus, events))
    queued: list[dict] = []  # every message queued for the humans, as each command left the queue

    def note_queue() -> None:
        queued.extend(lab.read(files.ALERTS).get("queue") or [])

    def run(*args: str, ok: tuple[int, ...] = (0, 1, 2)) -> None:
        proc = lab.cli(*args)
        assert proc.returncode in ok and "Traceback" not in proc.stderr, (args, proc.stderr)
        note_queue()

    try:
        run("bench")  # the results before the change
        lab.fleet.advance(60)
        run("bench", "--gpu", "gpu-b")  # 401: llama-server rejects the key (Rule 3's auth failure)
        for minute in range(8):
            lab.fleet.advance(60)
            run("heal", "--apply") if minute % 2 == 0 else run("check")
        with StateDir(lab.state_dir) as store:  # a re-benchmark mark of an older release: no run id of its own
            store.write(files.REBENCH, {"due": {"gpu-d": {  # the shape an older release wrote
                "issue": "benchmark-regression", "reason": "power limit restored",
                "requested_at": lab.fleet.now().timestamp(), "attempt": "", "action": "restore-power-limit"}}})
        lab.fleet.advance(60)
        run("bench")  # the context change's verdict, and the re-benchmark's proof
        lab.fleet.advance(60)
        wake(lab)  # a woken cycle: its heal-cycle line, then heal --apply and escalate
        note_queue()
        run("pause", "--gpu", "gpu-d", "--reason", "maintenance")
        run("escalate")
        run("report")
        run("report", "--weekly", "--send", ok=(0, 1, 3))  # no Zulip configured: one line, nothing written
        run("pause", "--gpu", "gpu-d", "--resume")
        lab.fleet.advance(60)
        run("heal", "--apply")
        run("escalate")  # the knowledge graph catches up with the whole trail
        trail = lab.audit()
        kg = [json.loads(line) for line in (lab.state_dir / files.KG_LOG).read_text().splitlines()]
    finally:
        lab.close()

    writers = {(r["action"], r.get("phase")) for r in trail}
    assert {("heal-cycle", None), ("context-change", None), ("re-benchmark", None),
            ("restore-power-limit", "rebench"), ("restart-llama-server", "intent"),
            ("restart-llama-server", "verification"), ("alert", "outcome")} <= writers, writers
    for line in trail:
        for key in ("timestamp", "gpu", "issue", "action", "result", "run_id"):
            assert isinstance(line.get(key), str) and line[key], (key, line)
        assert RUN_ID.fullmatch(line["run_id"]) and ISO_WITH_ZONE.fullmatch(line["timestamp"]), line
    per_attempt: dict[tuple, list[str]] = {}  # issue 27 item 13: an intent, then one line for its outcome
    for line in (r for r in trail if "attempt" in r and r["action"] != "alert"):
        per_attempt.setdefault((line["run_id"], line["gpu"], line["issue"], line["attempt"]), []).append(line["phase"])
    assert per_attempt and all(p in (["intent"], ["intent", "outcome"], ["intent", "verification"])
                               for p in per_attempt.values()), per_attempt
    told = {(a["gpu"], a["issue"]) for a in queued if a.get("kind") == "escalated"}
    for line in (r for r in trail if r["result"] == "escalated"):
        assert (line["gpu"], line["issue"]) in told, line  # the humans were told: a message was queued
    assert len(kg) == len(trail) and not [n for n in kg if "unknown-run" in n["name"]]


@pytest.mark.parametrize("mark", [{"issue": "", "attempt": 7, "action": ["x"]},
                                  {"issue": "benchmark-regression", "attempt": "gpu-self-heal-1-1", "action": ""},
                                  {"issue": "no-such-rule\u202e", "attempt": None, "action": None, "reason": 5}])
def test_a_damaged_re_benchmark_mark_still_gets_a_line_in_the_contract_form(tmp_path, mark):
    lab = Lab(tmp_path, scenario([{"alias": "gpu-a", "host": "ct1"}]))
    try:
        with StateDir(lab.state_dir) as store:
            store.write(files.REBENCH, {"due": {"gpu-a": mark}})
        proc = lab.cli("bench")
        assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
        [line] = lab.audit()
    finally:
        lab.close()
    assert audit_problem(line) is None and line["phase"] == "rebench" and line["run_id"].endswith("-001")


@pytest.mark.parametrize("kept", [7, "x", None, {"detected": "x", "steps": 5, "evidence": [1]}, {"junk": {"a": 1}},
                                  {"detected": {"n": 10**400}}, {"steps": [{"output": "\udcff"}]}])
def test_an_attempt_kept_damaged_in_the_heal_state_still_gets_its_one_outcome_line(tmp_path, kept):
    """An attempt awaiting its verdict whose kept record (``outcome``) is damaged: the verdict's line is
    still written in the contract's form, with what could be read (issue 27 item 13)."""
    lab = Lab(tmp_path, scenario([{"alias": "gpu-a", "host": "ct1"}, {"alias": "gpu-b", "host": "ct2"},
                                  {"alias": "gpu-c", "host": "ct3"}],
                                 [{"at": 30, "gpu": "gpu-a", "fault": "stuck", "heals_on_restart": True}]))  # fmt: skip
    try:
        lab.heal()
        lab.heal()  # restarted: the attempt awaits its verdict
        with StateDir(lab.state_dir) as store:
            doc = store.read(files.HEAL)
            [key] = doc["attempts"]
            doc["attempts"][key]["outcome"] = kept
            (lab.state_dir / files.HEAL).write_text(json.dumps({"schema_version": 1, "data": doc}, default=str))
        for _ in range(4):
            lab.heal()
        lines = [r for r in lab.audit() if r["issue"] == "model-stuck"]
    finally:
        lab.close()
    assert [(r["phase"], r["result"]) for r in lines] == [("intent", "pending"), ("verification", "resolved")]
    assert all(audit_problem(r) is None for r in lines) and isinstance(lines[-1]["detected"], dict)
