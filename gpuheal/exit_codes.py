"""Exit statuses are public API (contract: "Exit status").

``check`` and ``heal`` are Nagios-compatible; every other command uses OK / ATTENTION.
"""

HEALTHY = 0
DEGRADED = 1
DOWN = 2
CANNOT_RUN = 3

OK = 0
ATTENTION = 1

BY_STATUS = {"healthy": HEALTHY, "degraded": DEGRADED, "down": DOWN}
