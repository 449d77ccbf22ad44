"""Real-Prometheus tier (issue 13): Debian's ``prometheus`` 2.42 on 127.0.0.1, 1 s scrapes.

Skipped when the binary is missing, unless ``GPUHEAL_REQUIRE_PROMETHEUS=1`` (``.ci/run`` installs
the package, so CI never skips it). Marked ``realserver`` too, so the fast suite
(``-m "not realserver"``) leaves it out; ``make test`` runs it. Each test starts its own instance (own port, config and TSDB
under ``tmp_path``) and stops it at teardown.
"""

from __future__ import annotations

from tests.prom import prom_server, prometheus_bin  # noqa: F401 - fixtures
