"""The rules: one pure module per issue id, and the explicit registry :data:`ALL`.

A rule module has ``ID`` (a contract issue id), ``SCOPE`` (``"gpu"``: one issue per GPU, or
``"fleet"``), ``SEVERITY``, ``NEEDS`` (the signals it reads, :mod:`gpuheal.signals`: a poll that did
not deliver them is "not known" for it, and a source that cannot provide them lists it in
``rules_off``), optionally ``INHIBITS`` (``"host"``: the GPU's other issues,
``"monitor"``: the monitor-fed rules, or a frozenset of issue ids of the same GPU), and:

- ``detect(view, subject, params)`` → :class:`~gpuheal.core.engine.Finding` | ``False`` (quiet) |
  ``None`` (not known);
- optionally ``recovered(view, subject, params, record)`` → bool | ``None`` (clear-side hysteresis;
  default: "``detect`` is quiet");
- optionally ``hold(params)`` → ``(polls, seconds)`` (default: ``hold_polls``, ``hold_s`` params).

Holding, clearing, inhibition and muting belong to :mod:`gpuheal.core.engine`, once. Params come
from ``rules.<issue-id>`` in ``config/defaults.yaml`` ← the fleet config ← ``gpus[].rules``.

The registry is checked at import: an unknown id, a duplicate, a module not named after its id or a
missing attribute is an error, never a silently ignored rule.

Adding a rule, exactly (checked by adding one, issue 10):

1. ``gpuheal/ids.py``: its issue id in ``ISSUE_IDS`` (a contract id: alerts, the audit trail and
   dashboards key on it, so it never changes once released);
2. ``gpuheal/rules/<id with _ for ->.py``: ``ID``, ``SCOPE``, ``SEVERITY``, ``NEEDS``, ``detect``
   (and optionally ``INHIBITS``, ``recovered``, ``hold``), pure — values in, values out;
3. this module: import it and add it to :data:`ALL` (the registry line);
4. ``gpuheal/config/defaults.yaml``: ``rules.<id>: {...}`` with every parameter it reads (each
   then overridable per fleet and per GPU, and checked by name and type by the config loader);
5. what ``heal`` does about it: nothing to add to only alert — an issue without a remedy is
   escalated to the humans once per occurrence; a fix is a :class:`~gpuheal.core.catalog.Remedy`
   in ``gpuheal/core/catalog.py`` ``REMEDIES`` plus ``verify_within_s`` and
   ``escalate_after_failures`` in its defaults; an advice-only rule (severity ``info``) joins
   ``RECOMMENDATIONS`` there so it is reported, never acted on nor escalated;
6. its tests: a golden trace under ``tests/traces/`` or cases in a ``tests/test_rules_*.py``.

Nothing else names rules: the engine, ``check``, the renderers and the state read the registry.
"""

from __future__ import annotations

from types import ModuleType

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

SCOPES = ("gpu", "fleet")
SEVERITIES = ("info", "warning", "critical")
INHIBIT_KINDS = ("host", "monitor")


class RuleRegistryError(ValueError):
    """The rule set is inconsistent (a programming error, caught at import)."""


def build_registry(modules: tuple[ModuleType, ...]) -> tuple[ModuleType, ...]:
    seen: dict[str, ModuleType] = {}
    for module in modules:
        rule_id = getattr(module, "ID", None)
        name = module.__name__.rsplit(".", 1)[-1]
        if rule_id not in KNOWN_IDS:
            raise RuleRegistryError(f"{name}: unknown rule id {rule_id!r} (known: {', '.join(KNOWN_IDS)})")
        if rule_id in seen:
            raise RuleRegistryError(f"{name}: duplicate rule id {rule_id!r} (also {seen[rule_id].__name__})")
        if name != rule_id.replace("-", "_"):
            raise RuleRegistryError(f"{name}: a rule module is named after its id ({rule_id!r})")
        if getattr(module, "SCOPE", None) not in SCOPES:
            raise RuleRegistryError(f"{name}: SCOPE must be one of {SCOPES}")
        if getattr(module, "SEVERITY", None) not in SEVERITIES:
            raise RuleRegistryError(f"{name}: SEVERITY must be one of {SEVERITIES}")
        needs = getattr(module, "NEEDS", None)
        if not isinstance(needs, tuple) or not all(isinstance(n, Need) and n.any_of for n in needs):
            raise RuleRegistryError(f"{name}: NEEDS must be a tuple of gpuheal.signals.Need")
        inhibits = getattr(module, "INHIBITS", None)
        if not (
            inhibits is None
            or inhibits in INHIBIT_KINDS
            or (isinstance(inhibits, frozenset) and inhibits and inhibits <= set(KNOWN_IDS) and rule_id not in inhibits)
        ):
            raise RuleRegistryError(
                f"{name}: INHIBITS must be one of {INHIBIT_KINDS} or a frozenset of other issue ids"
            )
        if not callable(getattr(module, "detect", None)):
            raise RuleRegistryError(f"{name}: no detect(view, subject, params)")
        seen[rule_id] = module
    return tuple(modules)


ALL: tuple[ModuleType, ...] = build_registry(
    (
        thermal_critical,
        cooling_infrastructure,
        vram_leak,
        model_stuck,
        benchmark_regression,
        circuit_breaker_stuck,
        host_unreachable,
        data_source_unreachable,
        thermal_warning,
        thermal_rising,
        context_window,
        workload_misrouted,
        api_key_mismatch,
    )
)
BY_ID: dict[str, ModuleType] = {rule.ID: rule for rule in ALL}

# Rules judged from recorded benchmark results (``bench`` calls ``steps.evaluate.evaluate_bench_full``).
BENCH_RULES = ("benchmark-regression", "context-window", "api-key-mismatch")
