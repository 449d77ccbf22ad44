"""Lesson L1: api-key mismatch — a llama-server rejecting LiteLLM's key (401).

Seen two ways: the direct probe got a 401 (``endpoint`` "unauthorized"), or gpuheal's latest
``bench`` result for the GPU was a 401 (``error`` "unauthorized"). ``critical``: the GPU cannot serve.
Reported once, never retried in a loop (L2: the bench does not hammer a 401). While firing it
inhibits the symptoms a restart cannot fix on that GPU (L1's cascade: 401 → fallback → timeout):
``model-stuck``, ``circuit-breaker-stuck``, ``workload-misrouted``. Recovers when neither
signal says 401 any more: a later successful benchmark, and a probe that is not 401. The key itself
never appears in the evidence.

Its fix (issue 27 item 15, Lesson L2: "do NOT fall back to it again"): the GPU is taken out of LiteLLM's
routing — ``redirect-traffic``: its deployment's weight to 0 (or its rpm down), counted only when
LiteLLM's read-back shows it — and the humans are told in the same run (a key is never guessed). Never on
one poll: a second poll must see the 401 first. Once the GPU answers again and stayed so for
``heal.restore_after_s``, ``restore-load`` puts the value found back, read back too. Where LiteLLM cannot
change the deployment (no database, ``config.yaml``) or no ``redirect_command`` is configured, it is
escalated at once, saying why it could not be taken out.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from gpuheal import benchdata
from gpuheal.clock import format_iso
from gpuheal.config.model import RemedyParams
from gpuheal.core.engine import iso
from gpuheal.core.issue import Finding, Issue
from gpuheal.core.remedy import Execution, Guard, Planning, Remedy, RemedyContext, Result
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.model import ENDPOINT_UNAUTHORIZED, ERR_UNAUTHORIZED
from gpuheal.signals import Need

ID: Final = "api-key-mismatch"
SCOPE: Final = "gpu"
SEVERITY: Final = "critical"
NEEDS: Final[tuple[Need, ...]] = ()
# What a rejected key causes and a restart cannot fix: LiteLLM's failures (Rule 3 would restart the
# GPU), its breaker opening (Rule 5 would restart LiteLLM), traffic moving elsewhere (Rule 10).
INHIBITS: Final = frozenset({"model-stuck", "circuit-breaker-stuck", "workload-misrouted"})
JUDGED_FROM_BENCH: Final = True
recovered: Final = None  # neither signal says 401 any more (detect quiet)
hold: Final = None  # the engine's: hold_polls (1: reported at once)
remember: Final = None
UNAUTHORIZED_ERRORS = frozenset({"unauthorized", "http-401", "401"})


class Params(RemedyParams):
    """The engine's parameters and the fix's (its window and failure budget): the fix only takes the GPU
    out of routing; the key is the humans' (never guessed)."""


SEEN_TWICE_S = 30.0  # acted on once a later poll than the first saw the 401 (cron polls every 60 s)
WHY = "llama-server rejects the LiteLLM api key: align --api-key with litellm.api_key (Lesson L1)"


def _bench_401(view: FleetView, alias: str) -> tuple[bool | None, dict[str, Any] | None]:
    """The latest own-bench verdict: True (401), False (a success), None (no verdict)."""
    for result in reversed(view.bench_results(alias)):
        if result.get("source", "bench") != "bench":
            continue
        if result.get("ok"):
            return False, result
        error = str(result.get("error") or "").lower()
        if error in UNAUTHORIZED_ERRORS or error.startswith("unauthorized"):
            return True, result
        return None, result  # another failure says nothing about the key
    return None, None


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    state = view.endpoint(alias)
    probe = None if state is None else state == ENDPOINT_UNAUTHORIZED
    bench, result = _bench_401(view, alias)
    if probe or bench:
        via = [name for name, hit in (("probe", probe), ("bench", bench)) if hit]
        detected = {"via": via, "endpoint": state}
        if bench and result is not None:
            detected["bench_at"] = iso(result["at"])
        return Finding(
            detected,
            f"{alias} rejects LiteLLM's api key (401 via {' and '.join(via)}); "
            "do not fall back to it (L2)",
        )
    if probe is None and bench is None:
        return None
    return False


# --------------------------------------------------------------------------- bench's report of a 401


def key_alert(data: dict[str, Any], alias: str, iso: Callable[[float], str]) -> dict[str, Any] | None:
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
        "issue": ID,
        "severity": "critical",
        "since": iso(since),
        "message": f"llama-server answers 401 to the configured litellm.api_key (sent {sent}); "
        "not retried (L1/L2)",
    }


def complete_issues(
    issues: list[Issue], results: list[dict[str, Any]], now: datetime
) -> list[dict[str, Any]]:
    """``bench``'s document's ``issues``: the engine's (``issues``), making sure a 401 seen by this run is
    in the list as the api-key-mismatch issue of that GPU, with the key that was sent (described, never
    shown). The rules engine's own issue wins where it has one (its ``detected`` gains ``key_sent``);
    Rule 4 is the engine's alone."""
    out = [i.to_json() for i in issues]
    have = {(i.gpu, i.issue): doc for i, doc in zip(issues, out, strict=True)}
    stamp = format_iso(now)
    for r in results:
        if r["error"] != ERR_UNAUTHORIZED:
            continue
        key = (r["gpu"], ID)
        if key in have:
            detected = dict(have[key]["detected"])
            detected.setdefault("key_sent", r.get("key_sent"))
            have[key]["detected"] = detected
            continue
        issue = {
            "gpu": r["gpu"],
            "issue": ID,
            "severity": "critical",
            "state": "firing",
            "since": stamp,
            "detected": {"status": 401, "key_sent": r.get("key_sent"), "answer": r.get("detail")},
            "summary": f"llama-server rejects the configured litellm.api_key (sent {r.get('key_sent')}); "
            "start it with the LiteLLM key (L1). Not retried.",
        }
        out.append(issue)
        have[key] = issue
    return out


def guard(p: Planning) -> Guard:
    """Never act on one bad poll: the take-out waits for a poll after the one that first saw the 401."""
    seen = p.detected.get("duration_s")
    if isinstance(seen, int | float) and not isinstance(seen, bool) and seen >= SEEN_TWICE_S - p.tol_s:
        return Guard()
    return Guard(wait="a 401 is taken out of routing when a second poll sees it (never on one bad poll)")


def conclude(ex: Execution, ctx: RemedyContext) -> None:
    """Taken out of routing (its read-back seen) or not: the humans still have to fix the key — told now,
    with what became of its routing."""
    if ex.result is Result.ACTED:
        ex.ends(Result.ESCALATED, f"{WHY}; taken out of LiteLLM routing until it answers again (L2), then put "
                "back")
    elif ex.result is Result.ESCALATED:
        why = (ex.escalate_reason or "").removeprefix("load shedding ")
        ex.ends(Result.ESCALATED, f"{WHY}; it stays in LiteLLM's routing: taking it out {why}")


REMEDY: Final = Remedy(
    ("redirect-traffic",),  # out of LiteLLM's routing (L2); the key is the humans'
    why_escalate=WHY,
    guard=guard,
    conclude=conclude,
)
