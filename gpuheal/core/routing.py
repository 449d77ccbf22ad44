"""Rule 10, workload distribution, judged as the spec writes it (issue 22, item 6). Pure: values in,
values out; time is a parameter.

Spec Rule 10: "Alert if any GPU is handling workload outside its designated role … Track per-GPU
request distribution via LiteLLM spend logs … Verify: each GPU's request pattern matches its
designated role within 24h. Escalate: if role mismatch persists >48h → agent alias audit needed."

**Where the distribution comes from**, in this order, and every reading says which it was:

1. ``spend-logs``: LiteLLM's spend logs over the window (``sources/litellm_spend``), one row per
   request, each judged against the GPU's role here (:func:`tally`) — model group, request tags and
   prompt size are all judgeable;
2. ``litellm-counters``: with no database, LiteLLM's per-deployment request counters
   (``litellm_deployment_total_requests_total``), their increase over the window
   (:func:`counter_increase`; a counter that went down is a proxy restart, and counts from zero).
   The deployment's model group is known; request tags and prompt sizes are not;
3. ``gpu-monitor``: its per-host ``requests_60s`` summed over the window — weight only.

The last two are remembered poll by poll by the rule (``rules/workload_misrouted/memory.py``, which also
picks the source for the fleet).

**Weight**: a GPU's share of the fleet's requests against its weight over the sum of weights; off by
more than ``tolerance_ratio`` of the target (at least 2 points) is misrouted. **Role**: the requests
outside its role over those that could be judged, more than ``role_tolerance_ratio``, is misrouted.
A role criterion the source cannot judge is listed in ``not_judged``, never guessed.

**The recommendation names the traffic** (issue 27 item 11): which model group, tag or prompt size
the requests outside the role were (the spend logs per request; LiteLLM's counters per deployment,
whose model group is known), each with the GPUs whose role names it (``route``: "model group 'heavy'
(150 requests) → gpu-dense"), or that no GPU's role does; a share off its weight names the GPUs to move
requests to (under their weight) or from (over it). gpu-monitor's counts know no traffic: the line
stays generic there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from gpuheal.config.model import Role
from gpuheal.model import RoleTally
from gpuheal.parse.litellm_spend import SpendRow
from gpuheal.parse.values import printable

SPEND_LOGS = "spend-logs"
COUNTERS = "litellm-counters"
MONITOR = "gpu-monitor"
MIN_BAND = 0.02  # a share within 2 points of its target is never "misrouted", however small the target
TRAFFIC_KEPT = 20  # a tally keeps the 20 biggest kinds of outside traffic per GPU (a bounded trace)
TRAFFIC_SHOWN = 3  # the recommendation names the 3 biggest
VALUE_CHARS = 60  # a model group or tag as shown (text from LiteLLM's database: printable, bounded)
PEERS_SHOWN = 3


class Criterion(StrEnum):
    MODEL_GROUP = "model group"
    TAGS = "request tags"
    PROMPT = "prompt tokens"


def criteria(role: Role | None) -> tuple[Criterion, ...]:
    """The criteria a role names."""
    if role is None:
        return ()
    out = [Criterion.MODEL_GROUP] if role.model_groups else []
    out += [Criterion.TAGS] if role.request_tags else []
    out += [Criterion.PROMPT] if role.min_prompt_tokens is not None or role.max_prompt_tokens is not None else []
    return tuple(out)


def judge_request(role: Role, row: SpendRow) -> tuple[bool | None, Criterion | None]:
    """(inside the role: True / False / None = not known, the first criterion it broke). A request
    is outside when any criterion it can be judged on fails; not known when none fails but one
    cannot be judged (the row lacks that field)."""
    unknown = False
    for c in criteria(role):
        ok = _holds(role, c, row)
        if ok is False:
            return False, c
        unknown = unknown or ok is None
    return (None if unknown else True), None


def _holds(role: Role, c: Criterion, row: SpendRow) -> bool | None:
    if c is Criterion.MODEL_GROUP:
        return None if row.model_group is None else row.model_group in role.model_groups
    if c is Criterion.TAGS:
        return None if row.request_tags is None else bool(set(row.request_tags) & set(role.request_tags))
    if row.prompt_tokens is None:
        return None
    lo, hi = role.min_prompt_tokens, role.max_prompt_tokens
    return (lo is None or row.prompt_tokens >= lo) and (hi is None or row.prompt_tokens <= hi)


@dataclass(frozen=True)
class Deployment:
    """How a GPU is known in LiteLLM: its alias or ``litellm_model_id`` as ``model_id``, else its endpoint
    as ``api_base`` (with or without ``/v1``)."""

    alias: str
    ids: frozenset[str]
    endpoint: str
    role: Role | None


def owner(row: SpendRow, gpus: Iterable[Deployment]) -> str | None:
    """The GPU that served ``row``: by ``model_id``, else by ``api_base`` when exactly one GPU matches."""
    gpus = tuple(gpus)
    if row.model_id is not None:
        for g in gpus:
            if row.model_id in g.ids:
                return g.alias
    if row.api_base is None:
        return None
    base = row.api_base.rstrip("/").removesuffix("/v1")
    found = [g.alias for g in gpus if g.endpoint.rstrip("/") == base]
    return found[0] if len(found) == 1 else None


def tally(rows: Iterable[SpendRow], gpus: Iterable[Deployment], window_s: float) -> dict[str, RoleTally]:
    """Every GPU's requests in the rows, judged against its role. A GPU with no row has 0 requests
    (the spend logs list every request LiteLLM routed); rows of no configured GPU are not counted."""
    gpus = tuple(gpus)
    seen = {g.alias: 0 for g in gpus}
    unknown = dict(seen)
    outside: dict[str, dict[str, int]] = {g.alias: {} for g in gpus}
    traffic: dict[str, Counter[tuple[str, str]]] = {g.alias: Counter() for g in gpus}
    roles = {g.alias: g.role for g in gpus}
    for row in rows:
        alias = owner(row, gpus)
        if alias is None:
            continue
        seen[alias] += 1
        role = roles[alias]
        if role is None or not role.judged:
            continue
        inside, broke = judge_request(role, row)
        if inside is None:
            unknown[alias] += 1
        elif broke is not None:
            by = outside[alias]
            by[broke.value] = by.get(broke.value, 0) + 1
            traffic[alias].update((broke.value, v) for v in traffic_values(role, broke, row))
    return {a: RoleTally(n, sum(outside[a].values()), unknown[a], window_s, tuple(sorted(outside[a].items())),
                         _biggest(traffic[a]))
            for a, n in seen.items()}


def traffic_values(role: Role, c: Criterion, row: SpendRow) -> tuple[str, ...]:
    """What a request outside its role is known by, for the criterion it broke: its model group, its
    tags (each one), or its prompt size against the role's bound."""
    if c is Criterion.MODEL_GROUP:
        return (_value(row.model_group),)
    if c is Criterion.TAGS:
        return tuple(dict.fromkeys(_value(t) for t in row.request_tags or ())) or ("(no tag)",)
    hi, lo, n = role.max_prompt_tokens, role.min_prompt_tokens, row.prompt_tokens or 0
    return (f"above {hi}",) if hi is not None and n > hi else (f"below {lo}",)


def _value(text: object) -> str:
    return printable(text, VALUE_CHARS) or "?"


def _biggest(counts: Counter[tuple[str, str]]) -> tuple[tuple[str, str, int], ...]:
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:TRAFFIC_KEPT]
    return tuple((c, v, n) for (c, v), n in ranked)


def accepts(role: Role | None, criterion: str, value: str) -> bool:
    """Whether ``role`` names this traffic (a destination for it): its model group or tag among the role's,
    or a prompt size its bounds take. A role that does not name the criterion is no destination."""
    if role is None:
        return False
    if criterion == Criterion.MODEL_GROUP.value:
        return value in role.model_groups
    if criterion == Criterion.TAGS.value:
        return value in role.request_tags
    if criterion != Criterion.PROMPT.value or (role.min_prompt_tokens is None and role.max_prompt_tokens is None):
        return False
    side, _, bound = value.partition(" ")
    if not bound.isdigit():
        return False
    if side == "above":
        return role.max_prompt_tokens is None or role.max_prompt_tokens > int(bound)
    return role.min_prompt_tokens is None or role.min_prompt_tokens < int(bound)


def counter_increase(points: list[tuple[float, float]]) -> float | None:
    """The increase of a monotonic counter over ``[(t, value), ...]`` (oldest first), as Prometheus's
    ``increase`` without extrapolation: a value lower than the one before is a restart of the proxy,
    and the new value counts from zero. ``None`` with fewer than two points."""
    if len(points) < 2:
        return None
    total = 0.0
    for (_t0, before), (_t1, after) in zip(points, points[1:], strict=False):
        total += after - before if after >= before else after
    return total


@dataclass(frozen=True)
class Reading:
    """One GPU's requests over the window from one source; ``outside`` / ``unknown``: of those, outside
    its role and not judgeable; ``judged`` / ``not_judged``: the role's criteria this source could and
    could not judge."""

    requests: float
    source: str
    outside: float = 0.0
    unknown: float = 0.0
    outside_by: tuple[tuple[str, int], ...] = ()
    judged: tuple[str, ...] = ()
    not_judged: tuple[str, ...] = ()
    traffic: tuple[tuple[str, str, int], ...] = ()  # (criterion, value, requests) of the traffic outside the role


def from_spend(t: RoleTally, role: Role | None) -> Reading:
    names = tuple(c.value for c in criteria(role))
    return Reading(float(t.requests), SPEND_LOGS, float(t.outside), float(t.unknown), t.outside_by, names, (),
                   t.traffic)


def from_counters(requests: float, model_group: str | None, role: Role | None) -> Reading:
    """A deployment's increase; its requests are all outside the role when its model group is not one
    the role names. Tags and prompt sizes are not known from counters."""
    names = criteria(role)
    not_judged = tuple(c.value for c in names if c is not Criterion.MODEL_GROUP)
    if Criterion.MODEL_GROUP not in names:
        return Reading(requests, COUNTERS, not_judged=not_judged)
    if model_group is None:
        return Reading(requests, COUNTERS, unknown=requests, not_judged=(Criterion.MODEL_GROUP.value, *not_judged))
    assert role is not None
    outside = 0.0 if model_group in role.model_groups else requests
    by = ((Criterion.MODEL_GROUP.value, int(outside)),) if outside else ()
    traffic = ((Criterion.MODEL_GROUP.value, _value(model_group), int(outside)),) if outside else ()
    return Reading(requests, COUNTERS, outside, 0.0, by, (Criterion.MODEL_GROUP.value,), not_judged, traffic)


def from_monitor(requests: int, role: Role | None) -> Reading:
    return Reading(float(requests), MONITOR, not_judged=tuple(c.value for c in criteria(role)))


@dataclass(frozen=True)
class Verdict:
    """Rule 10's finding for one GPU: its evidence (units in the names) and one line."""

    detected: dict[str, Any]
    summary: str


def judge(alias: str, readings: Mapping[str, Reading], weights: Mapping[str, float], role_name: str | None,
          *, tolerance_ratio: float, role_tolerance_ratio: float, min_requests: float,
          window_s: float | None = None,
          roles: Mapping[str, Role | None] | None = None,
          fleet: FleetTotals | None | Literal["count"] = "count") -> Verdict | Literal[False] | None:
    """Misrouted (a :class:`Verdict`), quiet (``False``) or not known (``None``). ``readings``: every
    GPU of the fleet that has one this poll; ``weights``: the weighted GPUs (shares need all of them);
    ``roles``: every GPU's role, for naming where its outside traffic belongs; ``fleet``: what
    :func:`totals` says of these readings and weights, when the caller has it (once a poll, not once a
    GPU: summing the fleet for each GPU made a poll's Rule 10 quadratic in the fleet, issue 29)."""
    mine = readings.get(alias)
    if mine is None:
        return None
    if isinstance(fleet, str):  # not given: counted here
        fleet = totals(readings, weights)
    share = _share(alias, readings, weights, tolerance_ratio, min_requests, fleet)
    role = _role_check(mine, role_tolerance_ratio, min_requests)
    if share is None and role is None:
        return None
    if not (share and share["off"]) and not (role and role["off"]):
        return False
    detected: dict[str, Any] = {"source": mine.source, "requests": round(mine.requests), "role": role_name,
                                "window_s": window_s}
    lines, moves = [], []
    if share is not None:
        detected.update({k: v for k, v in share.items() if k != "off"})
        if share["off"]:
            lines.append(f"gets {_pct(share['share_pct'])} % of requests, target {_pct(share['target_pct'])} %: "
                         f"{share['direction']}-used")
            peers = _peers(alias, readings, weights, share["direction"], tolerance_ratio, min_requests, fleet)
            if peers:
                detected["move_" + ("to" if share["direction"] == "over" else "from")] = peers
                moves.append(f"move requests {'to' if share['direction'] == 'over' else 'here from'} "
                             f"{', '.join(peers)} ({'under' if share['direction'] == 'over' else 'over'} their weight)")
    if role is not None:
        detected.update({k: v for k, v in role.items() if k != "off"})
        if role["off"]:
            lines.append(f"{_pct(role['outside_role_pct'])} % of its requests are outside its role "
                         f"({', '.join(f'{k}: {n}' for k, n in mine.outside_by) or 'model group'})")
            route = _routes(alias, mine, roles or {})
            if route:
                detected["route"] = route
                moves += [_route_text(r) for r in route]
    if mine.not_judged:
        detected["not_judged"] = list(mine.not_judged)
    advice = "recommend agent alias updates: " + "; ".join(moves) if moves else \
        "recommend agent alias updates to match the GPU roles"
    summary = f"{alias} ({role_name or 'no role set'}) " + "; ".join(lines) + f" [{mine.source}]: {advice}"
    return Verdict(detected, summary)


def _routes(alias: str, mine: Reading, roles: Mapping[str, Role | None]) -> list[dict[str, Any]]:
    """The biggest kinds of this GPU's outside traffic, each with the GPUs whose role names it."""
    ranked = sorted(mine.traffic, key=lambda t: (-t[2], t[0], t[1]))[:TRAFFIC_SHOWN]
    return [{"traffic": c, "value": v, "requests": n,
             "to": sorted(a for a, r in roles.items() if a != alias and accepts(r, c, v))} for c, v, n in ranked]


def _route_text(r: Mapping[str, Any]) -> str:
    kind = {Criterion.TAGS.value: "tag"}.get(r["traffic"], r["traffic"])
    what = f"{kind} {r['value']}" if r["traffic"] == Criterion.PROMPT.value else f"{kind} '{r['value']}'"
    to = ", ".join(r["to"]) if r["to"] else "no GPU's role names it (give one a role that does)"
    return f"{what} ({r['requests']} requests) -> {to}"


def _peers(alias: str, readings: Mapping[str, Reading], weights: Mapping[str, float], direction: str,
           tolerance_ratio: float, min_requests: float, fleet: FleetTotals | None) -> list[str]:
    """The weighted GPUs on the other side of their target (under it when ``alias`` is over-used), the
    farthest first: where to move requests to, or from."""
    found = []
    for other in weights:
        if other == alias:
            continue
        s = _share(other, readings, weights, tolerance_ratio, min_requests, fleet)
        if s is not None and s["direction"] != direction and s["share_pct"] != s["target_pct"]:
            found.append((-abs(s["share_pct"] - s["target_pct"]), other))
    return [a for _, a in sorted(found)[:PEERS_SHOWN]]


@dataclass(frozen=True)
class FleetTotals:
    """The weighted GPUs' requests and weights, summed: what every GPU's share is measured against."""

    requests: float
    weight: float


def totals(readings: Mapping[str, Reading], weights: Mapping[str, float]) -> FleetTotals | None:
    """The fleet's sums for :func:`judge`; ``None`` when no share can be judged: fewer than two weighted
    GPUs, or a weighted GPU without a reading (shares need all of them)."""
    if len(weights) < 2 or any(a not in readings for a in weights):
        return None
    return FleetTotals(sum(readings[a].requests for a in weights), sum(weights.values()))


def _share(alias: str, readings: Mapping[str, Reading], weights: Mapping[str, float], tolerance_ratio: float,
           min_requests: float, fleet: FleetTotals | None) -> dict[str, Any] | None:
    if alias not in weights or fleet is None:
        return None
    total, weight_sum = fleet.requests, fleet.weight
    if total < min_requests or weight_sum <= 0:
        return None
    share, target = readings[alias].requests / total, weights[alias] / weight_sum
    band = max(tolerance_ratio * target, MIN_BAND)
    return {"off": abs(share - target) > band, "share_pct": round(100 * share, 1), "target_pct": round(100 * target, 1),
            "tolerance_pct": round(100 * band, 1), "fleet_requests": round(total),
            "direction": "over" if share > target else "under"}


def _role_check(mine: Reading, tolerance_ratio: float, min_requests: float) -> dict[str, Any] | None:
    known = mine.requests - mine.unknown
    if not mine.judged or known < max(min_requests, 1):
        return None
    ratio = mine.outside / known
    return {"off": ratio > tolerance_ratio, "outside_role_pct": round(100 * ratio, 1),
            "outside_role": round(mine.outside), "role_unknown": round(mine.unknown), "judged": list(mine.judged),
            "outside_by": dict(mine.outside_by)}


def _pct(value: float) -> str:
    return f"{value:.0f}"


