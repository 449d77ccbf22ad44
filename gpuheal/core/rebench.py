"""Re-benchmarks: what only a benchmark can prove, one mechanism for Rules 4 and 9. Pure: documents and
numbers in, documents and verdicts out; ``now_s`` a parameter.

The spec verifies two things by benchmarking again: Rule 4's fix ("Benchmark returns to within 10% of
baseline") and Rule 9's context change ("Re-benchmark after context change, confirm within 10% of
target"). Both go the same way:

1. **asked**: a fix asks for one through its attempt (:class:`Ask` on the
   :class:`~gpuheal.core.remedy.Execution`: Rule 4 after a restored power limit), and ``heal`` files it
   under the GPU in ``rebench.json`` (:func:`marked`) with the heal run that applied it; a change of a
   GPU's running context is asked by the poll that sees it, kept in Rule 9's memory row
   (:mod:`gpuheal.rules.context_window.change`);
2. **answered** by the next ``gpuheal bench`` that measures that GPU (:func:`taken`), judged by
   :func:`judge` — the one measure: the result against ``floor_ratio`` × the target (Rule 4: the
   baseline, ``1 − recovered_within_ratio``; Rule 9: the baseline when the change was seen,
   ``reduce_below_ratio``), with the ratio and the level it had to reach;
3. **the verdict reaches its owner**: a fix a re-benchmark disproved is noted (:func:`with_failure`) and
   the next ``heal`` fails its attempt (:func:`disproved`, for any issue), so the regression escalates
   instead of waiting out its window; a context change at a perf loss is Rule 9's ``info`` issue.

``rebench.json``: ``{"due": {ALIAS: {"issue", "reason", "requested_at", "attempt", "action"}}, "failed":
{ALIAS: {"issue", "attempt", "at"}}}``; a damaged entry is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ask:
    """A fix that only a benchmark can prove asks for one: why, and the action that applied it."""

    reason: str
    action: str


@dataclass(frozen=True)
class Measure:
    """One re-benchmark judged: ``tok_s`` against ``floor_ratio`` × ``target_tok_s``. ``met`` is ``None``
    when a figure is not known (a failed benchmark, no baseline)."""

    tok_s: float | None
    target_tok_s: float | None
    floor_ratio: float | None

    @property
    def known(self) -> bool:
        return self.tok_s is not None and self.target_tok_s is not None and self.floor_ratio is not None

    @property
    def level_tok_s(self) -> float | None:
        """The speed that counts as back (shown to 2 decimals)."""
        if self.target_tok_s is None or self.floor_ratio is None:
            return None
        return round(self.target_tok_s * self.floor_ratio, 2)

    @property
    def ratio_pct(self) -> float | None:
        if self.tok_s is None or not self.target_tok_s:
            return None
        return round(100 * self.tok_s / self.target_tok_s, 1)

    @property
    def met(self) -> bool | None:
        if self.tok_s is None or self.target_tok_s is None or self.floor_ratio is None:
            return None
        return self.tok_s >= self.target_tok_s * self.floor_ratio


def judge(tok_s: Any, target_tok_s: Any, floor_ratio: Any) -> Measure:
    """The one measure of a re-benchmark; a figure that is not a number is not known."""
    return Measure(_number(tok_s), _number(target_tok_s), _number(floor_ratio))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(value)


# --------------------------------------------------------------------------- rebench.json


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


def proof(mark: dict[str, Any], result: dict[str, Any], baseline_tok_s: Any, floor_ratio: Any) -> dict[str, Any]:
    """What one re-benchmark of a fix proved (the audit line's ``verification``, ``bench --json``):
    its tok/s against the level at which the regression counts as recovered."""
    tok_s = result.get("gen_tok_s") if result.get("ok") else None
    measure = judge(tok_s, baseline_tok_s, floor_ratio)
    return {
        "rebench_tok_s": tok_s,
        "baseline_tok_s": baseline_tok_s,
        "recovered_tok_s": measure.level_tok_s if measure.known else None,
        "within_threshold": measure.met,
        "fix": mark.get("reason"),
        "error": result.get("error"),
    }
