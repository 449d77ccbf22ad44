"""Issue 19 item 3: a GPU source declares itself in one place, and the rest of gpuheal asks the registry.

Read against the code, so the file list in ``gpuheal/source_kinds/__init__.py`` stays true:

- every registered source is whole: a spec of known signals, a reader that resolves, doctor probes that
  name real checks, a config section with its schema entry and its defaults, memory hooks that resolve;
- one source needs no section, and it is the last (the default when no section is written);
- no module outside the registry tests which source section a config has (``cfg.prometheus is None``),
  or which source a poll came from by name (``Source.MONITOR``, ``source == "smi"``): they ask the
  registry (``configured``, ``spec``, ``home``) instead. A grep over the source, like tests/test_layers.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gpuheal.config.load import load_config_dict
from gpuheal.named import resolve
from gpuheal.signals import Signal, SourceSpec
from gpuheal.source_kinds import REGISTRY, SOURCES, configured, home, kind_of, spec
from gpuheal.sources.gpu_source import gpu_source

PKG = Path(__file__).resolve().parent.parent / "gpuheal"
GPUS = [{"alias": "gpu-0", "host": "ct0", "endpoint": "http://127.0.0.1:9000"}]
SCHEMA = json.loads((PKG / "config" / "schema.json").read_text())
DEFAULTS = yaml.safe_load((PKG / "config" / "defaults.yaml").read_text())
SECTIONED = [k for k in REGISTRY if k.section]


def config_of(kind):
    """The smallest config that sets ``kind`` up: its section with a loopback URL, or nothing."""
    section = {"url": "http://127.0.0.1:9"} if "url" in (DEFAULTS.get(kind.section) or {}) else {}
    return load_config_dict({"gpus": GPUS, **({kind.section: section} if kind.section else {})})


@pytest.mark.parametrize("kind", REGISTRY, ids=lambda k: k.name)
def test_every_registered_source_is_whole(kind):
    assert isinstance(kind.spec, SourceSpec) and kind.spec.provides <= set(Signal)
    assert callable(resolve(kind.reader))
    cfg = config_of(kind)
    source = gpu_source(cfg)
    assert configured(cfg) is kind and source.kind is kind and source.provides() == kind.spec.provides
    for probe in source.doctor_probes():
        assert callable(resolve(probe.check)) and probe.deadline_s > 0
    for hook in (kind.memory.load, kind.memory.save) if kind.memory else ():
        assert callable(resolve(hook))
    if kind.fallback is not None:
        assert home(kind.fallback.source) == kind.name and kind_of(kind.fallback.source) is kind


@pytest.mark.parametrize("kind", SECTIONED, ids=lambda k: k.name)
def test_a_source_section_is_in_the_schema_and_the_defaults_and_becomes_its_record(kind):
    assert kind.section in SCHEMA["properties"] and kind.section in DEFAULTS and kind.build is not None
    cfg = config_of(kind)
    others = {k.section for k in SECTIONED} - {kind.section}
    assert cfg.sections[kind.section] is not None and not others & set(cfg.sections)


def test_one_source_needs_no_section_and_it_is_the_default():
    assert [k.section for k in REGISTRY].count(None) == 1 and REGISTRY[-1].section is None
    assert configured(load_config_dict({"gpus": GPUS})) is REGISTRY[-1]


def test_names_are_unique_and_every_name_a_poll_can_carry_is_declared():
    names = [s.source for k in REGISTRY for s in (k.spec, k.fallback) if s is not None]
    assert len(names) == len(set(names)) and set(SOURCES) == set(names)
    assert spec("garbage").provides == frozenset() and home("garbage") == "garbage" and kind_of("garbage") is None


def test_two_source_sections_are_refused_in_one_line():
    from gpuheal.errors import ConfigError

    both = {k.section: {"url": "http://127.0.0.1:9"} for k in SECTIONED}
    with pytest.raises(ConfigError, match="are two GPU data sources; keep one"):
        load_config_dict({"gpus": GPUS, **both})


def test_signals_keeps_no_shim_for_the_registry():
    """``SOURCES`` and ``spec`` live in the registry only (issue 26 item 4: the shim made signals import
    upward and a six-file circle)."""
    import gpuheal.signals as signals

    assert not hasattr(signals, "SOURCES") and not hasattr(signals, "spec") and not hasattr(signals, "__getattr__")


# --------------------------------------------------------------------------- nobody else asks by name

# The registry itself (each reader stamps its own declaration's name on its poll: ``KIND.name``).
OWNERS = {"source_kinds", "signals.py"}


def _owned(path: Path, root: Path) -> bool:
    rel = path.relative_to(root).as_posix()
    return any(rel == o or rel.startswith(o + "/") for o in OWNERS)


def offenders(root: Path = PKG) -> list[str]:
    names = "|".join(re.escape(n) for n in sorted(SOURCES, key=len, reverse=True))
    sections = "|".join(re.escape(k.section) for k in SECTIONED)
    patterns = [
        rf"\.(?:{sections})\s+is\s+(?:not\s+)?None",  # cfg.prometheus is None
        rf"getattr\([\w.]+,\s*[\"'](?:{sections})[\"']",  # getattr(cfg, "monitor", None)
        r"\bSource\.[A-Z]+\b",  # Source.MONITOR
        rf"source\w*\s*[=!]=\s*[\"'](?:{names})[\"']",  # obs.source == "smi"
        rf"[\"'](?:{names})[\"']\s*[=!]=\s*[\w.]*source",
        rf"source\w*\s+(?:not\s+)?in\s+\(\s*[\"'](?:{names})[\"']",  # source in ("monitor", ...)
    ]
    found = []
    for path in sorted(root.rglob("*.py")):
        if _owned(path, root) or path.relative_to(root).parts[0] == "sim":  # sim: the simulated fleet's own modes
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(re.search(p, line) for p in patterns):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return found


def test_no_module_outside_the_registry_asks_which_source_by_name():
    assert offenders() == []


def test_the_grep_sees_a_module_that_asks_by_name(tmp_path):
    bad = tmp_path / "steps"
    bad.mkdir()
    (bad / "x.py").write_text("def f(cfg, obs):\n    if cfg.prometheus is None:\n        return obs.source == 'smi'\n")
    (bad / "y.py").write_text("from gpuheal.signals import Source\nX = Source.FALLBACK\n")
    assert len(offenders(tmp_path)) == 3


# --------------------------------------------------------------------------- a new source, end to end


def test_sense_merges_the_typed_poll_without_asking_which_source_it_is():
    """Issue 26 item 5: every reader returns :class:`~gpuheal.model.SourcePoll`; ``sense`` reads none of
    a built-in source's own shapes (gpu-monitor's document, Prometheus's answers, smi's readings) nor
    their parsers, and the poll record has no field for one."""
    from dataclasses import fields

    from gpuheal.model import SourcePoll

    text = (PKG / "sources" / "sense.py").read_text()
    shapes = r"\.(?:doc|prom|readings|gpu_values)\b|monitor_values|MonitorDocument|PromReading|SmiReadings|prometheus\."
    assert re.findall(shapes, text) == []
    assert {f.name for f in fields(SourcePoll)} == {"source", "ok", "gpus", "faults", "warnings", "fallback_ok",
                                                    "lacking", "unmatched_hosts"}


def test_a_source_known_only_to_the_registry_is_read_judged_and_listed_off(monkeypatch):
    """A toy source, declared only by its ``SourceKind`` and its reader (files 1-3 of the list): sense
    reads through it, the observation carries its name, its values with the request its reader names,
    its faults, the llama-server liveness it reports and the GPUs it lacks, and coverage lists what it
    cannot feed with its own reason — no other module was told about it (sense.py has no branch for it)."""
    import sys
    import types
    from datetime import UTC, datetime

    import gpuheal.source_kinds as registry
    from gpuheal import provenance as prov
    from gpuheal.core.coverage import rules_off
    from gpuheal.model import DataFault, GpuValues, Liveness, SourcePoll
    from gpuheal.rules import ALL
    from gpuheal.signals import READINGS
    from gpuheal.source_kinds.base import SourceKind
    from gpuheal.sources.sense import sense

    toy = SourceKind(SourceSpec("toy", READINGS, computes_trends=False, lacks_why="toy counts no requests",
                                lacks_fix="use gpu-monitor"), reader="toy_reader:read",
                     probes_endpoints=lambda section: False)
    reader = types.ModuleType("toy_reader")
    told = Liveness("ok", "toy GET /up")
    reader.read = lambda cfg, now, deadline_s, transports, memory: SourcePoll(
        "toy", True,
        {"gpu-0": GpuValues((("toy GET /gpus", {"temp_c": 71.5, "vram_used_mb": 1000.0}),), liveness=told,
                            faults=(DataFault("gpu-0", "invalid", "toy: util is garbage"),))},
        faults=(DataFault("toy", "invalid", "toy lost one GPU"),), warnings=("toy is a toy",),
        lacking=("gpu-1",), unmatched_hosts=("ct-other",))
    monkeypatch.setitem(sys.modules, "toy_reader", reader)
    monkeypatch.setattr(registry, "REGISTRY", (toy,))
    monkeypatch.setitem(registry.SOURCES, "toy", toy.spec)
    gpus = [*GPUS, {"alias": "gpu-1", "host": "ct1", "endpoint": "http://127.0.0.1:9"}]
    cfg = load_config_dict({"gpus": gpus})
    obs = sense(cfg, datetime(2026, 7, 18, 8, 0, tzinfo=UTC))  # nothing probed: the toy says who is alive
    gpu = obs.gpus["gpu-0"]
    assert obs.source == "toy" and obs.monitor_ok and gpu.temp_c == 71.5 and gpu.endpoint == "ok"
    assert prov.to_json(gpu.provenance) == {"toy GET /gpus": ["temp_c", "vram_used_mb"], "toy GET /up": ["endpoint"]}
    assert obs.gpus["gpu-1"].temp_c is None and obs.gpus["gpu-1"].endpoint is None
    assert [(f.source, f.detail) for f in obs.faults] == [("toy", "toy lost one GPU"), ("gpu-0", "toy: util is garbage")]
    assert obs.warnings == ("toy is a toy",) and obs.lacking == ("gpu-1",) and obs.unmatched_hosts == ("ct-other",)
    off = {o["rule"]: o for o in rules_off(obs.source, obs, ALL)}
    assert "circuit-breaker-stuck" in off and off["circuit-breaker-stuck"]["why"].endswith("toy counts no requests")
    assert "thermal-critical" not in off
