"""The alert queue's helpers, kept importable here for callers of the first release; the logic
lives in :mod:`gpuheal.core.alerts` (pure) and is orchestrated by :mod:`gpuheal.steps.escalate`."""

from gpuheal.core.alerts import FILE, empty, enqueue, fingerprint, normalise

__all__ = ["FILE", "empty", "enqueue", "fingerprint", "normalise"]
