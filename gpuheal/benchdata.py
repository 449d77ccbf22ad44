"""Recorded benchmark results and baselines, shared by ``bench`` (writer), Rules 4 and 9 (readers)
and the weekly report. Pure functions over a plain dict; ``StateDir`` stores it as
``bench-results.json``.

Shape (``data`` of the file)::

    {"results":   {ALIAS: [RESULT, ...]},            # oldest first, bounded by keep_days
     "baselines": {ALIAS: {"baseline_tok_s": float, "source": "config" | "rolling-30d",
                           "computed_at": epoch_s, "n": int}}}

    RESULT = {"at": epoch_s, "gen_tok_s": float | None, "prompt_tok_s": float | None,
              "tokens": int | None, "ok": bool, "error": str | None, "source": "bench" | "monitor",
              "model": str | None, "n_ctx": int | None,
              "excluded": bool, "excluded_reason": str | None}

A result is ``excluded`` from the baseline when it was taken during an open incident or inside the
startup grace after a restart (issue 5); it still counts for Rule 4's "3+ benchmarks".
"""

from __future__ import annotations

from typing import Any

FILE = "bench-results.json"
DAY_S = 86400.0


def empty() -> dict[str, Any]:
    return {"results": {}, "baselines": {}}


def normalise(data: Any) -> dict[str, Any]:
    """Tolerate a damaged file: keep only well-formed entries."""
    out = empty()
    if not isinstance(data, dict):
        return out
    results = data.get("results")
    if isinstance(results, dict):
        for alias, items in results.items():
            if isinstance(items, list):
                good = [r for r in items if isinstance(r, dict) and isinstance(r.get("at"), int | float)]
                out["results"][str(alias)] = sorted(good, key=lambda r: r["at"])
    baselines = data.get("baselines")
    if isinstance(baselines, dict):
        for alias, b in baselines.items():
            if isinstance(b, dict) and isinstance(b.get("baseline_tok_s"), int | float):
                out["baselines"][str(alias)] = b
    return out


def add_result(data: dict[str, Any], alias: str, result: dict[str, Any]) -> None:
    items = data["results"].setdefault(alias, [])
    if items and result["at"] <= items[-1]["at"]:
        return  # same instant twice (a re-read monitor entry): keep the first
    items.append(result)


def results(data: dict[str, Any], alias: str, since_s: float | None = None) -> list[dict[str, Any]]:
    items = data["results"].get(alias, [])
    return [r for r in items if since_s is None or r["at"] >= since_s]


def ok_results(data: dict[str, Any], alias: str, since_s: float | None = None) -> list[dict[str, Any]]:
    return [r for r in results(data, alias, since_s) if r.get("ok") and r.get("gen_tok_s")]


def baseline(data: dict[str, Any], alias: str, config_baseline: float | None) -> tuple[float | None, str]:
    """The baseline in force: the rolling one once computed, else the config's seed."""
    b = data["baselines"].get(alias)
    if b is not None:
        return float(b["baseline_tok_s"]), str(b.get("source", "rolling-30d"))
    return config_baseline, "config"


def recompute_baseline(
    data: dict[str, Any],
    alias: str,
    now_s: float,
    config_baseline: float | None,
    window_days: float = 30.0,
    seed_days: float = 7.0,
    every_days: float = 7.0,
) -> None:
    """Design Decision 6: rolling 30-day average, recalculated weekly, seeded from the config
    until a week of (non-excluded, successful) results exists."""
    current = data["baselines"].get(alias)
    if current is not None and now_s - float(current.get("computed_at", 0)) < every_days * DAY_S:
        return
    usable = [
        r for r in ok_results(data, alias, now_s - window_days * DAY_S) if not r.get("excluded")
    ]
    if not usable or now_s - usable[0]["at"] < seed_days * DAY_S:
        return  # not a week of history yet: the config seed stays in force
    mean = sum(r["gen_tok_s"] for r in usable) / len(usable)
    data["baselines"][alias] = {
        "baseline_tok_s": round(mean, 2),
        "source": "rolling-30d",
        "computed_at": now_s,
        "n": len(usable),
        "seed_tok_s": config_baseline,
    }


def prune(data: dict[str, Any], now_s: float, keep_days: float, aliases: tuple[str, ...] | None = None) -> None:
    cut = now_s - keep_days * DAY_S
    for alias in list(data["results"]):
        if aliases is not None and alias not in aliases:
            del data["results"][alias]
            data["baselines"].pop(alias, None)
            continue
        data["results"][alias] = [r for r in data["results"][alias] if r["at"] >= cut]
