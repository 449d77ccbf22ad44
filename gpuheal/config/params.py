"""The strict rule-parameter schema, generated from ``defaults.yaml`` (issue 9, points 4 and 7). Pure.

A config that validates must also make sense: ``temp_cc: 90`` (a typo that leaves 85 °C in force),
``hold_polls: -1`` or ``2.5``, ``failure_ratio: 1.5``, ``window_h: 0``, ``min_samples: 0``,
``clear_below_c`` above ``temp_c`` (an issue that can never clear), or ``thermal-critical.temp_c:
-5`` (valid YAML that sheds load from every GPU at the second poll) are each one config error
naming the key path (contract: "Rule parameters").

Nothing is listed per rule. Each parameter's spec is derived from its **name and default**: the
default gives the type (bool, whole number, number, text), the name's unit suffix gives the
physical range (``_c`` a GPU temperature, ``_ratio`` a share, ``_polls`` a count of polls, ``_s``
and ``_h`` a duration, ...). A new parameter added to ``defaults.yaml`` is checked for free, by
the same rules; :data:`OVERRIDES` holds the few whose meaning is not in the suffix. Relations
between parameters of one rule (``clear_below_c <= temp_c``) are in :data:`RELATIONS`, checked on
the merged values each GPU will run with.

:func:`check_section` serves any section shaped ``{id: {param: value}}`` — ``rules:`` today, and
remedy budgets when they move to ``defaults.yaml`` (issue 10, point 4).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any

from gpuheal.config.model import EngineParams, ParamsMismatch, param_kinds
from gpuheal.errors import ConfigError

DAY_S = 86400.0


@dataclass(frozen=True)
class ParamSpec:
    """What one parameter may hold. ``lo``/``hi`` bound a number; ``lo_open`` makes ``lo`` strict."""

    kind: str  # bool | int | number | str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    why: str = ""  # what the range means, for the error line

    def check(self, value: Any) -> str | None:
        """``None`` when ``value`` fits, else the problem in words."""
        if self.kind == "bool":
            return None if isinstance(value, bool) else f"must be true or false, not {_shown(value)}"
        if self.kind == "str":
            return None if isinstance(value, str) else f"must be a string, not {_shown(value)}"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, not {_shown(value)}"
        if self.kind == "int" and not isinstance(value, int):
            return f"must be a whole number, not {_shown(value)}"
        below = False
        if self.lo is not None:
            below = value <= self.lo if self.lo_open else value < self.lo
        above = self.hi is not None and value > self.hi
        if below or above:
            return f"must be {self.range_text()}, not {_shown(value)}" + (f" ({self.why})" if self.why else "")
        return None

    def range_text(self) -> str:
        lo = None if self.lo is None else _num(self.lo)
        hi = None if self.hi is None else _num(self.hi)
        if lo is not None and hi is not None:
            return f"{'>' if self.lo_open else '>='} {lo} and <= {hi}"
        if lo is not None:
            return f"{'>' if self.lo_open else '>='} {lo}"
        return f"<= {hi}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return "a number of more than 30 digits"
    if isinstance(value, str) and len(value) > 40:
        return repr(value[:40]) + f" (+{len(value) - 40} characters)"
    return repr(value) if not isinstance(value, dict | list) else ("a mapping" if isinstance(value, dict) else "a list")


# Unit suffix → (kind for a numeric default, range). Checked in order: the first match wins.
SUFFIXES: tuple[tuple[str, ParamSpec], ...] = (
    ("_c_per_min", ParamSpec("number", 0, 100, lo_open=True, why="°C per minute")),
    ("_c", ParamSpec("number", 20, 125, why="a GPU temperature in °C; outside this it is not physical")),
    ("_ratio", ParamSpec("number", 0, 1, why="a share: 0 to 1")),
    ("_polls", ParamSpec("int", 1, 10_000, why="a count of polls")),
    ("samples", ParamSpec("int", 2, 1_000_000, why="a trend needs at least two points")),
    ("_requests", ParamSpec("int", 1, 10**9)),
    ("_results", ParamSpec("int", 1, 10_000)),
    ("_gpus", ParamSpec("int", 1, 100_000)),
    ("_failures", ParamSpec("int", 1, 1000, why="a count of failed attempts")),
    ("_s", ParamSpec("number", 0, 30 * DAY_S, lo_open=True, why="seconds, at most 30 days")),
    ("_h", ParamSpec("number", 0, 30 * 24, lo_open=True, why="hours, at most 30 days")),
    ("_mb", ParamSpec("number", 0, 16 * 1024 * 1024, lo_open=True, why="MB")),
    ("_per_hour", ParamSpec("number", 0, 16 * 1024 * 1024, lo_open=True)),
)
# The few whose meaning the suffix does not carry.
OVERRIDES: dict[str, ParamSpec] = {
    "grace_s": ParamSpec("number", 0, DAY_S, why="seconds; 0 = no grace"),
    "hold_s": ParamSpec("number", 0, 30 * DAY_S, why="seconds; 0 = at once"),
    "min_probes": ParamSpec("int", 0, 10_000, why="probes; 0 = the hold is counted in polls only"),
    "min_span_s": ParamSpec("number", 0, 30 * DAY_S),
    "min_span_h": ParamSpec("number", 0, 30 * 24),
    "samples": ParamSpec("int", 1, 10_000, why="benchmark results to average"),
    "headroom_above_ratio": ParamSpec("number", 1, 100, why="used/allowed context above which there is headroom"),
    "reduce_by_ratio": ParamSpec("number", 0, 0.9, lo_open=True, why="a share of the context to cut"),
    "drop_ratio": ParamSpec("number", 0, 1, lo_open=True, why="a share: 0 to 1"),
    "failure_ratio": ParamSpec("number", 0, 1, why="a share: 0 to 1"),
    "cooling_fraction": ParamSpec("number", 0, 1, lo_open=True, why="a share of a group's GPUs: above 0, at most 1"),
    "tolerance_ratio": ParamSpec("number", 0, 1, lo_open=True, why="a share: 0 to 1"),
}

_LE: Callable[[Any, Any], bool] = operator.le
_LT: Callable[[Any, Any], bool] = operator.lt
# (a, op, b, why): within one rule, when both are parameters of it.
RELATIONS: tuple[tuple[str, Callable[[Any, Any], bool], str, str], ...] = (
    ("clear_below_c", _LE, "temp_c", "or the issue could never clear"),
    ("clear_rise_c_per_min", _LE, "rise_c_per_min", "or the issue could never clear"),
    ("clear_failure_ratio", _LE, "failure_ratio", "or the issue could never clear"),
    ("min_span_s", _LE, "window_s", "a span cannot exceed its window"),
    ("min_span_h", _LE, "window_h", "a span cannot exceed its window"),
    ("recover_span_h", _LE, "window_h", "a span cannot exceed its window"),
    ("reduce_below_ratio", _LT, "headroom_above_ratio", "the bands would overlap"),
)
_OP_TEXT = {_LE: "<=", _LT: "<"}
_FLIP = {_LE: ">=", _LT: ">"}


def spec_for(name: str, default: Any) -> ParamSpec:
    """The spec of parameter ``name`` whose default is ``default`` (see the module docstring)."""
    if isinstance(default, bool):
        return ParamSpec("bool")
    if isinstance(default, str):
        return ParamSpec("str")
    if default is None or isinstance(default, dict | list):
        return ParamSpec("str") if default is None else ParamSpec("number")
    if name in OVERRIDES:
        return OVERRIDES[name]
    for suffix, spec in SUFFIXES:
        if name.endswith(suffix):
            return spec
    kind = "int" if isinstance(default, int) else "number"
    return ParamSpec(kind, 0, None)  # an unknown unit: at least a finite, non-negative number


def schema_from(
    defaults: Mapping[str, Mapping[str, Any]], common: Mapping[str, Any] | None = None
) -> dict[str, dict[str, ParamSpec]]:
    """``{id: {param: spec}}`` for a defaults section such as ``rules``; ``common`` parameters are
    allowed for every id."""
    return {
        rid: {k: spec_for(k, v) for k, v in {**(common or {}), **(params or {})}.items()}
        for rid, params in defaults.items()
    }


_SCHEMAS: dict[tuple[int, int], tuple[Any, Any, dict[str, dict[str, ParamSpec]]]] = {}


def _schema_cached(
    defaults: Mapping[str, Mapping[str, Any]], common: Mapping[str, Any] | None
) -> dict[str, dict[str, ParamSpec]]:
    """:func:`schema_from`, once per (defaults, common) object: a 1,000-GPU config checks 1,001
    ``rules:`` mappings against the same defaults."""
    key = (id(defaults), id(common))
    hit = _SCHEMAS.get(key)
    if hit is None or hit[0] is not defaults or hit[1] is not common:
        hit = (defaults, common, schema_from(defaults, common))
        _SCHEMAS[key] = hit
    return hit[2]


def check_section(
    user: Any, defaults: Mapping[str, Mapping[str, Any]], where: str, *, what: str = "rule id",
    inherited: Mapping[str, Mapping[str, Any]] | None = None, inherited_where: str | None = None,
    common: Mapping[str, Any] | None = None,
) -> None:
    """Check ``user`` (the ``rules:`` mapping at ``where``) against the schema of ``defaults``.

    Unknown ids and parameters, wrong types, ranges, then the relations on the merged values
    (defaults ← ``inherited`` (the fleet's, for a GPU) ← ``user``). Raises :class:`ConfigError`.
    """
    if user is None:
        return
    if not isinstance(user, dict):
        raise ConfigError(f"must be a mapping of {what} to parameters, not {_shown(user)}", where)
    schema = _schema_cached(defaults, common)
    for rid, params in user.items():
        if rid not in schema:
            raise ConfigError(f"unknown {what} {rid!r} (known: {', '.join(sorted(map(str, schema)))})", where)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise ConfigError(f"must be a mapping of parameters, not {_shown(params)}", f"{where}.{rid}")
        for key, value in params.items():
            spec = schema[rid].get(key)
            if spec is None:
                known = ", ".join(sorted(schema[rid])) or "none"
                raise ConfigError(f"unknown parameter (known for {rid}: {known})", f"{where}.{rid}.{key}")
            problem = spec.check(value)
            if problem:
                raise ConfigError(problem, f"{where}.{rid}.{key}")
    for rid in user:
        _check_relations(rid, defaults, inherited or {}, user, where, inherited_where)


def _check_relations(
    rid: str, defaults: Mapping[str, Mapping[str, Any]], inherited: Mapping[str, Mapping[str, Any]],
    user: Mapping[str, Any], where: str, inherited_where: str | None,
) -> None:
    own = user.get(rid) or {}
    above = inherited.get(rid) or {}
    merged = {**(defaults.get(rid) or {}), **above, **own}

    for a, op, b, why in RELATIONS:
        if a not in merged or b not in merged or op(merged[a], merged[b]):
            continue
        # name the most specific key the user wrote: this level's, else the inherited one
        paths = [f"{where}.{rid}.{k}" for k in (a, b) if k in own]
        paths += [f"{inherited_where}.{rid}.{k}" for k in (a, b) if k in above and inherited_where]
        if not paths:
            continue  # both from defaults.yaml: a defaults bug, caught by the test suite
        path = paths[0]
        if path.endswith(f".{a}"):
            message = f"must be {_OP_TEXT[op]} {b} ({_num(merged[b])}), not {_num(merged[a])}: {why}"
        else:
            message = f"must be {_FLIP[op]} {a} ({_num(merged[a])}), not {_num(merged[b])}: {why}; set {a} too"
        raise ConfigError(message, path)


# What a parameter record's field holds for each kind the schema gives a parameter.
KIND_TYPES: dict[str, type] = {"int": int, "number": float, "bool": bool, "str": str}


def record_problems(
    params_type: type[EngineParams], defaults: Mapping[str, Any], common: Mapping[str, Any] | None = None
) -> list[str]:
    """Where a rule's typed ``Params`` record and its ``defaults.yaml`` entry disagree (empty: they
    agree): a parameter of defaults.yaml the record lacks, a field of the record defaults.yaml gives
    no value, or a field whose type is not what the schema lets the operator write (``min_samples:
    float`` would take 2.5, ``temp_c: int`` would refuse the 85.5 the schema allows). The record
    and the schema then can never disagree at a poll (``tests/test_rule_params.py``)."""
    try:
        kinds = param_kinds(params_type)
    except ParamsMismatch as exc:
        return [str(exc)]
    problems = []
    for name, default in {**(common or {}), **defaults}.items():
        kind = kinds.get(name)
        want = KIND_TYPES[spec_for(name, default).kind]
        if kind is None:
            problems.append(f"{name}: in defaults.yaml, but Params has no such field")
        elif kind is not want:
            problems.append(f"{name}: Params says {kind.__name__}, the schema takes {want.__name__} ({default!r})")
    for name, (_, default) in params_type.FIELDS.items():
        if default is MISSING and name not in defaults:
            problems.append(f"{name}: a Params field without a value in defaults.yaml")
    return problems
