"""The pure half of ``gpuheal bench`` (issue 5; split out of the step by issue 10, item 1): which
results stay out of the baseline and the stored and public shapes of a result. Values in, values out,
time as a parameter: the step (:mod:`gpuheal.steps.bench`) does the requests and the state files.
What the rules make of the results is theirs: ``benchmark-regression.json``
(``rules/benchmark_regression/report.py``) and the issue a 401 raises (``rules/api_key_mismatch.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from gpuheal.core import timing
from gpuheal.core.issue import Issue
from gpuheal.model import BenchOutcome

RESULT_KEYS = ("gen_tok_s", "prompt_tok_s", "tokens", "model", "n_ctx")


def exclusion_reason(
    alias: str,
    now_s: float,
    incidents: Sequence[Issue],
    restarts: list[float],
    grace_s: float,
    *,
    fleet_incidents: Collection[str],
) -> str | None:
    """Why a result taken now stays out of the baseline, or None (issue 5, item 3): an incident of the
    GPU, or one of ``fleet_incidents`` (the fleet-wide issues that slow every GPU), or a restart's grace."""
    for issue in incidents:
        if issue.gpu == alias or (issue.gpu == "fleet" and issue.issue in fleet_incidents):
            return f"incident: {issue.issue}"
    recent = [t for t in restarts if timing.within_last(now_s, t, grace_s)]  # counted in polls (issue 9)
    if recent:
        return f"startup-grace: restarted {now_s - max(recent):.0f} s ago"
    return None


def result_record(outcome: BenchOutcome, now_s: float, excluded_reason: str | None) -> dict[str, Any]:
    """The stored RESULT (benchdata's shape)."""
    return {
        "at": now_s,
        "gen_tok_s": outcome.gen_tok_s if outcome.ok else None,
        "prompt_tok_s": outcome.prompt_tok_s if outcome.ok else None,
        "tokens": outcome.tokens,
        "ok": outcome.ok,
        "error": outcome.error,
        "source": "bench",
        "model": outcome.model,
        "n_ctx": outcome.n_ctx,
        "excluded": excluded_reason is not None,
        "excluded_reason": excluded_reason,
        "slots": outcome.slots,
        "api": outcome.api,
        "rate_source": outcome.rate_source,
        "elapsed_s": outcome.elapsed_s,
        "key_sent": outcome.key_sent,
    }


def public_result(alias: str, record: dict[str, Any], outcome: BenchOutcome) -> dict[str, Any]:
    """One entry of the ``--json`` ``results`` list."""
    out: dict[str, Any] = {"gpu": alias, **{k: record[k] for k in RESULT_KEYS}}
    out.update(
        ok=record["ok"],
        error=record["error"],
        excluded=record["excluded"],
        excluded_reason=record["excluded_reason"],
        detail=outcome.detail or None,
        elapsed_s=outcome.elapsed_s,
        api=outcome.api,
        requests=outcome.requests,
    )
    if outcome.key_sent is not None:
        out["key_sent"] = outcome.key_sent
    return out
