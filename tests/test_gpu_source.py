"""Issue 19, item 3: the GpuSource seam — the configured source is chosen in one place, declares what
it provides, and offers its doctor probes; doctor lists the rules the source cannot feed, derived as
check's rules_off is."""

from __future__ import annotations

import pytest

from gpuheal.config.load import load_config_dict
from gpuheal.doctor import OK, SKIP
from gpuheal.doctor.checks import coverage_checks
from gpuheal.named import resolve
from gpuheal.rules import ALL
from gpuheal.signals import ALWAYS, Source, unmet
from gpuheal.source_kinds import REGISTRY, SOURCES
from gpuheal.sources.gpu_source import gpu_source

GPUS = [{"alias": "gpu-0", "host": "ct0", "endpoint": "http://127.0.0.1:9000"}]
MODES = {
    Source.MONITOR: {"monitor": {"url": "http://127.0.0.1:9100/gpu-data"}},
    Source.SMI: {},
    Source.PROMETHEUS: {"prometheus": {"url": "http://127.0.0.1:9090"}},
}


def cfg(mode: Source):
    return load_config_dict({"gpus": GPUS, **MODES[mode]})


@pytest.mark.parametrize("mode", list(MODES))
def test_the_configured_source_declares_what_its_spec_provides(mode):
    source = gpu_source(cfg(mode))
    assert source.spec.source == mode and source.provides() == SOURCES[mode].provides


def test_every_configured_mode_has_a_source():
    assert {k.name for k in REGISTRY} == set(SOURCES) - {Source.FALLBACK}  # the fallback is gpu-monitor's
    assert set(MODES) == {k.name for k in REGISTRY}


@pytest.mark.parametrize("mode", list(MODES))
def test_doctor_probes_name_a_real_check(mode):
    for probe in gpu_source(cfg(mode)).doctor_probes():
        assert callable(resolve(probe.check)) and probe.deadline_s > 0


@pytest.mark.parametrize("mode", list(MODES))
def test_doctor_lists_every_rule_the_source_cannot_feed(mode):
    rows = coverage_checks(cfg(mode))
    expected = {r.ID for r in ALL if unmet(r.NEEDS, SOURCES[mode].provides | ALWAYS)}
    if not expected:
        assert [r.status for r in rows] == [OK]
        return
    assert {r.check.removeprefix("rule ") for r in rows} == expected
    assert all(r.status == SKIP and r.detail.startswith("off: needs ") and r.fix for r in rows)


def test_smi_mode_names_what_it_lacks_in_doctor():
    rows = {r.check: r for r in coverage_checks(cfg(Source.SMI))}
    assert "rule circuit-breaker-stuck" in rows
    assert "monitor.url" in rows["rule circuit-breaker-stuck"].fix
