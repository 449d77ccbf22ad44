"""Knowledge-graph records: every audit record as a ``[GPU-SELF-HEAL] <run_id>`` node, written
incrementally from the audit trail (stored offset), optionally POSTed to an endpoint with a
deadline and kept for the next run when that fails."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuheal import kg
from gpuheal.state import files
from gpuheal.state.store import StateDir

try:
    from tests.zulip_server import config_dict, runtime
except ImportError:
    from zulip_server import config_dict, runtime

NOW = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)


def record(n: int, **extra):
    r = {
        "run_id": f"gpu-self-heal-20260718-{n:03d}",
        "timestamp": f"2026-07-18T07:{n:02d}:00Z",
        "gpu": "gpu-dense",
        "issue": "model-stuck",
        "detected": {"failures_60s": 12},
        "action": "restart-llama-server",
        "result": "pending",
        "verification": None,
        "escalated": False,
        "phase": "intent",
    }
    r.update(extra)
    return r


def append(state, *lines):
    state.mkdir(exist_ok=True)
    with open(state / files.AUDIT_LOG, "a") as fh:
        for line in lines:
            fh.write((json.dumps(line) if isinstance(line, dict) else line) + "\n")


def sync(state, **kg_cfg):
    rt = runtime(config_dict(None, **({"knowledge_graph": kg_cfg} if kg_cfg else {})), state, NOW)
    with StateDir(state) as store:
        return kg.sync(rt.cfg, store, NOW, secrets=("sk-secret-abcdef",))


def nodes(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_audit_record_becomes_a_node_once(tmp_path):
    state = tmp_path / "state"
    append(state, record(1), record(1, phase="outcome", result="resolved"))
    out = sync(state)
    assert out["written"] == 2 and out["warnings"] == []
    got = nodes(state / files.KG_LOG)
    assert [n["name"] for n in got] == ["[GPU-SELF-HEAL] gpu-self-heal-20260718-001"] * 2
    assert got[0]["type"] == "entity" and got[0]["entityType"] == "gpu-self-heal"
    assert got[0]["record"] == record(1)  # the full audit record
    assert got[1]["observations"] == ["2026-07-18T07:01:00Z gpu-dense model-stuck: restart-llama-server → resolved (outcome)"]

    assert sync(state)["written"] == 0  # nothing new
    append(state, record(2))
    assert sync(state)["written"] == 1
    assert [n["record"]["run_id"] for n in nodes(state / files.KG_LOG)][-1] == "gpu-self-heal-20260718-002"


def test_a_half_written_line_waits_until_complete(tmp_path):
    state = tmp_path / "state"
    append(state, record(1))
    with open(state / files.AUDIT_LOG, "a") as fh:
        fh.write(json.dumps(record(2))[:30])
    assert sync(state)["written"] == 1
    with open(state / files.AUDIT_LOG, "a") as fh:
        fh.write(json.dumps(record(2))[30:] + "\n")
    assert sync(state)["written"] == 1
    assert len(nodes(state / files.KG_LOG)) == 2


def test_junk_lines_are_skipped_with_a_warning(tmp_path):
    state = tmp_path / "state"
    append(state, "not json", record(1), "[1,2]", "")
    out = sync(state)
    assert out["written"] == 1 and "skipped 2 unreadable line(s)" in out["warnings"][0]


def test_a_replaced_or_truncated_trail_is_read_from_the_start(tmp_path):
    state = tmp_path / "state"
    append(state, record(1), record(2), record(3))
    sync(state)
    (state / files.AUDIT_LOG).unlink()
    append(state, record(4))
    assert sync(state)["written"] == 1
    assert nodes(state / files.KG_LOG)[-1]["record"]["run_id"].endswith("-004")


def test_missing_audit_trail_is_nothing_to_do(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    assert sync(state) == {"written": 0, "posted": 0, "pending": 0, "warnings": []}


def test_corrupt_offset_file_is_set_aside(tmp_path):
    state = tmp_path / "state"
    append(state, record(1))
    (state / kg.STATE_FILE).write_text("garbage")
    rt = runtime(config_dict(None), state, NOW)
    with StateDir(state) as store:
        out = kg.sync(rt.cfg, store, NOW, secrets=())
        assert any("kg-state.json" in w for w in store.warnings)
    assert out["written"] == 1


@pytest.mark.parametrize(("data", "want"), [
    (None, (0, None, ())), ([1], (0, None, ())), ("x", (0, None, ())),
    ({"offset": -5, "ino": "7", "pending": "x"}, (0, None, ())),
    ({"offset": 3.5, "ino": 7, "pending": [{"id": 1}, 2, None, {"id": 3}]}, (0, 7, ({"id": 1}, {"id": 3}))),
    ({"offset": 40, "ino": None, "pending": []}, (40, None, ())),
])
def test_a_damaged_offset_file_reads_as_its_defaults_field_by_field(data, want):
    got = kg.KgState.from_json(data)
    assert (got.offset, got.ino, got.pending) == want
    assert kg.KgState.from_json(got.to_json()) == got


def test_an_unchanged_offset_file_is_not_rewritten(tmp_path):
    state = tmp_path / "state"
    append(state, record(1))
    rt = runtime(config_dict(None), state, NOW)
    with StateDir(state) as store:
        kg.sync(rt.cfg, store, NOW, secrets=())
    stamp = (state / kg.STATE_FILE).stat().st_mtime_ns
    time.sleep(0.01)
    with StateDir(state) as store:
        assert kg.sync(rt.cfg, store, NOW, secrets=())["written"] == 0
    assert (state / kg.STATE_FILE).stat().st_mtime_ns == stamp


def test_configured_file_relative_to_the_state_dir_or_absolute(tmp_path):
    state = tmp_path / "state"
    append(state, record(1))
    sync(state, file="kg/nodes.jsonl")
    assert len(nodes(state / "kg" / "nodes.jsonl")) == 1
    target = tmp_path / "elsewhere.jsonl"
    (state / kg.STATE_FILE).unlink()
    sync(state, file=str(target))
    assert len(nodes(target)) == 1


def test_secrets_are_redacted_in_nodes(tmp_path):
    state = tmp_path / "state"
    append(state, record(1, detected={"cmdline": "llama-server --api-key sk-secret-abcdef -c 131072"}))
    sync(state)
    text = (state / files.KG_LOG).read_text()
    assert "sk-secret-abcdef" not in text and "<redacted>" in text


# --------------------------------------------------------------------------- the optional endpoint


class Endpoint:
    def __init__(self):
        self.mode = "ok"
        self.bodies: list[dict] = []
        self.stop_event = threading.Event()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if outer.mode == "hang":
                    outer.stop_event.wait(30)
                    return
                status = 500 if outer.mode == "500" else 201
                if status == 201:
                    outer.bodies.append(json.loads(body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/nodes"

    def close(self):
        self.stop_event.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    ep = Endpoint()
    yield ep
    ep.close()


def test_nodes_are_posted_and_kept_when_the_endpoint_fails(tmp_path, endpoint):
    state = tmp_path / "state"
    append(state, record(1), record(2))
    endpoint.mode = "500"
    out = sync(state, url=endpoint.url)
    assert out["posted"] == 0 and out["pending"] == 2 and "HTTP 500" in out["warnings"][0]
    assert len(nodes(state / files.KG_LOG)) == 2  # the file does not wait for the endpoint

    endpoint.mode = "ok"
    append(state, record(3))
    out = sync(state, url=endpoint.url)
    assert out == {"written": 1, "posted": 3, "pending": 0, "warnings": []}
    assert [b["record"]["run_id"][-3:] for b in endpoint.bodies] == ["001", "002", "003"]
    assert endpoint.bodies[0]["name"] == "[GPU-SELF-HEAL] gpu-self-heal-20260718-001"


def test_a_hanging_endpoint_costs_one_deadline(tmp_path, endpoint):
    state = tmp_path / "state"
    append(state, *[record(i) for i in range(1, 6)])
    endpoint.mode = "hang"
    started = time.monotonic()
    out = sync(state, url=endpoint.url, timeout_s=0.5)
    assert time.monotonic() - started < 3
    assert out["pending"] == 5 and "timeout" in out["warnings"][0]


def test_escalate_and_report_sync_the_graph(tmp_path, monkeypatch):
    from gpuheal.steps import escalate, report

    monkeypatch.chdir(tmp_path)
    state = tmp_path / "state"
    append(state, record(1))
    rt = runtime(config_dict(None), state, NOW)
    with StateDir(state) as store:
        escalate.command(rt, store)
    assert len(nodes(state / files.KG_LOG)) == 1
    append(state, record(2))
    with StateDir(state) as store:
        report.command(rt, store)
    assert len(nodes(state / files.KG_LOG)) == 2


def test_a_lone_surrogate_in_a_node_never_stops_the_append(tmp_path):
    # issue 9 point 5: a string from a source (a GPU name in an audit detail) is valid UTF-8 on disk
    path = tmp_path / files.KG_LOG
    kg.append_nodes(path, [{"detail": "RTX \ud800 3090"}])
    (line,) = path.read_bytes().splitlines()
    assert json.loads(line.decode("utf-8"))["detail"] == "RTX ? 3090"
