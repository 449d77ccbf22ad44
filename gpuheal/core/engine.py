"""The issue lifecycle, owned once for every rule (design: "like Prometheus's ``for:``"). Pure.

A rule only says what it sees this poll (:func:`detect` → a :class:`Finding`, ``False`` for
"quiet", ``None`` for "not known"); the engine turns that into issues:

- **hold**: a finding must hold for the rule's ``hold_polls`` consecutive polls (and, where the rule
  has one, longer than ``hold_s`` since it started) before the issue goes ``pending`` → ``firing``.
  Rule 1 fires at the 2nd consecutive hot poll, Rule 6/7 at the 3rd, Rule 3 at the 2nd bad poll
  30 s+ after the first (contract "Rule timing").
- **missing data**: a poll where the rule cannot know (``None``, a muted GPU, a source the rule needs
  being down) neither advances nor resets the hold and never clears an issue.
- **clearing**: a pending issue whose finding stops holding is dropped (it never fired); a firing
  issue resolves only when the rule's recovery condition holds (``recovered``: clear-side
  hysteresis, e.g. thermal clears below 80 °C, not at 85 °C) for ``clear_polls`` polls.
- **inhibition** (a rule's ``INHIBITS``): a firing ``host-unreachable`` freezes and hides that GPU's
  other issues; a firing ``data-source-unreachable`` freezes and hides the issues of rules fed by
  gpu-monitor (reported as not known — neither healthy nor hot); a firing ``api-key-mismatch``
  freezes and hides the symptoms a restart cannot fix on that GPU (model-stuck, a stuck breaker,
  misrouted work: L1/L2). Hidden issues stay in the book and come back, or resolve, once the
  inhibitor resolves.
- **muting**: a GPU inside ``heal``'s startup grace is not evaluated at all.
- **verifying** (contract "Issue state after a remediation"): a firing issue whose remediation ran
  and passed its own checks (``heal``'s ``pending`` attempt, :class:`~gpuheal.core.view.Verifying`)
  is reported ``"state": "verifying"`` — its pre-action evidence moved under
  ``detected.before_action`` — until a poll from the attempt's ``judge_from_s`` on sees it still
  broken (the rule's finding, or its recovery condition not met: ``firing`` again) or it resolves.
  The book keeps it ``firing``: the lifecycle does not change, only what is reported.

The issue book is a JSON-able dict the caller stores between runs (``issues.json``), so cron's
one-shot runs behave like one long-lived evaluator, and ``replay`` keeps it in memory::

    {"version": 1,
     "issues": {"ALIAS|ISSUE-ID": RECORD},
     "memory": {...},                 # core/view.remember: request counts, breaker first seen
     "log":    [TRANSITION, ...]}     # the last LOG_MAX transitions, oldest first

    RECORD = {"gpu", "issue", "severity", "state": "pending"|"firing", "since", "since_s",
              "fired_at", "detected", "summary", "hits", "clear_hits", "last_s"}
    TRANSITION = {"at", "gpu", "issue", "severity", "event": "pending"|"firing"|"resolved"|"dropped",
                  "since", "summary", "detected"}
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpuheal.clock import format_epoch
from gpuheal.config.model import ENGINE_PARAMS
from gpuheal.core import timing
from gpuheal.core.view import FleetView, Verifying, epoch_or_none
from gpuheal.signals import Signal, unmet

BOOK_VERSION = 1
LOG_MAX = 1000
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
FLEET = "fleet"

PENDING = "pending"
FIRING = "firing"
VERIFYING = "verifying"  # reported only (see "verifying" above); never stored in the book
RESOLVED = "resolved"
DROPPED = "dropped"



@dataclass(frozen=True)
class Finding:
    """What a rule saw: the evidence (units in the names) and one human line.

    ``started_at`` (epoch s) when the rule knows better than "the first poll that saw it" when the
    condition began (Rule 5: the breaker's ``opened_at``); ``since`` then follows it.
    """

    detected: dict[str, Any]
    summary: str
    started_at: float | None = None


@dataclass
class Evaluation:
    """One evaluation's outcome.

    ``issues``: the open (pending + firing) issues to report, in the contract's shape, worst first;
    ``fired``/``resolved``: what changed state this run (``resolved`` carry ``resolved_at``);
    ``transitions``: every change (``pending``, ``firing``, ``resolved``, ``dropped``), for the
    replay timeline; ``inhibited``: open issues hidden by an inhibitor (with ``inhibited_by``);
    ``muted``: GPUs inside a startup grace; ``tolerance_s``: the poll jitter tolerance this
    evaluation counted time with (core/timing), for ``heal`` to judge its attempts by the same.
    """

    issues: list[dict[str, Any]] = field(default_factory=list)
    fired: list[dict[str, Any]] = field(default_factory=list)
    resolved: list[dict[str, Any]] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    inhibited: list[dict[str, Any]] = field(default_factory=list)
    muted: list[str] = field(default_factory=list)
    tolerance_s: float = timing.TOLERANCE_S


# --------------------------------------------------------------------------- the book


def new_book() -> dict[str, Any]:
    return {"version": BOOK_VERSION, "issues": {}, "memory": {}, "log": []}


_RECORD_KEYS = ("gpu", "issue", "severity", "state", "since", "since_s", "hits")


def load_book(data: Any) -> dict[str, Any]:
    """A book from stored data; malformed parts are dropped, never raised (state never crashes a
    run)."""
    book = new_book()
    if not isinstance(data, dict):
        return book
    issues = data.get("issues")
    if isinstance(issues, dict):
        for key, rec in issues.items():
            if (
                isinstance(rec, dict)
                and all(k in rec for k in _RECORD_KEYS)
                and rec["state"] in (PENDING, FIRING)
                and isinstance(rec["since_s"], int | float)
                and isinstance(rec["hits"], int)
                and key == f"{rec['gpu']}|{rec['issue']}"
            ):
                rec.setdefault("clear_hits", 0)
                rec.setdefault("fired_at", None)
                rec.setdefault("detected", {})
                rec.setdefault("summary", "")
                book["issues"][key] = rec
    if isinstance(data.get("memory"), dict):
        book["memory"] = data["memory"]
    if isinstance(data.get("log"), list):
        book["log"] = [t for t in data["log"] if isinstance(t, dict)][-LOG_MAX:]
    return book


# --------------------------------------------------------------------------- evaluation


def iso(epoch_s: float) -> str:
    return format_epoch(epoch_s)


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def rule_hold(rule: ModuleType, params: dict[str, Any]) -> tuple[int, float]:
    hold = getattr(rule, "hold", None)
    if hold is not None:
        return hold(params)
    return int(engine_param(params, "hold_polls")), float(engine_param(params, "hold_s"))


def engine_param(params: dict[str, Any], name: str) -> Any:
    """A parameter the engine reads for every rule (:data:`ENGINE_PARAMS`), the rule's own value
    when its defaults or the operator set one."""
    return params[name] if name in params else ENGINE_PARAMS[name]


def severity_rank(severity: str) -> int:
    """Worst first: critical > warning > info; a severity from an older book that is none of them
    sorts with ``info`` (it is still shown, never dropped)."""
    return SEVERITY_RANK[severity] if severity in SEVERITY_RANK else SEVERITY_RANK["info"]


def _gate_open(rule: ModuleType, view: FleetView, subject: str) -> bool:
    """The rule judges ``subject`` this poll only when this poll delivered every signal it needs
    (``gpuheal.signals``); otherwise it is "not known": its hold neither advances nor resets."""
    return not unmet(rule.NEEDS, view.provided(subject))


def _public(rec: dict[str, Any]) -> dict[str, Any]:
    return {
        "gpu": rec["gpu"],
        "issue": rec["issue"],
        "severity": rec["severity"],
        "state": rec["state"],
        "since": rec["since"],
        "fired_at": rec["fired_at"],
        "detected": rec["detected"],
        "summary": rec["summary"],
    }


def verifying_issue(issue: dict[str, Any], v: Verifying) -> dict[str, Any]:
    """``issue`` (public shape) as reported while its remediation is verified: the numbers it
    was detected with are the state *before* the action, never presented as current."""
    if issue.get("state") == VERIFYING:
        return issue
    what = "+".join(v.actions) or "remediation"
    return {
        **issue,
        "state": VERIFYING,
        "detected": {
            "verifying": what,
            "acted_at": iso(v.acted_s),
            "verifying_until": iso(v.judge_from_s),
            "before_action": issue.get("detected") or {},
        },
        "summary": f"{what} at {iso(v.acted_s)} passed its own checks; verifying until "
        f"{iso(v.judge_from_s)} (before: {issue.get('summary', '')})",
    }


def _present(rec: dict[str, Any], view: FleetView) -> dict[str, Any]:
    """The public issue; ``verifying`` while its remediation waits for a poll that can judge it."""
    public = _public(rec)
    v = view.restarts.verifying.get((rec["gpu"], rec["issue"]))
    if v is None or rec["state"] != FIRING or rec["since"] != v.since:
        return public
    seen_s = epoch_or_none(rec.get("last_s")) or 0.0  # the last poll that saw it still broken
    if timing.at_least(seen_s - v.judge_from_s, 0.0, view.tolerance_s):
        return public  # seen still broken from judge_from on: firing again (heal fails the attempt)
    return verifying_issue(public, v)


def evaluate(
    rules: Sequence[ModuleType],
    view: FleetView,
    book: dict[str, Any],
    only: Iterable[str] | None = None,
) -> Evaluation:
    """Advance every issue of ``rules`` (or only the ids in ``only``) by one poll at
    ``view.now_s``. Mutates ``book`` (the caller stores it).

    Inhibitors run first, so that what they fire this poll already hides the others' issues."""
    run = _Pass(rules, view, book, only)
    run.forget_gone()
    inhibitors = [r for r in rules if getattr(r, "INHIBITS", None)]
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
        cls, issues: dict[str, dict[str, Any]], by_id: dict[str, ModuleType], poll_signals: frozenset[Signal]
    ) -> _Inhibition:
        out = cls(poll_signals=poll_signals)
        for rec in issues.values():
            if rec["state"] != FIRING or rec["issue"] not in by_id:
                continue
            kind = getattr(by_id[rec["issue"]], "INHIBITS", None)
            if kind == "host":
                out.hosts_down[rec["gpu"]] = rec["issue"]
            elif kind == "monitor":
                out.monitor_down = rec["issue"]
            elif kind:
                for target in kind:
                    out.targeted.setdefault((rec["gpu"], target), rec["issue"])
        return out

    def hidden(self, rule: ModuleType) -> frozenset[str] | None:
        """The subjects on which ``rule`` is inhibited (as :meth:`by` says one at a time); ``None``:
        all of them. Asked once per rule, not once per rule and GPU (10,000 GPUs, issue 13)."""
        if self.monitor_down is not None and self.blinded(rule):
            return None
        hosts = self.hosts_down.keys() if getattr(rule, "INHIBITS", None) != "host" else ()
        return frozenset(hosts).union(gpu for gpu, target in self.targeted if target == rule.ID)

    def blinded(self, rule: ModuleType) -> bool:
        """While the GPU data source is down, the rules that need a signal this poll did not deliver
        fleet-wide are hidden — those the Rule 7 fallback feeds (temperatures, VRAM) still judge."""
        return bool(unmet(rule.NEEDS, self.poll_signals))

    def by(self, rule: ModuleType, subject: str) -> str | None:
        """The inhibitor hiding ``rule`` on ``subject``, or ``None``."""
        if subject in self.hosts_down and getattr(rule, "INHIBITS", None) != "host":
            return self.hosts_down[subject]
        if self.monitor_down is not None and self.blinded(rule):
            return self.monitor_down
        return self.targeted.get((subject, rule.ID))


class _Pass:
    """One evaluation: the book being advanced, the poll's view, and what changed so far."""

    def __init__(
        self, rules: Sequence[ModuleType], view: FleetView, book: dict[str, Any], only: Iterable[str] | None
    ) -> None:
        self.view = view
        self.now_s = view.now_s
        self.now_iso = iso(view.now_s)
        self.issues: dict[str, dict[str, Any]] = book["issues"]
        self.log: list[dict[str, Any]] = book["log"]
        self.by_id = {r.ID: r for r in rules}
        self.order = {alias: i for i, alias in enumerate(view.aliases)}
        self.order[FLEET] = len(self.order)
        self.rule_order = {r.ID: i for i, r in enumerate(rules)}
        self.only = set(only) if only is not None else None
        self.out = Evaluation(tolerance_s=view.tolerance_s)
        self.muted = {alias for alias in view.aliases if view.muted(alias)}
        self.out.muted = [a for a in view.aliases if a in self.muted]

    def forget_gone(self) -> None:
        """Issues of GPUs or rules that no longer exist (config changed) go, silently."""
        gone = [k for k, rec in self.issues.items() if rec["issue"] not in self.by_id or rec["gpu"] not in self.order]
        for key in gone:
            del self.issues[key]

    def run_rule(self, rule: ModuleType, inhibition: _Inhibition) -> None:
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
        for alias in self.view.aliases:
            if alias not in skip and _gate_open(rule, self.view, alias):
                self.advance(rule, alias)

    def advance(self, rule: ModuleType, subject: str) -> None:
        params = self.view.params(rule.ID, subject)
        outcome = rule.detect(self.view, subject, params)
        if isinstance(outcome, Finding):
            self.seen(rule, subject, params, outcome)
            return
        rec = self.issues.get(f"{subject}|{rule.ID}")
        if rec is None:
            return
        if rec["state"] == PENDING:
            if outcome is False:
                self.drop(rec, DROPPED)
            return
        self.recovering(rule, subject, params, rec, outcome)

    def seen(self, rule: ModuleType, subject: str, params: dict[str, Any], finding: Finding) -> None:
        """The rule's finding holds this poll: a new pending issue, a hold advanced, or it fires."""
        key = f"{subject}|{rule.ID}"
        rec = self.issues.get(key)
        new = rec is None
        if rec is None:
            rec = self.issues[key] = self.new_record(rule, subject, finding)
        elif rec["state"] == PENDING and finding.started_at is not None:
            rec["since_s"] = min(finding.started_at, self.now_s)
            rec["since"] = iso(rec["since_s"])
        rec["hits"] += 1
        rec["clear_hits"] = 0
        rec["last_s"] = self.now_s
        detected = dict(finding.detected)
        detected.setdefault("duration_s", round(self.now_s - rec["since_s"], 1))
        rec["detected"] = detected
        rec["summary"] = finding.summary
        polls, hold_s = rule_hold(rule, params)
        if rec["state"] == PENDING and rec["hits"] >= polls and (
            hold_s <= 0 or timing.more_than(self.now_s - rec["since_s"], hold_s, self.view.tolerance_s)
        ):
            rec["state"] = FIRING
            rec["fired_at"] = self.now_iso
            self.transition(rec, FIRING)
            self.out.fired.append(_public(rec))
        elif new:
            self.transition(rec, PENDING)

    def new_record(self, rule: ModuleType, subject: str, finding: Finding) -> dict[str, Any]:
        since_s = finding.started_at if finding.started_at is not None else self.now_s
        since_s = min(since_s, self.now_s)
        return {
            "gpu": subject,
            "issue": rule.ID,
            "severity": rule.SEVERITY,
            "state": PENDING,
            "since": iso(since_s),
            "since_s": since_s,
            "fired_at": None,
            "detected": {},
            "summary": "",
            "hits": 0,
            "clear_hits": 0,
            "last_s": self.now_s,
        }

    def recovering(
        self, rule: ModuleType, subject: str, params: dict[str, Any], rec: dict[str, Any], outcome: Any
    ) -> None:
        """A firing issue whose finding did not hold: it resolves after ``clear_polls`` polls of
        the rule's recovery condition (clear-side hysteresis); ``None`` (not known) changes nothing."""
        recovered_fn = getattr(rule, "recovered", None)
        if recovered_fn is not None:
            recovered = recovered_fn(self.view, subject, params, rec)
        else:
            recovered = True if outcome is False else None
        if recovered is None:
            return
        if not recovered:
            rec["clear_hits"] = 0
            rec["last_s"] = self.now_s  # seen still broken (a remediation being verified did not work)
            return
        rec["clear_hits"] += 1
        if rec["clear_hits"] >= int(engine_param(params, "clear_polls")):
            self.drop(rec, RESOLVED)
            self.out.resolved.append({**_public(rec), "resolved_at": self.now_iso})

    def drop(self, rec: dict[str, Any], event: str) -> None:
        del self.issues[f"{rec['gpu']}|{rec['issue']}"]
        self.transition(rec, event)

    def transition(self, rec: dict[str, Any], event: str) -> None:
        summary = rec["summary"]
        if event == RESOLVED:
            summary = f"resolved after {_minutes(self.now_s - rec['since_s'])} (was: {summary})"
        elif event == DROPPED:
            summary = f"cleared before firing (was: {summary})"
        t = {
            "at": self.now_iso,
            "gpu": rec["gpu"],
            "issue": rec["issue"],
            "severity": rec["severity"],
            "event": event,
            "since": rec["since"],
            "summary": summary,
            "detected": rec["detected"],
        }
        self.out.transitions.append(t)
        self.log.append(t)

    def report(self, inhibition: _Inhibition) -> None:
        """The open issues, worst first, split into visible and inhibited; the log trimmed."""
        visible = []
        for rec in self.issues.values():
            by = inhibition.by(self.by_id[rec["issue"]], rec["gpu"])
            if by is not None and by != rec["issue"]:
                self.out.inhibited.append({**_present(rec, self.view), "inhibited_by": by})
            else:
                visible.append(rec)
        visible.sort(key=lambda r: (-severity_rank(r["severity"]), self.order[r["gpu"]], self.rule_order[r["issue"]]))
        self.out.issues = [_present(r, self.view) for r in visible]
        if len(self.log) > LOG_MAX:
            del self.log[: len(self.log) - LOG_MAX]
