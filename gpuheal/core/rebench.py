"""Re-benchmarks asked for by a fix (Rule 4's verify: "Benchmark returns to within 10% of baseline").
Pure: the ``rebench.json`` document in, the document out; ``now_s`` a parameter.

``heal`` marks a GPU when a fix that only a benchmark can prove was applied (a restored power limit);
the next ``gpuheal bench`` run that benchmarks that GPU (``bench`` or ``bench --gpu ALIAS``) takes the
mark and writes what its result proved to the audit trail. Stored as
``{"due": {ALIAS: {"issue", "reason", "requested_at", "attempt", "action"}}, "failed": {ALIAS: {"issue",
"attempt", "at"}}}``; a damaged entry is dropped. ``failed``: a re-benchmark that did not reach the
recovered level, so that the next ``heal`` fails the attempt it was verifying at once (Rule 4:
"Escalate after: persistent regression") instead of waiting out its window.
"""

from __future__ import annotations

from typing import Any


def due(doc: Any, part: str = "due") -> dict[str, dict[str, Any]]:
    """The marks of a stored document (``part``: ``due`` or ``failed``), tolerant of anything."""
    marks = doc.get(part) if isinstance(doc, dict) else None
    if not isinstance(marks, dict):
        return {}
    return {str(g): m for g, m in marks.items() if isinstance(m, dict) and isinstance(m.get("issue"), str)}


def marked(
    doc: Any, gpu: str, issue: str, reason: str, now_s: float, attempt: str = "", action: str = ""
) -> dict[str, Any]:
    marks = due(doc)
    marks[gpu] = {"issue": issue, "reason": reason, "requested_at": now_s, "attempt": attempt, "action": action}
    return {"due": marks, "failed": due(doc, "failed")}


def taken(doc: Any, gpus: list[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The document without the marks of ``gpus`` (benchmarked now), and those marks."""
    marks = due(doc)
    took = {g: marks.pop(g) for g in gpus if g in marks}
    return {"due": marks, "failed": due(doc, "failed")}, took


def with_failure(doc: Any, gpu: str, mark: dict[str, Any], now_s: float) -> dict[str, Any]:
    """``doc`` noting that the re-benchmark ``mark`` asked for did not prove the fix."""
    failed = due(doc, "failed")
    failed[gpu] = {"issue": mark["issue"], "attempt": mark.get("attempt"), "at": now_s}
    return {"due": due(doc), "failed": failed}


def disproved(doc: Any, gpu: str, issue: str, run_id: str | None) -> bool:
    """Whether a re-benchmark showed the fix of attempt ``run_id`` (its heal run) did not work."""
    entry = due(doc, "failed").get(gpu)
    return bool(entry and run_id and entry.get("issue") == issue and entry.get("attempt") == run_id)


def proof(mark: dict[str, Any], result: dict[str, Any], baseline_tok_s: Any, within_ratio: Any) -> dict[str, Any]:
    """What one re-benchmark proved: its tok/s against the level at which the regression counts as
    recovered, ``baseline × (1 − within_ratio)`` (Rule 4's verify: "within 10% of baseline")."""
    tok_s = result.get("gen_tok_s") if result.get("ok") else None
    values = (tok_s, baseline_tok_s, within_ratio)
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    recovered = round(float(baseline_tok_s) * (1 - within_ratio), 2) if numbers else None
    return {
        "rebench_tok_s": tok_s,
        "baseline_tok_s": baseline_tok_s,
        "recovered_tok_s": recovered,
        "within_threshold": None if recovered is None else float(tok_s) >= recovered,  # type: ignore[arg-type]
        "fix": mark.get("reason"),
        "error": result.get("error"),
    }
