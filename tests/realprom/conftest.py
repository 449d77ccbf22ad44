"""Real-Prometheus tier (issue 13): Debian's ``prometheus`` 2.42 on 127.0.0.1, 1 s scrapes.

Skipped when the binary is missing, unless ``GPUHEAL_REQUIRE_PROMETHEUS=1`` (``.ci/run`` installs
the package, so CI never skips it). Each test starts its own instance (own port, config and TSDB
under ``tmp_path``) and stops it at teardown.
"""

from __future__ import annotations

import pytest

from tests.prom import prom_server, prometheus_bin  # noqa: F401 - fixtures


def pytest_collection_modifyitems(items):
    for item in items:
        if "realprom" in str(item.fspath):
            item.add_marker(pytest.mark.prometheus)


