"""Rule 3's remedy hook beyond its restart (:mod:`gpuheal.core.remedy`): ``drain`` (issue 28 item 2, drain
first) — which findings are hard faults. A hung task loop (``/health`` ok while ``/metrics``, ``/slots`` or
the canary completion do not answer) is one: the server takes requests it will never answer, so the GPU
leaves LiteLLM's routing at the first poll the finding is open. A failure ratio (gpu-monitor's, LiteLLM's)
and a decode stall seen in the counters are soft: they keep their holds and drain nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SOURCE_TASKLOOP = "llama-server task loop"  # the rule's source name for a hung task loop (``detected.source``)
CANARY = "canary"  # core/taskloop.ENDPOINTS: the canary completion's name in ``not_answered``


def hard_fault(detected: Mapping[str, Any]) -> str | None:
    """The hard fault in a finding's ``detected``: the canary completion failing, or the task loop stalled."""
    if SOURCE_TASKLOOP not in str(detected.get("source") or ""):
        return None
    silent = detected.get("not_answered")
    if isinstance(silent, list) and CANARY in silent:
        return "canary completion failing"
    return "task loop stalled"
