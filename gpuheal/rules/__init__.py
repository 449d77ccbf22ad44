"""The rules: one pure module per issue id, and the explicit registry :data:`ALL`.

Each module implements the :class:`~gpuheal.core.rule.Rule` protocol (the module itself is the
implementation; :mod:`gpuheal.core.rule` says what each name means): ``ID``, ``SCOPE``,
``SEVERITY``, ``NEEDS`` (the signals it reads, :mod:`gpuheal.signals`: a poll that did not deliver
them is "not known" for it, and a source that cannot provide them lists it in ``rules_off``),
``INHIBITS``, ``JUDGED_FROM_BENCH``, ``Params`` (its typed parameter record), ``detect(view, subject, p)``,
``recovered`` and ``hold`` (each ``None`` for the engine's default), ``remember`` (``None``, or
what it keeps between polls: ``rules/<id>/memory.py``), and at its bottom ``REMEDY``:
what ``heal`` does about its issue (:class:`~gpuheal.core.remedy.Remedy`; its hooks, if any, in the
rule package's ``remedy.py``). :data:`REMEDIES` is read from the registry; nothing else lists remedies.

Holding, clearing, inhibition, muting and the memory's bookkeeping belong to
:mod:`gpuheal.core.engine` (and its store, :mod:`gpuheal.core.memory`), once. Params come
from ``rules.<issue-id>`` in ``config/defaults.yaml`` ← the fleet config ← ``gpus[].rules``, as the
rule's ``Params`` record, built once per config and GPU (``Config.rule_record``).

The registry is checked twice. mypy (``make lint``) checks each module against the protocol where
:data:`ALL` lists it, including that ``detect``, ``recovered`` and ``hold`` take its own ``Params``.
At import, :func:`build_registry` refuses an unknown id, a duplicate, a module not named after its
id, a value outside the protocol's Literals, two memories under one key, or a ``Params`` that is not an
:class:`~gpuheal.config.model.EngineParams` record of scalar fields whose defaults fit their types — never
a silently ignored rule. That ``Params`` and ``defaults.yaml`` name the same parameters with the
types the config schema gives them (:func:`gpuheal.config.params.record_problems`) is checked by
``tests/test_rule_params.py``.

Adding a rule, exactly (checked by adding one, issue 10):

1. ``gpuheal/ids.py``: its issue id in ``ISSUE_IDS`` (a contract id: alerts, the audit trail and
   dashboards key on it, so it never changes once released);
2. ``gpuheal/rules/<id with _ for ->.py``: ``ID``, ``SCOPE``, ``SEVERITY``, ``NEEDS``, ``INHIBITS``,
   ``JUDGED_FROM_BENCH`` (``True`` when its evidence is the recorded benchmark results), a ``Params``
   record (``class Params(RemedyParams)`` if heal acts on it, else ``EngineParams``: frozen, and
   checked by mypy as a dataclass) with one field per parameter, units in the names,
   and ``detect`` — plus ``recovered``, ``hold`` and ``remember``, or ``None`` for each — pure, fully
   annotated: values in, values out. A rule that remembers between polls is a package
   (``rules/<id>/__init__.py``) whose ``memory.py`` declares its rows, their loader and fold
   (:class:`~gpuheal.core.remember.Remember`); the engine keeps them in the issue book;
3. this module: import it and add ``rule(<module>)`` to :data:`ALL` (the registry line);
4. ``gpuheal/config/defaults.yaml``: ``rules.<id>: {...}`` with every parameter of its ``Params``
   (each then overridable per fleet and per GPU, and checked by name and type by the config
   loader; a number's default must be what the field holds: ``int`` or ``float``);
5. what ``heal`` does about it, at the bottom of the module: ``REMEDY = Remedy(automatic=False,
   why_escalate=...)`` to only alert (escalated to the humans once per occurrence); a fix is
   ``Remedy(steps, ...)`` naming actions of :mod:`gpuheal.core.catalog`, plus ``verify_within_s`` and
   ``escalate_after_failures`` in its defaults, and its special cases as hooks in the rule package's
   ``remedy.py`` (:mod:`gpuheal.core.remedy` says which, and when each runs; a fleet rule's fix has no
   GPU to prove it with a completion, so it declares ``verify=``, its own proof); an advice-only rule
   (severity ``info``) is ``Remedy(recommend=True)``: reported, never acted on nor escalated;
6. its tests: a golden trace under ``tests/traces/`` or cases in a ``tests/test_rules_*.py``.

Nothing else names rules: the engine, ``check``, the renderers and the state read the registry.
"""

from __future__ import annotations

from dataclasses import MISSING, is_dataclass
from typing import Any

from gpuheal.config.model import EngineParams, ParamsMismatch, RemedyParams, param_fits, param_kinds
from gpuheal.core.remedy import Remedy
from gpuheal.core.remember import Remember
from gpuheal.core.rule import INHIBIT_KINDS, SCOPES, SEVERITIES, Rule, rule
from gpuheal.ids import ISSUE_IDS as KNOWN_IDS  # noqa: E402
from gpuheal.rules import (
    api_key_mismatch,
    benchmark_regression,
    circuit_breaker_stuck,
    context_window,
    cooling_infrastructure,
    data_source_unreachable,
    host_unreachable,
    model_stuck,
    thermal_critical,
    thermal_rising,
    thermal_warning,
    vram_leak,
    workload_misrouted,
)
from gpuheal.signals import Need

__all__ = ["ALL", "BY_ID", "INHIBIT_KINDS", "KNOWN_IDS", "REMEDIES", "SCOPES", "SEVERITIES", "Rule",
           "RuleRegistryError", "build_registry", "params_problem"]


class RuleRegistryError(ValueError):
    """The rule set is inconsistent (a programming error, caught at import)."""


def build_registry(modules: tuple[Rule[Any], ...]) -> tuple[Rule[Any], ...]:
    """``modules``, once each is shown to be a rule (the protocol's runtime check: mypy checks the
    types, this the values)."""
    seen: dict[str, Rule[Any]] = {}
    keys: dict[str, str] = {}
    for module in modules:
        name = getattr(module, "__name__", "?").rsplit(".", 1)[-1]
        rule_id = getattr(module, "ID", None)
        if rule_id not in KNOWN_IDS:
            raise RuleRegistryError(f"{name}: unknown rule id {rule_id!r} (known: {', '.join(KNOWN_IDS)})")
        if rule_id in seen:
            also = getattr(seen[rule_id], "__name__", "?")
            raise RuleRegistryError(f"{name}: duplicate rule id {rule_id!r} (also {also})")
        if name != rule_id.replace("-", "_"):
            raise RuleRegistryError(f"{name}: a rule module is named after its id ({rule_id!r})")
        problem = _declarations_problem(module) or params_problem(getattr(module, "Params", None))
        problem = problem or _windows_problem(module) or _remedy_params_problem(module)
        if problem:
            raise RuleRegistryError(f"{name}: {problem}")
        for memory in module.remember or ():
            if memory.key in keys:
                raise RuleRegistryError(f"{name}: memory key {memory.key!r} is also {keys[memory.key]}'s")
            keys[memory.key] = rule_id
        seen[rule_id] = module
    return tuple(modules)


def _declarations_problem(module: Any) -> str | None:
    """What is wrong with a module's declarations other than ``Params``, or ``None``."""
    if getattr(module, "SCOPE", None) not in SCOPES:
        return f"SCOPE must be one of {SCOPES}"
    if getattr(module, "SEVERITY", None) not in SEVERITIES:
        return f"SEVERITY must be one of {SEVERITIES}"
    needs = getattr(module, "NEEDS", None)
    if not isinstance(needs, tuple) or not all(isinstance(n, Need) and n.any_of for n in needs):
        return "NEEDS must be a tuple of gpuheal.signals.Need"
    inhibits = getattr(module, "INHIBITS", "missing")
    if not (
        inhibits is None
        or inhibits in INHIBIT_KINDS
        or (isinstance(inhibits, frozenset) and inhibits and inhibits <= set(KNOWN_IDS) and module.ID not in inhibits)
    ):
        return f"INHIBITS must be None, one of {INHIBIT_KINDS} or a frozenset of other issue ids"
    if not isinstance(getattr(module, "JUDGED_FROM_BENCH", None), bool):
        return "JUDGED_FROM_BENCH must be True or False"
    remember = getattr(module, "remember", "missing")
    if remember is not None and not (
        isinstance(remember, tuple) and remember and all(isinstance(m, Remember) for m in remember)
    ):
        return "remember must be None or a tuple of gpuheal.core.remember.Remember"
    if not callable(getattr(module, "detect", None)):
        return "no detect(view, subject, params)"
    for optional in ("recovered", "hold"):
        value = getattr(module, optional, "missing")
        if value is not None and not callable(value):
            return f"{optional} must be a function or None"
    remedy = getattr(module, "REMEDY", None)
    if not isinstance(remedy, Remedy):
        return "REMEDY must be a gpuheal.core.remedy.Remedy (what heal does about its issue)"
    if module.SCOPE == "fleet" and remedy.steps and remedy.automatic and remedy.verify is None:
        return "a fleet rule's fix has no GPU to prove it with a completion: REMEDY needs verify= (its own proof)"
    return None


def _windows_problem(module: Any) -> str | None:
    """A trend need's :class:`~gpuheal.signals.Window` names fields of the rule's own ``Params``."""
    for need in module.NEEDS:
        w = need.window
        named = () if w is None else (w.window, *w.spans, *(w.sustained or ()), *((w.above,) if w.above else ()))
        missing = [f for f in named if f not in module.Params.FIELDS]
        if missing:
            return f"NEEDS: a trend's window names {', '.join(missing)}, not fields of Params"
    return None


def _remedy_params_problem(module: Any) -> str | None:
    """A rule heal acts on has the parameters heal reads as a typed record (core/plan: when to escalate)."""
    remedy: Remedy = module.REMEDY
    if remedy.automatic and not remedy.recommend and not issubclass(module.Params, RemedyParams):
        return "REMEDY acts on its issue: Params must extend RemedyParams (escalate_after_failures, verify_within_s)"
    return None


def params_problem(params: Any) -> str | None:
    """What is wrong with a rule's ``Params`` as a record type, or ``None``: it extends
    :class:`EngineParams` (so it is a frozen :class:`~gpuheal.config.model.ParamsRecord`), its
    fields are scalars and their own defaults (if any) fit their types (``hold_polls: int = 1.5``
    is refused here, not at the first poll)."""
    if not (isinstance(params, type) and issubclass(params, EngineParams)):
        return "Params must be a record extending gpuheal.config.model.EngineParams"
    if is_dataclass(params):
        return "Params is a ParamsRecord, not also a dataclass (its generated __init__ would bypass the record's)"
    try:
        kinds = param_kinds(params)
    except ParamsMismatch as exc:
        return str(exc)
    for name, (_, default) in params.FIELDS.items():
        if default is not MISSING and not param_fits(kinds[name], default):
            return f"Params.{name}: its default {default!r} is not {kinds[name].__name__}"
    return None


ALL: tuple[Rule[Any], ...] = build_registry(
    (
        rule(thermal_critical),
        rule(cooling_infrastructure),
        rule(vram_leak),
        rule(model_stuck),
        rule(benchmark_regression),
        rule(circuit_breaker_stuck),
        rule(host_unreachable),
        rule(data_source_unreachable),
        rule(thermal_warning),
        rule(thermal_rising),
        rule(context_window),
        rule(workload_misrouted),
        rule(api_key_mismatch),
    )
)
BY_ID: dict[str, Rule[Any]] = {r.ID: r for r in ALL}
# What heal does about each issue, in the registry's order (the most severe first)
REMEDIES: dict[str, Remedy] = {r.ID: r.REMEDY for r in ALL}

