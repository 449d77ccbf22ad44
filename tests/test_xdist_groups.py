"""``make test`` runs on pytest-xdist workers with ``--dist loadgroup`` (issue 26: under 12 minutes on
2 CPUs). A test that shares a costly fixture must land in the same worker as its siblings, or the
fixture is built once per worker: the real LiteLLM proxy twice, tests/test_chaos_smoke.py's one chaos
run twice. These tests collect real test modules and read the groups ``tests/conftest.py`` gave them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
import json, os
def pytest_collection_finish(session):
    groups = {}
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        groups[item.nodeid] = mark.args[0] if mark else None
    with open(os.environ["GROUPS_OUT"], "w") as f:
        json.dump(groups, f)
'''


def groups_of(tmp_path: Path, *paths: str) -> dict[str, str | None]:
    (tmp_path / "groups_plugin.py").write_text(PLUGIN)
    out = tmp_path / "groups.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "GROUPS_OUT": str(out)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "groups_plugin",
         *paths],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


def test_costly_shared_fixtures_keep_their_tests_in_one_worker(tmp_path):
    groups = groups_of(
        tmp_path, "tests/test_chaos_smoke.py", "tests/reallitellm/test_real_litellm.py",
        "tests/reallitellm/test_heal_real.py", "tests/test_transport_ssh.py", "tests/test_layers.py",
    )
    by_file: dict[str, set[str | None]] = {}
    for nodeid, group in groups.items():
        by_file.setdefault(nodeid.split("::", 1)[0], set()).add(group)
    # one chaos run (module-scoped) for every test of the module that reads it
    smoke = {n: g for n, g in groups.items() if n.startswith("tests/test_chaos_smoke.py::")}
    assert smoke["tests/test_chaos_smoke.py::test_gpuheal_did_not_crash"] == "tests/test_chaos_smoke.py"
    assert set(smoke.values()) - {None} == {"tests/test_chaos_smoke.py"}
    # one real LiteLLM proxy (session-scoped) for the whole tier, whichever module asks for it
    assert by_file["tests/reallitellm/test_real_litellm.py"] == {"reallitellm"}
    assert by_file["tests/reallitellm/test_heal_real.py"] == {"reallitellm"}
    # one real sshd
    assert "sshd" in by_file["tests/test_transport_ssh.py"]
    # and a pure test may run anywhere
    assert by_file["tests/test_layers.py"] == {None}
