"""Rule 9's follow-through: a change of a GPU's running context, its re-benchmark and its verdict. Pure.

The spec (Rule 9): "Verify: Re-benchmark after context change, confirm within 10% of target" and
"Escalate: If context can't be adjusted without significant perf loss". gpuheal does not change the
context itself (the recommendation names the exact ``--ctx-size``; an operator restarts the server);
it notices that the running context changed and then does the verify and escalate steps:

- **Seen between polls.** Each poll reads ``n_ctx`` (per slot) from llama-server's ``GET /props``
  (Lesson L3: the running state, not the config). The last value known is Rule 9's memory
  (``rules/context_window/memory.py``; its rows, :class:`ContextRow`, are typed here because the
  re-benchmark below reads and updates them), so cron's one-shot runs and ``replay`` see the same
  sequence. A value that differs from it is a context change. The first sighting is not a change; a
  poll that does not know ``n_ctx`` (server down, restarting, a fault, garbage) changes nothing, so
  a restart that keeps ``n_ctx`` is not a change either.
- **Re-benchmark**, through the one mechanism Rule 4's fixes use too (:mod:`gpuheal.core.rebench`). A
  change waits (``state: pending``, kept in Rule 9's row across runs) and asks for its re-benchmark
  (``remedy.py``: :func:`ask_for`, filed in ``rebench.json`` by ``check``); ``bench`` answers it with the
  latest successful result taken after the change at its new context (the next ``bench`` run that
  measures that GPU, ``bench --gpu ALIAS`` at once, or gpu-monitor's), compared with the target: the
  GPU's baseline (rolling or from the config, as Rules 4 and 9 use it) when the change was seen
  (:func:`verdict_on`).
- **Verdict.** At least ``floor_ratio`` of the target (Rule 9's ``reduce_below_ratio``, 0.9: "within
  10 %"; faster than the target is headroom, not a loss) → ``verified``. Below it → ``perf-loss``:
  Rule 9 reports the spec's escalation as its ``info`` issue (a recommendation: told once, never
  acted on). No target known → ``no-target`` (said, never guessed). While at a perf loss, each later
  result judges again, so a GPU whose speed comes back clears the escalation; a newer change
  replaces the record. The audit trail gets a line when the verdict is new, not every bench run; a new
  perf loss is also told to the humans, once per change (:func:`loss_message`: the old and new
  ``n_ctx``, the tok/s before and after, the ``--ctx-size`` to go back to).

Entry shape::

    {"n_ctx": int, "at_s": poll of that value,
     "change": None | {"from_n_ctx": int, "to_n_ctx": int, "at_s": seen at, "target_tok_s": float|None,
                       "state": "pending|verified|perf-loss|no-target", "gen_tok_s": float|None,
                       "ratio_pct": float|None, "checked_at_s": float|None}}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuheal.core import rebench
from gpuheal.core.memory import Memory, number
from gpuheal.parse.llama_metrics import known_n_ctx

MEMORY_KEY = "context"
ISSUE = "context-window"  # Rule 9's id (its rule module's ``ID``): the audit lines and asks name it

AWAITING_BENCH = "pending"  # the stored word: a change whose re-bench has not judged it yet
VERIFIED = "verified"
PERF_LOSS = "perf-loss"
NO_TARGET = "no-target"
STATES = (AWAITING_BENCH, VERIFIED, PERF_LOSS, NO_TARGET)
ESCALATION = "context can't be adjusted without significant perf loss"  # the spec's words (Rule 9)


@dataclass(frozen=True)
class ContextChange:
    """A running context that differs from the last one known (from → to, seen at ``at_s``)."""

    gpu: str
    from_n_ctx: int
    to_n_ctx: int
    at_s: float
    target_tok_s: float | None


@dataclass(frozen=True)
class Verdict:
    """The re-benchmark of a change: ``state`` is verified, perf-loss or no-target."""

    change: ContextChange
    state: str
    gen_tok_s: float
    ratio_pct: float | None
    measured_at_s: float
    previous: str = AWAITING_BENCH  # the change's state before this verdict (a new state is an audit line)
    before_tok_s: float | None = None  # the last result at the old context, before the change (not known: None)
    slots: int | None = None  # the re-benchmark's slot count (--ctx-size = per-slot n_ctx x slots)

    @property
    def is_news(self) -> bool:
        return self.state != self.previous


# --------------------------------------------------------------------------- the remembered rows


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """A change as remembered: from → to, seen at ``at_s``, its target, and its re-benchmark so far
    (``state`` pending / verified / perf-loss / no-target; the result that judged it last)."""

    from_n_ctx: int
    to_n_ctx: int
    at_s: float
    target_tok_s: float | None
    state: str
    gen_tok_s: float | None = None
    ratio_pct: float | None = None
    checked_at_s: float | None = None

    def to_json(self) -> dict[str, object]:
        return {"from_n_ctx": self.from_n_ctx, "to_n_ctx": self.to_n_ctx, "at_s": self.at_s,
                "target_tok_s": self.target_tok_s, "state": self.state, "gen_tok_s": self.gen_tok_s,
                "ratio_pct": self.ratio_pct, "checked_at_s": self.checked_at_s}

    @classmethod
    def load(cls, record: object) -> ChangeRecord | None:
        """A stored change; ``None`` when there is none or it is damaged (a number that is not one
        reads as not known)."""
        if not isinstance(record, dict):
            return None
        from_n_ctx, to_n_ctx = known_n_ctx(record.get("from_n_ctx")), known_n_ctx(record.get("to_n_ctx"))
        at_s, state = number(record.get("at_s")), record.get("state")
        if from_n_ctx is None or to_n_ctx is None or at_s is None or state not in STATES:
            return None
        return cls(from_n_ctx, to_n_ctx, at_s, _positive(record.get("target_tok_s")),
                   str(state), number(record.get("gen_tok_s")), number(record.get("ratio_pct")),
                   number(record.get("checked_at_s")))


@dataclass(frozen=True, slots=True)
class ContextRow:
    """A GPU's last running context known (``n_ctx`` at the poll ``at_s``) and its last change."""

    n_ctx: int | None
    at_s: float | None
    change: ChangeRecord | None

    def to_json(self) -> dict[str, object]:
        change = None if self.change is None else self.change.to_json()
        return {"n_ctx": self.n_ctx, "at_s": self.at_s, "change": change}

    @classmethod
    def load(cls, data: object) -> ContextRow | None:
        """A stored row, each part read on its own: a damaged ``n_ctx`` is not known (no change is
        seen against it), a damaged change is none."""
        if not isinstance(data, dict):
            return None
        return cls(known_n_ctx(data.get("n_ctx")), _float(data.get("at_s")), ChangeRecord.load(data.get("change")))


def rows(memory: Memory) -> dict[str, ContextRow]:
    """Rule 9's rows, by alias (live: an update is kept)."""
    return memory.rows(MEMORY_KEY, ContextRow.load)


def pending(change: ContextChange) -> ChangeRecord:
    """A change just seen: waiting for its re-benchmark."""
    return ChangeRecord(change.from_n_ctx, change.to_n_ctx, change.at_s, change.target_tok_s, AWAITING_BENCH)


# --------------------------------------------------------------------------- bench


def awaiting(memory: Memory, seen_at_s: float | None = None) -> dict[str, ContextChange]:
    """Changes still waiting for their re-benchmark, by alias (only those seen at ``seen_at_s``:
    this poll's, for its audit lines)."""
    out = {}
    for alias, row in rows(memory).items():
        if row.change is None or row.change.state != AWAITING_BENCH:
            continue
        change = change_of(alias, row.change)
        if seen_at_s is None or change.at_s == seen_at_s:
            out[alias] = change
    return out


def verdict_on(
    memory: Memory,
    ask: rebench.RebenchAsk,
    result: Mapping[str, Any],
    measure: rebench.Measure,
    results: Iterable[Mapping[str, Any]],
) -> Verdict | None:
    """The re-benchmark of the GPU's change that ``ask`` was raised for, answered by ``result`` (the
    latest successful result after it, :func:`gpuheal.core.rebench.answering`) and judged by ``measure``
    (:func:`gpuheal.core.rebench.measured`: ``tok_s >= floor_ratio * target``); ``None`` when the GPU's
    change is no longer that one (a newer change replaced it, or it was settled). Its row keeps the
    verdict: a verified change is done, a perf loss is judged again by the next result, so a GPU whose
    speed comes back clears the escalation. Mutates ``memory``."""
    book = rows(memory)
    row = book.get(ask.gpu)
    record = None if row is None else row.change
    judged = (AWAITING_BENCH, PERF_LOSS)
    if row is None or record is None or record.at_s != ask.asked_at_s or record.state not in judged:
        return None
    change = change_of(ask.gpu, record)
    measured_s, tok_s = _float(result.get("at")), _positive(result.get("gen_tok_s"))
    if measured_s is None or tok_s is None:
        return None
    if change.target_tok_s is None or measure.met is None:
        state, ratio_pct = NO_TARGET, None
    else:
        state, ratio_pct = (VERIFIED if measure.met else PERF_LOSS), measure.ratio_pct
    verdict = Verdict(change, state, tok_s, ratio_pct, measured_s, previous=record.state,
                      before_tok_s=before_tok_s(results, change), slots=_slots(result.get("slots")))
    book[ask.gpu] = replace(row, change=replace(record, state=state, gen_tok_s=round(tok_s, 2),
                                                ratio_pct=ratio_pct, checked_at_s=measured_s))
    return verdict


def ask_for(alias: str, record: ChangeRecord) -> rebench.RebenchAsk:
    """The re-benchmark a change asks for: the latest successful result after it (after the last one that
    judged it) at the context it went to, against the target kept when it was seen."""
    return rebench.RebenchAsk(alias, ISSUE, f"context change n_ctx {record.from_n_ctx} -> {record.to_n_ctx}",
                              record.at_s, rebench.NEW_RESULT, "asked", record.target_tok_s, record.to_n_ctx,
                              checked_at_s=record.checked_at_s)  # fmt: skip


def before_tok_s(results: Iterable[Mapping[str, Any]], change: ContextChange) -> float | None:
    """The tok/s of the last successful result before the change, at the old context (a result that
    names another context is not it); ``None`` when there is none."""
    best: tuple[float, float] | None = None
    for r in results:
        at, tok_s = _float(r.get("at")), _positive(r.get("gen_tok_s"))
        n_ctx = known_n_ctx(r.get("n_ctx"))
        if r.get("ok") is not True or at is None or tok_s is None or at >= change.at_s:
            continue
        if n_ctx is not None and n_ctx != change.from_n_ctx:
            continue
        if best is None or at > best[0]:
            best = (at, tok_s)
    return None if best is None else best[1]


def _slots(value: object) -> int | None:
    """A slot count believed: a whole number 1..4096 (``-np``); anything else is not known."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 4096 else None


# --------------------------------------------------------------------------- rule 9 and reports


def escalation(memory: Memory, alias: str, iso: Callable[[float], str]) -> dict[str, Any] | None:
    """The ``detected`` of Rule 9's escalation when the GPU's last change lost significant
    performance at its re-benchmark; ``None`` otherwise."""
    row = rows(memory).get(alias)
    record = None if row is None else row.change
    if record is None or record.state != PERF_LOSS:
        return None
    change = change_of(alias, record)
    return {"recommendation": "escalate", "escalation": ESCALATION, "from_n_ctx": change.from_n_ctx,
            "to_n_ctx": change.to_n_ctx, "changed_at": iso(change.at_s), "gen_tok_s": record.gen_tok_s,
            "target_tok_s": change.target_tok_s, "ratio_pct": record.ratio_pct}


def escalation_summary(alias: str, detected: dict[str, Any]) -> str:
    return (f"{alias}: {ESCALATION}: n_ctx {detected['from_n_ctx']} -> {detected['to_n_ctx']}, "
            f"re-benchmark {detected['gen_tok_s']} tok/s = {detected['ratio_pct']} % of target "
            f"{detected['target_tok_s']}")


def ctx_size_back(verdict: Verdict) -> tuple[int, str]:
    """The ``--ctx-size`` that puts the old context back (llama-server's flag is shared by its slots:
    per-slot ``n_ctx`` x ``slots``), and how it is made up."""
    slots = verdict.slots
    if slots is None:
        return verdict.change.from_n_ctx, "per slot: x -np if the server runs several"
    return verdict.change.from_n_ctx * slots, f"{verdict.change.from_n_ctx} per slot x {slots} slots"


def loss_message(verdict: Verdict, iso: Callable[[float], str]) -> str:
    """Rule 9's escalation, told to the humans once per change (issue 27 item 3): the GPU, the old and
    new ``n_ctx``, the tok/s before and after, and the ``--ctx-size`` to go back to."""
    change = verdict.change
    size, made_of = ctx_size_back(verdict)
    if verdict.before_tok_s is not None:
        before = f"{_tok(verdict.before_tok_s)} tok/s before (last result at n_ctx {change.from_n_ctx})"
    else:
        before = "no result before it at the old context"
    target = "" if change.target_tok_s is None else (
        f", {verdict.ratio_pct:g} % of its {_tok(change.target_tok_s)} tok/s target" if verdict.ratio_pct is not None
        else f", target {_tok(change.target_tok_s)} tok/s")
    return (f"{change.gpu}: {ESCALATION} (Rule 9): n_ctx {change.from_n_ctx} -> {change.to_n_ctx} "
            f"(changed at {iso(change.at_s)}); re-benchmark {_tok(verdict.gen_tok_s)} tok/s after, {before}"
            f"{target}. To go back: restart llama-server with --ctx-size {size} ({made_of})")


def _tok(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def change_fields(change: ContextChange, iso: Callable[[float], str]) -> dict[str, Any]:
    """What the audit trail and ``bench --json`` say about a change: from, to, when, target."""
    return {"from_n_ctx": change.from_n_ctx, "to_n_ctx": change.to_n_ctx, "changed_at": iso(change.at_s),
            "target_tok_s": change.target_tok_s}


def verdict_fields(verdict: Verdict, iso: Callable[[float], str]) -> dict[str, Any]:
    return {"gpu": verdict.change.gpu, **change_fields(verdict.change, iso), "state": verdict.state,
            "gen_tok_s": round(verdict.gen_tok_s, 2), "ratio_pct": verdict.ratio_pct,
            "measured_at": iso(verdict.measured_at_s)}


def detected_audit(change: ContextChange, iso: Callable[[float], str], run_id: str) -> dict[str, Any]:
    """The audit line of a change seen by a poll (``run_id``: the run's that saw it): a re-benchmark is now due."""
    return _audit(run_id, change.gpu, iso(change.at_s), {"context_change": change_fields(change, iso)},
                  "context-change", AWAITING_BENCH, None, False)


def verdict_audit(verdict: Verdict, now_iso: str, iso: Callable[[float], str], run_id: str) -> dict[str, Any]:
    """The audit line of a re-benchmark's verdict; a perf loss is the spec's escalation, told once."""
    fields = verdict_fields(verdict, iso)
    proof = {k: fields[k] for k in ("gen_tok_s", "target_tok_s", "ratio_pct", "measured_at")}
    proof["before_tok_s"] = verdict.before_tok_s
    result = {VERIFIED: "resolved", PERF_LOSS: "escalated", NO_TARGET: "failed"}[verdict.state]
    detected: dict[str, Any] = {"context_change": change_fields(verdict.change, iso), "verdict": verdict.state}
    if verdict.state == PERF_LOSS:
        detected["escalation"] = ESCALATION
        detected["ctx_size_back"] = ctx_size_back(verdict)[0]
    return _audit(run_id, verdict.change.gpu, now_iso, detected, "re-benchmark", result, proof,
                  verdict.state == PERF_LOSS)


def _audit(run_id: str, gpu: str, at: str, detected: dict[str, Any], action: str, result: str,
           verification: dict[str, Any] | None, escalated: bool) -> dict[str, Any]:
    return {"run_id": run_id, "timestamp": at, "gpu": gpu, "issue": ISSUE, "detected": detected,
            "action": action, "result": result, "verification": verification, "escalated": escalated}


# --------------------------------------------------------------------------- values, tolerant


def change_of(alias: str, record: ChangeRecord) -> ContextChange:
    return ContextChange(alias, record.from_n_ctx, record.to_n_ctx, record.at_s, record.target_tok_s)


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return None
    return float(value) if abs(value) != float("inf") else None


def _positive(value: object) -> float | None:
    got = _float(value)
    return got if got is not None and got > 0 else None
