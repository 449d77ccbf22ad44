"""Confirm within the run (issue 28 item 1; contract "Rule timing"): which GPUs a ``heal`` run
re-probes, when, and what the probes said. Pure: every time is an argument.

A hold counted in cron polls makes users of a dead server wait about two minutes in holding alone,
while the evidence after the first seconds no longer changes. So when a poll sees a **hard fault**
on a GPU's own llama-server (:func:`signature`: the direct probe refused or timed out; the task loop
silent behind an ok ``/health``, which a canary completion that timed out also shows), the run
re-probes that GPU on a short schedule (:func:`due_s`, within ``heal.confirm_budget_s``) and the
rules judge each probe as a poll of that GPU alone. The engine counts the evidence by time: a rule
whose ``min_probes`` is set fires once its finding held for ``hold_s`` seconds of evidence over at
least ``min_probes`` probes (:mod:`gpuheal.core.engine`). One probe that answers ends the watch
and the rule's own finding drops the pending issue, so a flapping server is never restarted on
mixed evidence. Soft signals (failure ratios, temperatures, trends) are never re-probed: a probe
delivers only the server's own answers, and rules needing more read "not known" from it.

Each GPU's watch is a small state machine (:data:`TRANSITIONS`, as ``core/verify.py`` writes an
attempt's)::

    watching ─bad-probe─► watching
        ├─answered──► recovered     (a probe answered: the in-run confirmation is reset)
        ├─host-silent─► unconfirmed (its host's SSH is silent too: a network blip or a host down, not a
        │                            crash — cron's polls judge it, Rule 6's "host itself unreachable")
        ├─fired─────► confirmed     (a rule's hold in seconds of evidence was met)
        └─budget-spent─► unconfirmed (cron's next polls go on counting)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from gpuheal.clock import format_epoch
from gpuheal.core.issue import PENDING
from gpuheal.core.taskloop import classify
from gpuheal.model import ENDPOINT_TIMEOUT, UNREACHABLE_STATES

if TYPE_CHECKING:
    from gpuheal.core.engine import IssueBook
    from gpuheal.core.issue import Issue


class Watch(StrEnum):
    WATCHING = "watching"
    CONFIRMED = "confirmed"
    RECOVERED = "recovered"  # a probe saw the server answer (not core/verify's OPERATOR_CLEARED)
    UNCONFIRMED = "unconfirmed"


class Seen(StrEnum):
    """What one probe (or the end of the budget) did to a watch."""

    BAD_PROBE = "bad-probe"
    ANSWERED = "answered"
    FIRED = "fired"
    BUDGET_SPENT = "budget-spent"
    HOST_SILENT = "host-silent"


TRANSITIONS: dict[tuple[Watch, Seen], Watch] = {
    (Watch.WATCHING, Seen.BAD_PROBE): Watch.WATCHING,
    (Watch.WATCHING, Seen.ANSWERED): Watch.RECOVERED,
    (Watch.WATCHING, Seen.FIRED): Watch.CONFIRMED,
    (Watch.WATCHING, Seen.BUDGET_SPENT): Watch.UNCONFIRMED,
    (Watch.WATCHING, Seen.HOST_SILENT): Watch.UNCONFIRMED,
}


class BadTransition(ValueError):
    """An event the watch's state does not allow (a programming error, never data)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One look at a GPU's llama-server: when it was asked (epoch s) and what it answered —
    ``refused``, ``timeout``, ``task loop silent: /metrics, /slots``, or ``ok`` for a probe that
    showed no hard fault."""

    at_s: float
    answer: str

    @property
    def bad(self) -> bool:
        return self.answer != ANSWERED_OK


ANSWERED_OK = "ok"


@dataclass(frozen=True, slots=True)
class GpuWatch:
    """One GPU under in-run confirmation: its state and every probe so far, the poll's first."""

    alias: str
    state: Watch
    probes: tuple[Probe, ...]

    def after(self, event: Seen, probe: Probe | None = None) -> GpuWatch:
        new = TRANSITIONS.get((self.state, event))
        if new is None:
            raise BadTransition(f"watch of {self.alias}: {event!r} is not allowed while {self.state!r}")
        probes = self.probes if probe is None else (*self.probes, probe)
        return replace(self, state=new, probes=probes)

    def evidence(self, iso: Any) -> list[dict[str, Any]]:
        """``detected["probes"]``: each probe, its time (``iso(epoch_s)``) and its answer."""
        return [{"at": iso(p.at_s), "answer": p.answer} for p in self.probes]


def signature(sample: Any) -> str | None:
    """The hard fault this reading of a GPU shows, or ``None``: the direct ``/health`` probe refused or
    timed out, or ``/health`` ok while the task-loop endpoints asked (``/metrics``, ``/slots``, the canary
    completion) all stayed silent (:func:`gpuheal.core.taskloop.classify`). Anything that answered —
    loading, a 5xx, a 401, a busy server answering ``/metrics`` — is not a hard fault."""
    endpoint = getattr(sample, "endpoint", None)
    if endpoint in UNREACHABLE_STATES:
        return str(endpoint)
    stalled, _answered, silent = classify(sample)
    if stalled:
        return SILENT + ", ".join(silent)
    return None


def asks_host(sample: Any) -> bool:
    """Whether this hard fault needs its host asked before the run may confirm it: the direct ``/health``
    refused or timed out (the server, or the network to its host?). A silent task loop behind an ok
    ``/health`` needs no asking: the host answered the probe."""
    return getattr(sample, "endpoint", None) in UNREACHABLE_STATES


# gpuheal.transport's words for a connection that got no answer at all (its ``unreachable`` lumps a reset
# after an answer with no route: not counted, so such a host is confirmed in-run as before)
HOST_SILENT_ERRORS = frozenset({"refused", "timeout"})


def host_silent(error: str | None, timed_out: bool) -> bool:
    """Rule 6 ("SSH to the host → check llama-server process"; "if the host itself is unreachable →
    infrastructure alert"), asked before the run confirms a refused or silent ``/health`` in-run: the
    check's transport ``error`` says the host did not answer at all (connection refused, no answer
    within the connect timeout). Then the GPU's silence is the host's — a one-poll network
    blip (issue 29: a benign event, acting on it is a false action) or a host down — and no restart
    over SSH could arrive: the in-run confirmation stops (cron's poll holds judge it, and Rule 6's
    restart attempt escalates a host still silent). A crashed or frozen server sits on a host that
    answers; a host that answered with a bad key or a refused login answered, and so did one that ran the
    check but not within its deadline (``timed_out``: connected, the command was slow)."""
    return error in HOST_SILENT_ERRORS and not timed_out


def answer(sample: Any) -> str:
    """The probe's answer as ``detected`` keeps it: its hard fault, else ``ok``; a GPU missing from
    the probe (it could not be asked) is ``not probed`` — neither bad nor an answer."""
    if sample is None:
        return NOT_PROBED
    return signature(sample) or ANSWERED_OK


NOT_PROBED = "not probed"
SILENT = "task loop silent: "  # :func:`signature`'s prefix for a hung task loop


def answered_at_s(answer_text: str, asked_s: float, returned_s: float) -> float:
    """When a probe's answer was known, which is when its evidence ends: a silence (``/health`` timing
    out, the task loop not answering) only when the probe gave up at its deadline (``returned_s``) — the
    server stayed silent that whole time after being asked, so that much is evidence; a refusal, or any
    answer, at once (``asked_s``). A probe of several GPUs returns with the slowest: a refused server
    probed beside a hung one is never stamped at the hung one's deadline."""
    silent = answer_text == ENDPOINT_TIMEOUT or answer_text.startswith(SILENT)
    return max(asked_s, returned_s) if silent else asked_s


def due_s(first_s: float, n: int, interval_s: float) -> float:
    """When the ``n``-th re-probe (1, 2, ...) is due: every ``interval_s`` from the poll at ``first_s``
    (a probe that ran long is followed at once by the next one due, never by a burst)."""
    return first_s + n * interval_s


def within_budget(at_s: float, first_s: float, budget_s: float) -> bool:
    """A re-probe at ``at_s`` starts only within ``budget_s`` of the poll (``heal.confirm_budget_s``),
    so a run that confirms in-run still ends well inside the cron minute."""
    return at_s - first_s <= budget_s


def probe_tolerance_s(interval_s: float) -> float:
    """How far from a hold in seconds a probe's evidence still counts as the hold (core/timing's
    principle at the probe cadence): a quarter of the interval — probes start late by scheduling
    jitter, never by a whole interval."""
    return max(0.0, interval_s / 4)


def suspects(result: Any, only: tuple[str, ...]) -> dict[str, GpuWatch]:
    """The GPUs a run watches (``check``'s ``result``): a hard fault in this poll (:func:`signature`), not
    muted (a restart's grace), and no issue of a confirmable rule (``only``) already firing on it (a GPU
    being verified or escalated needs no proof). Each watch starts with the poll's own probe."""
    faults = {a: f for a, f in ((a, signature(s)) for a, s in result.obs.gpus.items()) if f is not None}
    if not faults:
        return {}
    ev = result.evaluation
    opened = (*result.issues, *ev.inhibited)
    firing = {i.gpu for i in opened if i.issue in only and i.state != PENDING}
    at_s = result.obs.at.timestamp()
    return {alias: GpuWatch(alias, Watch.WATCHING, (Probe(at_s, found),)) for alias, found in faults.items()
            if alias not in firing and alias not in ev.muted}  # fmt: skip


def with_probes(issue: Issue, watches: dict[str, GpuWatch], only: tuple[str, ...]) -> Issue:
    """``issue`` with what the run's probes of its GPU saw (its ``detected``'s ``probes`` and ``confirmation``)."""
    w = watches.get(issue.gpu)
    if w is None or issue.issue not in only:
        return issue
    return replace(issue, probes=w)


def annotate(book: IssueBook, watches: dict[str, GpuWatch], only: tuple[str, ...]) -> None:
    """The open issues of the watched GPUs keep what the run saw: each probe, its time, its answer."""
    for rec in book.issues.values():
        w = watches.get(rec.gpu)
        if w is not None and rec.issue in only:
            rec.detected = {**rec.detected, "probes": w.evidence(format_epoch), "confirmation": str(w.state)}
