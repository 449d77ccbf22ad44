"""The pure half of ``gpuheal bench`` (issue 5; split out of the step by issue 10, item 1): which
results stay out of the baseline, the stored and public shapes of a result, ``benchmark-regression.json``
and the api-key-mismatch issue a 401 raises. Values in, values out, time as a parameter: the step
(:mod:`gpuheal.steps.bench`) does the requests and the state files.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpuheal import benchdata
from gpuheal.clock import format_epoch, format_iso
from gpuheal.config import Config
from gpuheal.core import timing
from gpuheal.model import ERR_UNAUTHORIZED, BenchOutcome

REGRESSION_ISSUE = "benchmark-regression"
KEY_ISSUE = "api-key-mismatch"
RESULT_KEYS = ("gen_tok_s", "prompt_tok_s", "tokens", "model", "n_ctx")
# Fleet-wide issues that slow every GPU (and so keep this GPU's results out of its baseline).
FLEET_INCIDENTS = frozenset({"cooling-infrastructure"})


def exclusion_reason(
    alias: str,
    now_s: float,
    incidents: list[dict[str, Any]],
    restarts: list[float],
    grace_s: float,
) -> str | None:
    """Why a result taken now stays out of the baseline, or None (issue 5, item 3)."""
    for issue in incidents:
        gpu = issue.get("gpu")
        if gpu == alias or (gpu == "fleet" and issue["issue"] in FLEET_INCIDENTS):
            return f"incident: {issue['issue']}"
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


def regression_document(cfg: Config, data: dict[str, Any], now_s: float) -> dict[str, dict[str, Any]]:
    """``benchmark-regression.json`` (without ``schema_version``): one entry per configured GPU."""

    def iso(epoch: float) -> str:
        return format_epoch(epoch)

    window_start = now_s - 30 * benchdata.DAY_S
    out: dict[str, dict[str, Any]] = {}
    for g in cfg.gpus:
        params = cfg.rule_params(REGRESSION_ISSUE, g.alias)
        base, source = benchdata.baseline(data, g.alias, g.baseline_tok_s)
        state = benchdata.regression_state(
            data,
            g.alias,
            base,
            drop_ratio=float(params["drop_ratio"]),
            min_results=int(params["min_results"]),
            recovered_within_ratio=float(params["recovered_within_ratio"]),
            since_s=now_s - float(params["max_age_h"]) * 3600 if params.get("max_age_h") else None,
        )
        alerts: list[dict[str, Any]] = []
        if state["trend"] == "regressing":
            drop = 100 * (1 - state["current_tok_s"] / base)
            alerts.append(
                {
                    "issue": REGRESSION_ISSUE,
                    "severity": "warning",
                    "since": iso(state["regressing_since"]),
                    "message": (
                        f"{state['current_tok_s']:.1f} tok/s, {drop:.0f}% below the baseline "
                        f"{base:.1f} (alert below {state['threshold_tok_s']:.1f}; "
                        f"recovered at {state['recovered_tok_s']:.1f})"
                    ),
                }
            )
        key_alert = _key_alert(data, g.alias, iso)
        if key_alert:
            alerts.append(key_alert)
        usable = [
            r for r in benchdata.ok_results(data, g.alias, window_start) if not r.get("excluded")
        ]
        out[g.alias] = {
            "gpu": g.alias,
            "baseline_tok_sec": base,
            "current_tok_sec": state["current_tok_s"],
            "trend": state["trend"],
            "alerts": alerts,
            "baseline_source": source,
            "samples": len(usable),
            "alert_below_tok_sec": state["threshold_tok_s"],
            "updated_at": iso(now_s),
        }
    return out


def _key_alert(data: dict[str, Any], alias: str, iso: Callable[[float], str]) -> dict[str, Any] | None:
    """The latest attempt was refused with 401: say so, with the key described (never shown)."""
    items = benchdata.results(data, alias)
    if not items or items[-1].get("error") != ERR_UNAUTHORIZED:
        return None
    since = items[-1]["at"]
    for r in reversed(items):
        if r.get("error") != ERR_UNAUTHORIZED:
            break
        since = r["at"]
    sent = items[-1].get("key_sent") or "?"
    return {
        "issue": KEY_ISSUE,
        "severity": "critical",
        "since": iso(since),
        "message": f"llama-server answers 401 to the configured litellm.api_key (sent {sent}); "
        "not retried (L1/L2)",
    }


def complete_issues(
    issues: list[dict[str, Any]], results: list[dict[str, Any]], now: datetime
) -> list[dict[str, Any]]:
    """Make sure a 401 seen by this run is in the list as the api-key-mismatch issue of that GPU,
    with the key that was sent (described, never shown). The rules engine's own issue wins where
    it has one (its ``detected`` gains ``key_sent``); Rule 4 is the engine's alone."""
    have = {(i.get("gpu"), i.get("issue")): i for i in issues}
    stamp = format_iso(now)
    for r in results:
        if r["error"] != ERR_UNAUTHORIZED:
            continue
        key = (r["gpu"], KEY_ISSUE)
        if key in have:
            detected = have[key].get("detected")
            detected = dict(detected) if isinstance(detected, dict) else {}
            detected.setdefault("key_sent", r.get("key_sent"))
            have[key]["detected"] = detected
            continue
        issue = {
            "gpu": r["gpu"],
            "issue": KEY_ISSUE,
            "severity": "critical",
            "state": "firing",
            "since": stamp,
            "detected": {"status": 401, "key_sent": r.get("key_sent"), "answer": r.get("detail")},
            "summary": f"llama-server rejects the configured litellm.api_key (sent {r.get('key_sent')}); "
            "start it with the LiteLLM key (L1). Not retried.",
        }
        issues.append(issue)
        have[key] = issue
    return issues
