"""Which rules cannot judge this fleet, and why (issue 12: "check lists which rules are off and
why, once, not as faults every minute"; issue 19: derived, never hand-listed). Pure.

A rule is off for a GPU when the configured source's declaration (:data:`gpuheal.source_kinds.SOURCES`)
together with what the GPU's own llama-server serves cannot meet one of the rule's ``NEEDS``. Both
sides are declarations the code checks, so a rule that silently never judges cannot exist: a new rule
or a new source is covered by this function without touching it. Configuration facts are reported
once per rule with the GPUs concerned and the fix, never as a data fault each poll.

What one poll failed to deliver (gpu-monitor down, the fallback answering) is not "off": the rule is
"not known" for that poll (core/engine's gate) and stays out of this list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuheal.core.rule import Rule
from gpuheal.model import Observation
from gpuheal.parse.llama_metrics import HOW_TO_ENABLE
from gpuheal.signals import ALWAYS, Need, Signal, SourceSpec, per_gpu, serves_task_loop, unmet
from gpuheal.source_kinds import home, kind_of, spec

NO_MONITOR = "no gpu-monitor configured (monitor:)"


def without_metrics(monitor_configured: bool) -> str:
    """What a GPU whose llama-server serves no ``/metrics`` loses (Rule 3's decode counters), as
    ``check``'s ``rules_off`` and ``doctor`` both say it: it depends on whether gpu-monitor is there."""
    if monitor_configured:
        return ": a hung decode is seen only once gpu-monitor counts failures"
    return f" and {NO_MONITOR}: a stuck model is not detected"


@dataclass(frozen=True)
class _Judged:
    """What the declarations say of one rule on this fleet, asked of :mod:`gpuheal.signals` in one pass before
    any line is written: the needs the fleet cannot meet, the GPUs whose own llama-server cannot meet them,
    and the needs the source's stand-in cannot meet (empty when no stand-in reads for unlisted GPUs)."""

    rule: Rule[Any]
    fleet: tuple[Need, ...]
    gpus: list[str]
    stand_in: tuple[Need, ...]


def rules_off(source: str, obs: Observation, rules: tuple[Rule[Any], ...],
              litellm: frozenset[Signal] = frozenset()) -> list[dict[str, Any]]:
    """``[{"rule", "gpus", "why", "fix"}]`` for a fleet whose configured GPU source is ``source``
    (a registered source's name; a stand-in's poll counts as the source it stands for: the Rule 7.3
    fallback as ``monitor``); ``gpus`` is ``["fleet"]`` or the aliases concerned. ``rules``: the
    registry (:data:`gpuheal.rules.ALL`). ``litellm``: what the configured LiteLLM reads add whatever
    the GPU source (:func:`from_litellm`); a recorded poll that carries LiteLLM's counts or spend
    tallies adds the request counts too. The source's declaration and the signals' answers are asked
    first, once; the lines are then written from those answers alone (:func:`_written`)."""
    mode = spec(home(source))
    name = mode.label or home(source)  # the source, as the user knows it
    kind = kind_of(source)
    stand_in = kind.fallback if kind is not None else None  # the source's stand-in (the Rule 7.3 fallback)
    counted = any(s.litellm_requests_total is not None or s.routing is not None for s in obs.gpus.values())
    provides = mode.provides | litellm | ({Signal.REQUEST_SHARE} if counted else set())
    fleet_has = provides | ALWAYS
    # what each GPU's llama-server serves, and what that gives: a few kinds, however large the fleet
    # (issue 19 "Performance": 13 rules x 10,000 GPUs each asked per_gpu/unmet was ~0.3 s a check)
    kinds = {a: (s.metrics != "disabled", serves_task_loop(s.metrics, s.slots, s.canary)) for a, s in obs.gpus.items()}
    has = {kind: per_gpu(provides, serves_metrics=kind[0], reachable=True, serves_task_loop=kind[1])
           for kind in set(kinds.values())}
    stand_in_has = None  # what the stand-in gives while it reads for GPUs the source's answer did not list
    if stand_in is not None and obs.lacking and not obs.monitor_ok:
        stand_in_has = stand_in.provides | litellm | (provides - mode.provides) | ALWAYS
    judged = []
    for rule in rules:
        lacking = {kind for kind, signals in has.items() if unmet(rule.NEEDS, signals)}
        judged.append(_Judged(rule, unmet(rule.NEEDS, fleet_has),
                              sorted(a for a, kind in kinds.items() if kind in lacking) if lacking else [],
                              unmet(rule.NEEDS, stand_in_has) if stand_in_has is not None else ()))
    no_metrics = sorted(a for a, s in obs.gpus.items() if s.metrics == "disabled")
    slots_loop = any(serves_task_loop(obs.gpus[a].metrics, obs.gpus[a].slots) for a in no_metrics)
    return _written(judged, obs, mode, name, stand_in if stand_in_has is not None else None, no_metrics, slots_loop)


def _written(judged: list[_Judged], obs: Observation, mode: SourceSpec, name: str, stand_in: SourceSpec | None,
             no_metrics: list[str], slots_loop: bool) -> list[dict[str, Any]]:
    """The lines, in the contract's order: each rule the fleet or some GPUs cannot feed, those the stand-in
    cannot feed, those judged without decode progress, then ``/slots``. Pure over the answers asked."""
    monitor_configured = Signal.FAILURE_RATIO in mode.provides  # gpu-monitor counts failures
    off: list[dict[str, Any]] = []
    for j in judged:
        if j.fleet:
            what = "; ".join(n.describe() for n in j.fleet)
            off.append({"rule": j.rule.ID, "gpus": ["fleet"], "why": f"needs {what}: {mode.lacks_why}",
                        "fix": mode.lacks_fix})
        elif j.gpus:
            off.append({"rule": j.rule.ID, "gpus": j.gpus, "why": _gpu_why(j.rule, monitor_configured),
                        "fix": HOW_TO_ENABLE["metrics"]})
    if stand_in is not None:
        _lacking(off, obs, judged, name, stand_in)
    _partial_metrics(off, judged, no_metrics, monitor_configured, slots_loop)
    no_slots = sorted(a for a, s in obs.gpus.items() if s.slots == "disabled")
    if no_slots:
        off.append({"rule": "slots (report only)", "gpus": no_slots, "why": "llama-server serves no /slots",
                    "fix": HOW_TO_ENABLE["slots"]})
    return off


def _lacking(off: list[dict[str, Any]], obs: Observation, judged: list[_Judged], name: str,
             stand_in: SourceSpec) -> None:
    """An answer of the source that listed none of the fleet's GPUs (the spec's "returns no GPUs", issue
    27 defect 1: an exporter that restarted and lost its devices) leaves them to the source's stand-in
    (the Rule 7.3 fallback): the rules it cannot feed are off for those GPUs until the source lists them
    again — said here, once, with the GPUs concerned. (A source that does not answer at all is an
    outage: its rules are "not known" that poll, not listed.) ``name``: the source's, as the user knows it."""
    listed = {o["rule"] for o in off}
    for j in judged:
        if j.stand_in and j.rule.ID not in listed:
            what = "; ".join(n.describe() for n in j.stand_in)
            off.append({"rule": j.rule.ID, "gpus": list(obs.lacking),
                        "why": f"needs {what}: {name}'s answer lists no GPU for these, read through "
                               f"{stand_in.label or stand_in.source}",
                        "fix": f"get {name} to list them again (Rule 7 restarts it), or check gpus[].host "
                               "and gpu_index against what it lists"})


def from_litellm(url: str | None, read_metrics: bool, read_spend_logs: bool) -> frozenset[Signal]:
    """Per-GPU request counts from LiteLLM itself — its ``/metrics`` counters or its spend logs (Rule 10,
    issue 22) — whatever the GPU source."""
    return frozenset({Signal.REQUEST_SHARE}) if url and (read_metrics or read_spend_logs) else frozenset()


def _gpu_why(rule: Rule[Any], monitor_configured: bool) -> str:
    missing = "; ".join(n.describe() for n in rule.NEEDS if Signal.DECODE_PROGRESS in n.any_of)
    return f"needs {missing}: llama-server serves no /metrics{without_metrics(monitor_configured)}"


def _partial_metrics(off: list[dict[str, Any]], judged: list[_Judged], no_metrics: list[str],
                     monitor_configured: bool, slots_loop: bool) -> None:
    """A GPU without ``/metrics`` that a rule needing decode progress still judges by another signal
    in its place (Rule 3: gpu-monitor's failure ratio, or its task loop answering ``/slots`` — ``slots_loop``,
    issue 20) does not see a decode that hangs with requests in flight and no request failing yet: said once
    per such rule (one not already off), naming what it still has."""
    listed = {o["rule"] for o in off}
    partial = [j.rule for j in judged if j.rule.ID not in listed
               and any(Signal.DECODE_PROGRESS in n.any_of and len(n.any_of) > 1 for n in j.rule.NEEDS)]
    if not partial or not no_metrics:
        return
    has = [Signal.FAILURE_RATIO.value] if monitor_configured else []
    if slots_loop:
        has.append("its task loop answering /slots")
    why = (f"llama-server serves no /metrics: a decode frozen with requests in flight is not seen; "
           f"judged by {' and '.join(has)}" if has else f"llama-server serves no /metrics{without_metrics(False)}")
    off.extend({"rule": r.ID, "gpus": no_metrics, "why": why, "fix": HOW_TO_ENABLE["metrics"]} for r in partial)
