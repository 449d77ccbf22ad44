"""Suite-wide fixtures. Keep this file small: helpers live in their own modules (``sshd.py``)."""

from __future__ import annotations

import pytest

try:
    from tests.sshd import SKIP_REASON, find_sshd, sshd_version, start_sshd
except ImportError:  # tests/ itself on sys.path (pytest's rootdir conftest insertion)
    from sshd import SKIP_REASON, find_sshd, sshd_version, start_sshd


# Session-scoped fixtures that are costly to build (a real LiteLLM proxy in front of a simulated fleet,
# a ~540 MB GGUF, a real sshd with fresh keys): the tests that use one run in one pytest-xdist worker,
# so it is built once per run, not once per worker. Checked in this order; the first match wins.
SHARED_SESSION_FIXTURES: tuple[tuple[str, str], ...] = (
    ("real_litellm", "reallitellm"),
    ("sim_backends", "reallitellm"),
    ("slow_model", "slow-model"),
    ("sshd", "sshd"),
)
NARROW_SCOPES = frozenset({"module", "class", "package"})


def xdist_group_of(item: pytest.Item) -> str | None:
    """The pytest-xdist group an item must share (``make test`` runs ``-n 2 --dist loadgroup``), or
    None where it may run on any worker: an expensive session fixture's tier (above), else its own
    module when it uses a module-, class- or package-scoped fixture (tests/test_chaos_smoke.py's one
    chaos run), so such a fixture is built once and never twice at once."""
    names = set(item.fixturenames)
    for fixture, group in SHARED_SESSION_FIXTURES:
        if fixture in names:
            return group
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    defs = fixtureinfo.name2fixturedefs if fixtureinfo is not None else {}
    if any(d.scope in NARROW_SCOPES for name in names for d in defs.get(name, ())):
        return item.nodeid.split("::", 1)[0]
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


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
