"""``make test`` runs on pytest-xdist workers with ``--dist loadfile`` (issue 26: under 12 minutes on 2
CPUs). A test that shares a costly fixture must land in the same worker as its siblings, or the fixture is
built once per worker: the real LiteLLM proxy twice, tests/test_chaos_smoke.py's one chaos run twice.
``tests/conftest.py`` makes each file one unit of work and the real-LiteLLM tier one unit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import pytest_xdist_make_scheduler, xdist_unit_of

ROOT = Path(__file__).resolve().parents[1]


def test_a_module_fixture_keeps_its_file_together_and_the_real_litellm_tier_is_one_unit():
    assert xdist_unit_of("tests/test_chaos_smoke.py::test_gpuheal_did_not_crash") == "tests/test_chaos_smoke.py"
    assert xdist_unit_of("tests/test_chaos_smoke.py::test_the_document_has_the_issue_s_shape") == (
        "tests/test_chaos_smoke.py")
    assert xdist_unit_of("tests/reallitellm/test_real_litellm.py::test_x") == "tests/reallitellm"
    assert xdist_unit_of("tests/reallitellm/test_heal_real.py::test_y[a]") == "tests/reallitellm"
    assert xdist_unit_of("tests/test_layers.py::test_z") != xdist_unit_of("tests/test_cli.py::test_z")


def test_the_scheduler_uses_the_units_under_loadfile_only():
    pytest.importorskip("xdist")

    class Config:
        def __init__(self, dist):
            self.values = {"dist": dist, "numprocesses": 2, "tx": ["popen"] * 2, "maxschedchunk": None}

        def getvalue(self, name):
            return self.values[name]

    assert pytest_xdist_make_scheduler(Config("load"), None) is None
    sched = pytest_xdist_make_scheduler(Config("loadfile"), None)
    assert sched._split_scope("tests/reallitellm/test_a.py::t") == "tests/reallitellm"
    assert sched._split_scope("tests/test_chaos_smoke.py::t[1]") == "tests/test_chaos_smoke.py"


def test_make_test_runs_in_parallel_by_file():
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"PYTEST_PAR := -n \$\(WORKERS\) --dist loadfile", make)
    assert re.search(r"^test:.*\n\t\$\(PY\) -m pytest -q \$\(PYTEST_PAR\)", make, re.M)
