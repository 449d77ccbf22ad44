"""Suite-wide fixtures. Keep this file small: helpers live in their own modules (``sshd.py``)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

try:
    from tests.sshd import SKIP_REASON, find_sshd, sshd_version, start_sshd
except ImportError:  # tests/ itself on sys.path (pytest's rootdir conftest insertion)
    from sshd import SKIP_REASON, find_sshd, sshd_version, start_sshd


# `make test` runs the suite on pytest-xdist workers with `--dist loadfile`: a test file is one unit of
# work, so a module-scoped fixture (tests/test_chaos_smoke.py's one chaos run) is built once. Files that
# share a costly session-scoped fixture are one unit too, so the fixture is built once, not once per
# worker: the real-LiteLLM files that use the session's one proxy (``real_litellm``, ``sim_backends`` in
# tests/reallitellm/conftest.py). The tier's files that start proxies of their own (a restart launcher, the
# prometheus callback, Slack alerting) are units of their own and run beside the others.
# (xdist's `--dist loadgroup` with xdist_group marks does not group under pytest 9.2: it renames items by
# a private attribute pytest no longer reads.)
SHARED_PROXY_UNIT = "tests/reallitellm[shared proxy]"
SHARED_UNITS: dict[str, str] = {
    f"tests/reallitellm/{name}.py": SHARED_PROXY_UNIT
    for name in ("test_doctor_real", "test_heal_real", "test_init_real", "test_lookalike_matches",
                 "test_real_litellm", "test_rule6_litellm_real")
}

# The longest units first (longest-processing-time order), so that no long unit starts near the end and
# leaves one worker running it alone: seconds each took in a full `make test` (2 workers, 2 shared CPUs,
# `--durations` and junit times summed per unit). Only the order is read from them; a unit not named
# here comes after them, the units with most tests first (xdist's own order). Re-measure with
# `pytest -n 2 --dist loadfile --junitxml=x.xml` when a unit grows past the last one named.
UNIT_SECONDS: dict[str, float] = {
    "tests/realprom/test_prometheus_real.py": 141, "tests/test_chaos_smoke.py": 120,
    "tests/test_prometheus_source.py": 104, "tests/realserver/test_hung_task_loop_real.py": 92,
    "tests/test_demo.py": 89, "tests/realserver/test_real_telemetry.py": 69, "tests/test_confirm_in_run.py": 68,
    "tests/reallitellm/test_wake_real.py": 63, "tests/test_heal.py": 62, "tests/realprom/test_equivalence.py": 58,
    "tests/reallitellm/test_drain_real.py": 55, "tests/realserver/test_confirm_real.py": 45,
    "tests/test_alert_storm.py": 44, "tests/reallitellm/test_config_redirect_real.py": 42,
    "tests/test_heal_process.py": 39, SHARED_PROXY_UNIT: 37, "tests/test_heal_timing.py": 35,
    "tests/realserver/test_bench_real.py": 31, "tests/test_rules_vram.py": 28,
    "tests/reallitellm/test_spend_logs_real.py": 28, "tests/test_audit_trail.py": 23,
    "tests/test_heal_taskloop.py": 22, "tests/test_fuzz_check.py": 22, "tests/test_entry.py": 22,
    "tests/test_cli.py": 21, "tests/test_escalate_sim.py": 20, "tests/test_rule8_still_rising.py": 20,
}


def xdist_unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its shared-fixture unit (above) or its file."""
    path = nodeid.split("::", 1)[0]
    return SHARED_UNITS.get(path, path)


@pytest.hookimpl(optionalhook=True)  # pytest without xdist (plain `pytest tests/x.py`) still runs
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the units above, the longest first (pytest-xdist's scheduler hook)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class UnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            # the next unit a worker takes is the longest left, whatever order xdist queued them in
            if self.workqueue:
                longest = max(self.workqueue, key=lambda unit: (UNIT_SECONDS.get(unit, 0.0), len(self.workqueue[unit])))
                self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

    return UnitScheduling(config, log)


def pytest_configure(config):
    """Bytecode for the suite's hundreds of ``gpuheal`` processes. Where ``PYTHONDONTWRITEBYTECODE`` is set
    (as on the team's machine), every ``gpuheal`` a test starts compiled the whole package from source
    again: 1 to 2 s of each process on 2 shared cores, for a few hundred processes. The controller
    compiles ``gpuheal/`` once into a cache of its own (``PYTHONPYCACHEPREFIX``, a temporary directory:
    nothing is written into the tree) and the workers and the processes they start read it from there."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    import compileall

    prefix = tempfile.mkdtemp(prefix="gpuheal-pyc-")
    config.stash[PYC_PREFIX] = prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.pycache_prefix = prefix
    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "gpuheal"), quiet=2, workers=1)


def pytest_unconfigure(config):
    prefix = config.stash.get(PYC_PREFIX, None)
    if prefix is not None:
        shutil.rmtree(prefix, ignore_errors=True)


PYC_PREFIX = pytest.StashKey[str]()


def pytest_report_header(config):
    binary = find_sshd()
    if binary is None:
        return f"sshd: not found, SSH tests will be skipped ({SKIP_REASON})"
    return f"sshd: {binary} ({sshd_version(binary)})"


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A real sshd on 127.0.0.1 for the whole session (see ``tests/sshd.py``, ``SshdServer``):
    ``.host .port .user .key_filename .known_hosts .wrong_known_hosts .empty_known_hosts
    .unauthorized_key_filename``, ``.transport(**overrides)`` -> ``SshTransport``."""
    binary = find_sshd()
    if binary is None:
        pytest.skip(SKIP_REASON)
    server = start_sshd(tmp_path_factory.mktemp("sshd"), binary=binary)
    try:
        yield server
    finally:
        server.stop()
