"""The ``Rule`` protocol: what one rule module declares (design: "A rule is small and stateless").

A rule is a module (one per issue id, ``gpuheal/rules/<id>.py``), and the module itself is the
implementation: mypy checks each one against :class:`Rule` where the registry lists it
(``gpuheal/rules/__init__.py``), and the registry checks the values at import. The engine reads
these names and nothing else — no ``getattr`` on a module that may lack one:

- ``ID`` (a contract issue id), ``SCOPE`` (:data:`Scope`), ``SEVERITY`` (:data:`Severity`);
- ``NEEDS``: the signals it reads (:mod:`gpuheal.signals`);
- ``INHIBITS`` (:data:`Inhibits`): ``None``, ``"host"`` (the GPU's other issues), ``"monitor"`` (the
  rules whose signals the data source stopped delivering) or a frozenset of issue ids of the GPU;
- ``Params``: a frozen record class (:class:`~gpuheal.config.model.ParamsRecord`, checked by mypy as
  a frozen dataclass) extending :class:`~gpuheal.config.model.EngineParams` (or
  :class:`~gpuheal.config.model.RemedyParams` for a rule ``heal`` acts on), one field per
  parameter of ``rules.<id>`` in defaults.yaml, units in the names; the config builds it once per
  (rule, GPU) from defaults ← fleet ← ``gpus[].rules`` (``Config.rule_record``);
- ``detect(view, subject, p)`` → :data:`Detection`;
- ``recovered``: ``None`` ("``detect`` is quiet" clears it) or ``(view, subject, p, record)`` →
  ``bool | None`` (clear-side hysteresis: thermal clears below 80 °C, not at 85 °C);
- ``hold``: ``None`` (``p.hold_polls``, ``p.hold_s``) or ``(p)`` → ``(polls, seconds)``;
- ``remember``: ``None``, or what the rule keeps between polls — a tuple of
  :class:`~gpuheal.core.remember.Remember` (each a memory's key, its typed row's loader and a pure
  ``fold(row, view, subject)`` → the row after this poll, ``None`` for "this poll cannot say"). The
  engine folds every poll in before any rule detects (:func:`gpuheal.core.engine.remember`) and
  keeps the rows (:class:`~gpuheal.core.memory.Memory`); the rule reads its rows from ``view.memory``.
  Declared directly after ``hold``, in ``rules/<id>/memory.py`` when there is one;
- ``JUDGED_FROM_BENCH``: whether its evidence is the recorded benchmark results, so that ``bench``
  evaluates it after recording them (``steps.evaluate.evaluate_bench_full``);
- ``REMEDY``: what ``heal`` does about its issue (:class:`~gpuheal.core.remedy.Remedy`), at the bottom
  of the module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeVar, get_args

from gpuheal.config.model import EngineParams
from gpuheal.signals import Need

if TYPE_CHECKING:
    from gpuheal.core.issue import Finding, IssueRecord
    from gpuheal.core.remedy import Remedy
    from gpuheal.core.remember import Remember
    from gpuheal.core.view import FleetView

Scope: TypeAlias = Literal["gpu", "fleet"]  # one issue per GPU, or one for the fleet
Severity: TypeAlias = Literal["info", "warning", "critical"]
InhibitKind: TypeAlias = Literal["host", "monitor"]
Inhibits: TypeAlias = "InhibitKind | frozenset[str] | None"
# What a rule saw this poll: a finding, quiet (False) or not known (None: the hold neither
# advances nor resets, and a firing issue never clears on it).
Detection: TypeAlias = "Finding | Literal[False] | None"

SCOPES: tuple[str, ...] = get_args(Scope)
SEVERITIES: tuple[str, ...] = get_args(Severity)
INHIBIT_KINDS: tuple[str, ...] = get_args(InhibitKind)

P = TypeVar("P", bound=EngineParams)


class Rule(Protocol[P]):
    """One rule module (read-only names: a module satisfies this protocol)."""

    @property
    def ID(self) -> str: ...
    @property
    def SCOPE(self) -> Scope: ...
    @property
    def SEVERITY(self) -> Severity: ...
    @property
    def NEEDS(self) -> tuple[Need, ...]: ...
    @property
    def INHIBITS(self) -> Inhibits: ...
    @property
    def JUDGED_FROM_BENCH(self) -> bool: ...
    @property
    def Params(self) -> type[P]: ...

    def detect(self, view: FleetView, subject: str, p: P, /) -> Detection: ...

    @property
    def recovered(self) -> Callable[[FleetView, str, P, IssueRecord], bool | None] | None: ...
    @property
    def hold(self) -> Callable[[P], tuple[int, float]] | None: ...
    @property
    def REMEDY(self) -> Remedy: ...
    @property
    def remember(self) -> tuple[Remember[Any], ...] | None: ...


def rule(module: Rule[P]) -> Rule[Any]:
    """``module``, checked by mypy as one :class:`Rule` whose ``detect``, ``recovered`` and ``hold``
    all take its own ``Params``. The return type is deliberately not ``Rule[P]``: in the registry's
    ``tuple[Rule[Any], ...]`` that would let mypy infer ``P = Any`` and accept any mismatch."""
    return module
