"""LiteLLM's own Prometheus ``/metrics`` (its ``prometheus`` callback) → per-deployment request counts.
Pure (issue 20).

What users see, without gpu-monitor: the proxy counts every request it sent to each deployment, and
each failure. Names and labels as the real 1.108.7 proxy writes them (pinned by
tests/reallitellm/test_litellm_metrics_real.py, never taken from docs)::

    litellm_deployment_total_requests_total{...,model_id="gpu-a",model_group="qwen",api_base="http://ct1/v1"} 3.0
    litellm_deployment_failure_responses_total{...,model_id="gpu-dead",exception_status="500",...} 2.0

Counters, one series per label set (client ip, user agent, key, exception class…): a deployment's
figure is the sum over its series. ``model_id`` is LiteLLM's ``model_info.id`` — gpuheal matches it to
a GPU alias, else ``api_base`` to its endpoint. Garbage lines are skipped and counted, never guessed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

TOTAL = "litellm_deployment_total_requests_total"
FAILURES = "litellm_deployment_failure_responses_total"
HOW_TO_ENABLE = ("add `litellm_settings: {callbacks: [\"prometheus\"]}` to LiteLLM's config.yaml "
                 "(the proxy needs the prometheus-client package) and set litellm.read_metrics: true")
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')
MAX_SERIES = 100_000


class InvalidLiteLLMMetrics(ValueError):
    """Not LiteLLM's exposition (no deployment counter at all, or not text)."""


@dataclass(frozen=True)
class DeploymentRequests:
    """One deployment's cumulative counts since the proxy started (Rule 3's failure ratio; Rule 10's
    per-deployment request share)."""

    model_id: str
    model_group: str | None
    api_base: str | None
    total: float
    failures: float

    @property
    def successes(self) -> float:
        return max(0.0, self.total - self.failures)


@dataclass(frozen=True)
class LiteLLMRequests:
    """Every deployment's counts of one scrape; ``problems``: lines that were skipped."""

    deployments: dict[str, DeploymentRequests]
    problems: tuple[str, ...] = ()

    def for_gpu(self, alias: str, endpoint: str) -> DeploymentRequests | None:
        """The deployment of a GPU: ``model_id`` = the alias, else ``api_base`` on its endpoint."""
        if alias in self.deployments:
            return self.deployments[alias]
        base = endpoint.rstrip("/")
        found = [d for d in self.deployments.values()
                 if d.api_base and d.api_base.rstrip("/").removesuffix("/v1") == base]
        return found[0] if len(found) == 1 else None


def _labels(text: str) -> dict[str, str] | None:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            return None
        out[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        pos = m.end()
    return out


def parse_litellm_metrics(text: str) -> LiteLLMRequests:
    """The exposition text → :class:`LiteLLMRequests`; :class:`InvalidLiteLLMMetrics` when it holds no
    deployment counter (the callback is off, or this is not LiteLLM)."""
    sums: dict[str, DeploymentRequests] = {}
    problems: list[str] = []
    seen = 0
    for line in text.splitlines():
        if not line.startswith((TOTAL + "{", FAILURES + "{")):
            continue
        seen += 1
        if seen > MAX_SERIES:
            problems.append(f"more than {MAX_SERIES} deployment series: the rest skipped")
            break
        m = _LINE.match(line.strip())
        labels = _labels(m.group(2)) if m else None
        try:
            value = float(m.group(3)) if m else math.nan
        except ValueError:
            value = math.nan
        if m is None or labels is None or not labels.get("model_id") or not math.isfinite(value) or value < 0:
            problems.append(f"skipped: {line[:80]!r}")
            continue
        key = labels["model_id"]
        was = sums.get(key) or DeploymentRequests(key, labels.get("model_group"), labels.get("api_base"), 0.0, 0.0)
        if m.group(1) == TOTAL:
            sums[key] = replace(was, total=was.total + value)
        else:
            sums[key] = replace(was, failures=was.failures + value)
    if not sums and not seen and "litellm_" not in text:
        raise InvalidLiteLLMMetrics("no litellm_deployment_* counters: is the prometheus callback on?")
    return LiteLLMRequests(sums, tuple(problems[:20]))
