"""The issue book on disk (issue 29): ``issues.json`` without its log, the log appended to ``issues-log.jsonl``
(:mod:`gpuheal.steps.book`) — the same transitions, bounded as before, and garbage in either file survived."""

from __future__ import annotations

import json

import pytest

from gpuheal.core import engine
from gpuheal.core.engine import Event, Transition, new_book
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import book as book_file


def transition(i: int) -> Transition:
    return Transition(f"2026-07-18T07:{i // 60 % 60:02d}:{i % 60:02d}Z", f"gpu-{i:04d}", "thermal-critical",
                      "critical", Event.FIRING, "2026-07-18T07:00:00Z", f"hot {i} \u00b0C", {"temp_c": 90 + i % 7})


def one_run(state, transitions) -> None:
    """A cron run: the book loaded, these transitions logged (as the engine appends them), the book saved."""
    with StateDir(state, 1.0) as store:
        book = book_file.load(store)
        for t in transitions:
            book.log.append(t)
        book_file.save(store, book)


def logged(state) -> list[dict]:
    with StateDir(state, 1.0) as store:
        return book_file.log_lines(store)


def test_the_log_is_appended_apart_and_issues_json_keeps_no_log(tmp_path):
    state = tmp_path / "s"
    one_run(state, [transition(0), transition(1)])
    one_run(state, [])
    one_run(state, [transition(2)])
    doc = json.loads((state / files.ISSUES).read_text())["data"]
    assert "log" not in doc and set(doc) == {"version", "issues", "memory"}
    assert logged(state) == [transition(i).to_json() for i in range(3)]
    lines = (state / files.ISSUES_LOG).read_bytes().splitlines()
    assert [json.loads(line) for line in lines] == [transition(i).to_json() for i in range(3)]


def test_a_book_saved_again_in_one_run_appends_only_what_it_logged_since(tmp_path):
    """``heal``'s in-run confirmation saves its book after each round of probes (steps/confirm.py)."""
    state = tmp_path / "s"
    with StateDir(state, 1.0) as store:
        book = book_file.load(store)
        book.log.append(transition(0))
        book_file.save(store, book)
        book_file.save(store, book)
        book.log.append(transition(1))
        book_file.save(store, book)
        assert book_file.log_lines(store) == [transition(0).to_json(), transition(1).to_json()]


def test_a_run_without_transitions_does_not_touch_the_log_file(tmp_path):
    state = tmp_path / "s"
    one_run(state, [])
    assert not (state / files.ISSUES_LOG).exists()
    one_run(state, [transition(0)])
    before = (state / files.ISSUES_LOG).stat()
    one_run(state, [])
    after = (state / files.ISSUES_LOG).stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def test_an_earlier_versions_log_in_issues_json_moves_to_the_log_file(tmp_path):
    state = tmp_path / "s"
    old = new_book()
    for i in range(4):
        old.log.append(transition(i))
    with StateDir(state, 1.0) as store:
        store.write(files.ISSUES, old.to_json())  # what main wrote: the log inside
        assert book_file.log_lines(store) == [transition(i).to_json() for i in range(4)]  # read there, too
    one_run(state, [transition(4)])
    assert "log" not in json.loads((state / files.ISSUES).read_text())["data"]
    assert logged(state) == [transition(i).to_json() for i in range(5)]


@pytest.mark.parametrize("keep", [1, 3, 10])
def test_the_log_file_is_bounded_and_keeps_at_least_the_last_log_max(tmp_path, monkeypatch, keep):
    monkeypatch.setattr(engine, "LOG_MAX", keep)
    state = tmp_path / "s"
    n = 0
    for run in range(25):
        batch = [transition(n + i) for i in range(run % 4)]
        n += len(batch)
        one_run(state, batch)
        lines = (state / files.ISSUES_LOG).read_bytes().count(b"\n") if n else 0
        assert min(n, keep) <= lines <= 2 * keep  # past 2 * keep after an append: trimmed to keep
        assert logged(state) == [transition(i).to_json() for i in range(max(0, n - keep), n)]


def test_garbage_in_the_log_file_is_skipped_and_a_torn_line_healed(tmp_path):
    state = tmp_path / "s"
    one_run(state, [transition(0)])
    with open(state / files.ISSUES_LOG, "ab") as fh:
        fh.write(b'[1, 2]\nnot json\n\xff\xfe\x00\n{"at": "torn')  # a list, junk, binary, a torn append
    one_run(state, [transition(1)])
    with StateDir(state, 1.0) as store:
        assert book_file.log_lines(store) == [transition(0).to_json(), transition(1).to_json()]
        assert any("unreadable line" in w for w in store.warnings)
    assert (state / files.ISSUES_LOG).read_bytes().endswith(b"\n")


@pytest.mark.parametrize("junk", [b"", b"\x00" * 5000, b"x" * 300_000, b"\n" * 5000, b"{}\n" * 4000])
def test_a_damaged_or_huge_log_file_never_stops_a_save(tmp_path, monkeypatch, junk):
    monkeypatch.setattr(engine, "LOG_MAX", 100)
    state = tmp_path / "s"
    state.mkdir(mode=0o700)
    (state / files.ISSUES_LOG).write_bytes(junk)
    one_run(state, [transition(7)])
    assert logged(state)[-1] == transition(7).to_json()
    assert (state / files.ISSUES_LOG).read_bytes().count(b"\n") <= 2 * 100


@pytest.mark.parametrize("junk", [b"", b"nope", b'{"schema_version": 1, "data": [1]}', b'{"schema_version": 1,'
                                  b' "data": {"log": "x", "issues": 3}}', b'{"schema_version": 1, "data": {"log": [1, {}]}}'])
def test_a_damaged_issues_json_gives_an_empty_book_and_log(tmp_path, junk):
    state = tmp_path / "s"
    state.mkdir(mode=0o700)
    (state / files.ISSUES).write_bytes(junk)
    with StateDir(state, 1.0) as store:
        assert book_file.log_lines(store) == []
    one_run(state, [transition(3)])
    assert logged(state) == [transition(3).to_json()]
