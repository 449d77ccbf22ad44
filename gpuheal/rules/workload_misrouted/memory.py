"""What Rule 10 remembers between polls, per GPU, and the fleet's readings it judges from. Pure; the
engine keeps the rows (:mod:`gpuheal.core.memory`).

Two memories, so that one-shot cron runs see a trailing window (``window_s``, read at fleet level):

- ``routing``: LiteLLM's per-deployment request counter (``litellm_deployment_total_requests_total``)
  poll by poll, with the deployment's model group: its increase over the window is the GPU's requests
  when LiteLLM's spend logs are not read (:func:`gpuheal.core.routing.counter_increase`);
- ``requests``: gpu-monitor's ``requests_60s`` of each GPU with a configured ``weight``, summed in
  5-minute buckets: weight only, when LiteLLM's counters are not known either.

Both are kept ``window_s`` and one bucket more. A poll that does not know a GPU's count adds nothing
for it (and gpu-monitor not usable adds nothing at all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from gpuheal.core import routing, timing
from gpuheal.core.memory import Memory, number, whole
from gpuheal.core.remember import Remember
from gpuheal.core.routing import Reading

if TYPE_CHECKING:
    from gpuheal.core.view import FleetView

REQUEST_BUCKET_S = 300.0  # request counts are remembered in 5-minute buckets


def window_s(view: FleetView) -> float:
    """The rule's trailing window, read at fleet level (as its ``detect`` does)."""
    from gpuheal.rules.workload_misrouted import ID, Params  # the rule module imports this one

    key = ("window_s", ID)
    if key not in view.cache:
        view.cache[key] = view.rule_params(ID, Params, "fleet").window_s
    window: float = view.cache[key]
    return window


# --------------------------------------------------------------------------- LiteLLM's counters


@dataclass(frozen=True, slots=True)
class CountersRow:
    """``(t, total, model group)`` per poll that knew the counter, oldest first (never empty)."""

    points: tuple[tuple[float, float, object], ...]

    @property
    def at_s(self) -> float:
        return self.points[-1][0]

    def to_json(self) -> list[list[object]]:
        return [list(p) for p in self.points]

    @classmethod
    def load(cls, data: object) -> CountersRow | None:
        """A stored ``[[t, total, group], ...]``; a damaged point is dropped, an empty row is none."""
        if not isinstance(data, list):
            return None
        points = tuple((p[0], p[1], p[2]) for p in data
                       if isinstance(p, list) and len(p) == 3 and number(p[0]) is not None and number(p[1]) is not None)
        return cls(points) if points else None


def fold_counters(prev: CountersRow | None, view: FleetView, alias: str) -> CountersRow | None:
    sample = view.sample(alias)
    total = None if sample is None else sample.litellm_requests_total
    if total is None or sample is None:
        return None
    cut = view.now_s - window_s(view) - REQUEST_BUCKET_S
    kept = tuple(p for p in (prev.points if prev is not None else ()) if p[0] >= cut)
    return CountersRow((*kept, (view.now_s, total, sample.litellm_model_group)))


def counter_points(memory: Memory, alias: str, start_s: float) -> list[tuple[float, float]]:
    """The remembered counter values of ``alias`` from ``start_s`` on."""
    row = memory.get(COUNTERS, alias)
    return [] if row is None else [(float(t), float(total)) for t, total, _ in row.points if t >= start_s]


def last_group(memory: Memory, alias: str) -> str | None:
    row = memory.get(COUNTERS, alias)
    group = None if row is None else row.points[-1][2]
    return group if isinstance(group, str) else None


# --------------------------------------------------------------------------- gpu-monitor's counts


@dataclass(frozen=True, slots=True)
class RequestsRow:
    """``(bucket_start_s, requests)`` per 5-minute bucket, oldest first, folded in up to the poll
    ``at_s`` (``None``: a row an earlier version wrote, without it)."""

    at_s: float | None
    buckets: tuple[tuple[float, int], ...]

    def to_json(self) -> dict[str, object]:
        return {"at_s": self.at_s, "buckets": list(map(list, self.buckets))}

    @classmethod
    def load(cls, data: object) -> RequestsRow | None:
        """A stored row; an earlier version's bare ``[[bucket_start_s, count], ...]`` has no ``at_s``."""
        at_s: object = None
        if isinstance(data, dict):
            at_s, data = data.get("at_s"), data.get("buckets")
        if not isinstance(data, list) or (at_s is not None and number(at_s) is None):
            return None
        buckets = _plain_buckets(data)
        if buckets is None:
            buckets = _checked_buckets(data)
        return None if buckets is None else cls(number(at_s), buckets)


def _plain_buckets(data: list[object]) -> tuple[tuple[float, int], ...] | None:
    """The buckets of a row as this version writes them — lists of exactly two plain numbers, the start finite
    and the count whole — checked a column at a time (every weighted GPU's day of buckets, at every cron run:
    ~290 pairs each). ``None``: not plainly so; :func:`_checked_buckets` then says, pair by pair, what the row
    is. Where this answers, it answers what that does: the same pairs of the same numbers."""
    if not data:
        return ()
    if set(map(type, data)) != {list} or set(map(len, data)) != {2}:  # type: ignore[arg-type]
        return None
    pairs: list[list[object]] = data  # type: ignore[assignment]
    starts, counts = zip(*pairs, strict=True)
    if not set(map(type, counts)) <= {int} or not set(map(type, starts)) <= {int, float}:
        return None
    try:
        total = sum(starts)
    except OverflowError:  # an int start too large for a float: a float sum cannot say it is finite
        return None
    if total - total != 0:  # NaN or an infinity among the floats (or the sum overflowed): pair by pair
        return None
    return tuple(zip(starts, counts, strict=True))


def _checked_buckets(data: list[object]) -> tuple[tuple[float, int], ...] | None:
    """The buckets of a stored row, each pair checked (:func:`number`, :func:`whole`); ``None``: damaged."""
    buckets = []
    for b in data:
        if not isinstance(b, list) or len(b) != 2:
            return None
        start, count = number(b[0]), whole(b[1])
        if start is None or count is None:
            return None
        buckets.append((start, count))
    return tuple(buckets)


def fold_requests(prev: RequestsRow | None, view: FleetView, alias: str) -> RequestsRow | None:
    if view.gpu(alias).weight is None:  # only weighted GPUs have a share to judge
        return RequestsRow(view.now_s, ()) if prev is not None and prev.buckets else None
    obs, sample = view.obs, view.sample(alias)
    if obs is None or not obs.monitor_ok or sample is None or sample.requests_60s is None:
        return None
    now_s = view.now_s
    # a poll within the tolerance before a bucket boundary belongs to the bucket it stands for
    poll_s = now_s + timing.TOLERANCE_S
    start = poll_s - poll_s % REQUEST_BUCKET_S
    buckets = list(prev.buckets) if prev is not None else []
    if buckets and buckets[-1][0] == start:
        buckets[-1] = (start, buckets[-1][1] + sample.requests_60s)
    elif not buckets or buckets[-1][0] < start:
        buckets.append((start, sample.requests_60s))
    cut = now_s - window_s(view) - REQUEST_BUCKET_S
    return RequestsRow(now_s, tuple([b for b in buckets if b[0] >= cut]))


def requests_in_window(view: FleetView, alias: str, window: float) -> int | None:
    """Requests LiteLLM sent ``alias`` over the trailing window (summed ``requests_60s``); ``None``
    when no count was known in the window (or the GPU has no weight)."""
    row = view.memory.get(REQUESTS, alias)
    if row is None or not row.buckets or view.gpu(alias).weight is None:
        return None
    cut = view.now_s - window
    # the bucket ends after the cut (one ending within the tolerance of it does not): timing.more_than(end - cut,
    # 0, tol), which is ``end - cut > tol`` for a tolerance >= 0 and ``end - cut > 0`` otherwise (a NaN one too),
    # asked of every bucket of every weighted GPU at every poll
    tol = view.tolerance_s
    over = tol if tol >= 0.0 else 0.0
    counts = [count for start, count in row.buckets if start + REQUEST_BUCKET_S - cut > over]
    if not counts:
        return None
    total = 0
    for count in counts:  # added in order, as ever (not sum(): a float count would be summed otherwise)
        total += count
    return total


COUNTERS: Final = Remember("routing", CountersRow.load, fold_counters)
REQUESTS: Final = Remember("requests", RequestsRow.load, fold_requests)
REMEMBER: Final = (COUNTERS, REQUESTS)


# --------------------------------------------------------------------------- the fleet's readings


def fleet_readings(view: FleetView, window: float) -> dict[str, Reading]:
    """Every GPU's :class:`~gpuheal.core.routing.Reading` over the trailing window from the best source
    this poll has: the spend logs when this poll read them, else LiteLLM's counters when remembered,
    else gpu-monitor's counts. One source for the whole fleet, so that shares compare like with like.
    Cached per view."""
    key = ("routing", window)
    if key in view.cache:
        cached: dict[str, Reading] = view.cache[key]
        return cached
    gpus = view.gpus
    out: dict[str, Reading] = {}
    samples = {a: view.sample(a) for a in gpus}
    kept_from = view.now_s - window - REQUEST_BUCKET_S
    if any(s is not None and s.routing is not None for s in samples.values()):
        for a, s in samples.items():
            if s is not None and s.routing is not None:
                out[a] = routing.from_spend(s.routing, gpus[a].role_kinds)
    elif any(counter_points(view.memory, a, kept_from) for a in gpus):
        for a, g in gpus.items():
            increase = routing.counter_increase(
                counter_points(view.memory, a, view.now_s - window - view.tolerance_s))
            if increase is not None:
                out[a] = routing.from_counters(increase, last_group(view.memory, a), g.role_kinds)
    else:
        for a, g in gpus.items():
            n = requests_in_window(view, a, window)
            if n is not None:
                out[a] = routing.from_monitor(n, g.role_kinds)
    view.cache[key] = out
    return out
