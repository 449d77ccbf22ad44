"""The simulated fleet's state and its virtual clock (no sockets here).

Everything the sim reports derives from the virtual time since the scenario's start (``t``) and
the events applied so far. The clock moves only through :meth:`World.advance`. Two things are
measured in *real* seconds on purpose, because a healing tool waits for them in real time:
the reload after a restart (``reload_s``) and the delay of the ``slow`` fault (``slow_s``).

Load shedding (LiteLLM ``POST /model/update``): while a GPU's current LiteLLM rpm is below its
normal rpm the GPU is *shed*. Its reported ``util_pct`` and ``requests_60s`` are scaled by
``rpm / normal``, and its ``temp_c`` follows a cooling line instead of its ramp: from the
temperature at the moment shedding started (or a later ``set``) it falls by
``cooling_c_per_min`` per virtual minute down to ``idle_temp_c`` (never up to it). Any
``temp_c`` ramp is suspended meanwhile (an event may still replace or stop it); when the rpm
is back to >= normal the ramp resumes from the temperature reached. Both are closed forms of
``t``, so one big ``advance()`` gives the same result as many small ones.
"""

from __future__ import annotations

import email.utils
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .processes import gpu_processes
from .scenario import (
    INTEGER_FIELDS,
    RAMPABLE,
    Event,
    GpuSpec,
    Scenario,
    ScenarioError,
    iso,
    parse_event,
)

# Faults a monitor would see as failed requests in its 60 s window.
_FAILING_FAULTS = {"dead", "hang", "loading", "failing", "stuck", "wrong-key", "unreachable"}
_TIMEOUT_FAULTS = {"hang", "stuck", "unreachable"}
# Faults under which the busy slots still generate (n_decode_total advances); any other stops them.
_DECODING_FAULTS = {"none", "slow"}


@dataclass
class Ramp:
    rate_per_min: float
    anchor_t: float
    base: float
    max: float | None
    min: float | None
    heals_on_restart: bool


class GpuState:
    """One GPU: current values, ramps, fault, breaker, restart bookkeeping, request counters."""

    def __init__(self, spec: GpuSpec, index: int):
        self.spec = spec
        self.index = index
        self.alias = spec.alias
        self.values: dict[str, Any] = dict(spec.values)
        self.ramps: dict[str, Ramp] = {}
        self.api_key = spec.api_key
        self.model = spec.model
        self.model_path = spec.model_path
        self.metrics = spec.metrics
        self.reported = spec.reported
        self.breaker_open = spec.breaker_open
        self.breaker_opened_at: datetime | None = spec.breaker_opened_at
        self.fault = spec.fault
        self.fault_heals = spec.fault_heals_on_restart
        self.fault_since_t = 0.0
        self.slow_s = spec.slow_s
        self.wrong_api_key = spec.wrong_api_key
        self.restart_count = 0
        self.generation = 0  # bumped by restarts and fault changes: wakes hung handlers
        self.loading_until: float | None = None  # time.monotonic() deadline of a reload
        self.process_start_us = int(time.monotonic() * 1e6)
        self.requests_served = 0
        self.inflight = 0
        self.hung_requests = 0  # completions waiting behind a wedged decode (fault decode-hang)
        self.counters = {
            "prompt_tokens_total": 0,
            "prompt_tokens_cached_total": 0,
            "prompt_seconds_total": 0.0,
            "tokens_predicted_total": 0,
            "tokens_predicted_seconds_total": 0.0,
            "n_decode_total": 0,
            "n_tokens_max": 0,
        }
        self.window_tokens = 0.0  # for the throughput gauges (reset by each scrape)
        self.window_seconds = 0.0
        self.window_prompt_tokens = 0.0
        self.window_prompt_seconds = 0.0
        # LiteLLM deployment (survives LiteLLM and llama-server restarts: it is LiteLLM's DB)
        self.model_id = spec.model_id
        self.rpm_normal = spec.litellm_rpm
        self.rpm = spec.litellm_rpm
        self.weight_normal = spec.litellm_weight
        self.weight = spec.litellm_weight
        self.group = spec.litellm_group
        self.by_weight = False  # set by the World: does this deployment's group route by weight?
        self.rpm_updates = 0
        self.cooling: tuple[float, float] | None = None  # (anchor_t, temp then) while shed
        self.suspended_temp_ramp: Ramp | None = None
        self.decode_anchor_t = 0.0  # busy slots' decoding is counted into n_decode_total up to here

    # ----------------------------------------------------------------- traffic

    def decoding_rate(self, t: float) -> float:
        """Tokens a second the busy slots generate now (0 under a fault that stops them)."""
        busy = float(self.values.get("busy_slots") or 0)
        if busy <= 0 or self.fault not in _DECODING_FAULTS:
            return 0.0
        return self.gen_tok_s(t) * min(busy, float(self.spec.parallel))

    def decoded(self, t: float) -> float:
        """n_decode_total now: the completions' tokens plus the busy slots' since the anchor."""
        return float(self.counters["n_decode_total"]) + self.decoding_rate(t) * max(t - self.decode_anchor_t, 0.0)

    def settle_decoding(self, t: float) -> None:
        """Count the busy slots' tokens up to ``t`` (before anything that changes their rate)."""
        self.counters["n_decode_total"] = int(self.decoded(t))
        self.decode_anchor_t = t

    # ----------------------------------------------------------------- values over time

    def _clamp_default(self, name: str, v: float) -> float:
        if name == "vram_used_mb":
            return min(max(v, 0.0), float(self.values["vram_total_mb"]))
        if name == "util_pct":
            return min(max(v, 0.0), 100.0)
        return max(v, 0.0)

    @property
    def shed(self) -> bool:
        """Routed less than normal. As LiteLLM's simple-shuffle router: in a group where any
        deployment has a ``weight`` only the weight counts (an rpm change moves nothing)."""
        if self.by_weight:
            return (self.weight or 0.0) < (self.weight_normal or 0.0)
        return self.rpm < self.rpm_normal

    @property
    def load_factor(self) -> float:
        """What share of its normal load the GPU gets while shed (``weight / normal`` in a
        weighted group, else ``rpm / normal``), else 1."""
        if not self.shed:
            return 1.0
        if self.by_weight:
            return max(self.weight or 0.0, 0.0) / (self.weight_normal or 1.0)
        return max(self.rpm, 0) / self.rpm_normal

    def _cooled(self, t: float) -> float:
        anchor_t, base = self.cooling  # type: ignore[misc]
        floor = self.spec.idle_temp_c
        if base <= floor:
            return base
        return max(floor, base - self.spec.cooling_c_per_min * max(t - anchor_t, 0.0) / 60.0)

    def set_rpm(self, rpm: int, t: float) -> None:
        """LiteLLM's rpm for this deployment changed at virtual time ``t``."""
        self.set_litellm("rpm", rpm, t)

    def set_litellm(self, field: str, value: float, t: float) -> None:
        """LiteLLM's ``rpm`` or ``weight`` for this deployment changed at virtual time ``t``."""
        was = self.shed
        if field == "rpm":
            self.rpm = int(value)
        else:
            self.weight = float(value)
        self.rpm_updates += 1
        if self.shed and not was:
            cur = float(self.value("temp_c", t))
            self.suspended_temp_ramp = self.ramps.pop("temp_c", None)
            self.values["temp_c"] = cur
            self.cooling = (t, cur)
        elif was and not self.shed:
            cur = self._cooled(t)
            self.values["temp_c"] = cur
            self.cooling = None
            r, self.suspended_temp_ramp = self.suspended_temp_ramp, None
            if r is not None:
                r.base, r.anchor_t = cur, t
                self.ramps["temp_c"] = r

    def value(self, name: str, t: float) -> Any:
        if name == "temp_c" and self.cooling is not None:
            return self._cooled(t)
        r = self.ramps.get(name)
        if r is None:
            return self.values.get(name)
        v = r.base + r.rate_per_min * (t - r.anchor_t) / 60.0
        if r.max is not None:
            v = min(v, r.max)
        if r.min is not None:
            v = max(v, r.min)
        return self._clamp_default(name, v)

    def materialize(self, name: str, t: float) -> None:
        if name == "temp_c" and self.cooling is not None:
            v = self._cooled(t)
            self.values[name] = v
            self.cooling = (t, v)
            return
        r = self.ramps.get(name)
        if r is not None:
            v = self.value(name, t)
            self.values[name] = v
            r.base, r.anchor_t = v, t

    def gen_tok_s(self, t: float) -> float:
        """Generation speed now: ``tok_s``, slowed in proportion while the enforced power limit
        is below the board's default (a throttled board: what Rule 4.2 restores)."""
        tok_s = float(self.value("tok_s", t) or 0.0)
        limit, default = self.values.get("power_limit_w"), self.values.get("power_default_limit_w")
        if limit is not None and default and limit < default:
            return tok_s * float(limit) / float(default)
        return tok_s

    def set_value(self, name: str, v: Any, t: float) -> None:
        self.settle_decoding(t)
        self.ramps.pop(name, None)
        self.values[name] = v
        if name == "temp_c" and self.cooling is not None:
            self.suspended_temp_ramp = None  # a set stops the ramp; cooling goes on from v
            self.cooling = (t, float(v))

    def start_ramp(
        self, name: str, rate: float, t: float, lo: float | None, hi: float | None, heals: bool
    ) -> None:
        self.materialize(name, t)
        shed_temp = name == "temp_c" and self.cooling is not None
        if rate == 0:
            self.ramps.pop(name, None)
            if shed_temp:
                self.suspended_temp_ramp = None
            return
        base = self.values.get(name)
        base = 0.0 if base is None else float(base)
        self.values[name] = base
        ramp = Ramp(rate, t, base, hi, lo, heals)
        if shed_temp:  # held until the rpm is restored; it then starts from the temp reached
            self.suspended_temp_ramp = ramp
        else:
            self.ramps[name] = ramp

    def is_loading(self, mono: float | None = None) -> bool:
        if self.fault == "loading":
            return True
        if self.loading_until is None:
            return False
        if (time.monotonic() if mono is None else mono) < self.loading_until:
            return True
        self.loading_until = None
        return False

    def accepted_key(self) -> str | None:
        return self.wrong_api_key if self.fault == "wrong-key" else self.api_key

    def endpoint_state(self) -> str:
        if self.fault == "dead":
            return "refused"
        if self.fault == "hang":
            return "hang"
        if self.is_loading():
            return "loading"
        if self.fault in ("stuck", "failing", "slow", "wrong-key", "decode-hang", "taskloop-hang", "unreachable"):
            return self.fault
        return "ok"


class World:
    """Clock + fleet state, guarded by one lock. Servers read it; control endpoints change it."""

    def __init__(self, scenario: Scenario, on_change: Callable[[], None] | None = None):
        self.scenario = scenario
        self.lock = threading.RLock()
        self.stopped = threading.Event()
        self.on_change = on_change
        self.t = 0.0
        self.start = scenario.start
        self._http_date: tuple[float, str] = (math.nan, "")  # (t, its HTTP Date): see http_date
        self.reload_s = scenario.reload_s
        self.gpus: dict[str, GpuState] = {
            g.alias: GpuState(g, i) for i, g in enumerate(scenario.gpus)
        }
        weighted = {g.litellm_group for g in scenario.gpus if g.litellm_weight}
        for g in self.gpus.values():
            g.by_weight = g.group in weighted
        self.monitor_mode = scenario.monitor
        self.monitor_heals = True
        self.monitor_generation = 0
        self.litellm_mode = scenario.litellm
        self.litellm_heals = True
        self.litellm_generation = 0
        self.api_bases: dict[str, str] = {}  # alias -> LiteLLM api_base (set by the fleet)
        # LiteLLM's config.yaml, as the real proxy reads it: once, at (re)start (use_litellm_config)
        self.litellm_config_file: str | None = None
        self.litellm_model_list: list[dict[str, Any]] | None = None
        self.service_restarts = {"monitor": 0, "litellm": 0}
        self.pending: list[Event] = list(scenario.events)
        self.applied: list[dict[str, Any]] = []
        # What the fleet was done to, in order: (t, what, target, detail) for every restart, LiteLLM
        # deployment update, power-limit change and process kill (issue 29: the chaos benchmark's
        # ground truth of the actions taken, whoever took them)
        self.effects: list[tuple[float, str, str, Any]] = []
        with self.lock:
            self._apply_due(0.0)

    # ----------------------------------------------------------------- clock

    def now(self) -> datetime:
        with self.lock:
            return self.start + timedelta(seconds=self.t)

    def http_date(self) -> str:
        """Now as an HTTP ``Date`` header (every answer of the sim carries one), remembered for the
        instant: a poll asks it of every server at one virtual second (issue 29: a 100-GPU week
        answers ~3 million requests at ~10,000 instants)."""
        with self.lock:
            t = self.t
        at, text = self._http_date
        if at != t:
            text = email.utils.formatdate((self.start + timedelta(seconds=t)).timestamp(), usegmt=True)
            self._http_date = (t, text)
        return text

    def at(self, t: float) -> datetime:
        return self.start + timedelta(seconds=t)

    def advance(self, seconds: float) -> datetime:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ValueError("seconds must be a number")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError("seconds must be a finite number >= 0")
        with self.lock:
            self._apply_due(self.t + seconds)
            now = self.now()
        self._changed()
        return now

    def _apply_due(self, target: float) -> None:
        while self.pending and self.pending[0].at <= target:
            ev = self.pending.pop(0)
            self.t = max(self.t, ev.at)
            self._apply(ev, self.t)
        self.t = max(self.t, target)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # ----------------------------------------------------------------- events

    def _apply(self, ev: Event, t: float) -> None:
        if ev.gpu == "fleet":
            heals = True if ev.heals_on_restart is None else ev.heals_on_restart
            if ev.monitor is not None:
                self.monitor_mode = ev.monitor
                self.monitor_heals = heals
                self.monitor_generation += 1
            if ev.litellm is not None:
                self.litellm_mode = ev.litellm
                self.litellm_heals = heals
                self.litellm_generation += 1
        else:
            g = self.gpus[ev.gpu]
            heals = True if ev.heals_on_restart is None else ev.heals_on_restart
            for k, v in ev.set.items():
                if k == "breaker_open":
                    if v and not g.breaker_open:
                        g.breaker_opened_at = self.at(t)
                    if not v:
                        g.breaker_opened_at = None
                    g.breaker_open = v
                elif k in ("reported", "metrics", "api_key", "model"):
                    setattr(g, k, v)
                    if k == "model":
                        g.model_path = v if "/" in v else f"models/{v}"
                else:
                    g.set_value(k, v, t)
            for k, rate in ev.ramp.items():
                g.start_ramp(k, rate, t, ev.min.get(k), ev.max.get(k), heals)
            if ev.fault is not None:
                if ev.fault != g.fault:
                    g.settle_decoding(t)
                    g.fault_since_t = t
                    g.generation += 1
                g.fault = ev.fault
                g.fault_heals = heals
                if ev.slow_s is not None:
                    g.slow_s = ev.slow_s
                if ev.api_key is not None:
                    g.wrong_api_key = ev.api_key
        self.applied.append({"at": round(t, 3), "event": ev.index, "gpu": ev.gpu, "note": ev.note})

    def apply_now(self, data: dict[str, Any]) -> Event:
        """Apply an ad-hoc event (the body of ``POST /_sim/set``) at the current virtual time."""
        ev = parse_event(data, "body", set(self.gpus), require_at=False)
        if "at" in data:
            raise ScenarioError("ad-hoc events apply now; leave 'at' out", "body.at")
        with self.lock:
            self._apply(ev, self.t)
        self._changed()
        return ev

    # ----------------------------------------------------------------- restarts

    def read_litellm_config(self) -> None:
        """The model list of LiteLLM's config file, read as the real proxy reads it at start: a file that
        is not one leaves the proxy without models (the real one would not start; its routing is empty)."""
        import yaml

        if self.litellm_config_file is None:
            return
        try:
            with open(self.litellm_config_file, encoding="utf-8") as fh:
                doc = yaml.safe_load(fh)
        except (OSError, yaml.YAMLError):
            doc = None
        listed = doc.get("model_list") if isinstance(doc, dict) else None
        self.litellm_model_list = [e for e in listed if isinstance(e, dict)] if isinstance(listed, list) else []

    def restart(self, target: str) -> int:
        """Restart a GPU's llama-server (or 'monitor' / 'litellm'); return its restart count.

        A GPU restart: loading for ``reload_s`` real seconds, VRAM back to the scenario's
        initial value (a VRAM ramp stops unless it was marked ``heals_on_restart: false``),
        a fault marked ``heals_on_restart: true`` (the default) is cleared, hung requests are
        dropped. A ``dead`` fault that does not heal keeps the port closed.
        """
        with self.lock:
            g = self.gpus.get(target)
            if g is None:
                if target in ("monitor", "litellm"):
                    self.effects.append((self.t, "restart", target, None))
                if target == "monitor":
                    self.service_restarts["monitor"] += 1
                    if self.monitor_heals:
                        self.monitor_mode = "ok"
                    self.monitor_generation += 1
                    count = self.service_restarts["monitor"]
                elif target == "litellm":
                    self.service_restarts["litellm"] += 1
                    if self.litellm_heals:
                        self.litellm_mode = "ok"
                    # Rule 5: a LiteLLM restart clears its (stuck) circuit breakers
                    for gg in self.gpus.values():
                        gg.breaker_open = False
                        gg.breaker_opened_at = None
                    self.litellm_generation += 1
                    count = self.service_restarts["litellm"]
                    self.read_litellm_config()
                else:
                    raise KeyError(target)
            else:
                t = self.t
                self.effects.append((t, "restart", target, g.fault))
                g.restart_count += 1
                g.generation += 1
                for name in list(g.ramps):
                    g.materialize(name, t)
                # a competing process keeps what it holds: only the server's own memory is given back
                held = float(g.value("competing_vram_mb", t) or 0) if g.values.get("competing_pid") else 0.0
                g.values["vram_used_mb"] = g.spec.values["vram_used_mb"] + held
                vr = g.ramps.get("vram_used_mb")
                if vr is not None:
                    if vr.heals_on_restart:
                        del g.ramps["vram_used_mb"]
                    else:
                        vr.base, vr.anchor_t = g.values["vram_used_mb"], t
                if g.fault != "none" and g.fault_heals:
                    g.fault = "none"
                    g.fault_since_t = t
                if g.fault != "dead":
                    g.loading_until = time.monotonic() + self.reload_s if self.reload_s else None
                g.process_start_us = int(time.monotonic() * 1e6)
                g.inflight = 0
                for k in g.counters:
                    g.counters[k] = 0
                g.decode_anchor_t = t
                count = g.restart_count
        self._changed()
        return count

    # ----------------------------------------------------------------- per-process VRAM

    def smi_processes(self, alias: str) -> str:
        """What the GPU's per-process query prints, as the real tools do (Rule 2's attribution):
        NVIDIA ``nvidia-smi --query-compute-apps=pid,process_name,used_memory
        --format=csv,noheader,nounits`` lines, AMD ``rocm-smi --showpids --json``'s ``system``
        object (VRAM in bytes). Who runs on the GPU: :mod:`gpuheal.sim.processes` (a leak grows its
        llama-server; a restart gives it a new pid; a dead server lists none)."""
        with self.lock:
            g = self.gpus[alias]
            values = self._reported_values(g, self.t)
            procs = gpu_processes(values, list(self.gpus).index(alias), g.restart_count, g.fault != "dead")
            vendor = g.spec.vendor
        if vendor == "amd":
            entries = {f"PID{p.pid}": f"{p.name.rsplit('/', 1)[-1]}, 1, {p.used_mb * 1048576}, 0, 0" for p in procs}
            return json.dumps({"system": entries}, indent=4) + "\n"
        return "".join(f"{p.pid}, {p.name}, {p.used_mb}\n" for p in procs)

    # ----------------------------------------------------------------- what is listening

    def listening(self) -> dict[str, bool]:
        with self.lock:
            return {key: self.is_listening(key) for key in ("monitor", "litellm", *(f"gpu:{a}" for a in self.gpus))}

    def is_listening(self, key: str) -> bool:
        """Is the port of ``monitor``, ``litellm`` or ``gpu:ALIAS`` open now (else: refused)?"""
        if key == "monitor":
            return self.monitor_mode != "down"
        if key == "litellm":
            return self.litellm_mode != "down"
        return self.gpus[key[4:]].fault != "dead"

    # ----------------------------------------------------------------- documents

    def _reported_values(self, g: GpuState, t: float) -> dict[str, Any]:
        # with no ramp and no cooling every value is as set (GpuState.value): a copy says the same
        v = dict(g.values) if not g.ramps and g.cooling is None else {k: g.value(k, t) for k in g.values}
        for k in RAMPABLE:
            if v.get(k) is None and k in g.ramps:
                v[k] = 0.0
        if g.shed:  # load-side cooling: fewer requests routed here, less work done
            f = g.load_factor
            if v.get("util_pct") is not None:
                v["util_pct"] = float(v["util_pct"]) * f
            if v.get("requests_60s") is not None:
                v["requests_60s"] = int(round(float(v["requests_60s"]) * f))
        return v

    # ----------------------------------------------------------------- LiteLLM deployments

    def gpu_by_model_id(self, model_id: str) -> GpuState | None:
        with self.lock:
            for g in self.gpus.values():
                if g.model_id == model_id:
                    return g
            return None

    def update_rpm(self, model_id: str, rpm: int) -> bool:
        """LiteLLM ``/model/update`` of a deployment's rpm, now; False for an unknown id."""
        if isinstance(rpm, bool) or not isinstance(rpm, int) or rpm < 0:
            raise ValueError("rpm must be a whole number >= 0")
        return self.update_deployment(model_id, {"rpm": rpm})

    def update_deployment(self, model_id: str, params: dict[str, float]) -> bool:
        """LiteLLM ``/model/update`` of a deployment's ``rpm`` / ``weight``, now; False for an
        unknown id."""
        with self.lock:
            g = self.gpu_by_model_id(model_id)
            if g is None:
                return False
            for field in ("rpm", "weight"):
                if field in params:
                    g.set_litellm(field, params[field], self.t)
                    self.effects.append((self.t, f"litellm-{field}", g.alias, params[field]))
        self._changed()
        return True

    def gpu_values(self, alias: str) -> dict[str, Any]:
        with self.lock:
            return self._reported_values(self.gpus[alias], self.t)

    def gpu_data(self) -> dict[str, Any]:
        """The gpu-monitor v2.1 ``/gpu-data`` document at the current virtual time."""
        with self.lock:
            t = self.t
            gpus: list[dict[str, Any]] = []
            benchmarks: dict[str, Any] = {}
            models: list[dict[str, Any]] = []
            breakers: list[dict[str, Any]] = []
            strix: dict[str, Any] | None = None
            for g in self.gpus.values():
                v = self._reported_values(g, t)
                if g.reported and g.fault != "unreachable":  # gpu-monitor cannot reach the host's agent
                    entry = {
                        "hostname": g.spec.host,
                        "name": g.spec.name,
                        "vendor": g.spec.vendor,
                        "temp_c": _rnd(v["temp_c"], 0),
                        "vram_used_mb": _rnd(v["vram_used_mb"], 0),
                        "vram_total_mb": _rnd(v["vram_total_mb"], 0),
                        "util_pct": _rnd(v["util_pct"], 0),
                        "power_w": _rnd(v.get("power_w"), 1),
                        "power_limit_w": _rnd(v.get("power_limit_w"), 1),
                    }
                    entry = {k: x for k, x in entry.items() if x is not None}
                    if g.spec.gpu_index is not None:  # several GPUs on one host (issue 12)
                        entry["index"] = g.spec.gpu_index
                    if g.spec.legacy_strix:
                        strix = {
                            "running": g.fault != "dead",
                            "hostname": g.spec.host,
                            "temp_c": entry.get("temp_c"),
                            "vram_used_mb": entry.get("vram_used_mb"),
                            "vram_total_mb": entry.get("vram_total_mb"),
                        }
                    else:
                        gpus.append(entry)
                    benchmarks[g.spec.host] = {
                        "current_tok_s": _rnd(g.gen_tok_s(t), 1),
                        "baseline_tok_s": _rnd(v["baseline_tok_s"], 1),
                    }
                requests = int(round(v["requests_60s"]))
                failures = int(round(v["failures_60s"]))
                timeouts = int(round(v["consecutive_timeouts"]))
                if g.fault in _FAILING_FAULTS:
                    failures = max(failures, requests)
                if g.fault in _TIMEOUT_FAULTS:
                    minutes = max(t - g.fault_since_t, 0.0) / 60.0
                    timeouts = max(timeouts, min(1000, 1 + int(minutes * max(requests, 1))))
                models.append(
                    {
                        "name": g.alias,
                        "hostname": g.spec.host,
                        "requests_60s": requests,
                        "failures_60s": failures,
                        "consecutive_timeouts": timeouts,
                    }
                )
                if g.breaker_open:
                    breakers.append(
                        {
                            "model": g.alias,
                            "hostname": g.spec.host,
                            "open": True,
                            "opened_at": iso(g.breaker_opened_at or self.start),
                        }
                    )
            doc: dict[str, Any] = {
                "generated_at": iso(self.at(t)),
                "gpus": gpus,
                "benchmarks": benchmarks,
                "summary": {
                    "available_models": models,
                    "circuit_breakers_open": len(breakers),
                    "circuit_breakers": breakers,
                },
            }
            if strix is not None:
                doc["strix"] = strix
            return doc

    def state(self) -> dict[str, Any]:
        """What ``GET /_sim/state`` returns: the clock, modes and every GPU's live values."""
        with self.lock:
            t = self.t
            gpus = {a: self.gpu_entry(a) for a in self.gpus}
            return {
                "scenario": self.scenario.name,
                "now": iso(self.at(t)),
                "t": round(t, 3),
                "monitor": self.monitor_mode,
                "litellm": self.litellm_mode,
                "restarts": {
                    **{a: g.restart_count for a, g in self.gpus.items()},
                    **self.service_restarts,
                },
                "events_applied": len(self.applied),
                "next_event_at": self.pending[0].at if self.pending else None,
                "gpus": gpus,
            }

    def gpu_entry(self, alias: str) -> dict[str, Any]:
        """One GPU's entry of :meth:`state` (``state()["gpus"][alias]``)."""
        with self.lock:
            g = self.gpus[alias]
            v = self._reported_values(g, self.t)
            return {
                "host": g.spec.host,
                "endpoint": g.endpoint_state(),
                "fault": g.fault,
                "fault_heals_on_restart": g.fault_heals,
                "loading": g.is_loading(),
                "restart_count": g.restart_count,
                "breaker_open": g.breaker_open,
                "breaker_opened_at": iso(g.breaker_opened_at) if g.breaker_opened_at else None,
                "reported": g.reported,
                "metrics": g.metrics,
                "api_key": g.accepted_key(),
                "model": g.model,
                "requests_served": g.requests_served,
                "ramps": {k: r.rate_per_min for k, r in g.ramps.items()},
                "suspended_ramps": (
                    {"temp_c": g.suspended_temp_ramp.rate_per_min}
                    if g.suspended_temp_ramp is not None
                    else {}
                ),
                "litellm_model_id": g.model_id,
                "litellm_rpm": g.rpm,
                "litellm_rpm_normal": g.rpm_normal,
                "litellm_weight": g.weight,
                "litellm_weight_normal": g.weight_normal,
                "litellm_updates": g.rpm_updates,
                "shed": g.shed,
                "cooling_c_per_min": g.spec.cooling_c_per_min,
                "idle_temp_c": g.spec.idle_temp_c,
                **{
                    k: (_rnd(x, 3) if k not in INTEGER_FIELDS else _rnd(x, 0))
                    for k, x in v.items()
                },
            }

    # ----------------------------------------------------------------- what a host's tools change

    def set_power_limit(self, alias: str, watts: float) -> None:
        """``nvidia-smi -pl`` on the GPU's host (the limit is already checked against the board's)."""
        with self.lock:
            self.gpus[alias].set_value("power_limit_w", float(watts), self.t)
            self.effects.append((self.t, "power-limit", alias, float(watts)))
        self._changed()

    def kill_process(self, alias: str, pid: int) -> bool:
        """A signal to ``pid`` on the GPU's host: True if it was the GPU's competing process (it goes,
        with its VRAM); False for any other pid (the llama-server is only ever restarted)."""
        with self.lock:
            g = self.gpus[alias]
            if not pid or int(g.values.get("competing_pid") or 0) != pid:
                return False
            t = self.t
            g.materialize("vram_used_mb", t)
            freed = float(g.value("competing_vram_mb", t) or 0)
            g.set_value("competing_vram_mb", 0, t)
            g.set_value("competing_pid", 0, t)
            g.set_value("vram_used_mb", max(float(g.value("vram_used_mb", t) or 0) - freed, 0.0), t)
            self.effects.append((t, "kill", alias, pid))
        self._changed()
        return True


def _rnd(x: Any, nd: int) -> Any:
    if x is None:
        return None
    r = round(float(x), nd)
    if nd == 0 or r == int(r):
        return int(r)
    return r
