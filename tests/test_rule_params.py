"""Issue 19 item 4: every rule implements the ``Rule`` protocol with a typed, frozen ``Params`` record.

The record and ``defaults.yaml`` name the same parameters with the types the config schema gives them;
a rule whose ``Params`` lacks a field, has one defaults.yaml does not fill, or types one otherwise is
caught (here and, for the record's own shape, by the registry at import). The config builds each
record once per (rule, GPU) and GPUs with the same values share it."""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

try:
    from tests.series import fleet_config
except ImportError:
    from series import fleet_config

from gpuheal import benchdata
from gpuheal.config.load import _defaults
from gpuheal.config.model import ENGINE_PARAMS, EngineParams, ParamsMismatch, RemedyParams, params_record
from gpuheal.config.params import record_problems
from gpuheal.core.view import FleetView
from gpuheal.rules import ALL, BY_ID, RuleRegistryError, build_registry, thermal_critical, vram_leak
from gpuheal.state.history import History

ROOT = Path(__file__).resolve().parent.parent
RULES = _defaults()["rules"]


@pytest.mark.parametrize("rule", ALL, ids=lambda r: r.ID)
def test_every_rules_params_agree_with_defaults_yaml(rule):
    assert record_problems(rule.Params, RULES[rule.ID], ENGINE_PARAMS) == []
    p = params_record(rule.Params, RULES[rule.ID])
    assert isinstance(p, EngineParams) and p == params_record(rule.Params, dict(RULES[rule.ID]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.hold_polls = 9  # a rule never changes its parameters
    assert repr(p).startswith("Params(hold_polls=")


class _NoClearBelow(RemedyParams):  # Rule 1's record with clear_below_c forgotten
    temp_c: float


class _ExtraField(thermal_critical.Params):  # a field defaults.yaml has no value for
    fan_rpm: int


class _IntTemp(RemedyParams):  # the schema takes 85.5 °C; an int field would not
    temp_c: int
    clear_below_c: float


class _StrPolls(RemedyParams):  # a field of a type no parameter has
    temp_c: float
    clear_below_c: float
    hold_polls: str = "2"


def test_a_params_record_missing_a_field_or_typed_otherwise_is_caught():
    defaults = RULES["thermal-critical"]
    assert record_problems(_NoClearBelow, defaults, ENGINE_PARAMS) == [
        "clear_below_c: in defaults.yaml, but Params has no such field"
    ]
    assert record_problems(_ExtraField, defaults, ENGINE_PARAMS) == [
        "fan_rpm: a Params field without a value in defaults.yaml"
    ]
    assert record_problems(_IntTemp, defaults, ENGINE_PARAMS) == [
        "temp_c: Params says int, the schema takes float (85)"
    ]
    assert record_problems(_StrPolls, defaults, ENGINE_PARAMS) == [
        "hold_polls: Params says str, the schema takes int (2)"
    ]


def _module(params, **attrs):
    mod = SimpleNamespace(__name__="gpuheal.rules.thermal_critical", ID="thermal-critical", SCOPE="gpu",
                          SEVERITY="critical", NEEDS=(), INHIBITS=None, Params=params,
                          detect=lambda v, s, p: None, recovered=None, hold=None, remember=None,
                          JUDGED_FROM_BENCH=False, REMEDY=thermal_critical.REMEDY)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


def test_the_registry_refuses_a_params_that_is_not_a_record_of_scalars_with_fitting_defaults():
    class WrongDefault(RemedyParams):
        temp_c: float = "85"  # a wrong-typed default

    class BoolAsNumber(EngineParams):
        temp_c: float = True  # a bool is never a number

    class Listy(EngineParams):
        temps_c: list

    @dataclass(frozen=True)
    class Alone:  # a frozen dataclass, but not a parameter record
        temp_c: float

    @dataclass(frozen=True)
    class Both(EngineParams):  # its generated __init__ would skip the record's checks
        temp_c: float = 85.0

    cases = [
        (WrongDefault, "its default '85' is not float"),
        (BoolAsNumber, "its default True is not float"),
        (Listy, "a parameter is one of int, float, bool, str, not list"),
        (Alone, "extending gpuheal.config.model.EngineParams"),
        (None, "extending gpuheal.config.model.EngineParams"),
        (Both, "not also a dataclass"),
    ]
    for params, message in cases:
        with pytest.raises(RuleRegistryError, match=message):
            build_registry((_module(params),))
    for name, bad in (("recovered", "no"), ("hold", 3), ("INHIBITS", "gpu")):
        with pytest.raises(RuleRegistryError, match=name):
            build_registry((_module(thermal_critical.Params, **{name: bad}),))
    bare = _module(thermal_critical.Params)
    del bare.hold
    with pytest.raises(RuleRegistryError, match="hold must be a function or None"):
        build_registry((bare,))
    good = _module(thermal_critical.Params)
    assert build_registry((good,)) == (good,)


def test_params_record_checks_each_value_against_its_field():
    p = params_record(thermal_critical.Params, {**RULES["thermal-critical"], "temp_c": 83})
    assert p.temp_c == 83.0 and type(p.temp_c) is float and p.clear_polls == 1  # an engine default
    for merged, message in (
        ({**RULES["thermal-critical"], "temp_cc": 90}, "temp_cc: no such field"),
        ({**RULES["thermal-critical"], "hold_polls": 2.5}, "hold_polls: 2.5 is not int"),
        ({**RULES["thermal-critical"], "hold_polls": True}, "hold_polls: True is not int"),
        ({**RULES["thermal-critical"], "temp_c": "85"}, "temp_c: '85' is not float"),
        ({"temp_c": 85}, "clear_below_c"),
    ):
        with pytest.raises(ParamsMismatch, match=message):
            params_record(thermal_critical.Params, merged)


def test_each_gpu_gets_its_own_typed_params_built_once_and_shared_when_equal():
    cfg = fleet_config(rules={"thermal-critical": {"temp_c": 84}},
                       gpus=[{"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:18001",
                              "rules": {"thermal-critical": {"temp_c": 83}}},
                             {"alias": "b", "host": "h2", "endpoint": "http://127.0.0.1:18002"},
                             {"alias": "c", "host": "h3", "endpoint": "http://127.0.0.1:18003",
                              "vram_leak_mb_per_hour": 200}])
    view = FleetView(cfg, 0.0, None, History(), benchdata.empty(), {})
    a, b, c = (view.rule_params(thermal_critical.ID, thermal_critical.Params, g) for g in "abc")
    assert (a.temp_c, b.temp_c, c.temp_c) == (83.0, 84.0, 84.0)
    assert b is c  # c has its own copy of the fleet's mappings (it overrides vram-leak) but equal values
    assert view.rule_params(thermal_critical.ID, thermal_critical.Params, "fleet").temp_c == 84.0
    assert view.rule_params(vram_leak.ID, vram_leak.Params, "c").mb_per_hour == 200.0
    again = FleetView(cfg, 60.0, None, History(), benchdata.empty(), {})
    assert again.rule_params(thermal_critical.ID, thermal_critical.Params, "a") is a  # once per config


def test_a_rules_records_across_the_fleet_are_each_distinct_one_once_and_say_what_heal_confirms():
    """``Config.rule_records``: the fleet's record and every GPU's own, built once per config; ``heal``'s
    in-run confirmation asks it which rules any GPU may hold in seconds (``min_probes`` > 0)."""
    from gpuheal.steps.confirm import confirmable

    gpus = [{"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:18001",
             "rules": {"thermal-critical": {"min_probes": 2}}},
            {"alias": "b", "host": "h2", "endpoint": "http://127.0.0.1:18002"},
            {"alias": "c", "host": "h3", "endpoint": "http://127.0.0.1:18003", "vram_leak_mb_per_hour": 200}]
    cfg = fleet_config(gpus=gpus)
    view = FleetView(cfg, 0.0, None, History(), benchdata.empty(), {})
    for rule in ALL:
        records = cfg.rule_records(rule.Params, rule.ID)
        every = {view.rule_params(rule.ID, rule.Params, s) for s in ("fleet", "a", "b", "c")}
        assert set(records) == every and cfg.rule_records(rule.Params, rule.ID) is records  # once per config
    assert [p.min_probes for p in cfg.rule_records(thermal_critical.Params, thermal_critical.ID)] == [0, 2]
    expected = tuple(r.ID for r in ALL if r.ID == thermal_critical.ID or RULES[r.ID].get("min_probes", 0) > 0)
    assert confirmable(cfg) == expected and thermal_critical.ID not in confirmable(fleet_config(gpus=gpus[1:]))


def test_the_engine_reads_rules_through_the_protocol_not_getattr():
    tree = ast.parse((ROOT / "gpuheal/core/engine.py").read_text())
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    assert "getattr" not in calls and "hasattr" not in calls
    assert {r.ID for r in ALL} == set(BY_ID)


def test_code_outside_a_rule_reads_its_parameters_typed_the_same_values_the_engine_uses():
    """Issue 26 item 3: heal's planner and attempts, the re-benchmark and the sources read a rule's
    parameters as a typed record (``Config.params_as``), never by name from the merged mapping. A rule
    whose defaults do not list ``verify_within_s`` has the engine's 300 s there too (the string read
    it replaces raised KeyError), and a GPU's own values win over the fleet's."""
    from gpuheal.steps.rebench import rebench_floor_ratio

    cfg = fleet_config(rules={"model-stuck": {"escalate_after_failures": 2}},
                       gpus=[{"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:18001",
                              "rules": {"model-stuck": {"verify_within_s": 900}}},
                             {"alias": "b", "host": "h2", "endpoint": "http://127.0.0.1:18002"}])
    view = FleetView(cfg, 0.0, None, History(), benchdata.empty(), {})
    for rule in ALL:
        for subject in ("a", "b", "fleet"):
            engine = view.rule_params(rule.ID, rule.Params, subject)
            assert cfg.params_as(EngineParams, rule.ID, subject).verify_within_s == engine.verify_within_s
            assert cfg.params_as(rule.Params, rule.ID, subject) == engine
            if issubclass(rule.Params, RemedyParams):
                assert cfg.params_as(RemedyParams, rule.ID, subject).escalate_after_failures == (
                    engine.escalate_after_failures)
    assert "verify_within_s" not in RULES["cooling-infrastructure"]
    assert cfg.params_as(EngineParams, "cooling-infrastructure", "a").verify_within_s == 300.0
    stuck = [cfg.params_as(RemedyParams, "model-stuck", s) for s in ("a", "b", "fleet", "no-such-gpu")]
    assert [(p.verify_within_s, p.escalate_after_failures) for p in stuck] == [(900.0, 2), (180.0, 2)] + [(180.0, 2)] * 2
    assert rebench_floor_ratio(cfg, "benchmark-regression", "a") == pytest.approx(0.9)
    assert rebench_floor_ratio(cfg, "thermal-critical", "a") is None  # its rule has no such parameter
    assert rebench_floor_ratio(cfg, "no-such-issue", "a") is None


def test_the_registry_refuses_a_fix_whose_params_do_not_say_when_to_escalate():
    """heal reads ``escalate_after_failures`` of every rule it acts on (core/plan): the registry proves
    it is there, so the typed read cannot fail at the first attempt."""

    class Bare(EngineParams):
        temp_c: float
        clear_below_c: float

    with pytest.raises(RuleRegistryError, match="Params must extend RemedyParams"):
        build_registry((_module(Bare),))


def test_no_module_outside_the_rules_reads_rule_parameters_by_name():
    """The merged ``{param: value}`` mapping (``Config.rule_params`` with two arguments, or
    ``cfg.rules["<id>"]``) is read only by the config and the rules; everyone else asks for a record."""
    offenders = []
    for path in sorted((ROOT / "gpuheal").rglob("*.py")):
        rel = path.relative_to(ROOT / "gpuheal").as_posix()
        if rel.startswith(("config/", "rules/", "sim/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            by_mapping = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                          and node.func.attr == "rule_params" and len(node.args) < 3)
            by_id = (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                     and node.value.attr == "rules" and isinstance(node.slice, ast.Constant))
            if by_mapping or by_id:
                offenders.append(f"{rel}:{node.lineno}")
    assert offenders == []
