"""Issue 26 item 5: Prometheus's trend queries and its trend memory follow the rules' declarations.

Each rule that reads a trend says how in its ``NEEDS`` (``trend(Signal.X, "window_field", spans=...,
sustained=..., above=..., restarts=...)``: :class:`gpuheal.signals.Window`); the Prometheus source
derives its PromQL windows, the fleet-wide-window check at config load, and what it remembers between
polls from those declarations alone, and keeps that memory in its own declaration
(``SourceKind.memory``), not in ``steps/check.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuheal.config import load_config_dict
from gpuheal.errors import ConfigError
from gpuheal.ids import ISSUE_IDS
from gpuheal.rules import BY_ID, RuleRegistryError, build_registry
from gpuheal.signals import Signal, Window, trend
from gpuheal.source_kinds import prometheus as kind
from gpuheal.sources import prometheus

PKG = Path(__file__).resolve().parent.parent / "gpuheal"
GPUS = [{"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:9"},
        {"alias": "b", "host": "h2", "endpoint": "http://127.0.0.1:9"}]


def config(rules=None, gpus=GPUS):
    return load_config_dict({"prometheus": {"url": "http://127.0.0.1:9"}, "gpus": gpus, "rules": rules or {}})


@pytest.mark.parametrize("module", ["sources/prometheus.py", "source_kinds/prometheus.py", "steps/check.py"])
def test_no_rule_is_named_where_the_trends_are_asked(module):
    text = (PKG / module).read_text()
    assert [i for i in ISSUE_IDS if re.search(rf"\b{re.escape(i)}\b", text)] == []


def test_the_trend_reads_are_the_rules_needs():
    reads = kind.rule_trends()
    assert [r for r, _ in reads[Signal.VRAM_TREND]] == ["vram-leak"]
    assert [r for r, _ in reads[Signal.TEMP_TREND]] == ["thermal-warning", "thermal-rising"]
    assert reads[Signal.VRAM_TREND][0][1] == BY_ID["vram-leak"].NEEDS[1].window


def test_the_windows_follow_the_rules_parameters():
    cfg = config({"vram-leak": {"window_h": 5, "min_span_h": 4, "recover_span_h": 1, "mb_per_hour": 200,
                                "sustain_ratio": 0.5},
                  "thermal-warning": {"window_s": 240, "min_span_s": 120, "temp_c": 60},
                  "thermal-rising": {"window_s": 240, "min_span_s": 180, "temp_c": 65, "clear_below_c": 65}})
    windows = {tw.series.kind: tw for tw in prometheus.trend_windows(cfg)}
    vram, temp = windows["vram"], windows["temp"]
    assert (vram.window_s, vram.spans, vram.restarts, vram.remembered, vram.hot_from) == (
        5 * 3600, [3600.0, 4 * 3600.0], True, True, None)
    assert vram.halves_from == 200 * 0.5 / 3600 / 2  # half the lowest sustained rate, per second
    assert (temp.window_s, temp.spans, temp.restarts, temp.remembered, temp.hot_from) == (
        240, [120.0, 180.0], False, False, 55.0)
    assert prometheus.remembered_window(cfg) == vram


def test_a_window_a_rule_declares_is_what_prometheus_asks(monkeypatch):
    """Swap the declaration: Rule 8's trend read over another of its fields, from another threshold —
    the PromQL range and the hot line follow, nothing else was told."""
    declared = {Signal.TEMP_TREND: (("thermal-warning", Window("min_span_s", above="rise_c_per_min")),)}
    monkeypatch.setattr(prometheus, "rule_trends", lambda: declared)
    cfg = config({"thermal-warning": {"min_span_s": 150, "rise_c_per_min": 40}})
    (temp,) = prometheus.trend_windows(cfg)
    assert temp.window_s == 150 and temp.hot_from == 35.0 and temp.spans == []
    queries = prometheus.build_queries(cfg, prometheus.PromMemory(), 0.0, prometheus.Matcher(cfg), every_gpu=True)
    assert queries["temp.slope"][0] == "deriv(DCGM_FI_DEV_GPU_TEMP[150000ms])"


def test_a_gpu_may_not_set_a_declared_window_with_prometheus(monkeypatch):
    declared = {Signal.TEMP_TREND: (("thermal-warning", Window("clear_rise_c_per_min")),)}
    monkeypatch.setattr(kind, "rule_trends", lambda: declared)
    gpus = [{**GPUS[0], "rules": {"thermal-warning": {"clear_rise_c_per_min": 3}}}]
    with pytest.raises(ConfigError) as err:
        config(gpus=gpus)
    assert err.value.key_path == "gpus[0].rules.thermal-warning.clear_rise_c_per_min"


def test_two_rules_reading_one_trend_read_one_window():
    with pytest.raises(ConfigError) as err:
        config({"thermal-rising": {"window_s": 600}})
    assert err.value.key_path == "rules.thermal-rising.window_s" and "rules.thermal-warning.window_s" in str(err.value)


def test_a_trend_window_naming_no_params_field_is_refused_by_the_registry():
    base = BY_ID["thermal-warning"]
    bad = SimpleNamespace(**{k: getattr(base, k) for k in ("ID", "SCOPE", "SEVERITY", "INHIBITS", "Params", "detect",
                                                          "recovered", "hold", "remember", "JUDGED_FROM_BENCH", "REMEDY")},
                          __name__="gpuheal.rules.thermal_warning",
                          NEEDS=(trend(Signal.TEMP_TREND, "window_minutes"),))
    with pytest.raises(RuleRegistryError, match="window_minutes"):
        build_registry((bad,))


def test_the_trend_memory_is_the_sources_own_declaration():
    memory = kind.KIND.memory
    assert memory is not None and memory.file == "prometheus-trend.json"
    assert memory.load.startswith("gpuheal.sources.prometheus:") and memory.save.startswith("gpuheal.sources.prometheus:")
    assert "prom_memory" not in (PKG / "steps" / "check.py").read_text()
