"""A simulated llama.cpp GPU fleet on loopback, driven by a scenario file and a virtual clock.

    from gpuheal.sim import Scenario, SimFleet
    with SimFleet(Scenario.load("examples/scenarios/demo.yaml"), ports="ephemeral") as fleet:
        fleet.monitor_url       # http://127.0.0.1:P/gpu-data      (gpu-monitor v2.1 document)
        fleet.litellm_url       # http://127.0.0.1:P/litellm       ({url}/health/liveliness)
        fleet.control_url       # http://127.0.0.1:P/_sim          (its own port)
        fleet.endpoints         # {alias: "http://127.0.0.1:P"}    (llama-server look-alikes)
        fleet.advance(60)       # move the virtual clock; due events apply
        fleet.restart("gpu-dense")
        fleet.config_dict()     # a gpuheal config pointing at this fleet

Standalone: ``python -m gpuheal.sim SCENARIO [--ephemeral] [--write-config PATH] [--speed X]``.
The control protocol, the scenario format and the fault catalogue are in ``README.md`` next to
this file. Stdlib + PyYAML only; nothing else from gpuheal is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Scenario", "ScenarioError", "SimError", "SimFleet", "run_sim"]

if TYPE_CHECKING:  # pragma: no cover
    from .fleet import SimError, SimFleet, run_sim
    from .scenario import Scenario, ScenarioError

_LAZY = {
    "Scenario": ".scenario",
    "ScenarioError": ".scenario",
    "SimFleet": ".fleet",
    "SimError": ".fleet",
    "run_sim": ".fleet",
}


def __getattr__(name: str) -> Any:
    # Lazy, so ``python -m gpuheal.sim.control`` (a restart command) stays a tiny stdlib client.
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod, __name__), name)
