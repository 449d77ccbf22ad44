"""Re-benchmarks: what only a benchmark can prove — one mechanism for Rules 4 and 9. Pure: documents
and numbers in, records and verdicts out; ``now_s`` a parameter.

The spec verifies two things by benchmarking again: Rule 4's fix ("Benchmark returns to within 10% of
baseline") and Rule 9's context change ("Re-benchmark after context change, confirm within 10% of
target"). Both go the same way, through one typed record (:class:`RebenchAsk`) in one store
(:class:`Asks`, ``rebench.json``):

1. **asked** — by a fix, through its attempt (:class:`Ask` on the
   :class:`~gpuheal.core.remedy.Execution`: Rule 4 after a restored power limit; ``heal`` files it with
   the heal run that applied it), or by a rule's ``Remedy.asks`` hook from what its memory folded in
   this poll (Rule 9: a change of the GPU's running context, :mod:`gpuheal.rules.context_window.change`);
2. **answered** by ``gpuheal bench`` (:mod:`gpuheal.steps.rebench`): the result the ask names
   (:func:`answering`: the GPU's result of the next bench run, or the latest successful result
   recorded after it, at its context) judged by :func:`judge` — the one measure, the result against
   ``floor_ratio`` × the target (the baseline at the answer, or the target kept when asked);
3. **the verdict reaches its owner**: the rule's ``Remedy.rebenched`` hook says what it means
   (:class:`Told`: audit lines, messages, what ``bench --json`` shows, whether the ask stays open);
   without one, :func:`prove_fix` — a fix the re-benchmark disproved is noted and the next ``heal``
   fails its attempt (:meth:`Asks.disproved`, for any issue), so the regression escalates instead of
   waiting out its window.

``rebench.json`` (``data``)::

    {"asks": [{"gpu", "issue", "why", "asked_at_s", "answered_by", "against", "target_tok_s",
               "at_n_ctx", "attempt", "action", "checked_at_s"}, ...],
     "failed": {ALIAS: {"issue", "attempt", "at"}}}

An older release's document, ``{"due": {ALIAS: {"issue", "reason", "requested_at", "attempt",
"action"}}, "failed": ...}``, reads as the same asks (:meth:`Asks.load`); a damaged entry is dropped and
counted (``dropped``), never trusted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from gpuheal.core.heal_state import num  # a finite number as stored; None for junk (huge ints too)
from gpuheal.parse.llama_metrics import known_n_ctx

if TYPE_CHECKING:
    from gpuheal.core.alert import Alert
    from gpuheal.core.memory import Memory

NEXT_BENCH: Literal["next-bench"] = "next-bench"
NEW_RESULT: Literal["new-result"] = "new-result"
AnsweredBy = Literal["next-bench", "new-result"]
Against = Literal["baseline", "asked"]


@dataclass(frozen=True)
class Ask:
    """A fix that only a benchmark can prove asks for one: why, and the action that applied it."""

    reason: str
    action: str


@dataclass(frozen=True)
class RebenchAsk:
    """One re-benchmark asked for, until it is answered.

    ``answered_by``: ``next-bench`` — the GPU's result in the next ``gpuheal bench`` run, failed or not
    (a fix is proved by the bench that follows it, Rule 4); ``new-result`` — the latest successful result
    recorded after the ask (or after ``checked_at_s``, the last one that judged it), from any source,
    at ``at_n_ctx`` when set (Rule 9: the context the change went to).
    ``against``: ``baseline`` — the GPU's baseline when the answer comes; ``asked`` — ``target_tok_s``,
    kept when asked (``None``: no target known, which the verdict says).
    ``attempt`` / ``action``: the heal run that applied the fix, and its action (the audit line's)."""

    gpu: str
    issue: str
    why: str
    asked_at_s: float
    answered_by: AnsweredBy = NEXT_BENCH
    against: Against = "baseline"
    target_tok_s: float | None = None
    at_n_ctx: int | None = None
    attempt: str = ""
    action: str = ""
    checked_at_s: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.gpu, self.issue

    def to_json(self) -> dict[str, object]:
        return {"gpu": self.gpu, "issue": self.issue, "why": self.why, "asked_at_s": self.asked_at_s,
                "answered_by": self.answered_by, "against": self.against, "target_tok_s": self.target_tok_s,
                "at_n_ctx": self.at_n_ctx, "attempt": self.attempt, "action": self.action,
                "checked_at_s": self.checked_at_s}  # fmt: skip

    @classmethod
    def load(cls, data: object) -> RebenchAsk | None:
        """A stored ask; ``None`` when damaged (no GPU or issue named). A damaged optional value reads
        as not known."""
        if not isinstance(data, Mapping):
            return None
        gpu, issue = data.get("gpu"), data.get("issue")
        if not isinstance(gpu, str) or not gpu or not isinstance(issue, str):
            return None
        by = data.get("answered_by")
        against = data.get("against")
        return cls(gpu, issue, _text(data.get("why")), num(data.get("asked_at_s")) or 0.0,
                   NEW_RESULT if by == NEW_RESULT else NEXT_BENCH, "asked" if against == "asked" else "baseline",
                   _positive(data.get("target_tok_s")),
                   known_n_ctx(data.get("at_n_ctx")),
                   _text(data.get("attempt")), _text(data.get("action")), num(data.get("checked_at_s")))

    @classmethod
    def from_mark(cls, gpu: str, mark: object) -> RebenchAsk | None:
        """An older release's ``rebench.json`` mark (``{"issue", "reason", "requested_at", "attempt",
        "action"}``): a fix's ask, answered by the next bench, against the baseline then."""
        if not isinstance(mark, Mapping) or not isinstance(mark.get("issue"), str):
            return None
        return cls(gpu, mark["issue"], _text(mark.get("reason")), num(mark.get("requested_at")) or 0.0,
                   attempt=_text(mark.get("attempt")), action=_text(mark.get("action")))


@dataclass(frozen=True)
class Disproved:
    """A re-benchmark that did not prove the fix of ``attempt`` (its heal run) for ``issue``."""

    issue: str
    attempt: str
    at_s: float


@dataclass(frozen=True)
class Asks:
    """The one store of re-benchmarks asked for (``rebench.json``), one ask per (GPU, issue), and the
    fixes a re-benchmark disproved (one per GPU, the latest). ``dropped``: damaged entries not loaded."""

    asks: tuple[RebenchAsk, ...] = ()
    failed: Mapping[str, Disproved] = field(default_factory=dict)
    dropped: int = 0

    @classmethod
    def load(cls, doc: object) -> Asks:
        """The store from ``rebench.json``'s ``data`` — this release's shape or an older one's ``due``
        marks — tolerant of anything: what is damaged is dropped and counted."""
        if not isinstance(doc, Mapping):
            return cls(dropped=0 if doc is None or doc == {} else 1)
        got: list[RebenchAsk | None] = []
        raw_asks = doc.get("asks")
        if isinstance(raw_asks, list):
            got += [RebenchAsk.load(a) for a in raw_asks]
        raw_due = doc.get("due")  # an older release's marks, by GPU
        if isinstance(raw_due, Mapping):
            got += [RebenchAsk.from_mark(str(g), m) for g, m in raw_due.items()]
        store = cls()
        for ask in got:
            store = store.with_ask(ask) if ask is not None else store
        raw_failed = doc.get("failed")
        failed: dict[str, Disproved] = {}
        bad_failed = 0
        if isinstance(raw_failed, Mapping):
            for gpu, entry in raw_failed.items():
                if isinstance(entry, Mapping) and isinstance(entry.get("issue"), str):
                    failed[str(gpu)] = Disproved(entry["issue"], _text(entry.get("attempt")),
                                                 num(entry.get("at")) or 0.0)
                else:
                    bad_failed += 1
        bad = sum(a is None for a in got) + bad_failed
        bad += int("asks" in doc and not isinstance(raw_asks, list))
        bad += int("due" in doc and not isinstance(raw_due, Mapping))
        bad += int("failed" in doc and not isinstance(raw_failed, Mapping))
        return cls(store.asks, failed, bad)

    def to_json(self) -> dict[str, object]:
        return {"asks": [a.to_json() for a in self.asks],
                "failed": {g: {"issue": d.issue, "attempt": d.attempt, "at": d.at_s} for g, d in self.failed.items()}}

    def with_ask(self, ask: RebenchAsk) -> Asks:
        """The store with ``ask`` in place of any earlier ask of its GPU and issue (a newer one replaces it)."""
        return replace(self, asks=(*(a for a in self.asks if a.key != ask.key), ask))

    def ask(self, gpu: str, issue: str) -> RebenchAsk | None:
        return next((a for a in self.asks if a.key == (gpu, issue)), None)

    def with_failure(self, ask: RebenchAsk, now_s: float) -> Asks:
        """The store noting that the re-benchmark ``ask`` asked for did not prove its fix."""
        return replace(self, failed={**self.failed, ask.gpu: Disproved(ask.issue, ask.attempt, now_s)})

    def disproved(self, gpu: str, issue: str, run_id: str | None) -> bool:
        """Whether a re-benchmark showed the fix of attempt ``run_id`` (its heal run) did not work."""
        entry = self.failed.get(gpu)
        return bool(entry and run_id and entry.issue == issue and entry.attempt == run_id)

    def merged(self, raised: Iterable[RebenchAsk]) -> tuple[Asks, tuple[RebenchAsk, ...]]:
        """The store with each ask a rule's memory holds filed (a newer one of its GPU and issue replaces
        the stored one; the same one is kept as stored, with what judged it so far), and those new."""
        store, new = self, list[RebenchAsk]()
        for ask in raised:
            stored = store.ask(*ask.key)
            if stored is None or stored.asked_at_s != ask.asked_at_s:
                store, new = store.with_ask(ask), [*new, ask]
        return store, tuple(new)


# --------------------------------------------------------------------------- the answer


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
    return Measure(num(tok_s), num(target_tok_s), num(floor_ratio))


@runtime_checkable
class FloorRatio(Protocol):
    """A rule's parameters that say what share of the target a re-benchmark must reach (Rule 4: back
    within ``recovered_within_ratio`` of the baseline; Rule 9: ``reduce_below_ratio`` of the target)."""

    @property
    def rebench_floor_ratio(self) -> float: ...


def answering(
    ask: RebenchAsk, recorded: Iterable[Mapping[str, Any]], benched: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """The result that answers ``ask`` now (``None``: not yet): ``benched`` (this bench run's result of
    the GPU) for a fix's ask; else the latest successful result ``recorded`` after the ask (after the
    last one that judged it) at the ask's context — a result naming another context is not it."""
    if ask.answered_by == NEXT_BENCH:
        return benched
    after_s = ask.checked_at_s or ask.asked_at_s
    best: tuple[float, Mapping[str, Any]] | None = None
    for r in recorded:
        at, n_ctx = num(r.get("at")), known_n_ctx(r.get("n_ctx"))
        if ask.at_n_ctx is not None and n_ctx is not None and n_ctx != ask.at_n_ctx:
            continue  # measured at yet another context, one the polls have not seen yet
        if r.get("ok") is True and at is not None and _positive(r.get("gen_tok_s")) is not None and at > after_s:
            if best is None or at > best[0]:
                best = (at, r)
    return None if best is None else best[1]


def measured(ask: RebenchAsk, result: Mapping[str, Any], baseline_tok_s: Any, floor_ratio: Any) -> Measure:
    """The answer judged: its tok/s (a failed benchmark's is not known) against the ask's target."""
    tok_s = result.get("gen_tok_s") if result.get("ok") else None
    target = baseline_tok_s if ask.against == "baseline" else ask.target_tok_s
    return judge(tok_s, target, floor_ratio)


def measured_at(result: Mapping[str, Any], otherwise: float | None) -> float | None:
    """When the answering result was measured (``otherwise`` when it does not say)."""
    at = num(result.get("at"))
    return otherwise if at is None else at


@dataclass(frozen=True)
class Rebenched:
    """What a ``Remedy.rebenched`` hook sees: the ask, the result that answered it and its measure, the
    GPU's recorded results, the rules' memory (the rule reads and updates its own rows) and the clock."""

    ask: RebenchAsk
    result: Mapping[str, Any]
    measure: Measure
    results: tuple[Mapping[str, Any], ...]
    memory: Memory
    now_s: float
    now_iso: str


@dataclass(frozen=True)
class Told:
    """What a verdict means, as its rule says: audit lines (without ``run_id``: the answerer gives each
    the fix's heal run, or this run's), messages for the humans, the entry ``bench --json`` shows under
    ``section`` (by GPU when ``by_gpu``, else in a list), whether the ask stays open (``keep``: judged
    again by a later result) and whether it failed the attempt that asked (``disproves``)."""

    audit: tuple[dict[str, Any], ...] = ()
    alerts: tuple[Alert, ...] = ()
    section: str = ""
    shown: Mapping[str, Any] | None = None
    by_gpu: bool = False
    keep: bool = False
    disproves: bool = False


@dataclass(frozen=True)
class Raised:
    """An ask a rule's memory holds (``Remedy.asks``), with its audit line when this poll saw it first."""

    ask: RebenchAsk
    line: dict[str, Any] | None = None


def prove_fix(r: Rebenched) -> Told:
    """The verdict on a fix (any rule's without a hook of its own; Rule 4's: "Verify: benchmark returns
    to within 10% of baseline"): what the re-benchmark proved, against the level at which the regression
    counts as recovered; one audit line (phase ``rebench``); a fix it disproved fails its attempt."""
    result, measure = r.result, r.measure
    proof = {
        "rebench_tok_s": result.get("gen_tok_s") if result.get("ok") else None,
        "baseline_tok_s": measure.target_tok_s,
        "recovered_tok_s": measure.level_tok_s if measure.known else None,
        "within_threshold": measure.met,
        "fix": r.ask.why,
        "error": result.get("error"),
    }
    verdict = "pending" if measure.met is None else "resolved" if measure.met else "failed"
    line = {"timestamp": r.now_iso, "gpu": r.ask.gpu, "issue": r.ask.issue or "unknown", "detected": {},
            "action": r.ask.action or "re-benchmark", "result": verdict, "verification": proof,
            "escalated": False, "phase": "rebench"}  # fmt: skip
    return Told(audit=(line,), section="rebench", shown=proof, by_gpu=True, disproves=verdict == "failed")


# --------------------------------------------------------------------------- values, tolerant


def _positive(value: Any) -> float | None:
    got = num(value)
    return got if got is not None and got > 0 else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
