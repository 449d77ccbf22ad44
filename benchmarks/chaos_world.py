"""The chaos week's simulated fleet (``gpuheal.sim``) and what each incident does to it (issue 29).

:func:`scenario` builds the fleet of a :class:`~chaos_inject.Layout`: GPUs four to a host with their
``gpu_index``, varied but steady values (a seeded generator of their own), every llama-server with
``--metrics`` and two slots. :data:`SCRIPTS` says, per kind, how an incident begins, how it ends when
nobody acts (or a human fixes it), what it does each minute, and whether it is still *live* in the
world: the ground truth a system is judged by. A healer ends a fault only through the fleet — a
restart, LiteLLM's ``/model/update``, ``nvidia-smi -pl``, a service restart — and the script sees it
because the fault is no longer there.

The world is the sim's :class:`~gpuheal.sim.world.World`; everything here goes through its public
methods (``apply_now``, ``gpu_entry``, the ``effects`` log) and the GPU states it holds.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos_inject import Incident, Layout

CRITICAL_C = 85.0  # Rule 1's default threshold: above it a GPU is overheating
SLOWDOWN_C = 88.0  # above it the board throttles itself (half its speed): lost capacity
VRAM_OOM_MARGIN_MB = 64  # a leak this close to the total crashes the server (CUDA out of memory)
COMPETITOR_PID_BASE = 70000
START = "2026-07-20T00:00:00Z"  # a Monday, midnight UTC


def scenario(layout: Layout, seed: int) -> dict[str, Any]:
    """The sim scenario of the fleet: steady values drawn once per GPU (``chaos-fleet:SEED``)."""
    rng = random.Random(f"chaos-fleet:{seed}")
    gpus = []
    for alias in layout.gpus:
        host = layout.host_of[alias]
        index = layout.gpus_of_host(host).index(alias)
        baseline = round(rng.uniform(35, 80), 1)
        gpus.append({
            "alias": alias, "host": host, "gpu_index": index, "vendor": "nvidia",
            "name": "NVIDIA GeForce RTX 3090", "vram_total_mb": 24576,
            "vram_used_mb": rng.randrange(16000, 20000), "temp_c": rng.randrange(50, 64),
            "util_pct": rng.randrange(40, 75), "power_w": round(rng.uniform(220, 300), 1),
            "power_limit_w": 350, "power_default_limit_w": 350, "power_max_limit_w": 400,
            "baseline_tok_s": baseline, "tok_s": baseline, "requests_60s": rng.randrange(15, 30),
            "parallel": 2, "n_ctx": 65536, "model": "Qwen3-27B-Q4_K_M.gguf",
            "litellm_model_id": alias, "litellm_rpm": 60,
        })
    return {
        "name": f"chaos-{len(layout.gpus)}", "start": START, "reload_s": 0,
        "ports": {"monitor": 0, "litellm": 0, "control": 0, "gpus_from": 0},
        "gpus": gpus, "events": [],
    }


# --------------------------------------------------------------------------- the world, as scripts see it


@dataclass
class Live:
    """What the driver keeps about an incident while the week runs."""

    incident: Incident
    begun: bool = False
    ended_at: float | None = None  # the fault left the world (anyone's doing)
    ended_by: str | None = None  # system | human | natural
    healed_at: float | None = None  # first time the system's action made it not live (heal-claim kinds)
    relapses: int = 0  # live again after a heal (it is still there: a mitigation undone)
    first_page_at: float | None = None
    human_fix_at: float | None = None
    state: dict[str, Any] = field(default_factory=dict)  # the script's own (e.g. OOM seen)


def _gpu(world, alias: str):
    return world.gpus[alias]


def _apply(world, alias: str, **event: Any) -> None:
    world.apply_now({"gpu": alias, **event})


def _spec(world, alias: str, name: str) -> Any:
    return _gpu(world, alias).spec.values[name]


def _restore(world, alias: str, *names: str) -> None:
    _apply(world, alias, set={n: _spec(world, alias, n) for n in names})


@dataclass(frozen=True)
class Script:
    begin: Callable[[Any, Live, float], list[tuple[float, Callable[[Any], None]]]]
    end: Callable[[Any, Live], None]
    live: Callable[[Any, Live], bool]
    tick: Callable[[Any, Live, float], None] | None = None


def _fault(name: str, heals: bool) -> Script:
    def begin(world, lv: Live, t: float):
        for a in lv.incident.gpus:
            _apply(world, a, fault=name, heals_on_restart=heals)
        return []

    def end(world, lv: Live) -> None:
        for a in lv.incident.gpus:
            _apply(world, a, fault="none")

    def live(world, lv: Live) -> bool:
        return any(_gpu(world, a).fault == name for a in lv.incident.gpus)

    return Script(begin, end, live)


# ---- VRAM leaks: the server's own (a restart gives it back) or a foreign process's (it does not)


def _leak_begin(world, lv: Live, t: float):
    a, rate = lv.incident.gpus[0], lv.incident.params["mb_per_hour"] / 60.0
    if lv.incident.kind == "vram-leak-foreign":
        g = _gpu(world, a)
        room = float(_spec(world, a, "vram_total_mb")) - float(g.value("vram_used_mb", t)) - 1024
        pid = COMPETITOR_PID_BASE + list(world.gpus).index(a)
        _apply(world, a, set={"competing_pid": pid, "competing_vram_mb": 300},
               ramp={"competing_vram_mb": rate}, max={"competing_vram_mb": 300 + room})
        used = float(g.value("vram_used_mb", t)) + 300
        _apply(world, a, set={"vram_used_mb": used}, ramp={"vram_used_mb": rate},
               max={"vram_used_mb": used + room - 300}, heals_on_restart=False)
    else:
        _apply(world, a, ramp={"vram_used_mb": rate}, heals_on_restart=True)
    return []


def _leak_end(world, lv: Live) -> None:
    a = lv.incident.gpus[0]
    if lv.incident.kind == "vram-leak-foreign":
        _apply(world, a, set={"competing_pid": 0, "competing_vram_mb": 0})
    _apply(world, a, ramp={"vram_used_mb": 0})
    _restore(world, a, "vram_used_mb")
    if _gpu(world, a).fault == "dead":  # the OOM it caused: the human's restart brings it back
        _apply(world, a, fault="none")


def _leak_live(world, lv: Live) -> bool:
    g = _gpu(world, lv.incident.gpus[0])
    if lv.incident.kind == "vram-leak-foreign":
        return bool(g.values.get("competing_pid"))
    return "vram_used_mb" in g.ramps or (lv.state.get("oom") and g.fault == "dead")


def _leak_tick(world, lv: Live, t: float) -> None:
    """A leak that reaches the board's total crashes the server (CUDA out of memory); a restart
    brings it back with its model's memory only."""
    a = lv.incident.gpus[0]
    g = _gpu(world, a)
    if g.fault == "none" and float(g.value("vram_used_mb", t)) >= float(g.values["vram_total_mb"]) - VRAM_OOM_MARGIN_MB:
        lv.state["oom"] = lv.state.get("oom", 0) + 1
        _apply(world, a, ramp={"vram_used_mb": 0} if lv.incident.kind == "vram-leak" else {},
               fault="dead", heals_on_restart=True)


# ---- heat: one GPU (its fan), or a rack (its cooling: shedding load does not cool the room)


def _heat_begin(world, lv: Live, t: float):
    p = lv.incident.params
    lv.state["from_c"] = {a: float(_gpu(world, a).value("temp_c", t)) for a in lv.incident.gpus}
    if lv.incident.kind == "overheat":
        a = lv.incident.gpus[0]
        _apply(world, a, ramp={"temp_c": p["c_per_min"]}, max={"temp_c": p["max_c"]})
    return []


def _heat_end(world, lv: Live) -> None:
    for a in lv.incident.gpus:
        _apply(world, a, ramp={"temp_c": 0})
        _restore(world, a, "temp_c")


def _overheat_live(world, lv: Live) -> bool:
    return "temp_c" in _gpu(world, lv.incident.gpus[0]).ramps  # heating, not held by load shedding


def _rack_tick(world, lv: Live, t: float) -> None:
    p, start = lv.incident.params, lv.incident.start_s
    for a, base in lv.state["from_c"].items():
        _apply(world, a, set={"temp_c": min(p["max_c"], base + p["c_per_min"] * (t - start) / 60.0)})


def _always(world, lv: Live) -> bool:
    return True


# ---- one value set for the incident, put back at its end


def _setter(values: Callable[[Any, str, dict], dict[str, Any]], live: Callable[[Any, str], bool]) -> Script:
    def begin(world, lv: Live, t: float):
        for a in lv.incident.gpus:
            lv.state.setdefault("was", {})[a] = {k: _gpu(world, a).values.get(k)
                                                 for k in values(world, a, lv.incident.params)}
            _apply(world, a, set=values(world, a, lv.incident.params))
        return []

    def end(world, lv: Live) -> None:
        for a in lv.incident.gpus:
            _apply(world, a, set=lv.state["was"][a])

    return Script(begin, end, lambda world, lv: any(live(world, a) for a in lv.incident.gpus))


def _power_cap(world, a: str, p: dict) -> dict[str, Any]:
    return {"power_limit_w": round(float(_spec(world, a, "power_default_limit_w")) * p["ratio"])}


def _capped(world, a: str) -> bool:
    g = _gpu(world, a)
    return float(g.values["power_limit_w"]) < float(g.values["power_default_limit_w"]) - 1.0


def _context(world, a: str, p: dict) -> dict[str, Any]:
    return {"n_ctx": int(_spec(world, a, "n_ctx") * p["n_ctx_ratio"]),
            "tok_s": round(float(_spec(world, a, "tok_s")) * p["tok_ratio"], 2)}


def _slower(world, a: str) -> bool:
    g = _gpu(world, a)
    return float(g.values["tok_s"]) < 0.9 * float(g.values["baseline_tok_s"])


def _drift(world, a: str, p: dict) -> dict[str, Any]:
    return {"requests_60s": int(_spec(world, a, "requests_60s") * p["requests_ratio"])}


def _drifted(world, a: str) -> bool:
    return int(_gpu(world, a).values["requests_60s"]) > int(_spec(world, a, "requests_60s"))


# ---- the services


def _monitor(mode: str) -> Script:
    def begin(world, lv: Live, t: float):
        world.apply_now({"gpu": "fleet", "monitor": mode, "heals_on_restart": True})
        return []

    def end(world, lv: Live) -> None:
        world.apply_now({"gpu": "fleet", "monitor": "ok"})

    return Script(begin, end, lambda world, lv: world.monitor_mode == mode)


def _breaker() -> Script:
    def begin(world, lv: Live, t: float):
        _apply(world, lv.incident.gpus[0], set={"breaker_open": True})
        return []

    def end(world, lv: Live) -> None:
        _apply(world, lv.incident.gpus[0], set={"breaker_open": False})

    return Script(begin, end, lambda world, lv: bool(_gpu(world, lv.incident.gpus[0]).breaker_open))


# ---- benign events


def _deploy_begin(world, lv: Live, t: float):
    """A planned restart: the port closes for ~20 s, then the model loads (503) until the end."""
    a = lv.incident.gpus[0]
    _apply(world, a, fault="dead", heals_on_restart=True)
    extra: dict[str, Any] = {}
    if lv.incident.kind == "nctx-change":
        extra = {"set": {"n_ctx": int(_spec(world, a, "n_ctx") * lv.incident.params["n_ctx_ratio"])}}
    return [(t + 20.0, lambda w: _apply(w, a, fault="loading", heals_on_restart=True, **extra))]


def _traffic(world, a: str, p: dict) -> dict[str, Any]:
    """Every slot generating and more waiting (a spike: more of them than usual)."""
    ratio = p.get("requests_ratio", 1.0)  # long generations fill the slots; they do not bring more requests
    return {"busy_slots": 2, "queued": 4, "util_pct": 100, "requests_60s": int(_spec(world, a, "requests_60s") * ratio)}


def _blip_begin(world, lv: Live, t: float):
    """A one-poll network blip: the path to the GPU's host drops for a few seconds — its ``/health``
    refused (a firewall's reject, a port forward reloading) or timing out (packets dropped), and the
    host's SSH the same way (:func:`ssh_silence`); the server itself runs on untouched."""
    a = lv.incident.gpus[0]
    _apply(world, a, fault="dead" if lv.incident.params["how"] == "refused" else "hang", heals_on_restart=True)
    host = _gpu(world, a).spec.host
    silent_ssh(world)[host] = lv.incident.params["how"]
    lv.state["host"] = host
    return []


def _blip_end(world, lv: Live) -> None:
    _fault("dead", True).end(world, lv)
    silent_ssh(world).pop(lv.state.get("host"), None)


def silent_ssh(world) -> dict[str, str]:
    """{host: refused | timeout}: the hosts whose SSH a network blip silences now."""
    if not hasattr(world, "chaos_silent_ssh"):
        world.chaos_silent_ssh = {}
    return world.chaos_silent_ssh


def ssh_silence(world, host: str | None) -> str | None:
    """How SSH to ``host`` fails now (``refused`` | ``timeout``), or ``None`` when it answers."""
    return silent_ssh(world).get(host) if host is not None else None


def _slow_begin(world, lv: Live, t: float):
    a = lv.incident.gpus[0]
    _apply(world, a, fault="slow", slow_s=lv.incident.params["slow_s"], set={"busy_slots": 2, "queued": 2})
    return []


def _slow_end(world, lv: Live) -> None:
    a = lv.incident.gpus[0]
    _apply(world, a, fault="none", set={"busy_slots": 0, "queued": 0})


def _nothing_begin(world, lv: Live, t: float):
    return []


def _nothing(world, lv: Live) -> None:
    return None


def _never(world, lv: Live) -> bool:
    return False


SCRIPTS: dict[str, Script] = {
    "crash": _fault("dead", True),
    "crash-hardware": _fault("dead", False),
    "freeze": _fault("hang", True),
    "taskloop-hang": _fault("taskloop-hang", True),
    "vram-leak": Script(_leak_begin, _leak_end, _leak_live, _leak_tick),
    "vram-leak-foreign": Script(_leak_begin, _leak_end, _leak_live),
    "overheat": Script(_heat_begin, _heat_end, _overheat_live),
    "rack-cooling": Script(_heat_begin, _heat_end, _always, _rack_tick),
    "power-cap": _setter(_power_cap, _capped),
    "breaker-stuck": _breaker(),
    "context-perf-loss": _setter(_context, _slower),
    "role-drift": _setter(_drift, _drifted),
    "host-unreachable": _fault("unreachable", False),
    "partition": _fault("unreachable", False),
    "monitor-down": _monitor("down"),
    "monitor-empty": _monitor("empty"),
    "deploy": Script(_deploy_begin, _fault("dead", True).end, _never),
    "nctx-change": Script(_deploy_begin, _fault("dead", True).end, _never),
    "maintenance": Script(_fault("dead", True).begin, _fault("dead", True).end, _never),
    "saturated": Script(_setter(_traffic, lambda w, a: False).begin, _setter(_traffic, lambda w, a: False).end,
                        _never),
    "traffic-spike": Script(_setter(_traffic, lambda w, a: False).begin, _setter(_traffic, lambda w, a: False).end,
                            _never),
    "blip": Script(_blip_begin, _blip_end, _never),
    "slow": Script(_slow_begin, _slow_end, _never),
    "clock-step": Script(_nothing_begin, _nothing, _never),
}


# --------------------------------------------------------------------------- serving capacity


def serving(world, alias: str, t: float) -> float:
    """How much of its normal serving this GPU gives now, 0..1: nothing when it cannot answer or
    LiteLLM routes it nothing (breaker open), its LiteLLM share while shed, its speed's share while
    throttled (power cap, slower context), half above the board's slowdown temperature."""
    g = world.gpus[alias]
    if g.fault in ("dead", "hang", "taskloop-hang", "stuck", "unreachable", "decode-hang", "failing", "loading",
                   "wrong-key") or g.breaker_open:
        return 0.0
    share = g.load_factor
    speed = g.gen_tok_s(t) / max(float(g.values["baseline_tok_s"]), 1e-9)
    heat = 0.5 if float(g.value("temp_c", t)) >= SLOWDOWN_C else 1.0
    return max(0.0, min(1.0, share * min(speed, 1.0) * heat))
