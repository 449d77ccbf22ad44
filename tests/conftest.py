"""Suite-wide fixtures. Keep this file small: helpers live in their own modules (``sshd.py``)."""

from __future__ import annotations

import pytest

try:
    from tests.sshd import SKIP_REASON, find_sshd, sshd_version, start_sshd
except ImportError:  # tests/ itself on sys.path (pytest's rootdir conftest insertion)
    from sshd import SKIP_REASON, find_sshd, sshd_version, start_sshd


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
