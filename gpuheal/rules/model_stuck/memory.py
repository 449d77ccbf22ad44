"""What Rule 3 remembers between polls, per GPU: three memories, one per way it can see a stuck model.
Pure; the engine keeps the rows (:mod:`gpuheal.core.memory`: missing data, a poll seen twice, a
damaged row and a GPU gone are handled there, once).

**Decode progress** (``decode``), from llama-server's own ``/metrics`` — contract "Rule 3 from
llama-server": a poll whose ``/metrics`` shows requests in flight (``llamacpp:requests_processing`` > 0)
and ``llamacpp:n_decode_total`` unchanged since the previous poll is a stalled poll; ``model-stuck``
fires at the 3rd consecutive poll with requests in flight and no decode since the first of them.
``n_decode_total`` and not ``tokens_predicted_total``: a real b11312 server adds to the latter only
when a request ends (0 through a whole 2,300-token generation while ``n_decode_total`` went
158 → 2,301), so a detector on it would restart every server serving a long answer. A counter that
went down is a restart, never progress and never a stall: the run starts again from that poll.

**A hung task loop** (``taskloop``, issue 20; :mod:`gpuheal.core.taskloop` classifies a poll):
``/health`` ok while ``/metrics``, ``/slots`` (and the canary) do not answer is a stalled poll; one
answer ends the run.

**LiteLLM's counters** (``litellm``, issue 20): LiteLLM's ``prometheus`` callback counts every request
to each deployment and every failure since the proxy started (:mod:`gpuheal.parse.litellm_metrics`).
The difference between two polls is what users saw in between — at cron's cadence the spec's "over
60 s". A counter that went down is a restart of the proxy: never a rate.

**A model loading** (``loading``, issue 29): the first of the consecutive polls whose ``/health`` said
503 ``Loading model``. A loading server is not stuck (a deploy, an ``n_ctx`` change: its requests fail
until the model is in memory); one that stays loading past ``loading_max_s`` is.

Each row is read by :func:`decode_state`, :func:`taskloop_state`, :func:`litellm_window` and
:func:`loading_since` only for
the poll it is of: a poll that could not say leaves the row as it was, and the rule reads "not known".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from gpuheal.core.memory import Memory, number, whole
from gpuheal.core.remember import Remember
from gpuheal.core.taskloop import classify
from gpuheal.model import ENDPOINT_LOADING

if TYPE_CHECKING:
    from gpuheal.core.view import FleetView


# --------------------------------------------------------------------------- decode progress


@dataclass(frozen=True, slots=True)
class DecodeRow:
    """``n``: ``n_decode_total``; ``polls``: consecutive polls in flight without a decode (1 = the first
    of them), since ``first_s``; ``reset_s``: the last poll whose counter went down (a restart);
    ``busy``/``deferred``: requests processing / deferred; ``deferred_growing``: consecutive polls whose
    deferred count grew while no request finished."""

    n: float
    in_flight: bool
    at_s: float
    busy: int
    deferred: int | None
    reset_s: float | None
    polls: int
    first_s: float | None
    deferred_growing: int

    def to_json(self) -> dict[str, object]:
        return {"n": self.n, "in_flight": self.in_flight, "at_s": self.at_s, "busy": self.busy,
                "deferred": self.deferred, "reset_s": self.reset_s, "polls": self.polls, "first_s": self.first_s,
                "deferred_growing": self.deferred_growing}

    @classmethod
    def load(cls, data: object) -> DecodeRow | None:
        """A stored row; ``None`` when damaged. Fields an older version did not write take their
        defaults (no deferred count, no reset, not growing)."""
        if not isinstance(data, dict):
            return None
        n, at_s, busy = number(data.get("n")), number(data.get("at_s")), whole(data.get("busy", 0))
        polls, growing = whole(data.get("polls", 0)), whole(data.get("deferred_growing", 0))
        in_flight, deferred = data.get("in_flight", False), data.get("deferred")
        first_s, reset_s = data.get("first_s"), data.get("reset_s")
        if n is None or at_s is None or busy is None or polls is None or growing is None:
            return None
        if not isinstance(in_flight, bool) or (deferred is not None and whole(deferred) is None):
            return None
        if (first_s is not None and number(first_s) is None) or (reset_s is not None and number(reset_s) is None):
            return None
        return cls(n=n, in_flight=in_flight, at_s=at_s, busy=busy, deferred=whole(deferred), reset_s=number(reset_s),
                   polls=polls, first_s=number(first_s), deferred_growing=growing)


def fold_decode(prev: DecodeRow | None, view: FleetView, alias: str) -> DecodeRow | None:
    """This poll's ``/metrics`` after ``prev``; ``None`` when it does not know the counters."""
    sample = view.sample(alias)
    if sample is None:
        return None
    n, busy = reading(sample.n_decode_total), reading(sample.requests_processing)
    if n is None or busy is None:
        return None
    deferred = reading(sample.requests_deferred)
    return next_decode(prev, n, int(busy), None if deferred is None else int(deferred), bool(sample.is_sleeping),
                       view.now_s)


def next_decode(prev: DecodeRow | None, n: float, busy: int, deferred: int | None, sleeping: bool,
                now_s: float) -> DecodeRow:
    reset = prev is not None and n < prev.n
    in_flight = busy > 0 and not sleeping
    first_s: float | None = now_s  # the first of a possible run: decoding up to now
    polls = 1
    if not in_flight:
        polls, first_s = 0, None
    elif prev is not None and not reset and prev.in_flight and n == prev.n and prev.polls > 0:
        polls, first_s = prev.polls + 1, prev.first_s
    growing = 0
    if prev is not None and not reset and deferred is not None and prev.deferred is not None:
        freed = busy < prev.busy
        if deferred > prev.deferred and not freed:
            growing = prev.deferred_growing + 1
    return DecodeRow(n=n, in_flight=in_flight, at_s=now_s, busy=busy, deferred=deferred,
                     reset_s=now_s if reset else (prev.reset_s if prev is not None else None),
                     polls=polls, first_s=first_s, deferred_growing=growing)


def reading(value: object) -> float | None:
    """A counter the sources already checked; a hand-made trace may hold anything: not known."""
    got = number(value)
    return None if got is None or got < 0 else got


# --------------------------------------------------------------------------- hung task loop


@dataclass(frozen=True, slots=True)
class TaskloopRow:
    """``polls``: consecutive stalled polls (1 = the first), since ``first_s``; the paths that
    answered and those that did not, at the poll ``at_s``."""

    polls: int
    first_s: float | None
    at_s: float
    answered: tuple[str, ...]
    silent: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"polls": self.polls, "first_s": self.first_s, "at_s": self.at_s, "answered": list(self.answered),
                "silent": list(self.silent)}

    @classmethod
    def load(cls, data: object) -> TaskloopRow | None:
        if not isinstance(data, dict):
            return None
        polls, at_s, first_s = whole(data.get("polls", 0)), number(data.get("at_s")), data.get("first_s")
        answered, silent = _paths(data.get("answered", [])), _paths(data.get("silent", []))
        if polls is None or at_s is None or answered is None or silent is None:
            return None
        if first_s is not None and number(first_s) is None:
            return None
        return cls(polls=polls, first_s=number(first_s), at_s=at_s, answered=answered, silent=silent)


def _paths(value: object) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        return None
    return tuple(value)


def fold_taskloop(prev: TaskloopRow | None, view: FleetView, alias: str) -> TaskloopRow | None:
    """This poll after ``prev``; ``None`` when the poll cannot say (see :func:`classify`)."""
    stalled, answered, silent = classify(view.sample(alias))
    if stalled is None:
        return None
    now_s = view.now_s
    if not stalled:
        return TaskloopRow(polls=0, first_s=None, at_s=now_s, answered=tuple(answered), silent=tuple(silent))
    polls = prev.polls if prev is not None else 0
    first_s = prev.first_s if prev is not None and polls > 0 else now_s
    return TaskloopRow(polls=polls + 1, first_s=first_s, at_s=now_s, answered=tuple(answered), silent=tuple(silent))


# --------------------------------------------------------------------------- LiteLLM's counters


@dataclass(frozen=True, slots=True)
class LitellmRow:
    """The counters at ``at_s``, and ``requests``/``failed`` since the previous poll (``None`` on the
    first poll and after a proxy restart)."""

    total: float
    failures: float
    at_s: float
    requests: float | None
    failed: float | None

    def to_json(self) -> dict[str, object]:
        return {"total": self.total, "failures": self.failures, "at_s": self.at_s, "requests": self.requests,
                "failed": self.failed}

    @classmethod
    def load(cls, data: object) -> LitellmRow | None:
        if not isinstance(data, dict):
            return None
        total, failures, at_s = _count(data.get("total")), _count(data.get("failures")), number(data.get("at_s"))
        requests, failed = data.get("requests"), data.get("failed")
        if total is None or failures is None or at_s is None:
            return None
        if (requests is None) != (failed is None) or (requests is not None and (
                _count(requests) is None or _count(failed) is None)):
            return None
        return cls(total=total, failures=failures, at_s=at_s, requests=_count(requests), failed=_count(failed))


def fold_litellm(prev: LitellmRow | None, view: FleetView, alias: str) -> LitellmRow | None:
    """This poll's counters after ``prev``; ``None`` when the poll does not know the request count."""
    sample = view.sample(alias)
    total = _count(None if sample is None else sample.litellm_requests_total)
    if total is None:
        return None
    failures = _count(None if sample is None else sample.litellm_failures_total) or 0.0
    row = LitellmRow(total=total, failures=failures, at_s=view.now_s, requests=None, failed=None)
    if prev is not None:
        requests, failed = total - prev.total, failures - prev.failures
        if requests >= 0 and failed >= 0:
            row = LitellmRow(total=total, failures=failures, at_s=view.now_s, requests=requests,
                             failed=min(failed, requests))
    return row


def _count(value: object) -> float | None:
    got = number(value)
    return None if got is None or got < 0 else float(got)


# --------------------------------------------------------------------------- a model loading


@dataclass(frozen=True, slots=True)
class LoadingRow:
    """``first_s``: the first of the consecutive polls up to ``at_s`` whose ``/health`` said loading
    (``None``: the poll ``at_s`` did not)."""

    first_s: float | None
    at_s: float

    def to_json(self) -> dict[str, object] | None:
        """Kept only while loading: a server not loading is no row (``fold_loading`` reads both alike)."""
        return None if self.first_s is None else {"first_s": self.first_s, "at_s": self.at_s}

    @classmethod
    def load(cls, data: object) -> LoadingRow | None:
        if not isinstance(data, dict):
            return None
        first_s, at_s = data.get("first_s"), number(data.get("at_s"))
        if at_s is None or (first_s is not None and number(first_s) is None):
            return None
        return cls(first_s=number(first_s), at_s=at_s)


def fold_loading(prev: LoadingRow | None, view: FleetView, alias: str) -> LoadingRow | None:
    """This poll's ``/health`` after ``prev``; ``None`` when the poll does not know it (the load's
    start is kept: a poll that could not see the server neither ends nor restarts a load)."""
    state = view.endpoint(alias)
    if state is None:
        return None
    if state != ENDPOINT_LOADING:
        return LoadingRow(first_s=None, at_s=view.now_s)
    first_s = prev.first_s if prev is not None and prev.first_s is not None else view.now_s
    return LoadingRow(first_s=first_s, at_s=view.now_s)


# --------------------------------------------------------------------------- declared, and read

DECODE: Final = Remember("decode", DecodeRow.load, fold_decode)
TASKLOOP: Final = Remember("taskloop", TaskloopRow.load, fold_taskloop)
LITELLM: Final = Remember("litellm", LitellmRow.load, fold_litellm)
LOADING: Final = Remember("loading", LoadingRow.load, fold_loading)
REMEMBER: Final = (DECODE, TASKLOOP, LITELLM, LOADING)


def decode_state(memory: Memory, alias: str, now_s: float) -> DecodeRow | None:
    """This poll's decode progress of ``alias``; ``None`` when this poll did not know the counters."""
    row = memory.get(DECODE, alias)
    return row if row is not None and row.at_s == now_s else None


def progress_columns(memory: Memory, aliases: Iterable[str], now_s: float) -> dict[str, dict[str, int | None]]:
    """Per GPU, ``check``'s columns from llama-server's ``/metrics`` poll over poll (issue 12):
    ``polls_without_decode`` (requests in flight, ``n_decode_total`` unchanged) and
    ``deferred_growing_polls`` (waiting requests growing while none finished) — shown in ``check``'s
    table, not an issue by itself; ``None`` when this poll did not know the counters."""
    out: dict[str, dict[str, int | None]] = {}
    for alias in aliases:
        state = decode_state(memory, alias, now_s)
        out[alias] = {"polls_without_decode": None if state is None else state.polls,
                      "deferred_growing_polls": None if state is None else state.deferred_growing}
    return out


def taskloop_state(memory: Memory, alias: str, now_s: float) -> TaskloopRow | None:
    """This poll's task-loop run of ``alias``; ``None`` when this poll could not say."""
    row = memory.get(TASKLOOP, alias)
    return row if row is not None and row.at_s == now_s else None


def litellm_window(memory: Memory, alias: str, now_s: float) -> tuple[float, float] | None:
    """(requests, failed) since the previous poll, when this poll knew them."""
    row = memory.get(LITELLM, alias)
    if row is None or row.at_s != now_s or row.requests is None or row.failed is None:
        return None
    return row.requests, row.failed


def loading_since(memory: Memory, alias: str, now_s: float) -> float | None:
    """When ``alias``'s model began loading, if this poll's ``/health`` says it still is."""
    row = memory.get(LOADING, alias)
    return row.first_s if row is not None and row.at_s == now_s else None
