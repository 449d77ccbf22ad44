"""Real-Alertmanager tier (issue 22 item 7): Debian's ``prometheus-alertmanager`` 0.25 on 127.0.0.1.

Skipped when the binary is missing, unless ``GPUHEAL_REQUIRE_ALERTMANAGER=1`` (``.ci/run`` installs
the package and sets it, so CI never skips it). Marked ``realserver`` too, so ``make test-fast``
leaves it out; ``make test`` runs it.
"""

from __future__ import annotations

from tests.alertmanager import alertmanager_bin  # noqa: F401 - fixture
