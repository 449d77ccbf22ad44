"""``make test`` runs on pytest-xdist workers with ``--dist loadfile`` (issue 26: under 12 minutes on 2
CPUs). A test that shares a costly fixture must land in the same worker as its siblings, or the fixture is
built once per worker: the real LiteLLM proxy twice, tests/test_chaos_smoke.py's one chaos run twice.
``tests/conftest.py`` makes each file one unit of work, the files that share the real LiteLLM proxy one
unit, and hands out the longest units first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import SHARED_PROXY_UNIT, SHARED_UNITS, UNIT_SECONDS, pytest_xdist_make_scheduler, xdist_unit_of

ROOT = Path(__file__).resolve().parents[1]


def test_a_module_fixture_keeps_its_file_together_and_the_shared_proxy_files_are_one_unit():
    assert xdist_unit_of("tests/test_chaos_smoke.py::test_gpuheal_did_not_crash") == "tests/test_chaos_smoke.py"
    assert xdist_unit_of("tests/test_chaos_smoke.py::test_the_document_has_the_issue_s_shape") == (
        "tests/test_chaos_smoke.py")
    assert xdist_unit_of("tests/reallitellm/test_real_litellm.py::test_x") == SHARED_PROXY_UNIT
    assert xdist_unit_of("tests/reallitellm/test_heal_real.py::test_y[a]") == SHARED_PROXY_UNIT
    assert xdist_unit_of("tests/reallitellm/test_wake_real.py::t") == "tests/reallitellm/test_wake_real.py"
    assert xdist_unit_of("tests/test_layers.py::test_z") != xdist_unit_of("tests/test_cli.py::test_z")


def test_every_file_that_uses_the_session_proxy_is_in_its_unit_and_no_other():
    """A new file using ``real_litellm``/``sim_backends`` outside the unit would start a second proxy."""
    uses = {f"tests/reallitellm/{p.name}" for p in sorted((ROOT / "tests" / "reallitellm").glob("test_*.py"))
            if re.search(r"\b(real_litellm|sim_backends)\b", p.read_text())}
    assert uses == set(SHARED_UNITS)


class Node:
    def __init__(self):
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes):
        self.sent.append(indexes)


def scheduler(dist):
    class Config:
        def __init__(self):
            self.values = {"dist": dist, "numprocesses": 2, "tx": ["popen"] * 2, "maxschedchunk": None}

        def getvalue(self, name):
            return self.values[name]

    return pytest_xdist_make_scheduler(Config(), None)


def test_the_scheduler_uses_the_units_under_loadfile_only():
    pytest.importorskip("xdist")
    assert scheduler("load") is None
    sched = scheduler("loadfile")
    assert sched._split_scope("tests/reallitellm/test_a.py::t") == "tests/reallitellm/test_a.py"
    assert sched._split_scope("tests/reallitellm/test_drain_real.py::t") == "tests/reallitellm/test_drain_real.py"
    assert sched._split_scope("tests/test_chaos_smoke.py::t[1]") == "tests/test_chaos_smoke.py"


def test_a_worker_takes_the_longest_unit_left_first():
    """The order of the queue (xdist's: most tests first) is not the order work is handed out."""
    pytest.importorskip("xdist")
    sched = scheduler("loadfile")
    ids = ["tests/test_many.py::a", "tests/test_many.py::b", "tests/test_many.py::c", "tests/test_demo.py::t",
           "tests/test_chaos_smoke.py::t"]
    node = Node()
    sched.registered_collections[node] = ids
    for nodeid in ids:
        sched.workqueue.setdefault(sched._split_scope(nodeid), {})[nodeid] = False
    for _ in range(3):
        sched._assign_work_unit(node)
    longest = sorted(["tests/test_demo.py", "tests/test_chaos_smoke.py"], key=lambda u: -UNIT_SECONDS[u])
    assert [ids[i[0]].split("::")[0] for i in node.sent] == [*longest, "tests/test_many.py"]


def test_make_test_runs_in_parallel_by_file():
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"PYTEST_PAR := -n \$\(WORKERS\) --dist loadfile", make)
    assert re.search(r"^test:.*\n\t\$\(PY\) -m pytest -q \$\(PYTEST_PAR\)", make, re.M)
