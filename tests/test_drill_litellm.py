"""The LiteLLM drill's wiring (benchmarks/drill_litellm.py, issue 28 item 5): gpuheal's config in front of
the real proxy drains first through the path a proxy without a database takes — its ``config.yaml`` and a
restart command (``/model/update`` is refused there) — so the drill measures drain first as LiteLLM's users
see it. The real run is ``benchmarks/drill.py --litellm``; tests/reallitellm/test_drain_real.py proves the
path itself against the real LiteLLM 1.108.7."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "realserver"))

import drill  # noqa: E402
import drill_litellm  # noqa: E402

from gpuheal.actions.drain import config_step  # noqa: E402
from gpuheal.config.load import load_config  # noqa: E402


def proxy(tmp_path: Path) -> drill_litellm.Proxy:
    return drill_litellm.Proxy("http://127.0.0.1:4999", "sk-drill", tmp_path / "litellm" / "config.yaml",
                               tmp_path / "litellm" / "launcher.json", tmp_path / "litellm" / "litellm.pid",
                               tmp_path / "litellm" / "litellm.log")


def test_the_litellm_drill_configures_drain_first_through_the_config_file(tmp_path):
    p = proxy(tmp_path)
    ports = {"hang": 4001, "hang-twin": 4002, "control-1": 4003}
    path = tmp_path / "gpuheal.yaml"
    drill.write_config(path, ports, tmp_path / "sup.sock", 4100, drill_litellm.gpuheal_litellm(p))
    cfg = load_config(path)
    step = config_step(cfg)
    assert step is not None  # drain first is configured: heal --apply drains at the first bad poll
    assert step.path == str(p.config_file)
    assert list(step.restart_argv) == [sys.executable, str(drill_litellm.LAUNCHER), str(p.launcher_state)]
    assert cfg.litellm.url == p.url
    assert all(g.litellm_model_id is None for g in cfg.gpus)  # /model/update is refused without a database


def test_the_direct_drill_has_no_litellm_to_drain_through(tmp_path):
    path = tmp_path / "gpuheal.yaml"
    drill.write_config(path, {"hang": 4001, "control-1": 4003}, tmp_path / "sup.sock", 4100)
    assert config_step(load_config(path)) is None


def test_no_drain_leaves_routing_to_litellm_alone(tmp_path):
    path = tmp_path / "gpuheal.yaml"
    drill.write_config(path, {"hang": 4001, "hang-twin": 4002}, tmp_path / "sup.sock", 4100,
                       drill_litellm.gpuheal_litellm(proxy(tmp_path), drain=False))
    cfg = load_config(path)
    assert config_step(cfg) is None and cfg.litellm.url == "http://127.0.0.1:4999"
