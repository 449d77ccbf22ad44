"""``GET {litellm.url}/metrics/`` (``/metrics`` answers 307 to it): LiteLLM's per-deployment request
and failure counters, read every poll when ``litellm.read_metrics`` is on (issue 20). One request under
LiteLLM's deadline and a byte cap; what the network does is a :class:`~gpuheal.model.DataFault`, never
an exception."""

from __future__ import annotations

from gpuheal.model import DataFault
from gpuheal.parse.litellm_metrics import InvalidLiteLLMMetrics, LiteLLMRequests, parse_litellm_metrics
from gpuheal.sources.http import HttpFault, request

MAX_BYTES = 8 << 20  # one series per deployment x client x key x exception class: large fleets write MBs


def fetch_requests(url: str, api_key: str | None, deadline_s: float) -> LiteLLMRequests | DataFault:
    """The proxy's counts, or the fault that says why they are not known this poll."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    result = request("GET", url.rstrip("/") + "/metrics/", deadline_s=deadline_s, max_bytes=MAX_BYTES, headers=headers)
    if isinstance(result, HttpFault):
        return DataFault("litellm", result.kind, f"GET /metrics/: {result.detail}")
    if result.status != 200:
        return DataFault("litellm", f"http-{result.status:03d}", f"GET /metrics/: HTTP {result.status}")
    try:
        return parse_litellm_metrics(result.body.decode("utf-8"))
    except UnicodeDecodeError:
        return DataFault("litellm", "invalid", "GET /metrics/: not UTF-8 text")
    except InvalidLiteLLMMetrics as exc:
        return DataFault("litellm", "invalid", f"GET /metrics/: {exc}")
