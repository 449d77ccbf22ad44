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
# work, so a module-scoped fixture (tests/test_chaos_smoke.py's one chaos run) is built once. A tier whose
# files share a costly session-scoped fixture is one unit too, so the fixture is built once, not once per
# worker: the real LiteLLM proxy in front of a simulated fleet (tests/reallitellm/conftest.py).
# (xdist's `--dist loadgroup` with xdist_group marks does not group under pytest 9.2: it renames items by
# a private attribute pytest no longer reads.)
SHARED_UNITS: tuple[tuple[str, str], ...] = (("tests/reallitellm/", "tests/reallitellm"),)


def xdist_unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its tier (above) or its file."""
    path = nodeid.split("::", 1)[0]
    for prefix, unit in SHARED_UNITS:
        if path.startswith(prefix):
            return unit
    return path


@pytest.hookimpl(optionalhook=True)  # pytest without xdist (plain `pytest tests/x.py`) still runs
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the tiers above as one unit each (pytest-xdist's scheduler hook)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class TierScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit_of(nodeid)

    return TierScheduling(config, log)


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
