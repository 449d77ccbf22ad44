"""The chaos week's measures (issue 29), per system, per fault kind and overall, from one recorded
:class:`chaos_week.Week` and the ground truth it ran on.

Definitions (every time is virtual seconds; "live" is the incident's script's judgement of the world):

- **healed** — a fault of a kind gpuheal claims to *heal* (``claim: heal``): the system's action
  took it out of the world before a human did (before its natural end, or the end a page brought).
  A fault it can only *escalate* (hardware, a host or a rack off the network, a rack's cooling, a
  foreign process's leak while ``kill_unknown_processes`` is off): a page naming one of its GPUs (or
  the fleet, for the fleet's own) reached the humans before the fault ended. A fault it *reports*
  (``claim: report``: a context change that cost speed, a GPU's traffic off its weight): an issue of
  any severity fired on its GPU. Baselines are judged by the same three rules.
- **recall** — faults healed / faults, overall and per kind.
- **time to detect** — fault start → the first cycle in which the system had a warning or critical
  issue firing on its GPU (the fleet for gpu-monitor's faults) or acted on it.
- **repair time** (MTTR p50 / p90) — fault start → out of the world: healed by the system, fixed by a
  human (HUMAN_RESPONSE_S after a page), its natural end, or the end of the week (censored).
- **action** — a change a system made to the fleet: a llama-server or service restart (also one
  sent to a host that cannot be reached), a LiteLLM deployment's rpm or weight lowered (load shed,
  traffic redirected; giving the load back ends a mitigation and is not counted), a power limit set,
  a process killed, a LiteLLM cooldown. **Action precision** — actions on a target (a GPU, or the
  service) with a live fault at that minute / all actions. **False actions** — the others; those on a
  GPU in a benign event are listed by event kind.
- **restarts per fault** — llama-server and service restarts on a live fault / faults.
- **messages per incident** / **pages per incident** — messages the humans got that name a GPU of a
  fault (or the fleet, for the fleet's own) while it was live or in the hour after it ended, per
  fault; a *page* is a warning or critical one (``⚠ … needs attention``, reminders included).
  Messages about nothing live are counted apart (``stray_messages``), All Clear notices too.
- **escalations needed / not needed** — first (not reminder) pages about a fault: needed when the
  fault was not healable (``claim`` escalate), not needed when it was, or when the page concerned no
  fault. **Unhealable faults escalated exactly once** — of the ``claim: escalate`` faults, how many got
  exactly one first page.
- **capacity lost** — GPU-minutes of serving lost (:func:`chaos_world.serving`), charged to the fault
  that held the GPU, planned downtime (deploys, maintenance) excluded.
"""

from __future__ import annotations

from typing import Any

from chaos_inject import KINDS
from chaos_week import Week

MESSAGE_AFTER_S = 3600.0  # a message up to an hour after a fault ended still concerns it (its resolution)
SERVICE_TARGETS = {"monitor": ("monitor-down", "monitor-empty"), "litellm": ("breaker-stuck",)}
ALL_CLEAR = "✅"


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return round(ordered[rank - 1], 1)


def _end(lv, week: Week) -> float:
    if lv.healed_at is not None and (lv.ended_at is None or lv.healed_at <= lv.ended_at):
        return lv.healed_at
    return lv.ended_at if lv.ended_at is not None else week.end_s


def _touches(lv, target: str) -> bool:
    return target in lv.incident.gpus or lv.incident.kind in SERVICE_TARGETS.get(target, ())


def _live_at(lv, t: float, week: Week, after_s: float = 60.0) -> bool:
    end = lv.ended_at if lv.ended_at is not None else week.end_s
    return lv.incident.start_s <= t <= end + after_s


def healed(lv, week: Week) -> bool:
    inc = lv.incident
    claim = inc.spec.claim
    if claim == "heal":
        return lv.healed_at is not None and lv.healed_at <= min(inc.natural_end_s, lv.human_fix_at or inc.natural_end_s)
    if claim == "escalate":
        return lv.first_page_at is not None and lv.first_page_at <= (lv.ended_at or week.end_s)
    return inc.id in week.reported


def _attribute_actions(week: Week) -> tuple[dict[int, list], list, dict[str, int]]:
    """Actions on a live fault (by incident id), the false ones, and the false ones per benign kind."""
    on_fault: dict[int, list] = {}
    false: list = []
    on_benign: dict[str, int] = {}
    faults = [lv for lv in week.incidents if lv.incident.fault and lv.begun]
    benign = [lv for lv in week.incidents if not lv.incident.fault and lv.begun]
    for act in week.actions:
        hit = [lv for lv in faults if _touches(lv, act.target) and _live_at(lv, act.t, week)]
        if hit:
            on_fault.setdefault(hit[0].incident.id, []).append(act)
            continue
        false.append(act)
        for lv in benign:
            if _touches(lv, act.target) and _live_at(lv, act.t, week):
                on_benign[lv.incident.kind] = on_benign.get(lv.incident.kind, 0) + 1
                break
    return on_fault, false, on_benign


def _attribute_messages(week: Week) -> tuple[dict[int, list], list, int]:
    per_fault: dict[int, list] = {}
    stray: list = []
    all_clear = 0
    faults = [lv for lv in week.incidents if lv.incident.fault and lv.begun]
    for msg in week.messages:
        if msg.title.startswith(ALL_CLEAR):
            all_clear += 1
            continue
        hit = False
        for lv in faults:
            named = set(msg.gpus) & (set(lv.incident.gpus) | ({"fleet"} if lv.incident.kind.startswith("monitor-")
                                                              else set()))
            if named and _live_at(lv, msg.t, week, MESSAGE_AFTER_S):
                per_fault.setdefault(lv.incident.id, []).append(msg)
                hit = True
        if not hit:
            stray.append(msg)
    return per_fault, stray, all_clear


def _group(lvs: list, week: Week, actions: dict[int, list], messages: dict[int, list]) -> dict[str, Any]:
    """The per-fault measures over ``lvs`` (one kind, or all)."""
    n = len(lvs)
    detect = [week.detected[lv.incident.id] - lv.incident.start_s for lv in lvs if lv.incident.id in week.detected]
    repair = [_end(lv, week) - lv.incident.start_s for lv in lvs]
    restarts = sum(1 for lv in lvs for a in actions.get(lv.incident.id, []) if a.what == "restart")
    msgs = [m for lv in lvs for m in messages.get(lv.incident.id, [])]
    lost = sum(week.lost_gpu_min.get(lv.incident.id, 0.0) for lv in lvs)
    return {
        "faults": n,
        "healed": sum(1 for lv in lvs if healed(lv, week)),
        "recall": round(sum(1 for lv in lvs if healed(lv, week)) / n, 3) if n else None,
        "detected": len(detect),
        "detect_p50_s": pct(detect, 0.5),
        "detect_p90_s": pct(detect, 0.9),
        "mttr_p50_s": pct(repair, 0.5),
        "mttr_p90_s": pct(repair, 0.9),
        "restarts_per_fault": round(restarts / n, 2) if n else None,
        "actions": sum(len(actions.get(lv.incident.id, [])) for lv in lvs),
        "messages_per_incident": round(len(msgs) / n, 2) if n else None,
        "pages_per_incident": round(sum(1 for m in msgs if m.page) / n, 2) if n else None,
        "max_pages_one_incident": max((sum(1 for m in messages.get(lv.incident.id, []) if m.page) for lv in lvs),
                                      default=0),
        "capacity_lost_gpu_min": round(lost, 1),
        "relapses": sum(lv.relapses for lv in lvs),
    }


def _escalations(week: Week, messages: dict[int, list], stray: list) -> dict[str, Any]:
    needed = not_needed = once = unhealable = 0
    for lv in week.incidents:
        if not lv.incident.fault or not lv.begun:
            continue
        first = [m for m in messages.get(lv.incident.id, []) if m.page and not m.reminder]
        if lv.incident.spec.claim == "escalate":
            unhealable += 1
            once += len(first) == 1
            needed += len(first)
        else:
            not_needed += len(first)
    not_needed += sum(1 for m in stray if m.page and not m.reminder)
    return {"needed": needed, "not_needed": not_needed, "unhealable_faults": unhealable,
            "unhealable_escalated_exactly_once": once}


def measure(week: Week) -> dict[str, Any]:
    """Every figure of one system's week (the JSON's ``systems[name]``)."""
    actions, false, on_benign = _attribute_actions(week)
    messages, stray, all_clear = _attribute_messages(week)
    faults = [lv for lv in week.incidents if lv.incident.fault and lv.begun]
    overall = _group(faults, week, actions, messages)
    total_actions = len(week.actions)
    by_kind = {}
    for kind in KINDS:
        lvs = [lv for lv in faults if lv.incident.kind == kind.name]
        if lvs:
            by_kind[kind.name] = {"claim": kind.claim, **_group(lvs, week, actions, messages)}
    claimed = [lv for lv in faults if lv.incident.spec.claim == "heal"]
    return {
        "recall": overall["recall"],
        "recall_claimed": round(sum(healed(lv, week) for lv in claimed) / len(claimed), 3) if claimed else None,
        "precision": round((total_actions - len(false)) / total_actions, 4) if total_actions else None,
        "actions": total_actions,
        "false_actions": len(false),
        "false_actions_on_benign": dict(sorted(on_benign.items())),
        "false_action_list": [{"t": round(a.t, 1), "what": a.what, "target": a.target} for a in false[:50]],
        "detect_p50_s": overall["detect_p50_s"],
        "detect_p90_s": overall["detect_p90_s"],
        "mttr_p50_s": overall["mttr_p50_s"],
        "mttr_p90_s": overall["mttr_p90_s"],
        "restarts_per_fault": overall["restarts_per_fault"],
        "messages_per_incident": overall["messages_per_incident"],
        "pages_per_incident": overall["pages_per_incident"],
        "max_pages_one_incident": overall["max_pages_one_incident"],
        "messages": len(week.messages),
        "stray_messages": len(stray),
        "stray_pages": sum(1 for m in stray if m.page),
        "all_clear_messages": all_clear,
        "capacity_lost_gpu_min": round(sum(week.lost_gpu_min.values()), 1),
        "capacity_lost_outside_faults_gpu_min": round(week.lost_gpu_min.get(None, 0.0), 1),
        "escalations": _escalations(week, messages, stray),
        "crashes": len(week.crashes),
        "crash_list": [{"t": round(t, 1), "error": e} for t, e in week.crashes[:20]],
        "cycles": week.cycles,
        "by_kind": by_kind,
    }
