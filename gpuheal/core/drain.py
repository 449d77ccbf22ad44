"""Drain first (issue 28 item 2): what to take out of LiteLLM's routing, and what to put back. Pure: values
in, values out; time is a parameter.

**Why.** A hard fault (connection refused, ``/health`` timing out, the task loop stalled, a canary
completion failing) is seen at the first bad poll, but the fix waits for the rule's hold; meanwhile LiteLLM
keeps sending that GPU's share of its model group's requests to a server that cannot answer them. A rule
declares which of its findings are hard (its remedy's ``drain`` hook, :class:`gpuheal.core.remedy.Remedy`);
at the first poll where such an issue is open — pending, before its hold is met — the GPU leaves its model
groups' routing when each of them has another deployment on a healthy GPU, and comes back once the issue
cleared (the verified restart, or a blip that cleared by itself) and a real completion on it succeeds.

**Never** the last healthy deployment of a group (:func:`decide`: every group of the GPU needs a twin on a
configured GPU that answered ``/health`` this poll, cannot-serve nothing open, is neither drained nor
paused), and never
more GPUs out of routing at once than the fleet guard allows (``heal.fleet_guard_fraction``, the guard
every restart meets: :func:`gpuheal.core.plan.fleet_guard_tripped`) — many GPUs failing at once is a
shared cause, and draining them all would leave their groups with nothing.

The book of drained GPUs (:class:`Book`, ``drain.json``) is what the next run puts back; a damaged one
reads as empty entries skipped, never a crash.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuheal.core.issue import Issue
from gpuheal.core.litellm_config import base_of
from gpuheal.core.plan import fleet_guard_tripped
from gpuheal.core.remedy import Remedy
from gpuheal.core.topology import Route
from gpuheal.model import ENDPOINT_OK

MAX_DRAINED = 1000  # entries read from a book (a hostile file cannot make a run walk more)


@dataclass(frozen=True)
class Drained:
    """One GPU out of routing: which issue took it out (``fault``: the hard fault seen), its model groups,
    when (``at_s``), the run that did it and the evidence (``detected``) the audit lines carry."""

    gpu: str
    issue: str
    since: str | None
    fault: str
    groups: tuple[str, ...]
    at_s: float
    run_id: str
    detected: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: object) -> Drained | None:
        if not isinstance(raw, dict):
            return None
        gpu, issue, fault, run_id = (raw.get(k) for k in ("gpu", "issue", "fault", "run_id"))
        groups, at_s, since = raw.get("groups"), raw.get("at_s"), raw.get("since")
        if not all(isinstance(v, str) for v in (gpu, issue, fault, run_id)) or not isinstance(groups, list):
            return None
        if not isinstance(at_s, int | float) or isinstance(at_s, bool) or not isinstance(since, str | None):
            return None
        detected = raw.get("detected")
        return cls(str(gpu), str(issue), since, str(fault), tuple(str(g) for g in groups[:100]), float(at_s),
                   str(run_id), dict(detected) if isinstance(detected, dict) else {})  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "groups": list(self.groups), "detected": dict(self.detected)}


@dataclass(frozen=True)
class Book:
    """The GPUs drained by earlier runs, by alias."""

    drained: Mapping[str, Drained] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: object) -> Book:
        items = raw.get("drained") if isinstance(raw, dict) else None
        found = [Drained.from_json(x) for x in (items if isinstance(items, list) else [])[:MAX_DRAINED]]
        return cls({d.gpu: d for d in found if d is not None})

    def to_json(self) -> dict[str, Any]:
        return {"drained": [d.to_json() for d in self.drained.values()]}

    def with_(self, d: Drained) -> Book:
        return Book({**self.drained, d.gpu: d})

    def without(self, gpu: str) -> Book:
        return Book({k: v for k, v in self.drained.items() if k != gpu})


@dataclass(frozen=True)
class Hard:
    """An open issue whose evidence is a hard fault (its remedy's ``drain`` hook said which)."""

    gpu: str
    issue: str
    since: str | None
    fault: str
    detected: Mapping[str, Any]


def hard_faults(open_issues: Iterable[Issue], remedies: Mapping[str, Remedy]) -> list[Hard]:
    """The open issues (pending or firing) that a rule declares a hard fault, one per GPU (the first)."""
    out: dict[str, Hard] = {}
    for i in open_issues:
        remedy = remedies.get(i.issue)
        if remedy is None or remedy.drain is None or i.gpu == "fleet" or i.gpu in out:
            continue
        detected = i.detected
        fault = remedy.drain(detected)
        if fault:
            out[i.gpu] = Hard(i.gpu, i.issue, i.since, fault, detected)
    return list(out.values())


@dataclass(frozen=True)
class Go:
    """Drain: the GPU's model groups, and for each the healthy GPUs that keep serving it."""

    groups: tuple[str, ...]
    twins: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Refuse:
    why: str


def decide(hard: Hard, routes: tuple[Route, ...], endpoints: Mapping[str, str], healthy: frozenset[str],
           failing: frozenset[str], book: Book, fraction: float) -> Go | Refuse:  # fmt: skip
    """Whether ``hard.gpu`` may leave routing now. ``endpoints``: every configured GPU's endpoint by alias;
    ``healthy``: the GPUs that may carry a group (answered ``/health``, nothing open, not drained, not
    paused); ``failing``: the GPUs that cannot serve this poll (open issues of a ``cannot_serve`` remedy)."""
    where = base_of(endpoints.get(hard.gpu, ""))
    if where is None:
        return Refuse(f"{hard.gpu} has no endpoint LiteLLM could route to")
    mine = [r for r in routes if base_of(r.api_base) == where]
    if not mine:
        return Refuse(f"LiteLLM routes nothing to {hard.gpu} ({endpoints[hard.gpu]})")
    owner = {base_of(ep): alias for alias, ep in endpoints.items()}
    groups = tuple(dict.fromkeys(r.group for r in mine))
    twins: dict[str, tuple[str, ...]] = {}
    for group in groups:
        others = {owner.get(base_of(r.api_base)) for r in routes if r.group == group and base_of(r.api_base) != where}
        twins[group] = tuple(sorted(a for a in others if a is not None and a in healthy and a != hard.gpu))
        if not twins[group]:
            return Refuse(f"{hard.gpu} is the last healthy deployment of LiteLLM's group {group!r}: it stays in")
    out = set(book.drained) | set(failing) | {hard.gpu}
    n_gpus = len(endpoints)
    if fleet_guard_tripped(len(out), n_gpus, fraction):
        return Refuse(f"fleet guard: {len(out)} of {n_gpus} GPUs would be out of routing or failing at once "
                      "(shared cause suspected): nothing more is drained")
    return Go(groups, twins)


def due_back(book: Book, still_open: Iterable[tuple[str, str]]) -> list[Drained]:
    """The drained GPUs whose issue is no longer open (a verified restart cleared it, or it was a blip)."""
    open_now = set(still_open)
    return [d for d in book.drained.values() if (d.gpu, d.issue) not in open_now]


def healthy_gpus(endpoint_states: Mapping[str, str | None], failing: Iterable[str], book: Book,
                 paused: Iterable[str]) -> frozenset[str]:  # fmt: skip
    """The GPUs that may carry a drained GPU's requests: ``/health`` ok this poll, no open issue that keeps it
    from serving (``failing``), not drained, not paused by the operators."""
    out = set(failing) | set(book.drained) | set(paused)
    return frozenset(a for a, state in endpoint_states.items() if state == ENDPOINT_OK and a not in out)
