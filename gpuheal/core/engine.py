"""The issue lifecycle, owned once for every rule (design: "like Prometheus's ``for:``"). Pure.

A rule only says what it sees this poll (:func:`detect` → a :class:`~gpuheal.core.issue.Finding`, ``False`` for
"quiet", ``None`` for "not known"); the engine turns that into issues:

- **hold**: a finding must hold for the rule's ``hold_polls`` consecutive polls (and, where the rule
  has one, longer than ``hold_s`` since it started) before the issue goes ``pending`` → ``firing``;
  or, where the rule sets ``min_probes``, for ``hold_s`` seconds of evidence over at least that many
  probes (:func:`held`: a ``heal`` run's re-probes of a hard fault count, ``core/confirm.py``).
  Rule 1 fires at the 2nd consecutive hot poll, Rule 6/7 at the 3rd, Rule 3 at the 2nd bad poll
  30 s+ after the first (contract "Rule timing").
- **missing data**: a poll where the rule cannot know (``None``, a muted GPU, a source the rule needs
  being down) neither advances nor resets the hold and never clears an issue.
- **clearing**: a pending issue whose finding stops holding is dropped (it never fired); a firing
  issue resolves only when the rule's recovery condition holds (``recovered``: clear-side
  hysteresis, e.g. thermal clears below 80 °C, not at 85 °C) for ``clear_polls`` polls.
- **inhibition** (a rule's ``INHIBITS``): a firing issue of a rule that inhibits ``"host"`` (an
  unreachable host) freezes and hides that GPU's other issues; one that inhibits ``"monitor"`` (the
  GPU data source down) freezes and hides the issues of the rules whose signals that poll did not
  deliver (reported as not known — neither healthy nor hot); one that inhibits a set of issue ids
  freezes and hides those issues on that GPU (a rejected API key hides the symptoms a restart cannot
  fix: L1/L2). Hidden issues stay in the book and come back, or resolve, once the inhibitor resolves.
- **memory** (a rule's ``remember``): before any rule detects, :func:`remember` folds the poll into
  what each rule keeps between polls (:mod:`gpuheal.core.memory`: missing data, a poll seen twice, a
  damaged row and a GPU gone are handled there and here, once).
- **muting**: a GPU inside ``heal``'s startup grace is not evaluated at all.
- **verifying** (contract "Issue state after a remediation"): a firing issue whose remediation ran
  and passed its own checks (``heal``'s ``pending`` attempt, :class:`~gpuheal.core.view.Verifying`)
  is reported ``"state": "verifying"`` — its pre-action evidence moved under
  ``detected.before_action`` — until a poll from the attempt's ``judge_from_s`` on sees it still
  broken (the rule's finding, or its recovery condition not met: ``firing`` again) or it resolves.
  The book keeps it ``firing``: the lifecycle does not change, only what is reported.

The issue book (:class:`IssueBook`) is what the caller stores between runs (``issues.json``), so
cron's one-shot runs behave like one long-lived evaluator, and ``replay`` keeps it in memory. In
memory it is typed: :class:`~gpuheal.core.issue.IssueRecord` per open issue, :class:`Transition` per logged change, and
every change of an issue's state is one line of :data:`TRANSITIONS` (as ``core/verify.py`` does
for attempts, after h11's state tables). On disk it keeps the shape earlier versions wrote, so a
state directory from before stays readable both ways::

    {"version": 1,
     "issues": {"ALIAS|ISSUE-ID": RECORD},
     "memory": {KEY: {SUBJECT: ROW}}, # what the rules remember (core/memory.Memory)
     "log":    [TRANSITION, ...]}     # the last LOG_MAX transitions, oldest first

``since`` is kept once, as ``since_s``; the ISO text is derived (and still written, for the
readers of ``issues.json`` and older versions).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpuheal.clock import format_epoch
from gpuheal.config.model import EngineParams
from gpuheal.core import timing
from gpuheal.core.issue import Finding, Issue, IssueRecord, IssueState, reported
from gpuheal.core.memory import Memory
from gpuheal.core.rule import Detection, Rule
from gpuheal.core.view import NO_PARAMS, FleetView
from gpuheal.signals import Signal, unmet

BOOK_VERSION = 1
LOG_MAX = 1000
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
FLEET = "fleet"



class Event(StrEnum):
    """A logged change of an issue (the ``event`` of a transition)."""

    PENDING = "pending"  # a finding opened it; it holds for hold_polls / hold_s before firing
    FIRING = "firing"
    RESOLVED = "resolved"  # a firing issue recovered for clear_polls polls
    DROPPED = "dropped"  # a pending issue whose finding stopped holding: it never fired


PENDING = IssueState.PENDING
FIRING = IssueState.FIRING
RESOLVED = Event.RESOLVED
DROPPED = Event.DROPPED

# Every allowed change: (state before or None for "not in the book", event) -> state after or
# None for "out of the book". Anything else is a BadTransition (a programming error, never data).
# An issue whose hold is met on its first poll is created pending and fires the same poll: only
# its ``firing`` is logged.
TRANSITIONS: dict[tuple[IssueState | None, Event], IssueState | None] = {
    (None, Event.PENDING): IssueState.PENDING,
    (IssueState.PENDING, Event.FIRING): IssueState.FIRING,
    (IssueState.PENDING, Event.DROPPED): None,
    (IssueState.FIRING, Event.RESOLVED): None,
}


class BadTransition(ValueError):
    """An event the issue's state does not allow."""



@dataclass
class Evaluation:
    """One evaluation's outcome.

    ``issues``: the open (pending + firing) issues to report (:class:`~gpuheal.core.issue.Issue`: the
    contract's shape is its ``to_json``), worst first;
    ``fired``/``resolved``: what changed state this run (``resolved`` carry ``resolved_at``);
    ``transitions``: every change (``pending``, ``firing``, ``resolved``, ``dropped``), for the
    replay timeline; ``inhibited``: open issues hidden by an inhibitor (with ``inhibited_by``);
    ``muted``: GPUs inside a startup grace; ``tolerance_s``: the poll jitter tolerance this
    evaluation counted time with (core/timing), for ``heal`` to judge its attempts by the same;
    ``memory``: the book's memory after it (``check`` shows each GPU's decode progress from it).
    """

    issues: list[Issue] = field(default_factory=list)
    fired: list[Issue] = field(default_factory=list)
    resolved: list[Issue] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    inhibited: list[Issue] = field(default_factory=list)
    muted: list[str] = field(default_factory=list)
    tolerance_s: float = timing.TOLERANCE_S
    memory: Memory = field(default_factory=Memory)  # the book's memory after it (decode progress)


# --------------------------------------------------------------------------- the book


@dataclass(frozen=True, slots=True)
class Transition:
    """One logged change of an issue (the book's ``log``, ``replay``'s timeline)."""

    at: str  # ISO text of the poll
    gpu: str
    issue: str
    severity: str
    event: Event
    since: str
    summary: str
    detected: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "gpu": self.gpu,
            "issue": self.issue,
            "severity": self.severity,
            "event": str(self.event),
            "since": self.since,
            "summary": self.summary,
            "detected": self.detected,
        }

    @classmethod
    def from_json(cls, data: Any) -> Transition | None:
        """A stored transition; ``None`` when damaged (an unknown event, a text field that is not text). Read
        for every line of the book's log at every cron run: the events and the text fields are named once."""
        if not isinstance(data, dict) or data.get("event") not in _EVENTS:
            return None
        get = data.get
        at, gpu, issue, severity, since, summary = (get("at"), get("gpu"), get("issue"), get("severity"),
                                                    get("since"), get("summary"))
        if not (isinstance(at, str) and isinstance(gpu, str) and isinstance(issue, str)
                and isinstance(severity, str) and isinstance(since, str) and isinstance(summary, str)):
            return None
        detected = get("detected")
        event = data["event"]
        return cls(at, gpu, issue, severity, _EVENT_OF.get(event) or Event(event), since, summary,
                   detected if isinstance(detected, dict) else {})


_EVENTS: tuple[Event, ...] = tuple(Event)  # what a stored transition's event may be (compared as text)
_EVENT_OF: dict[str, Event] = {str(e): e for e in Event}  # the stored text's event, without the enum's lookup
# a stored transition exactly as Transition.to_json writes it: these keys in this order (see TransitionLog)
_LINE_KEYS = ["at", "gpu", "issue", "severity", "event", "since", "summary", "detected"]


def _as_written(line: Any) -> bool:
    """Whether a stored line of the log is one :meth:`Transition.to_json` writes — these keys in this order, an
    event's text, text where text goes, a ``detected`` object — so that reading it and writing it back gives
    it back, the same JSON (anything else is read and written again: :meth:`Transition.from_json`)."""
    if type(line) is not dict or list(line) != _LINE_KEYS:
        return False
    at, gpu, issue, severity, event, since, summary, detected = line.values()
    return (type(event) is str and event in _EVENT_OF and type(at) is str and type(gpu) is str
            and type(issue) is str and type(severity) is str and type(since) is str and type(summary) is str
            and type(detected) is dict)


class TransitionLog:
    """The book's ``log``: the last :data:`LOG_MAX` transitions, oldest first.

    The lines read from ``issues.json`` stay as read, each one shown at load to be what
    :meth:`Transition.to_json` writes (a line written otherwise is read and written again: the same as
    decoding it), until something reads them as transitions: the engine only appends to the log and
    writes it, and at every cron run decoding the whole log into records and encoding it back was work
    for the same JSON."""

    __slots__ = ("_added", "_stored")

    def __init__(self, transitions: Iterable[Transition] = ()) -> None:
        self._stored: list[dict[str, Any]] = []  # older lines, as written (see _as_written)
        self._added: list[Transition] = list(transitions)  # newer ones, as logged

    @classmethod
    def from_json(cls, data: list[Any]) -> TransitionLog:
        """The stored log; a damaged line is dropped (:meth:`Transition.from_json`), the last
        :data:`LOG_MAX` kept."""
        log = cls()
        kept = log._stored
        for line in data:
            if _as_written(line):
                kept.append(line)
            else:
                t = Transition.from_json(line)
                if t is not None:
                    kept.append(t.to_json())
        del kept[: max(0, len(kept) - LOG_MAX)]
        return log

    def to_json(self) -> list[dict[str, Any]]:
        return [*self._stored, *(t.to_json() for t in self._added)]

    def append(self, t: Transition) -> None:
        self._added.append(t)

    def trim(self, keep: int) -> None:
        """Only the last ``keep`` transitions stay."""
        drop = max(0, len(self) - keep)
        stored = min(drop, len(self._stored))
        del self._stored[:stored]
        del self._added[: drop - stored]

    def __len__(self) -> int:
        return len(self._stored) + len(self._added)

    def __iter__(self) -> Iterator[Transition]:
        for line in self._stored:
            t = Transition.from_json(line)
            assert t is not None  # shown at load
            yield t
        yield from self._added

    def __getitem__(self, index: int) -> Transition:
        return list(self)[index]


@dataclass
class IssueBook:
    """The engine's state between polls: the open issues by ``ALIAS|ISSUE-ID``, what the rules
    remember (:class:`~gpuheal.core.memory.Memory`) and the last :data:`LOG_MAX` transitions, oldest first."""

    issues: dict[str, IssueRecord] = field(default_factory=dict)
    memory: Memory = field(default_factory=Memory)
    log: TransitionLog = field(default_factory=TransitionLog)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": BOOK_VERSION,
            "issues": {key: rec.to_json() for key, rec in self.issues.items()},
            "memory": self.memory.to_json(),
            "log": self.log.to_json(),
        }


def new_book() -> IssueBook:
    return IssueBook()


def load_book(data: Any) -> IssueBook:
    """A book from stored data (this version's or an earlier one's); malformed parts are dropped,
    never raised (state never crashes a run)."""
    book = new_book()
    if not isinstance(data, dict):
        return book
    issues = data.get("issues")
    if isinstance(issues, dict):
        for key, stored in issues.items():
            rec = IssueRecord.from_json(key, stored)
            if rec is not None:
                book.issues[key] = rec
    book.memory = Memory.from_json(data.get("memory"))
    if isinstance(data.get("log"), list):
        book.log = TransitionLog.from_json(data["log"])
    return book


# --------------------------------------------------------------------------- evaluation


def iso(epoch_s: float) -> str:
    return format_epoch(epoch_s)


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def rule_hold(rule: Rule[Any], params: EngineParams) -> tuple[int, float]:
    """The rule's own ``hold`` (Rule 3: ``grace_s``; Rule 5: ``open_for_s``), else the engine's
    ``hold_polls`` and ``hold_s``."""
    if rule.hold is not None:
        return rule.hold(params)
    return params.hold_polls, params.hold_s


def held(rule: Rule[Any], params: EngineParams, hits: int, span_s: float, tol: float,
         evidence_hold_s: float | None = None) -> bool:  # fmt: skip
    """Whether a finding seen ``hits`` consecutive times over ``span_s`` seconds meets the rule's hold:
    its ``hold_polls`` polls (and more than ``hold_s`` since it started), or — where the rule sets
    ``min_probes`` (contract "Rule timing": holds in seconds of evidence) — ``hold_s`` seconds of
    evidence over at least ``min_probes`` probes, a ``heal`` run's in-run re-probes counting as probes
    (:mod:`gpuheal.core.confirm`). Never on fewer probes than the hold's polls: an operator who raised
    ``hold_polls`` past ``min_probes`` raised both, so at cron's cadence both say the same poll, and
    within one run only the evidence in seconds can be met. ``tol``: the cadence's tolerance (core/timing).
    ``evidence_hold_s`` (the finding's own, :class:`~gpuheal.core.issue.Finding`) replaces ``hold_s`` on
    the seconds-of-evidence path only; the poll hold is the rule's whatever the finding."""
    polls, hold_s = rule_hold(rule, params)
    if hits >= polls and (hold_s <= 0 or timing.more_than(span_s, hold_s, tol)):
        return True
    probes = max(params.min_probes, polls)
    evidence_s = hold_s if evidence_hold_s is None else evidence_hold_s
    return params.min_probes > 0 and probes <= hits and timing.at_least(span_s, evidence_s, tol)


def severity_rank(severity: str) -> int:
    """Worst first: critical > warning > info; a severity from an older book that is none of them
    sorts with ``info`` (it is still shown, never dropped)."""
    return SEVERITY_RANK[severity] if severity in SEVERITY_RANK else SEVERITY_RANK["info"]


def _gate_open(rule: Rule[Any], view: FleetView, subject: str) -> bool:
    """The rule judges ``subject`` this poll only when this poll delivered every signal it needs
    (``gpuheal.signals``); otherwise it is "not known": its hold neither advances nor resets. Worked out
    once per rule and kind of GPU (what a poll provides comes in a few sets, however large the fleet)."""
    provided = view.provided(subject)
    key = ("gate", rule.ID, provided)
    gate: bool | None = view.cache.get(key)
    if gate is None:
        gate = view.cache[key] = not unmet(rule.NEEDS, provided)
    return gate


def remember(rules: Sequence[Rule[Any]], view: FleetView, memory: Memory, prune: bool = True) -> None:
    """Fold this poll (``view``) into what each rule remembers (its ``remember``), before any rule
    detects. Missing data neither advances nor resets (a fold answers ``None``: the row stays); a poll
    already folded in — the same poll again, a clock stepped back — is never folded twice; the rows of a
    GPU no longer configured, and the memories no rule declares, go. A muted or inhibited GPU is still
    remembered: its memory is what it was seen doing. A bench-only evaluation (no poll) changes nothing.
    Mutates ``memory``. ``prune=False``: ``rules`` are only some of the rules (an in-run re-probe, which
    judges only the rules that count evidence in seconds): the others' memories stay as they are."""
    if view.obs is None:
        return
    declared = [(rule, m) for rule in rules for m in rule.remember or ()]
    if prune:
        memory.keep({m.key for _, m in declared}, {*view.aliases, FLEET})
    now_s = view.now_s
    for rule, m in declared:
        rows = memory.of(m)
        for subject in (FLEET,) if rule.SCOPE == FLEET else view.aliases:
            row = rows.get(subject)
            if row is not None and row.at_s is not None and now_s <= row.at_s:
                continue
            folded = m.fold(row, view, subject)
            if folded is not None:
                rows[subject] = folded


def evaluate(
    rules: Sequence[Rule[Any]],
    view: FleetView,
    book: IssueBook,
    only: Iterable[str] | None = None,
) -> Evaluation:
    """Advance every issue of ``rules`` (or only the ids in ``only``) by one poll at
    ``view.now_s``. Mutates ``book`` (the caller stores it).

    Inhibitors run first, so that what they fire this poll already hides the others' issues."""
    run = _Pass(rules, view, book, only)
    run.forget_gone()
    inhibitors = [r for r in rules if r.INHIBITS]
    for rule in inhibitors:
        run.run_rule(rule, _Inhibition())
    inhibition = _Inhibition.of(run.issues, run.by_id, view.provided(FLEET))
    for rule in rules:
        if rule not in inhibitors:
            run.run_rule(rule, inhibition)
    run.report(inhibition)
    return run.out


@dataclass
class _Inhibition:
    """What the firing inhibitors suppress: ``"host"`` → every other issue of that GPU;
    ``"monitor"`` → the monitor-fed rules everywhere; a set of ids → those issues of the same GPU.
    Empty: nothing is inhibited (how the inhibitors themselves run)."""

    hosts_down: dict[str, str] = field(default_factory=dict)
    targeted: dict[tuple[str, str], str] = field(default_factory=dict)
    monitor_down: str | None = None
    poll_signals: frozenset[Signal] = frozenset()

    @classmethod
    def of(
        cls, issues: dict[str, IssueRecord], by_id: dict[str, Rule[Any]], poll_signals: frozenset[Signal]
    ) -> _Inhibition:
        out = cls(poll_signals=poll_signals)
        for rec in issues.values():
            if rec.state != FIRING or rec.issue not in by_id:
                continue
            kind = by_id[rec.issue].INHIBITS
            if kind == "host":
                out.hosts_down[rec.gpu] = rec.issue
            elif kind == "monitor":
                out.monitor_down = rec.issue
            elif kind:
                for target in kind:
                    out.targeted.setdefault((rec.gpu, target), rec.issue)
        return out

    def hidden(self, rule: Rule[Any]) -> frozenset[str] | None:
        """The subjects on which ``rule`` is inhibited (as :meth:`by` says one at a time); ``None``:
        all of them. Asked once per rule, not once per rule and GPU (10,000 GPUs, issue 13)."""
        if self.monitor_down is not None and self.blinded(rule):
            return None
        hosts = self.hosts_down.keys() if rule.INHIBITS != "host" else ()
        return frozenset(hosts).union(gpu for gpu, target in self.targeted if target == rule.ID)

    def blinded(self, rule: Rule[Any]) -> bool:
        """While the GPU data source is down, the rules that need a signal this poll did not deliver
        fleet-wide are hidden — those the Rule 7 fallback feeds (temperatures, VRAM) still judge."""
        return bool(unmet(rule.NEEDS, self.poll_signals))

    def by(self, rule: Rule[Any], subject: str) -> str | None:
        """The inhibitor hiding ``rule`` on ``subject``, or ``None``."""
        if subject in self.hosts_down and rule.INHIBITS != "host":
            return self.hosts_down[subject]
        if self.monitor_down is not None and self.blinded(rule):
            return self.monitor_down
        return self.targeted.get((subject, rule.ID))


class _Pass:
    """One evaluation: the book being advanced, the poll's view, and what changed so far."""

    def __init__(
        self, rules: Sequence[Rule[Any]], view: FleetView, book: IssueBook, only: Iterable[str] | None
    ) -> None:
        self.view = view
        self.now_s = view.now_s
        self.now_iso = iso(view.now_s)
        self.issues = book.issues
        self.log = book.log
        self.by_id: dict[str, Rule[Any]] = {r.ID: r for r in rules}
        self.order = {alias: i for i, alias in enumerate(view.aliases)}
        self.order[FLEET] = len(self.order)
        self.rule_order = {r.ID: i for i, r in enumerate(rules)}
        self.only = set(only) if only is not None else None
        self.out = Evaluation(tolerance_s=view.tolerance_s, memory=book.memory)
        self.muted = {alias for alias in view.aliases if view.muted(alias)}
        self.out.muted = [a for a in view.aliases if a in self.muted]
        # what this poll delivered for each GPU and the GPU's ``rules``, asked once a pass (not once per rule and GPU)
        self.provided = [(alias, view.provided(alias), view.gpus[alias].rules) for alias in view.aliases]

    def forget_gone(self) -> None:
        """Issues of GPUs or rules that no longer exist (config changed) go, silently."""
        gone = [k for k, rec in self.issues.items() if rec.issue not in self.by_id or rec.gpu not in self.order]
        for key in gone:
            del self.issues[key]

    def run_rule(self, rule: Rule[Any], inhibition: _Inhibition) -> None:
        if self.only is not None and rule.ID not in self.only:
            return
        if rule.SCOPE == FLEET:
            if inhibition.by(rule, FLEET) is None and _gate_open(rule, self.view, FLEET):
                self.advance(rule, FLEET)
            return
        hidden = inhibition.hidden(rule)
        if hidden is None:
            return  # inhibited on every GPU
        skip = self.muted | hidden
        gates: dict[frozenset[Signal], bool] = {}  # per set of signals provided: a poll has a few, however many GPUs
        # the rule's parameter record per distinct ``rules`` mapping (GPUs that override nothing share one):
        # what view.rule_params answers for each GPU, asked once a pass, not once per GPU
        records: dict[int, EngineParams] = {}
        rule_id, params_type, record_of = rule.ID, rule.Params, self.view.cfg.rule_record
        detect, view = rule.detect, self.view
        # the GPUs whose issue of this rule is in the book (the keys :meth:`advanced` looks up; only a GPU's own poll
        # of the rule changes its issue): where there is none and the finding does not hold, the outcome changes
        # nothing and is not looked up (issue 29: most of the ~1,100 outcomes of a 100-GPU poll)
        suffix = f"|{rule_id}"
        open_on = {key[: -len(suffix)] for key in self.issues if key.endswith(suffix)}
        for alias, provided, rules in self.provided:
            if alias in skip:
                continue
            gate = gates.get(provided)
            if gate is None:
                gate = gates[provided] = _gate_open(rule, view, alias)
            if gate:
                merged = rules.get(rule_id, NO_PARAMS)
                params = records.get(id(merged))
                if params is None:
                    params = records[id(merged)] = record_of(params_type, merged)
                outcome = detect(view, alias, params)
                if alias in open_on or isinstance(outcome, Finding):
                    self.advanced(rule, alias, params, outcome)

    def advance(self, rule: Rule[Any], subject: str, params: EngineParams | None = None) -> None:
        """One poll of ``rule`` on ``subject``, with the rule's parameters for it (``None``: looked up)."""
        if params is None:
            params = self.view.rule_params(rule.ID, rule.Params, subject)
        self.advanced(rule, subject, params, rule.detect(self.view, subject, params))

    def advanced(self, rule: Rule[Any], subject: str, params: EngineParams, outcome: Detection) -> None:
        """What ``rule``'s ``outcome`` of this poll on ``subject`` does to its issue there."""
        if isinstance(outcome, Finding):
            self.seen(rule, subject, params, outcome)
            return
        rec = self.issues.get(f"{subject}|{rule.ID}")
        if rec is None:
            return
        if rec.state == PENDING:
            if outcome is False:
                self.transition(rec, Event.DROPPED)
            return
        self.recovering(rule, subject, params, rec, outcome)

    def seen(self, rule: Rule[Any], subject: str, params: EngineParams, finding: Finding) -> None:
        """The rule's finding holds this poll: a new pending issue, a hold advanced, or it fires."""
        rec = self.issues.get(f"{subject}|{rule.ID}")
        new = rec is None
        if rec is None:
            rec = self.new_record(rule, subject, finding)
        elif rec.state == PENDING and finding.started_at is not None:
            rec.since_s = min(finding.started_at, self.now_s)
        rec.hits += 1
        rec.clear_hits = 0
        rec.last_s = self.now_s
        detected = dict(finding.detected)
        detected.setdefault("duration_s", round(self.now_s - rec.since_s, 1))
        rec.detected = detected
        rec.summary = finding.summary
        if rec.state == PENDING and held(rule, params, rec.hits, self.now_s - rec.since_s, self.view.tolerance_s,
                                         finding.evidence_hold_s):
            rec.fired_at = self.now_iso
            self.transition(rec, Event.FIRING)
            self.out.fired.append(rec.as_issue())
        elif new:
            self.log_event(rec, Event.PENDING)

    def new_record(self, rule: Rule[Any], subject: str, finding: Finding) -> IssueRecord:
        """A new pending issue, in the book from now (its ``pending`` is logged unless it fires at
        once: see :data:`TRANSITIONS`)."""
        since_s = finding.started_at if finding.started_at is not None else self.now_s
        rec = IssueRecord(gpu=subject, issue=rule.ID, severity=rule.SEVERITY, state=PENDING,
                          since_s=min(since_s, self.now_s), last_s=self.now_s)
        self.move(rec, Event.PENDING)
        return rec

    def recovering(
        self, rule: Rule[Any], subject: str, params: EngineParams, rec: IssueRecord, outcome: Detection
    ) -> None:
        """A firing issue whose finding did not hold: it resolves after ``clear_polls`` polls of
        the rule's recovery condition (clear-side hysteresis); ``None`` (not known) changes nothing."""
        if rule.recovered is not None:
            recovered = rule.recovered(self.view, subject, params, rec)
        else:
            recovered = True if outcome is False else None
        if recovered is None:
            return
        if not recovered:
            rec.clear_hits = 0
            rec.last_s = self.now_s  # seen still broken (a remediation being verified did not work)
            return
        rec.clear_hits += 1
        if rec.clear_hits >= params.clear_polls:
            self.transition(rec, Event.RESOLVED)
            self.out.resolved.append(replace(rec.as_issue(), resolved_at=self.now_iso))

    def transition(self, rec: IssueRecord, event: Event) -> None:
        self.move(rec, event)
        self.log_event(rec, event)

    def move(self, rec: IssueRecord, event: Event) -> None:
        """Move ``rec`` by ``event`` as :data:`TRANSITIONS` allows: into, within or out of the book."""
        before = rec.state if rec.key in self.issues else None
        if (before, event) not in TRANSITIONS:
            raise BadTransition(f"issue {rec.key}: {event!r} is not allowed while {before!r}")
        after = TRANSITIONS[(before, event)]
        if after is None:
            del self.issues[rec.key]
        else:
            rec.state = after
            self.issues[rec.key] = rec

    def log_event(self, rec: IssueRecord, event: Event) -> None:
        summary = rec.summary
        if event == RESOLVED:
            summary = f"resolved after {_minutes(self.now_s - rec.since_s)} (was: {summary})"
        elif event == DROPPED:
            summary = f"cleared before firing (was: {summary})"
        t = Transition(at=self.now_iso, gpu=rec.gpu, issue=rec.issue, severity=rec.severity, event=event,
                       since=rec.since, summary=summary, detected=rec.detected)
        self.out.transitions.append(t.to_json())
        self.log.append(t)

    def report(self, inhibition: _Inhibition) -> None:
        """The open issues, worst first, split into visible and inhibited; the log trimmed."""
        visible = []
        for rec in self.issues.values():
            by = inhibition.by(self.by_id[rec.issue], rec.gpu)
            if by is not None and by != rec.issue:
                self.out.inhibited.append(replace(reported(rec, self.view), inhibited_by=by))
            else:
                visible.append(rec)
        visible.sort(key=lambda r: (-severity_rank(r.severity), self.order[r.gpu], self.rule_order[r.issue]))
        self.out.issues = [reported(r, self.view) for r in visible]
        self.log.trim(LOG_MAX)
