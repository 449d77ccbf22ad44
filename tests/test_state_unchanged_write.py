"""A JSON state file rewritten with the bytes it holds is left as it is (issue 29: cron rewrote
``heal-state.json`` and ``circuit-breaker-status.json`` unchanged at nearly every run): only when the file is
exactly what the write would leave — a regular file of this user's, mode 0600, one link, the same bytes."""

from __future__ import annotations

import json
import os
import stat

import pytest

from gpuheal.state.store import StateDir


def identity(path):
    st = os.lstat(path)
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def test_an_unchanged_document_is_not_rewritten_and_a_changed_one_is(tmp_path):
    with StateDir(tmp_path / "s", 1.0) as store:
        path = store.path / "heal-state.json"
        store.write("heal-state.json", {"attempts": {"a": 1.5}, "restarts": {}})
        before = identity(path)
        store.write("heal-state.json", {"attempts": {"a": 1.5}, "restarts": {}})
        assert identity(path) == before
        store.write("heal-state.json", {"attempts": {"a": 2.5}, "restarts": {}})  # same size, other bytes
        assert identity(path) != before
        assert store.read("heal-state.json") == {"attempts": {"a": 2.5}, "restarts": {}}
        store.write_raw("public.json", {"schema_version": 1, "gpu-a": {"open": None}})
        before = identity(store.path / "public.json")
        store.write_raw("public.json", {"schema_version": 1, "gpu-a": {"open": None}})
        assert identity(store.path / "public.json") == before


def test_key_order_and_number_form_are_bytes_too(tmp_path):
    with StateDir(tmp_path / "s", 1.0) as store:
        path = store.path / "x.json"
        store.write("x.json", {"a": 1, "b": 2})
        store.write("x.json", {"b": 2, "a": 1})
        assert json.loads(path.read_text())["data"] == {"b": 2, "a": 1} and list(store.read("x.json")) == ["b", "a"]
        store.write("x.json", {"b": 2.0, "a": 1})
        assert path.read_text() == '{"schema_version":1,"data":{"b":2.0,"a":1}}\n'


@pytest.mark.parametrize("damage", ["mode", "link", "symlink", "same-size-junk", "longer", "directory"])
def test_a_file_that_is_not_what_the_write_leaves_is_written(tmp_path, damage):
    doc = {"n": 12345}
    with StateDir(tmp_path / "s", 1.0) as store:
        path = store.path / "f.json"
        store.write("f.json", doc)
        text = path.read_bytes()
        if damage == "mode":
            os.chmod(path, 0o644)
        elif damage == "link":
            os.link(path, tmp_path / "other")
        elif damage == "symlink":
            (tmp_path / "target").write_bytes(text)
            path.unlink()
            path.symlink_to(tmp_path / "target")
        elif damage == "same-size-junk":
            path.write_bytes(b"x" * len(text))
        elif damage == "longer":
            path.write_bytes(text + b" ")
        elif damage == "directory":
            path.unlink()
            path.mkdir()
        if damage == "directory":
            with pytest.raises(OSError):
                store.write("f.json", doc)  # as before: a directory in the way is not replaced
            return
        store.write("f.json", doc)
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_nlink == 1
        assert path.read_bytes() == text
        if damage == "link":
            assert (tmp_path / "other").read_bytes() == text  # the other name keeps the old inode


def test_a_lone_surrogate_is_compared_as_it_is_written(tmp_path):
    with StateDir(tmp_path / "s", 1.0) as store:
        path = store.path / "s.json"
        store.write("s.json", {"name": "gpu-\udc80"}, stream=True)  # the streamed path, as before
        streamed = path.read_bytes()
        store.write("s.json", {"name": "gpu-\udc80"})
        assert path.read_bytes() == streamed
        before = identity(path)
        store.write("s.json", {"name": "gpu-\udc80"})
        assert identity(path) == before
