"""``check``'s plan (issue 26, "the walk of cfg"): what one check needs of the config and of heal's record
is resolved once, before the poll, and each step receives its part — the restarts the source's trend
windows start from are the ones the rules judge with, from one read of ``heal-state.json``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gpuheal.core.heal_state import HealState
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import check

try:
    from tests.series import START, fleet_config, fleet_trace
except ImportError:  # run from tests/
    from series import START, fleet_config, fleet_trace

CFG = fleet_config()
NOW = START + timedelta(minutes=30)


def test_the_plan_reads_heal_state_once_and_gives_the_windows_their_start(tmp_path):
    alias = CFG.aliases[0]
    restarted = (NOW - timedelta(minutes=10)).timestamp()
    with StateDir(tmp_path) as store:
        store.write(files.HEAL, {"restarts": {alias: [restarted - 600, restarted]}})
        plan = check.plan_check(CFG, HealState.from_json(store.read(files.HEAL, {})))
    assert plan.keep_history  # gpu-monitor: a per-poll source, fitted over the recorded history
    assert plan.restarts.last == {alias: restarted}
    assert plan.restarts.grace_s == CFG.heal.startup_grace_s
    assert plan.window_starts == {alias: restarted + CFG.heal.startup_grace_s}


def test_a_check_reads_heal_state_once(tmp_path, monkeypatch):
    reads: list[str] = []
    real = StateDir.read

    def counted(self: StateDir, name: str, default: Any = None) -> Any:
        reads.append(name)
        return real(self, name, default)

    monkeypatch.setattr(StateDir, "read", counted)
    obs = fleet_trace(CFG, n=1, start=NOW)[0]
    with StateDir(tmp_path) as store:
        result = check.run(CFG, store, obs.at, obs=obs)
    assert reads.count(files.HEAL) == 1
    rows = result.health["gpus"]
    assert all(list(row)[-2:] == ["polls_without_decode", "deferred_growing_polls"] for row in rows.values())
    assert list(result.health)[-1] == "rules_off"


def test_a_polls_plan_recalls_the_source_memory_once_and_a_plan_without_a_store_reads_none(tmp_path, monkeypatch):
    """Prometheus keeps a memory between runs: a poll's plan reads its file with heal's record, before the
    poll (the restarted GPUs' windows in it); a plan made without the store (``check`` given a poll) reads
    no file, and its memory's functions are still found once, for the write after the judgement."""
    from gpuheal.config import load_config_dict
    from gpuheal.sources.prometheus import PromMemory

    cfg = load_config_dict({"prometheus": {"url": "http://127.0.0.1:9"},
                            "gpus": [{"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:9"}]})
    restarted = (NOW - timedelta(minutes=10)).timestamp()
    reads: list[str] = []
    real = StateDir.read

    def counted(self: StateDir, name: str, default: Any = None) -> Any:
        reads.append(name)
        return real(self, name, default)

    with StateDir(tmp_path) as store:
        store.write(files.HEAL, {"restarts": {"a": [restarted]}})
        heal_state = HealState.from_json(store.read(files.HEAL, {}))
        monkeypatch.setattr(StateDir, "read", counted)
        plan = check.plan_check(cfg, heal_state, store, NOW)
        assert plan.memory is not None and reads == [plan.memory.file]
        assert isinstance(plan.recalled, PromMemory)
        assert plan.recalled.window_starts == {"a": restarted + cfg.heal.startup_grace_s}
        reads.clear()
        bare = check.plan_check(cfg, heal_state)
    assert reads == [] and bare.recalled is None and bare.memory is not None and not bare.keep_history
