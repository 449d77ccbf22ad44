"""One issue as a rule and the issue book see it: what a rule found this poll (:class:`Finding`) and an
open issue's record in the book (:class:`IssueRecord`, in its :class:`IssueState`), and an issue as
reported, ``verifying`` while its remediation is verified (:func:`reported`). Pure.

Below both the ``Rule`` protocol (:mod:`gpuheal.core.rule`: ``detect`` returns a finding, ``hold`` and
``recovered`` read the record) and the engine that advances the records
(:mod:`gpuheal.core.engine`: its transition table is the only way a record's state changes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from gpuheal.clock import format_epoch
from gpuheal.core import timing
from gpuheal.core.view import epoch_or_none

if TYPE_CHECKING:
    from gpuheal.core.view import FleetView, Verifying


class Probes(Protocol):
    """The in-run confirmation's record of one GPU's re-probes (:class:`gpuheal.core.confirm.GpuWatch`), as an
    issue reports it: named by what it offers, so that the issue sits below the confirmation that annotates it."""

    @property
    def state(self) -> str: ...

    def evidence(self, iso: Callable[[float], str]) -> list[dict[str, Any]]: ...

class IssueState(StrEnum):
    """An open issue's state in the book (a ``str``: it is written and compared as its text)."""

    PENDING = "pending"  # its finding holds, its hold has not run yet: never fired
    FIRING = "firing"


PENDING = IssueState.PENDING
FIRING = IssueState.FIRING
# reported only, while a remediation is verified (contract "Issue state after a remediation"); never
# stored in the book. Its attempt is ``core/verify.ACTED`` (stored ``"pending"``): the same fact seen
# from the attempt's side, never this issue state's ``pending``.
VERIFYING = "verifying"
# the states an issue is reported in, each an open issue (gpu-health ``issues``)
OPEN_STATES = (FIRING, PENDING, VERIFYING)
# those of an issue that fired and has not resolved (the metric ``gpuheal_issues_open``; an attempt's
# proof asks which issues are still firing): a ``pending`` one has not fired yet
FIRED_STATES = frozenset({FIRING, VERIFYING})


@dataclass(frozen=True)
class Finding:
    """What a rule saw: the evidence (units in the names) and one human line.

    ``started_at`` (epoch s) when the rule knows better than "the first poll that saw it" when the
    condition began (Rule 5: the breaker's ``opened_at``); ``since`` then follows it.

    ``evidence_hold_s``: the seconds of evidence this finding needs on the ``min_probes`` path
    (:func:`gpuheal.core.engine.held`) when the rule knows this kind of finding is a hard fault that needs
    less than the rule's own hold (Rule 3: a task loop answering nothing is every request stuck, not the
    failure ratio its 30 s grace was written for). ``None``: the rule's hold.
    """

    detected: dict[str, Any]
    summary: str
    started_at: float | None = None
    evidence_hold_s: float | None = None


@dataclass(frozen=True, slots=True)
class Issue:
    """One open issue as the engine reports it (issue 26, item 3): ``Evaluation.issues`` (and its
    ``fired``, ``resolved`` and ``inhibited``), typed from the engine to the renderers' documents, the
    alerts, ``plan``, ``confirm``, ``verify``, ``heal``, ``escalate`` and ``report``. A dict only at the
    JSON edges, through :meth:`to_json` (the contract's shape, byte for byte what the dicts were).

    ``state``: ``pending``, ``firing`` (the book's :class:`IssueState`) or :data:`VERIFYING`
    (reported only). ``evidence``: what the rule saw (or, while verifying, the remediation and the
    evidence before it); ``probes``: the in-run confirmation of a hard fault (issue 28,
    :class:`~gpuheal.core.confirm.GpuWatch`), added with :func:`dataclasses.replace`; :attr:`detected` is
    the two together, as the contract's ``detected`` reads. ``inhibited_by``: set on
    ``Evaluation.inhibited`` only; ``resolved_at``: on ``Evaluation.resolved`` only."""

    gpu: str
    issue: str
    severity: str
    state: str
    since: str | None  # ISO text (always, from the engine)
    fired_at: str | None
    evidence: dict[str, Any]
    summary: str
    probes: Probes | None = None
    inhibited_by: str | None = None
    resolved_at: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.gpu, self.issue

    @property
    def detected(self) -> dict[str, Any]:
        """The contract's ``detected``: the evidence, and the probes that confirmed it (``probes``,
        ``confirmation``) when it was confirmed within the run."""
        if self.probes is None:
            return self.evidence
        return {**self.evidence, "probes": self.probes.evidence(format_epoch), "confirmation": str(self.probes.state)}

    def to_json(self) -> dict[str, Any]:
        """The contract's shape: :class:`Reported`'s fields, then what only an engine's issue carries."""
        out = Reported(self.gpu, self.issue, self.severity, self.state, self.since, self.fired_at, self.detected,
                       self.summary).to_json()  # fmt: skip
        if self.inhibited_by is not None:
            out["inhibited_by"] = self.inhibited_by
        if self.resolved_at is not None:
            out["resolved_at"] = self.resolved_at
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Issue:
        """An issue in the contract's shape back as a record (:meth:`to_json`'s inverse; a document's
        ``detected`` keeps its probes as evidence). A missing field reads as the consumers read it
        before they were typed: ``firing``, a ``warning``, no ``since``, nothing detected."""
        detected = data.get("detected")
        return cls(
            gpu=str(data.get("gpu", "")),
            issue=str(data.get("issue", "")),
            severity=str(data.get("severity", "warning")),
            state=str(data.get("state", FIRING)),
            since=data.get("since"),
            fired_at=data.get("fired_at"),
            evidence=detected if isinstance(detected, dict) else {},
            summary=str(data.get("summary") or ""),
            inhibited_by=data.get("inhibited_by"),
            resolved_at=data.get("resolved_at"),
        )


@dataclass(frozen=True)
class Reported:
    """One issue as reported — ``gpu-health.json`` ``issues`` (contract: Files), the ``issues`` of
    ``check``'s, ``heal``'s and ``bench``'s documents — typed for the renderers (issue 26, item 3).
    :meth:`to_json` is the contract's shape (:meth:`IssueRecord.public` writes through it;
    :func:`verifying_issue` rewrites three of its fields);
    :meth:`from_json` reads an issue of such a document back, tolerantly (a damaged field reads as
    its default, a non-object is no issue). ``state``: ``pending``, ``firing`` or ``verifying``."""

    gpu: str | None
    issue: str | None
    severity: str | None
    state: str = "firing"  # as the renderers always read a missing one
    since: str | None = None
    fired_at: str | None = None
    detected: dict[str, Any] = field(default_factory=dict)
    summary: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "issue": self.issue,
            "severity": self.severity,
            "state": self.state,
            "since": self.since,
            "fired_at": self.fired_at,
            "detected": self.detected,
            "summary": self.summary,
        }

    @classmethod
    def from_json(cls, value: Any) -> Reported | None:
        if not isinstance(value, dict):
            return None
        detected = value.get("detected")
        return cls(
            gpu=_text(value.get("gpu")),
            issue=_text(value.get("issue")),
            severity=_text(value.get("severity")),
            state=_text(value.get("state", "firing")) or "firing",
            since=_text(value.get("since")),
            fired_at=_text(value.get("fired_at")),
            detected=detected if isinstance(detected, dict) else {},
            summary=_text(value.get("summary")),
        )

    @classmethod
    def all_of(cls, values: Any) -> list[Reported]:
        """The issues of a document's ``issues`` list (anything else: none)."""
        found = (cls.from_json(v) for v in (values if isinstance(values, list) else ()))
        return [r for r in found if r is not None]


def _text(value: Any) -> str | None:
    """A document's text field; a number is its text (as it renders), anything else missing."""
    if value is None or isinstance(value, str):
        return value
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(slots=True)
class IssueRecord:
    """One open issue in the book. Mutable: one poll's pass advances it in place (``hits``,
    ``clear_hits``, ``last_s``, the latest evidence); its state changes only through
    :meth:`gpuheal.core.engine._Pass.transition` and
    :data:`gpuheal.core.engine.TRANSITIONS`."""

    gpu: str
    issue: str
    severity: str
    state: IssueState
    since_s: float  # when the condition began (epoch s)
    fired_at: str | None = None  # ISO text, as reported
    detected: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    hits: int = 0  # consecutive polls its finding held
    clear_hits: int = 0  # consecutive polls it recovered (firing only)
    last_s: float | None = None  # the last poll that saw it still broken

    @property
    def key(self) -> str:
        return f"{self.gpu}|{self.issue}"

    @property
    def since(self) -> str:
        return format_epoch(self.since_s)

    def public(self) -> dict[str, Any]:
        """The issue as reported (gpu-health ``issues``; contract)."""
        return self.as_reported().to_json()

    def as_reported(self) -> Reported:
        return Reported(self.gpu, self.issue, self.severity, str(self.state), self.since, self.fired_at,
                        self.detected, self.summary)

    def as_issue(self) -> Issue:
        """The record as the engine reports it (:class:`Issue`)."""
        return Issue(self.gpu, self.issue, self.severity, str(self.state), self.since, self.fired_at,
                     self.detected, self.summary)

    def to_json(self) -> dict[str, Any]:
        return {**self.public(), "since_s": self.since_s, "hits": self.hits, "clear_hits": self.clear_hits,
                "last_s": self.last_s}

    @classmethod
    def from_json(cls, key: str, data: Any) -> IssueRecord | None:
        """A stored record, or ``None`` when it is malformed (dropped, never raised). ``since_s``
        is the truth; the stored ISO ``since`` is derived from it."""
        if not isinstance(data, dict):
            return None
        gpu, issue, since_s, hits = data.get("gpu"), data.get("issue"), data.get("since_s"), data.get("hits")
        if not (isinstance(gpu, str) and isinstance(issue, str) and key == f"{gpu}|{issue}"):
            return None
        if data.get("state") not in tuple(IssueState) or not isinstance(data.get("severity"), str):
            return None
        if not isinstance(since_s, int | float) or isinstance(since_s, bool):
            return None
        if not isinstance(hits, int) or isinstance(hits, bool):
            return None
        clear_hits, fired_at = data.get("clear_hits"), data.get("fired_at")
        detected, summary = data.get("detected"), data.get("summary")
        return cls(
            gpu=gpu,
            issue=issue,
            severity=data["severity"],
            state=IssueState(data["state"]),
            since_s=float(since_s),
            fired_at=fired_at if isinstance(fired_at, str) else None,
            detected=detected if isinstance(detected, dict) else {},
            summary=summary if isinstance(summary, str) else "",
            hits=hits,
            clear_hits=clear_hits if isinstance(clear_hits, int) and not isinstance(clear_hits, bool) else 0,
            last_s=float(data["last_s"]) if _number(data.get("last_s")) else None,
        )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def verifying_issue(issue: Issue, v: Verifying) -> Issue:
    """``issue`` as reported while its remediation is verified: the numbers it was detected with are
    the state *before* the action, never presented as current (their probes, if any, with them)."""
    if issue.state == VERIFYING:
        return issue
    what = "+".join(v.actions) or "remediation"
    return replace(
        issue,
        state=VERIFYING,
        evidence={
            "verifying": what,
            "acted_at": format_epoch(v.acted_s),
            "verifying_until": format_epoch(v.judge_from_s),
            "before_action": issue.detected or {},
        },
        summary=f"{what} at {format_epoch(v.acted_s)} passed its own checks; verifying until "
        f"{format_epoch(v.judge_from_s)} (before: {issue.summary})",
        probes=None,
    )


def reported(rec: IssueRecord, view: FleetView) -> Issue:
    """The issue as reported; ``verifying`` while its remediation waits for a poll that can judge it."""
    public = rec.as_issue()
    v = view.restarts.verifying.get((rec.gpu, rec.issue))
    if v is None or rec.state != IssueState.FIRING or rec.since != v.since:
        return public
    seen_s = epoch_or_none(rec.last_s) or 0.0  # the last poll that saw it still broken
    if timing.at_least(seen_s - v.judge_from_s, 0.0, view.tolerance_s):
        return public  # seen still broken from judge_from on: firing again (heal fails the attempt)
    return verifying_issue(public, v)
