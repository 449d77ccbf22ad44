"""What ``heal`` does about one rule's issue, declared on the rule (issue 26 item 2). Pure: records and types.

Every rule module ends with ``REMEDY = Remedy(...)`` (the registry, ``gpuheal/rules/__init__.py``,
collects them): its fix as data — the contract actions in order (``steps``, from the generic action
catalog :mod:`gpuheal.core.catalog`), whether the humans hear of it on detection (``alert_now``),
whether anything safe can be done at all (``automatic``), whether its fix is announced (``silent``),
why it escalates — and, where a rule's fix has special cases, optional **hooks**. The hooks live in the
rule's own ``remedy.py`` and get every capability through a :class:`RemedyContext` (the heal step's
implementation is :mod:`gpuheal.actions.context`), so ``rules/`` stays pure by its imports and
``actions/execute``, ``steps/heal`` and ``steps/escalate`` name no issue id. One heal run, and where
each hook enters, in order:

1. ``track(open, ctx)`` — ``--apply`` only, before earlier attempts are judged: keep what the fix will
   need from each open issue of the rule in the rule's own record (Rule 2: the per-process VRAM
   snapshot at the leak's onset);
2. ``guard(planning)`` → :class:`Guard` — pure, while planning (a dry run shows it too): what holds the
   fix back this run, and what the guard looked at (Rule 2 waits for its second snapshot; Rule 4.3
   joins the open thermal incident of its GPU);
3. ``before_step(ex, step, ctx)`` → bool — as the attempt runs, before each step; True ends the attempt
   (Rule 2's attribution decides restart, kill or escalate; Rule 6.1 looks whether llama-server runs);
   setting ``ex.instead`` runs that action in the step's place (Rule 6: a llama-server that is not
   running is started, one that hangs is restarted);
4. ``conclude(ex, ctx)`` — after the steps: what the attempt's own checks conclude (Rule 4's three
   checks, and the re-benchmark a restored power limit asks for; Rule 6's LiteLLM health, and its
   escalation when the host cannot be reached over SSH);
5. ``follow_up(followed)`` → :data:`FollowUp` steps — pure, for advice heal never acts on: what it
   says about it, run after run (Rule 10's alert, its 24 h verify and its 48 h alias audit);
6. ``recheck(rechecking)`` → ``str | None`` — pure, in a later run, when an attempt's verification window
   passed with its issue still open: a reason to keep the fix running and judge it again one window
   later, or ``None`` (it failed). Rule 8 tier 2 escalates only while the GPU is *still rising*: one
   falling above 80 °C keeps its load shed and is re-checked.

Before any of them, at every poll where the issue is open — pending too, before its hold is met:
``drain(detected)`` → ``str | None`` — pure: the hard fault the evidence shows (connection refused,
``/health`` timing out, the task loop stalled, a canary completion failing), which takes the GPU out of its
LiteLLM model groups while each has a healthy twin (issue 28 item 2, :mod:`gpuheal.core.drain`); ``None``
for soft evidence (a failure ratio): nothing is drained.

And in a later run, when the attempt's issue cleared: ``verify(proving, ctx)`` → a verdict (``ok`` and
what proved it, joined to the resolved record's ``verification``): the rule's own proof before the
attempt is resolved — not ``ok``, and the attempt waits for the next poll, until its window passes.
Without one, a GPU's fix is proved by a real completion on its llama-server
(:func:`completion_proof`); a fleet fix has no GPU to complete on, so a fleet rule with steps must
declare its own (the registry refuses one that does not): Rule 7's "gpu-monitor returns healthy + all
sidecars reachable".

What a fix found on the way joins what was detected through :attr:`Execution.found` (the audit line
and the alert carry it); a fix only a benchmark can prove asks for one through
:attr:`Execution.rebench` (:mod:`gpuheal.core.rebench`); a verdict of that re-benchmark fails the
attempt whatever its issue. A rule whose memory sees something only a benchmark can judge raises the
ask itself: ``asks(memory, now_s)`` → :class:`~gpuheal.core.rebench.Raised` — pure, after each poll's
fold (Rule 9: a change of the running context). Each verdict reaches ``rebenched(rebenched)`` →
:class:`~gpuheal.core.rebench.Told` — pure, in ``bench``: what the verdict means (Rule 9: its escalation,
told once per change); without one, :func:`~gpuheal.core.rebench.prove_fix`. Declarations read by the
generic loops: ``recommend`` (advice only: reported, never acted on nor escalated), ``cannot_serve``
(the fleet guard counts it), ``remind`` (reminders while escalated), ``incident`` (which alerts of one
GPU are one message: Alertmanager's ``inhibit_rules`` as data) and ``state_file`` (where the remedy
keeps its own record between runs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from gpuheal.core.actions import Action, CommandOutcome, StepResult
from gpuheal.core.issue import FIRING
from gpuheal.core.rebench import Ask, Raised, Rebenched, Told

if TYPE_CHECKING:
    from gpuheal.config.model import Config
    from gpuheal.core.issue import Issue
    from gpuheal.core.memory import Memory


class Result(StrEnum):
    """An executed attempt's result, as the audit trail's ``result`` says it (contract)."""

    ACTED = "pending"  # its steps ran and passed their own checks: judged later, from fresh data
    FAILED = "failed"  # a step failed, or its own check did (the restart's completion)
    ESCALATED = "escalated"  # what it found needs the humans (L1, an unknown VRAM process, Rule 4.1)


@dataclass
class Execution:
    """One attempt as it runs: the steps done so far and what the attempt concludes. The executor
    (:mod:`gpuheal.actions.execute`) fills it; a hook may end it (:meth:`ends`) and add what it found."""

    item: PlanItem
    steps: list[StepResult] = field(default_factory=list)
    result: Result = Result.ACTED
    verification: dict[str, Any] = field(default_factory=dict)
    evidence: dict[str, Any] = field(default_factory=dict)
    found: dict[str, Any] = field(default_factory=dict)  # joins the issue's ``detected`` (audit line, alert)
    escalate_reason: str | None = None
    restarted: bool = False
    rebench: Ask | None = None  # a re-benchmark this fix asks for (core/rebench)
    instead: Action | None = None  # set by ``before_step``: run this in place of the step (Rule 6: start, not restart)

    def ends(self, result: Result, reason: str | None = None) -> None:
        """The attempt ends with ``result``; an escalation says why (``reason``)."""
        self.result = result
        if reason is not None:
            self.escalate_reason = reason


@dataclass(frozen=True)
class Ran:
    """A command run for a look (not a step of the attempt): the argv as run, and its answer."""

    argv: tuple[str, ...]
    outcome: CommandOutcome


@dataclass(frozen=True)
class Proving:
    """What a ``verify`` hook sees: the attempt whose issue cleared, and this run's poll — whether the
    configured data source answered usable (``source_ok``; ``None``: no such source), each configured
    GPU's direct ``/health`` probe (``endpoints``: ``None`` = not probed) and the open issues."""

    gpu: str
    issue: str
    source: str
    source_ok: bool | None
    endpoints: Mapping[str, str | None]
    firing: frozenset[tuple[str, str]]  # (gpu, issue) firing (or verifying a fix) at this poll, hidden ones too


class RemedyContext(Protocol):
    """Every capability a remedy's hooks use, bound to one GPU (``gpu``) of one heal run."""

    @property
    def cfg(self) -> Config: ...
    @property
    def gpu(self) -> str: ...
    @property
    def now_s(self) -> float:
        """This run's time (epoch s): when a snapshot it takes counts as taken."""
        ...

    def for_gpu(self, alias: str) -> RemedyContext:
        """The same run's context bound to another GPU (``track`` walks the rule's open issues)."""
        ...

    def perform(self, step: Action, timeout_s: float | None = None, **values: str) -> StepResult:
        """Perform one action on this GPU — a command where its commands run (placeholders filled,
        ``values`` adding e.g. ``pid``), a LiteLLM admin change — within ``timeout_s`` (default
        ``heal.command_timeout_s``), its output redacted. Never raises for what the world does."""
        ...

    def run(self, argv: tuple[str, ...], target: str) -> Ran:
        """Run one argv on ``target`` to look at something (``heal.command_timeout_s``, at most 15 s)."""
        ...

    def llama_pids(self) -> frozenset[int]:
        """This GPU's llama-server by its endpoint's port, where its commands run; empty when not known."""
        ...

    @property
    def llama_port(self) -> int | None:
        """The port this GPU's llama-server listens on (its endpoint's); ``None`` when not known."""
        ...

    def complete(self) -> Mapping[str, Any]:
        """A real completion on this GPU's llama-server (``ok``, ``completion_s``, ``gen_tok_s``, ``error``)."""
        ...

    def model_health(self) -> Mapping[str, Any]:
        """LiteLLM's own health check of this GPU's deployment (``litellm``: healthy | unhealthy | ...)."""
        ...

    def until(self, seen: Callable[[], bool], within_s: float, every_s: float) -> bool:
        """Whether ``seen()`` comes true within ``within_s``, asked every ``every_s`` (an effect counts when seen)."""
        ...

    def record(self) -> Any:
        """The rule's own record as last saved (its ``state_file``; ``{}`` when there is none)."""
        ...

    def save_record(self, doc: Any) -> None: ...


@dataclass(frozen=True)
class Incident:
    """Which alerts of one GPU go out as one message (Alertmanager's ``inhibit_rules``, as data): an
    alert carries, inside its message, the same GPU's alerts of the same kind and ``family`` with a
    lower ``rank`` (Rule 1 over Rule 8's two tiers; a hot GPU's regression joins the tiers above it,
    Rule 4.3). Equal ranks are peers: neither carries the other."""

    family: str
    rank: int


@dataclass(frozen=True)
class Planning:
    """What a ``guard`` sees: one firing issue as the planner has it, this poll's other open issues of
    its GPU, the rule's own record as last saved and the run's clock."""

    gpu: str
    issue: str
    since: str | None
    detected: Mapping[str, Any]
    open_ids: frozenset[str]  # issue ids open on this GPU at this poll (firing or pending its hold)
    incidents: Mapping[str, Incident]  # every rule's incident family, by issue id
    record: Any
    now_s: float
    tol_s: float
    cfg: Config

    def open_in(self, family: str) -> tuple[str, ...]:
        """The family's other issues open on this GPU, highest rank first."""
        found = [(inc.rank, i) for i, inc in self.incidents.items()
                 if inc.family == family and i != self.issue and i in self.open_ids]  # fmt: skip
        return tuple(i for _, i in sorted(found, key=lambda x: -x[0]))


@dataclass(frozen=True)
class Guard:
    """What a guard says before planning (both ``None``: go ahead).

    ``wait``: the fix waits this run (an escalation the guards decided still goes out);
    ``joins``: the issue is part of another open incident whose own fix runs — neither a fix nor an
    escalation of its own; ``seen``: what the guard looked at, joined to the issue's ``detected``."""

    wait: str | None = None
    joins: str | None = None
    seen: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OpenIssue:
    """One open issue as ``track`` sees it: its occurrence and whether it fired yet."""

    gpu: str
    since: str | None
    firing: bool

    @classmethod
    def of(cls, issue_id: str, still_open: Mapping[tuple[str, str], Issue]) -> tuple[OpenIssue, ...]:
        """The open issues (pending, firing or hidden; by ``(gpu, issue)``) of one rule, as its ``track`` sees them."""
        return tuple(cls(gpu, i.since, i.state == FIRING) for (gpu, name), i in still_open.items() if name == issue_id)


@dataclass(frozen=True)
class Followed:
    """What a ``follow_up`` sees: one advice item of this run and the humans' side of it."""

    gpu: str
    issue: str
    since: str | None
    reason: str
    escalated_at_s: float | None  # when this occurrence was escalated (``None``: not yet)
    now_s: float
    tol_s: float
    apply: bool  # False: a dry run, which only shows what it would say
    cfg: Config


@dataclass(frozen=True)
class Rechecking:
    """What a ``recheck`` hook sees: an attempt whose verification window passed, its issue still open
    now (``detected``, as last found), the rules' memory after this poll (the rule reads its own rows)
    and the run's clock."""

    gpu: str
    issue: str
    since: str | None
    actions: tuple[str, ...]
    started_s: float | None
    detected: Mapping[str, Any]
    memory: Memory
    now_s: float
    tol_s: float
    cfg: Config


@dataclass(frozen=True)
class Escalate:
    """Tell the humans, and hold the issue as escalated until it resolves or is cleared."""

    reason: str


@dataclass(frozen=True)
class Note:
    """One entry of the run's ``actions`` list (action ``alert``) with its ``result``."""

    text: str
    result: str


@dataclass(frozen=True)
class Notice:
    """An escalated alert of its own (state ``key``: never deduplicated against the issue's
    escalation), audited and shown once — when it is first queued."""

    text: str
    key: str


FollowUp = Escalate | Note | Notice


@dataclass(frozen=True)
class Remedy:
    """The fix for one rule's issue. The verification window and the failure budget are the rule's
    ``verify_within_s`` / ``escalate_after_failures`` parameters (``config/defaults.yaml``).

    ``steps``: action names in order. ``alert_now``: the spec alerts on detection (Rule 8 tier 2).
    ``automatic``: False = nothing safe to do, escalate at once. ``silent``: its fix is announced to
    nobody — the spec's "no alert" (Rule 8 tier 1): the audit trail keeps it, and only an escalation
    (the fix failed or cannot be configured) reaches the humans."""

    steps: tuple[str, ...] = ()
    alert_now: bool = False
    automatic: bool = True
    why_escalate: str = "remediation did not fix it"
    silent: bool = False
    recommend: bool = False  # advice (severity info): reported, never acted on nor escalated
    cannot_serve: bool = False  # its GPU cannot serve while it is open: the fleet guard counts it
    remind: bool = True  # an escalation still open is repeated every alerts.repeat_interval_h
    incident: Incident | None = None
    state_file: str | None = None  # the state directory file of the remedy's own record
    track: Callable[[tuple[OpenIssue, ...], RemedyContext], None] | None = None
    guard: Callable[[Planning], Guard] | None = None
    before_step: Callable[[Execution, Action, RemedyContext], bool] | None = None
    conclude: Callable[[Execution, RemedyContext], None] | None = None
    follow_up: Callable[[Followed], tuple[FollowUp, ...]] | None = None
    verify: Callable[[Proving, RemedyContext], Mapping[str, Any]] | None = None
    recheck: Callable[[Rechecking], str | None] | None = None
    drain: Callable[[Mapping[str, Any]], str | None] | None = None  # drain first: the hard fault ``detected`` shows
    asks: Callable[[Memory, float], tuple[Raised, ...]] | None = None  # re-benchmarks its memory holds (Rule 9)
    rebenched: Callable[[Rebenched], Told] | None = None  # a re-benchmark's verdict (default: rebench.prove_fix)


def completion_proof(ctx: RemedyContext) -> dict[str, Any]:
    """The default proof of a GPU's fix (design: "verify with a real completion", issue 20): a real
    completion on its llama-server. ``ok`` False: not proved this poll."""
    done = ctx.complete()
    if not done.get("ok"):
        return {"ok": False, "error": done.get("error") or "the completion failed"}
    return {"ok": True, "completion_s": done.get("completion_s"), "proof_tok_s": done.get("gen_tok_s")}


NO_REMEDY = Remedy(automatic=False, why_escalate="no remedy known")


@dataclass(frozen=True)
class PlanItem:
    """One firing issue as planned (:func:`gpuheal.core.plan.plan`): act, escalate, blocked or recommend,
    why, the steps and the remedy whose hooks the executor runs. Beside :class:`Remedy`, which its hooks
    are typed against."""

    gpu: str
    issue: str
    decision: str  # act | escalate | blocked | recommend
    reason: str
    steps: tuple[Action, ...] = ()
    attempt_no: int = 0
    key: str = ""
    detected: dict[str, Any] = field(default_factory=dict)
    since: str | None = None
    severity: str = "warning"
    alert_now: bool = False
    restarts: bool = False  # a step restarts the GPU's llama-server (restart budget, grace)
    restart_targets: frozenset[str] = frozenset()  # the GPU and the services its steps restart
    remedy: Remedy = field(default=NO_REMEDY, repr=False)  # its rule's remedy: the hooks the executor runs

    @property
    def actions(self) -> list[str]:
        """The contract action names of the steps, in order."""
        return [s.action for s in self.steps]
