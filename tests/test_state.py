"""The state directory in a real temporary directory: atomic writes, a process killed mid-write,
corrupt files set aside, 0600/0700 modes, and two processes racing for the lock (contract:
"Writes are atomic; a run never leaves a half-written file; two runs never act at once; a corrupt
file is set aside with a warning, never a crash")."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import (
    Hang,
    LoopbackServer,
    closed_url,
    fleet_config,
    gpuheal_argv,
    run_gpuheal,
    write_config,
)

from gpuheal.errors import GpuhealError, StateLockedError
from gpuheal.state.history import METRICS, History
from gpuheal.state.store import LOCK_FILE, SCHEMA_VERSION, STREAM_LEVELS, StateDir, encoded_pieces

NOW = "2026-07-18T08:00:00Z"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def litter(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.endswith(".tmp"))


# --------------------------------------------------------------------------- JSON files


def test_write_then_read_round_trip_with_schema_version(tmp_path):
    with StateDir(tmp_path / "s") as store:
        store.write("a.json", {"x": [1, 2.5, None, "é"]})
        assert store.read("a.json") == {"x": [1, 2.5, None, "é"]}
        assert store.read("missing.json", {"d": 1}) == {"d": 1}
        assert store.warnings == []
    doc = json.loads((tmp_path / "s" / "a.json").read_text())
    assert doc == {"schema_version": SCHEMA_VERSION, "data": {"x": [1, 2.5, None, "é"]}}


def test_atomic_write_leaves_no_temp_files(tmp_path):
    with StateDir(tmp_path) as store:
        for i in range(50):
            store.write("a.json", {"i": i})
            store.write_raw("gpu-health.json", {"schema_version": 1, "status": "healthy", "i": i})
        assert store.read("a.json") == {"i": 49}
    assert litter(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE, "a.json", "gpu-health.json"]


def test_nan_is_refused_before_anything_is_written(tmp_path):
    with StateDir(tmp_path) as store:
        store.write("a.json", {"ok": 1})
        with pytest.raises(ValueError):
            store.write("a.json", {"bad": float("nan")})
        assert store.read("a.json") == {"ok": 1}
    assert litter(tmp_path) == []


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
def test_large_documents_round_trip_both_ways(tmp_path, stream):
    data = {"big": "x" * 3_000_000, "numbers": list(range(50_000)), "nested": {"a": [None, True, 1.5]}}
    with StateDir(tmp_path) as store:
        store.write("big.json", data, stream=stream)
        assert store.read("big.json") == data
    assert litter(tmp_path) == []


@pytest.mark.parametrize("stream", [False, True], ids=["one-shot", "streamed"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, stream):
    with StateDir(tmp_path) as store:
        store.write("a.json", {"ok": 1})
        with pytest.raises(ValueError):
            store.write("a.json", {"pad": "x" * 3_000_000, "bad": float("nan")}, stream=stream)
        assert store.read("a.json") == {"ok": 1}
    assert litter(tmp_path) == []


def test_modes_file_0600_and_directory_0700(tmp_path):
    target = tmp_path / "state"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    old_umask = os.umask(0)
    try:
        with StateDir(target) as store:
            store.write("a.json", {})
            store.write_raw("gpu-health.json", {"schema_version": 1})
            store.append_lines("log.jsonl", [{"a": 1}])
    finally:
        os.umask(old_umask)
    assert mode(target) == 0o700
    for name in ("a.json", "gpu-health.json", "log.jsonl", LOCK_FILE):
        assert mode(target / name) == 0o600, name


def test_nested_state_dir_is_created(tmp_path):
    with StateDir(tmp_path / "a" / "b" / "state") as store:
        store.write("x.json", 1)
    assert (tmp_path / "a" / "b" / "state" / "x.json").exists()


def test_unusable_state_dir_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(GpuhealError) as info:
        StateDir(blocker).open()
    assert "cannot use state directory" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"", b"\x00\xff\xfe", b"[1, 2]", b'{"data": 1}', b"null", b"[" * 100_000],
    ids=["broken", "empty", "binary", "list", "no-version", "null", "deep"],
)
def test_corrupt_file_is_set_aside_with_a_warning(tmp_path, content):
    (tmp_path / "a.json").write_bytes(content)
    with StateDir(tmp_path) as store:
        assert store.read("a.json", {"default": True}) == {"default": True}
        assert len(store.warnings) == 1
        assert "a.json" in store.warnings[0] and "set aside" in store.warnings[0]
        store.write("a.json", {"fresh": 1})
        assert store.read("a.json") == {"fresh": 1}
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("a.json.corrupt-")]
    assert len(aside) == 1
    assert aside[0].read_bytes() == content  # the evidence is kept, not deleted


@pytest.mark.parametrize("version", [0, 2, 99, "1", None])
def test_wrong_schema_version_is_set_aside(tmp_path, version):
    (tmp_path / "a.json").write_text(json.dumps({"schema_version": version, "data": {"x": 1}}))
    with StateDir(tmp_path) as store:
        assert store.read("a.json", "default") == "default"
        assert "schema_version" in store.warnings[0]
    assert not (tmp_path / "a.json").exists()


def test_read_raw_of_a_corrupt_public_file(tmp_path):
    (tmp_path / "gpu-health.json").write_text('{"status": ')
    (tmp_path / "b.json").write_text("[]")
    with StateDir(tmp_path) as store:
        assert store.read_raw("gpu-health.json") is None
        assert store.read_raw("b.json") is None
        assert store.read_raw("missing.json") is None
        assert len(store.warnings) == 2


def test_stale_temp_files_of_a_killed_run_are_removed_under_the_lock(tmp_path):
    (tmp_path / ".a.json.12345.tmp").write_text('{"half')
    with StateDir(tmp_path) as store:
        assert litter(tmp_path) == []
        assert store.read("a.json") is None


# --------------------------------------------------------------------------- killed mid-write

WRITER = textwrap.dedent(
    """
    import sys
    from gpuheal.state.store import StateDir
    store = StateDir(sys.argv[1])
    store.open()
    pad = "x" * int(sys.argv[2])
    i = 0
    while True:
        store.{call}
        i += 1
        if i == 20:
            print("running", flush=True)
    """
)


def run_and_kill(tmp_path: Path, call: str, pad: int, seconds: float = 0.4) -> None:
    code = WRITER.replace("{call}", call)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path), str(pad)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "running"
        time.sleep(seconds)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("pad", [10, 300_000], ids=["small", "300kB"])
def test_process_killed_in_a_tight_write_loop_leaves_a_readable_file(tmp_path, pad):
    run_and_kill(tmp_path, 'write("a.json", {"i": i, "pad": pad})', pad)
    with StateDir(tmp_path) as store:  # the kernel released the dead writer's lock
        data = store.read("a.json")
        assert store.warnings == []
        assert isinstance(data, dict) and data["i"] >= 19 and len(data["pad"]) == pad
    assert litter(tmp_path) == []


@pytest.mark.parametrize("pad", [100, 200_000], ids=["small", "200kB"])
def test_append_lines_killed_mid_write_loses_no_whole_record_and_heals(tmp_path, pad):
    """SIGKILL can tear a write between pages (Linux checks for a fatal signal there), so the
    file may end in a partial line for a moment. No whole record is lost, a torn tail is never
    read as a record, and the next append removes it: no lasting damage, no lasting warning."""
    run_and_kill(tmp_path, 'append_lines("log.jsonl", [{"i": i, "pad": pad}, {"i": i, "second": True}])', pad)
    raw = (tmp_path / "log.jsonl").read_bytes()
    lines = raw.split(b"\n")
    whole, tail = lines[:-1], lines[-1]  # tail is b"" unless the kill tore the last write
    assert len(whole) >= 40
    for line in whole:
        json.loads(line)  # every line before the tail is whole
    with StateDir(tmp_path) as store:
        records = store.read_lines("log.jsonl")
        assert len(records) == len(whole) + (1 if tail and tail.endswith(b"}") and _is_json(tail) else 0)
        store.warnings.clear()
        store.append_lines("log.jsonl", [{"after": "kill"}])
        assert store.read_lines("log.jsonl")[-1] == {"after": "kill"}
        assert all("skipped" not in w for w in store.warnings)
    healed = (tmp_path / "log.jsonl").read_bytes()
    assert healed.endswith(b"\n")
    for line in healed.splitlines():
        json.loads(line)


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def test_append_after_a_torn_last_line_removes_it(tmp_path):
    (tmp_path / "log.jsonl").write_bytes(b'{"a": 1}\n{"b": ')
    with StateDir(tmp_path) as store:
        assert store.read_lines("log.jsonl") == [{"a": 1}]  # the torn tail is never a record
        store.append_lines("log.jsonl", [{"c": 3}])
        assert store.read_lines("log.jsonl") == [{"a": 1}, {"c": 3}]
        assert any("removed a partial last line (6 bytes)" in w for w in store.warnings)
    assert (tmp_path / "log.jsonl").read_bytes() == b'{"a": 1}\n{"c":3}\n'


def test_append_after_a_whole_record_missing_its_newline_keeps_it(tmp_path):
    (tmp_path / "log.jsonl").write_bytes(b'{"a": 1}\n{"b": 2}')
    with StateDir(tmp_path) as store:
        store.append_lines("log.jsonl", [{"c": 3}])
        assert store.read_lines("log.jsonl") == [{"a": 1}, {"b": 2}, {"c": 3}]
        assert store.warnings == []


def test_append_to_a_file_that_is_one_torn_line(tmp_path):
    (tmp_path / "log.jsonl").write_bytes(b'{"half": "x' * 10_000)
    with StateDir(tmp_path) as store:
        store.append_lines("log.jsonl", [{"c": 3}])
        assert store.read_lines("log.jsonl") == [{"c": 3}]


def test_a_bad_record_appends_nothing(tmp_path):
    with StateDir(tmp_path) as store:
        store.append_lines("log.jsonl", [{"a": 1}])
        with pytest.raises(ValueError):
            store.append_lines("log.jsonl", [{"b": 2}, {"bad": float("nan")}])
        assert store.read_lines("log.jsonl") == [{"a": 1}]


def test_read_lines_skips_junk(tmp_path):
    (tmp_path / "log.jsonl").write_bytes(b'{"a": 1}\n\n[1]\nnot json\n\xff\xfe\n{"b": 2}\n')
    with StateDir(tmp_path) as store:
        assert store.read_lines("log.jsonl") == [{"a": 1}, {"b": 2}]
        assert store.read_lines("missing.jsonl") == []
        assert "skipped 3" in store.warnings[0]


# --------------------------------------------------------------------------- the lock


def hold_lock(path: Path) -> int:
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_lock_waits_then_gives_up_in_process(tmp_path):
    fd = hold_lock(tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(StateLockedError) as info:
            StateDir(tmp_path, lock_wait_s=0.3).open()
        took = time.monotonic() - started
    finally:
        os.close(fd)
    assert 0.3 <= took < 2.0
    assert "locked by another gpuheal run" in str(info.value)


def test_lock_is_released_on_exit_and_reusable(tmp_path):
    with StateDir(tmp_path, lock_wait_s=0):
        pass
    with StateDir(tmp_path, lock_wait_s=0) as store:
        store.write("a.json", 1)


def test_second_run_gets_the_lock_when_the_first_releases_in_time(tmp_path):
    fd = hold_lock(tmp_path)
    started = time.monotonic()

    def release_later():
        time.sleep(0.3)
        os.close(fd)

    import threading

    threading.Thread(target=release_later).start()
    with StateDir(tmp_path, lock_wait_s=5):
        took = time.monotonic() - started
    assert 0.25 <= took < 2


def test_a_released_lock_is_free_and_resume_says_whether_another_run_held_it(tmp_path):
    """Issue 28: the in-run confirmation waits without the lock. resume() is True only when nobody held it
    meanwhile (the lock file still bears this run's stamp); a real second process that took it -> False."""
    store = StateDir(tmp_path, lock_wait_s=0)
    store.open()
    try:
        store.release()
        assert store.resume(0) is True  # nobody came
        store.release()
        fd = hold_lock(tmp_path)  # a lock check without a stamp (the doctor's): it reads, writes nothing
        os.close(fd)
        assert store.resume(0) is True
        store.release()
        other = subprocess.run([sys.executable, "-c", "import sys; from gpuheal.state.store import StateDir\n"
                                "with StateDir(sys.argv[1], 0): pass", str(tmp_path)], capture_output=True, text=True,
                               timeout=60)
        assert other.returncode == 0, other.stderr  # the lock was free for a real second process
        assert store.resume(0) is False  # and this run learns it
        assert store.resume(0) is True  # already held: nothing to take back
    finally:
        store.close()


def test_resume_waits_for_a_held_lock_then_gives_up(tmp_path):
    store = StateDir(tmp_path, lock_wait_s=0)
    store.open()
    store.release()
    fd = hold_lock(tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(StateLockedError):
            store.resume(0.3)
        assert 0.3 <= time.monotonic() - started < 2.0
    finally:
        os.close(fd)
        store.close()


def write_dead_fleet_config(tmp_path: Path, monitor_url: str, lock_wait_s: float, timeout_s: float = 1.0) -> Path:
    cfg = fleet_config(monitor_url, [("g1", "h1", closed_url())], timeout_s=timeout_s, lock_wait_s=lock_wait_s)
    return write_config(tmp_path / "gpuheal.yaml", cfg)


def test_gpuheal_waits_for_a_held_lock_then_exits_3_with_one_line(tmp_path):
    state = tmp_path / "state"
    config = write_dead_fleet_config(tmp_path, closed_url() + "/gpu-data", lock_wait_s=0.5)
    fd = hold_lock(state)
    try:
        started = time.monotonic()
        proc = run_gpuheal("--config", str(config), "--state-dir", str(state), "check", env={"GPUHEAL_NOW": NOW})
        took = time.monotonic() - started
    finally:
        os.close(fd)
    assert proc.returncode == 3, proc.stderr
    assert took >= 0.5
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpuheal: state directory") and "locked" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not (state / "gpu-health.json").exists()  # it did not act


def test_two_gpuheal_processes_race_for_the_lock(tmp_path):
    """The first run holds the lock while its monitor poll hangs (1.5 s); the second waits its
    0.5 s, then exits 3 with one line and writes nothing. The first finishes normally."""
    state = tmp_path / "state"
    with LoopbackServer({"/gpu-data": Hang()}) as monitor:
        slow = write_dead_fleet_config(tmp_path, monitor.url + "/gpu-data", lock_wait_s=0.5, timeout_s=1.5)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")}
        env.update(GPUHEAL_NOW=NOW, TERM="dumb")
        first = subprocess.Popen(
            [*gpuheal_argv(), "--config", str(slow), "--state-dir", str(state), "check", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        deadline = time.monotonic() + 10
        while not (state / LOCK_FILE).exists() or not (state / LOCK_FILE).read_text().strip():
            assert time.monotonic() < deadline, "first run never took the lock"
            time.sleep(0.02)
        started = time.monotonic()
        second = run_gpuheal("--config", str(slow), "--state-dir", str(state), "check", "--json", env={"GPUHEAL_NOW": NOW})
        took = time.monotonic() - started
        out, err = first.communicate(timeout=30)
    assert second.returncode == 3, second.stderr
    assert second.stdout == ""
    assert len(second.stderr.splitlines()) == 1 and "locked" in second.stderr
    assert 0.5 <= took < 3.0  # the wait (0.5 s) plus a process start on a busy machine
    assert first.returncode == 2, err  # nothing answered: down
    assert json.loads(out)["status"] == "down"
    assert "Traceback" not in err + second.stderr


# ---------------------------------------------------------------- the streamed encoding (issue 29)

_KEYS = st.one_of(st.text(max_size=6), st.integers(-3, 3), st.booleans(), st.none(), st.floats(allow_nan=False))
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4)
    | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=25,
)


def _one_shot(value):
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return ValueError


def _pieces(value, depth):
    try:
        return "".join(encoded_pieces(value, depth))
    except ValueError:
        return ValueError


@settings(max_examples=600, deadline=None)
@given(_JSONISH, st.integers(0, 5))
def test_streamed_pieces_are_the_one_shot_text(value, depth):
    """Whatever the document and the depth streamed, the file's text is json.dumps's, byte for byte (NaN
    and infinities refused as there)."""
    assert _pieces(value, depth) == _one_shot(value)


def test_a_streamed_history_is_the_one_shot_text(tmp_path):
    columns = {"t": [1.0 * j for j in range(50)], "endpoint": ["ok"] * 50, **{c: [0.5] * 50 for c in METRICS}}
    history = History(raw={f"g{i}": dict(columns) for i in range(3)})
    doc = {"schema_version": 1, "data": history.to_dict()}
    with StateDir(tmp_path) as store:
        store.write("history.json", history.to_dict(), stream=True)
    assert (tmp_path / "history.json").read_text() == json.dumps(doc, separators=(",", ":")) + "\n"
    assert len(list(encoded_pieces(doc, STREAM_LEVELS))) > 10  # a GPU's block a piece, not one string
