"""Scenario files for the simulated fleet: load, validate, and describe one timeline.

A scenario is plain data (YAML or a dict). Every validation error names the key path of the
offending value (``events[2].at: must be >= 0``) so a typo in a demo file is fixed in one look.
Stdlib + PyYAML only: the sim is standalone and imports nothing else from gpuheal.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_START = "2026-07-18T08:00:00Z"
DEFAULT_PORTS = {"monitor": 19100, "litellm": 19400, "control": 19099, "gpus_from": 19081}
DEFAULT_WRONG_KEY = "sk-local-wrong-5678"
DEFAULT_LITELLM_ADMIN_KEY = "sk-sim-admin-0000"
DEFAULT_LITELLM_GROUP = "gpu-fleet"
# How the simulated LiteLLM keeps its deployments, as the real proxy 1.108.7 answers each setup:
#   db             database + STORE_MODEL_IN_DB=True, models added via /model/new: updates work
#   config-no-db   models in config.yaml, no database (the common setup): 500 No DB Connected
#   config-with-db models in config.yaml, a database: 400 Can't edit model. Model in config
#   db-store-off   models in the database, STORE_MODEL_IN_DB off: 200 null, nothing changes
LITELLM_STORES = ("db", "config-no-db", "config-with-db", "db-store-off")
DEFAULT_LITELLM_RPM = 60
DEFAULT_COOLING_C_PER_MIN = 2.0
DEFAULT_IDLE_TEMP_C = 45.0
RESERVED_ALIASES = {"fleet", "monitor", "litellm", "control"}

# decode-hang: /health ok, the decode loop wedged with a request in its slot; gpu-monitor sees no
# failure yet (its clients are still waiting), only llama-server's own /metrics shows it (issue 12)
# taskloop-hang: the task loop (main thread) stopped, HTTP threads running: /health and /props answer,
# /metrics, /slots and completions do not — as a real b11312 server with its main thread ptrace-stopped
# (issue 20; tests/realserver/test_hung_task_loop_real.py compares the two)
# unreachable: the GPU's host is off the network (issue 29): its llama-server never answers (as a dropped
# SYN: a timeout), gpu-monitor no longer lists the host's GPUs, and a command for the host does not run
# (gpuheal.sim.hosts answers as SSH to a host that does not answer).
GPU_FAULTS = ("none", "dead", "hang", "loading", "failing", "slow", "stuck", "wrong-key", "decode-hang",
              "taskloop-hang", "unreachable")
# empty: gpu-monitor answers a valid document that lists no GPU (the spec's "returns no GPUs", issue 29)
MONITOR_MODES = ("ok", "down", "hang", "oversized", "garbage", "invalid", "dribble", "http-500", "empty")
LITELLM_MODES = ("ok", "down", "hang", "http-503")

# Numeric per-GPU values. Ramps apply to these (units per virtual minute).
RAMPABLE = (
    "temp_c",
    "vram_used_mb",
    "util_pct",
    "power_w",
    "tok_s",
    "prompt_tok_s",
    "requests_60s",
    "failures_60s",
    "consecutive_timeouts",
)
# Numeric values an event may `set` (ramped ones plus slow-changing configuration).
# The board's power limits (``power_limit_w`` is the one enforced; below the default the GPU
# generates proportionally slower, see GpuState.gen_tok_s) and another compute process on the GPU
# (``competing_pid`` 0 = none), as nvidia-smi reports them (gpuheal.sim.smi).
POWER_LIMITS = ("power_limit_w", "power_default_limit_w", "power_max_limit_w")
NULLABLE = ("power_w", *POWER_LIMITS)
# Traffic the server is working on (issue 29): ``busy_slots`` slots generating (at ``tok_s`` each, so
# /metrics' n_decode_total advances with the virtual clock) and ``queued`` requests waiting for a slot.
TRAFFIC = ("busy_slots", "queued")
SETTABLE_NUMBERS = RAMPABLE + (*POWER_LIMITS, "baseline_tok_s", "vram_total_mb", "n_ctx",
                               "competing_pid", "competing_vram_mb", *TRAFFIC)  # fmt: skip
SETTABLE_BOOLS = ("breaker_open", "reported", "metrics")
SETTABLE_STRINGS = ("api_key", "model")
INTEGER_FIELDS = (
    "vram_total_mb",
    "requests_60s",
    "failures_60s",
    "consecutive_timeouts",
    "n_ctx",
    "parallel",
    "competing_pid",
    *TRAFFIC,
)

_ALIAS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


class ScenarioError(ValueError):
    """A scenario that cannot be used. ``str(err)`` is one line: ``key.path: problem``."""

    def __init__(self, message: str, key_path: str | None = None):
        self.key_path = key_path
        self.problem = message
        super().__init__(f"{key_path}: {message}" if key_path else message)


# --------------------------------------------------------------------------- small validators


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _number(v: Any, path: str, *, minimum: float | None = None, integer: bool = False) -> float:
    if not _is_number(v):
        raise ScenarioError("must be a number", path)
    if integer and float(v) != int(v):
        raise ScenarioError("must be a whole number", path)
    if minimum is not None and v < minimum:
        raise ScenarioError(f"must be >= {minimum:g}", path)
    return int(v) if integer else float(v)


def _bool(v: Any, path: str) -> bool:
    if not isinstance(v, bool):
        raise ScenarioError("must be true or false", path)
    return v


def _string(v: Any, path: str, *, allow_empty: bool = False) -> str:
    if not isinstance(v, str) or (not allow_empty and not v.strip()):
        raise ScenarioError("must be a non-empty string", path)
    return v


def _choice(v: Any, path: str, choices: tuple[str, ...]) -> str:
    if v not in choices:
        raise ScenarioError(f"must be one of {', '.join(choices)} (got {v!r})", path)
    return v


def _mapping(v: Any, path: str) -> dict:
    if not isinstance(v, dict):
        raise ScenarioError("must be a mapping", path)
    for k in v:
        if not isinstance(k, str):
            raise ScenarioError(f"keys must be strings (got {k!r})", path)
    return v


def _no_unknown(d: dict, allowed: set[str] | tuple[str, ...], path: str) -> None:
    for k in d:
        if k not in allowed:
            raise ScenarioError("unknown key", f"{path}.{k}" if path else k)


def parse_time(v: Any, path: str) -> datetime:
    """ISO 8601 with a zone (string, or a datetime YAML already parsed) -> aware UTC datetime."""
    if isinstance(v, datetime):
        dt = v
    elif isinstance(v, str):
        try:
            dt = datetime.fromisoformat(v.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ScenarioError(f"not an ISO 8601 time: {v!r}", path) from None
    else:
        raise ScenarioError("must be an ISO 8601 time with a zone, e.g. 2026-07-18T08:00:00Z", path)
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ScenarioError("must include a zone (e.g. Z or +02:00)", path)
    return dt.astimezone(UTC)


def parse_duration(v: Any, path: str) -> float:
    """Seconds: a number, or a string like ``90s``, ``10m``, ``1h30m``."""
    if _is_number(v):
        secs = float(v)
    elif isinstance(v, str) and v.strip():
        s = v.strip()
        try:
            secs = float(s)
        except ValueError:
            m = _DURATION_RE.match(s)
            if not m or not any(m.groups()):
                raise ScenarioError(
                    f"not a duration: {v!r} (use seconds, or e.g. 90s, 10m, 1h30m)", path
                ) from None
            h, mi, se = (float(g) if g else 0.0 for g in m.groups())
            secs = h * 3600 + mi * 60 + se
    else:
        raise ScenarioError("must be seconds or a duration like 10m", path)
    if not math.isfinite(secs):
        raise ScenarioError("must be finite", path)
    if secs < 0:
        raise ScenarioError("must be >= 0", path)
    return secs


def iso(dt: datetime) -> str:
    """``2026-07-18T08:00:00Z`` (UTC, whole seconds): the shape every sim document uses."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class GpuSpec:
    """One GPU and its llama-server, as the scenario starts it."""

    alias: str
    host: str
    name: str
    vendor: str
    legacy_strix: bool
    port: int | None
    values: dict[str, float]  # numeric initial values (RAMPABLE + power_limit_w, baseline...)
    api_key: str | None
    model: str
    model_path: str
    parallel: int
    metrics: bool
    reported: bool
    breaker_open: bool
    breaker_opened_at: datetime | None
    fault: str
    fault_heals_on_restart: bool
    slow_s: float
    wrong_api_key: str
    # LiteLLM deployment of this GPU (load shedding through POST /model/update)
    litellm_model_id: str = ""  # "" = the alias
    litellm_rpm: int = DEFAULT_LITELLM_RPM  # the normal rpm
    litellm_weight: float | None = None  # the normal weight (None: the group routes by rpm)
    litellm_group: str = DEFAULT_LITELLM_GROUP  # the deployment's model_name (model group)
    cooling_c_per_min: float = DEFAULT_COOLING_C_PER_MIN  # fall of temp_c while shed
    idle_temp_c: float = DEFAULT_IDLE_TEMP_C  # the floor of that fall
    gpu_index: int | None = None  # its index on a host of several GPUs (gpu-monitor's "index")

    @property
    def model_id(self) -> str:
        return self.litellm_model_id or self.alias


@dataclass(frozen=True)
class Event:
    """One timeline entry, applied when the virtual clock reaches ``at`` (seconds since start)."""

    at: float
    gpu: str  # an alias, or "fleet"
    set: dict[str, Any] = field(default_factory=dict)
    ramp: dict[str, float] = field(default_factory=dict)
    max: dict[str, float] = field(default_factory=dict)
    min: dict[str, float] = field(default_factory=dict)
    fault: str | None = None
    heals_on_restart: bool | None = None
    slow_s: float | None = None
    api_key: str | None = None  # the key the server switches to under fault: wrong-key
    monitor: str | None = None
    litellm: str | None = None
    note: str | None = None
    index: int = -1


GPU_KEYS = {
    "alias",
    "host",
    "gpu_index",
    "name",
    "vendor",
    "legacy_strix",
    "port",
    "api_key",
    "model",
    "model_path",
    "parallel",
    "metrics",
    "reported",
    "breaker_open",
    "breaker_opened_at",
    "fault",
    "heals_on_restart",
    "slow_s",
    "wrong_api_key",
    "litellm_model_id",
    "litellm_rpm",
    "litellm_weight",
    "litellm_group",
    "cooling_c_per_min",
    "idle_temp_c",
    *SETTABLE_NUMBERS,
}
EVENT_KEYS = {
    "at",
    "gpu",
    "set",
    "ramp",
    "max",
    "min",
    "fault",
    "heals_on_restart",
    "slow_s",
    "api_key",
    "monitor",
    "litellm",
    "note",
}
TOP_KEYS = {
    "name",
    "description",
    "start",
    "ports",
    "reload_s",
    "monitor",
    "litellm",
    "litellm_admin_key",
    "litellm_store",
    "gpus",
    "events",
}


def _gpu_defaults(vram_total: float, baseline: float) -> dict[str, float]:
    return {
        "temp_c": 45.0,
        "vram_used_mb": 0.0,
        "util_pct": 0.0,
        "power_w": None,
        "power_limit_w": None,
        "power_default_limit_w": None,
        "power_max_limit_w": None,
        "competing_pid": 0,
        "competing_vram_mb": 0,
        "tok_s": baseline,
        "prompt_tok_s": 900.0,
        "baseline_tok_s": baseline,
        "vram_total_mb": vram_total,
        "requests_60s": 10,
        "failures_60s": 0,
        "consecutive_timeouts": 0,
        "n_ctx": 131072,
        "busy_slots": 0,
        "queued": 0,
    }


def _parse_gpu(d: Any, path: str) -> GpuSpec:
    d = _mapping(d, path)
    _no_unknown(d, GPU_KEYS, path)
    for req in ("alias", "host", "vram_total_mb", "baseline_tok_s"):
        if req not in d:
            raise ScenarioError("is required", f"{path}.{req}")
    alias = _string(d["alias"], f"{path}.alias")
    if not _ALIAS_RE.match(alias):
        raise ScenarioError(
            "must be letters, digits, '.', '_' or '-' (at most 64 characters)", f"{path}.alias"
        )
    if alias in RESERVED_ALIASES:
        raise ScenarioError(f"{alias!r} is reserved", f"{path}.alias")
    host = _string(d["host"], f"{path}.host")
    vram_total = _number(d["vram_total_mb"], f"{path}.vram_total_mb", minimum=1, integer=True)
    baseline = _number(d["baseline_tok_s"], f"{path}.baseline_tok_s", minimum=0)
    values = _gpu_defaults(vram_total, baseline)
    for k in SETTABLE_NUMBERS:
        if k in d and k not in ("vram_total_mb", "baseline_tok_s"):
            if d[k] is None and k in NULLABLE:
                values[k] = None
                continue
            values[k] = _number(
                d[k], f"{path}.{k}", minimum=1 if k == "n_ctx" else 0, integer=k in INTEGER_FIELDS
            )
    if "tok_s" not in d:
        values["tok_s"] = baseline
    if values["vram_used_mb"] > vram_total:
        raise ScenarioError(f"must be <= vram_total_mb ({vram_total})", f"{path}.vram_used_mb")
    if values["util_pct"] > 100:
        raise ScenarioError("must be <= 100", f"{path}.util_pct")
    vendor = _choice(d.get("vendor", "nvidia"), f"{path}.vendor", ("nvidia", "amd"))
    default_name = "NVIDIA GPU" if vendor == "nvidia" else "AMD GPU"
    name = _string(d.get("name", default_name), f"{path}.name")
    port = d.get("port")
    if port is not None:
        port = _number(port, f"{path}.port", minimum=0, integer=True)
        if port > 65535:
            raise ScenarioError("must be <= 65535", f"{path}.port")
    api_key = d.get("api_key", "not-needed")
    if api_key is not None:
        api_key = _string(api_key, f"{path}.api_key")
    model = _string(d.get("model", f"{alias}.gguf"), f"{path}.model")
    model_path = _string(d.get("model_path", f"models/{model}"), f"{path}.model_path")
    parallel = _number(d.get("parallel", 1), f"{path}.parallel", minimum=1, integer=True)
    opened_at = None
    if d.get("breaker_opened_at") is not None:
        opened_at = parse_time(d["breaker_opened_at"], f"{path}.breaker_opened_at")
    fault = _choice(d.get("fault", "none"), f"{path}.fault", GPU_FAULTS)
    slow_s = _number(d.get("slow_s", 5.0), f"{path}.slow_s", minimum=0)
    gpu_index = d.get("gpu_index")
    if gpu_index is not None:
        gpu_index = _number(gpu_index, f"{path}.gpu_index", minimum=0, integer=True)
    return GpuSpec(
        gpu_index=gpu_index,
        alias=alias,
        host=host,
        name=name,
        vendor=vendor,
        legacy_strix=_bool(d.get("legacy_strix", False), f"{path}.legacy_strix"),
        port=port,
        values=values,
        api_key=api_key,
        model=model,
        model_path=model_path,
        parallel=parallel,
        metrics=_bool(d.get("metrics", True), f"{path}.metrics"),
        reported=_bool(d.get("reported", True), f"{path}.reported"),
        breaker_open=_bool(d.get("breaker_open", False), f"{path}.breaker_open"),
        breaker_opened_at=opened_at,
        fault=fault,
        fault_heals_on_restart=_bool(d.get("heals_on_restart", True), f"{path}.heals_on_restart"),
        slow_s=slow_s,
        wrong_api_key=_string(d.get("wrong_api_key", DEFAULT_WRONG_KEY), f"{path}.wrong_api_key"),
        litellm_model_id=_string(d.get("litellm_model_id", alias), f"{path}.litellm_model_id"),
        litellm_rpm=_number(
            d.get("litellm_rpm", DEFAULT_LITELLM_RPM),
            f"{path}.litellm_rpm",
            minimum=1,
            integer=True,
        ),
        litellm_weight=(
            None if d.get("litellm_weight") is None
            else _number(d["litellm_weight"], f"{path}.litellm_weight", minimum=0)
        ),
        litellm_group=_string(d.get("litellm_group", DEFAULT_LITELLM_GROUP), f"{path}.litellm_group"),
        cooling_c_per_min=_number(
            d.get("cooling_c_per_min", DEFAULT_COOLING_C_PER_MIN),
            f"{path}.cooling_c_per_min",
            minimum=0,
        ),
        idle_temp_c=_number(
            d.get("idle_temp_c", DEFAULT_IDLE_TEMP_C), f"{path}.idle_temp_c", minimum=0
        ),
    )


def parse_event(
    d: Any, path: str, aliases: set[str], *, index: int = -1, require_at: bool = True
) -> Event:
    """Validate one event mapping. Also used by the control endpoint's ``/_sim/set``."""
    d = _mapping(d, path)
    _no_unknown(d, EVENT_KEYS, path)
    if "at" in d:
        at = parse_duration(d["at"], f"{path}.at")
    elif require_at:
        raise ScenarioError("is required", f"{path}.at")
    else:
        at = 0.0
    if "gpu" not in d:
        raise ScenarioError("is required (a GPU alias, or 'fleet')", f"{path}.gpu")
    gpu = d["gpu"]
    if gpu != "fleet" and gpu not in aliases:
        known = ", ".join(sorted(aliases) + ["fleet"])
        raise ScenarioError(f"unknown GPU {gpu!r} (known: {known})", f"{path}.gpu")
    note = d.get("note")
    if note is not None:
        note = _string(note, f"{path}.note", allow_empty=True)
    heals = d.get("heals_on_restart")
    if heals is not None:
        heals = _bool(heals, f"{path}.heals_on_restart")

    if gpu == "fleet":
        for k in ("set", "ramp", "max", "min", "fault", "slow_s", "api_key"):
            if k in d:
                raise ScenarioError("only GPU events take this key (gpu: fleet)", f"{path}.{k}")
        if "monitor" not in d and "litellm" not in d:
            raise ScenarioError("a fleet event needs 'monitor' or 'litellm'", path)
        monitor = d.get("monitor")
        if monitor is not None:
            monitor = _choice(monitor, f"{path}.monitor", MONITOR_MODES)
        litellm = d.get("litellm")
        if litellm is not None:
            litellm = _choice(litellm, f"{path}.litellm", LITELLM_MODES)
        return Event(
            at=at,
            gpu=gpu,
            monitor=monitor,
            litellm=litellm,
            heals_on_restart=heals,
            note=note,
            index=index,
        )

    for k in ("monitor", "litellm"):
        if k in d:
            raise ScenarioError(f"'{k}' modes go on a fleet event (gpu: fleet)", f"{path}.{k}")
    if not any(k in d for k in ("set", "ramp", "fault")):
        raise ScenarioError("a GPU event needs 'set', 'ramp' or 'fault'", path)

    sets: dict[str, Any] = {}
    if "set" in d:
        raw = _mapping(d["set"], f"{path}.set")
        if not raw:
            raise ScenarioError("must not be empty", f"{path}.set")
        for k, v in raw.items():
            kp = f"{path}.set.{k}"
            if k in SETTABLE_NUMBERS:
                if v is None and k in NULLABLE:
                    sets[k] = None
                else:
                    sets[k] = _number(
                        v,
                        kp,
                        minimum=1 if k in ("n_ctx", "vram_total_mb") else 0,
                        integer=k in INTEGER_FIELDS,
                    )
            elif k in SETTABLE_BOOLS:
                sets[k] = _bool(v, kp)
            elif k == "api_key":
                sets[k] = None if v is None else _string(v, kp)
            elif k in SETTABLE_STRINGS:
                sets[k] = _string(v, kp)
            else:
                allowed = ", ".join(SETTABLE_NUMBERS + SETTABLE_BOOLS + SETTABLE_STRINGS)
                raise ScenarioError(f"cannot be set (settable: {allowed})", kp)
        if "util_pct" in sets and sets["util_pct"] > 100:
            raise ScenarioError("must be <= 100", f"{path}.set.util_pct")

    ramps: dict[str, float] = {}
    if "ramp" in d:
        raw = _mapping(d["ramp"], f"{path}.ramp")
        if not raw:
            raise ScenarioError("must not be empty", f"{path}.ramp")
        for k, v in raw.items():
            kp = f"{path}.ramp.{k}"
            if k not in RAMPABLE:
                raise ScenarioError(f"cannot ramp (rampable: {', '.join(RAMPABLE)})", kp)
            if k in sets:
                # set + ramp in one event is fine: the ramp starts from the set value
                pass
            ramps[k] = _number(v, kp)
    bounds: dict[str, dict[str, float]] = {}
    for bound in ("max", "min"):
        bounds[bound] = {}
        if bound in d:
            raw = _mapping(d[bound], f"{path}.{bound}")
            for k, v in raw.items():
                kp = f"{path}.{bound}.{k}"
                if k not in ramps:
                    raise ScenarioError(f"'{bound}' applies only to a field this event ramps", kp)
                bounds[bound][k] = _number(v, kp)
    for k in bounds["max"]:
        if k in bounds["min"] and bounds["min"][k] > bounds["max"][k]:
            raise ScenarioError("min must be <= max", f"{path}.min.{k}")

    fault = d.get("fault")
    if fault is not None:
        fault = _choice(fault, f"{path}.fault", GPU_FAULTS)
    slow_s = d.get("slow_s")
    if slow_s is not None:
        if fault != "slow":
            raise ScenarioError("goes with fault: slow", f"{path}.slow_s")
        slow_s = _number(slow_s, f"{path}.slow_s", minimum=0)
    api_key = d.get("api_key")
    if api_key is not None:
        if fault != "wrong-key":
            raise ScenarioError(
                "goes with fault: wrong-key (to change the accepted key use set: {api_key: ...})",
                f"{path}.api_key",
            )
        api_key = _string(api_key, f"{path}.api_key")
    if heals is not None and fault is None and not ramps:
        raise ScenarioError("goes with 'fault' or 'ramp'", f"{path}.heals_on_restart")
    return Event(
        at=at,
        gpu=gpu,
        set=sets,
        ramp=ramps,
        max=bounds["max"],
        min=bounds["min"],
        fault=fault,
        heals_on_restart=heals,
        slow_s=slow_s,
        api_key=api_key,
        note=note,
        index=index,
    )


@dataclass(frozen=True)
class Scenario:
    """A validated scenario. Build with :meth:`load` (a YAML file) or :meth:`from_dict`."""

    name: str
    description: str
    start: datetime
    ports: dict[str, int]
    reload_s: float
    monitor: str
    litellm: str
    gpus: tuple[GpuSpec, ...]
    events: tuple[Event, ...]  # sorted by `at` (stable: equal times keep file order)
    source: str | None = None
    litellm_admin_key: str = DEFAULT_LITELLM_ADMIN_KEY  # POST /model/update's Bearer key
    litellm_store: str = "db"  # how LiteLLM keeps its deployments: LITELLM_STORES

    @property
    def aliases(self) -> list[str]:
        return [g.alias for g in self.gpus]

    def gpu(self, alias: str) -> GpuSpec:
        for g in self.gpus:
            if g.alias == alias:
                return g
        raise KeyError(alias)

    def gpu_port(self, index: int) -> int:
        g = self.gpus[index]
        if g.port is not None:
            return g.port
        return self.ports["gpus_from"] + index if self.ports["gpus_from"] else 0

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        p = Path(path)
        try:
            import yaml
        except ImportError as exc:  # pragma: no cover - pyyaml is a dependency
            raise ScenarioError(f"{p}: PyYAML is needed to read scenario files") from exc
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScenarioError(f"{p}: cannot read: {exc.strerror or exc}") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ScenarioError(f"{p}: invalid YAML{where}: {problem}") from None
        if data is None:
            raise ScenarioError(f"{p}: empty scenario file")
        scn = cls.from_dict(data)
        if scn.name == "scenario":
            scn = _replace(scn, name=p.stem)
        return _replace(scn, source=str(p))

    @classmethod
    def from_dict(cls, d: Any) -> Scenario:
        if not isinstance(d, dict):
            raise ScenarioError("a scenario must be a mapping at the top level")
        _mapping(d, "")
        _no_unknown(d, TOP_KEYS, "")
        name = _string(d.get("name", "scenario"), "name")
        description = d.get("description", "") or ""
        if not isinstance(description, str):
            raise ScenarioError("must be a string", "description")
        start = parse_time(d.get("start", DEFAULT_START), "start")

        ports = dict(DEFAULT_PORTS)
        if d.get("ports") is not None:
            raw = _mapping(d["ports"], "ports")
            _no_unknown(raw, tuple(DEFAULT_PORTS), "ports")
            for k, v in raw.items():
                ports[k] = _number(v, f"ports.{k}", minimum=0, integer=True)
                if ports[k] > 65535:
                    raise ScenarioError("must be <= 65535", f"ports.{k}")

        reload_s = _number(d.get("reload_s", 1.0), "reload_s", minimum=0)
        monitor = _choice(d.get("monitor", "ok"), "monitor", MONITOR_MODES)
        litellm = _choice(d.get("litellm", "ok"), "litellm", LITELLM_MODES)
        admin_key = _string(
            d.get("litellm_admin_key", DEFAULT_LITELLM_ADMIN_KEY), "litellm_admin_key"
        )
        if admin_key != admin_key.strip():
            raise ScenarioError("must not start or end with whitespace", "litellm_admin_key")
        store = _choice(d.get("litellm_store", "db"), "litellm_store", LITELLM_STORES)

        raw_gpus = d.get("gpus")
        if raw_gpus is None:
            raise ScenarioError("is required (a list of GPUs)", "gpus")
        if not isinstance(raw_gpus, list) or not raw_gpus:
            raise ScenarioError("must be a non-empty list", "gpus")
        gpus: list[GpuSpec] = []
        seen_alias: dict[str, int] = {}
        seen_host: dict[str, int] = {}
        seen_model_id: dict[str, int] = {}
        strix_at: int | None = None
        for i, g in enumerate(raw_gpus):
            spec = _parse_gpu(g, f"gpus[{i}]")
            if spec.alias in seen_alias:
                raise ScenarioError(
                    f"duplicate alias {spec.alias!r} (also gpus[{seen_alias[spec.alias]}])",
                    f"gpus[{i}].alias",
                )
            if spec.host in seen_host and (
                spec.gpu_index is None
                or gpus[seen_host[spec.host]].gpu_index is None
                or any(o.host == spec.host and o.gpu_index == spec.gpu_index for o in gpus)
            ):
                raise ScenarioError(
                    f"duplicate host {spec.host!r} (also gpus[{seen_host[spec.host]}]); "
                    "GPUs sharing a host each need their own gpu_index",
                    f"gpus[{i}].host",
                )
            if spec.legacy_strix:
                if strix_at is not None:
                    raise ScenarioError(
                        f"only one GPU can use the legacy strix block (also gpus[{strix_at}])",
                        f"gpus[{i}].legacy_strix",
                    )
                strix_at = i
            if spec.model_id in seen_model_id:
                raise ScenarioError(
                    f"duplicate LiteLLM model id {spec.model_id!r} "
                    f"(also gpus[{seen_model_id[spec.model_id]}])",
                    f"gpus[{i}].litellm_model_id",
                )
            seen_alias[spec.alias] = i
            seen_host[spec.host] = i
            seen_model_id[spec.model_id] = i
            gpus.append(spec)

        aliases = set(seen_alias)
        raw_events = d.get("events") or []
        if not isinstance(raw_events, list):
            raise ScenarioError("must be a list", "events")
        events = [
            parse_event(e, f"events[{i}]", aliases, index=i) for i, e in enumerate(raw_events)
        ]
        events.sort(key=lambda e: e.at)  # stable: equal times keep file order

        scn = cls(
            name=name,
            description=description,
            start=start,
            ports=ports,
            reload_s=reload_s,
            monitor=monitor,
            litellm=litellm,
            gpus=tuple(gpus),
            events=tuple(events),
            litellm_admin_key=admin_key,
            litellm_store=store,
        )
        _check_ports(scn)
        return scn


def _replace(scn: Scenario, **kw: Any) -> Scenario:
    from dataclasses import replace

    return replace(scn, **kw)


def _check_ports(scn: Scenario) -> None:
    used: dict[int, str] = {}
    wanted = [
        ("ports.monitor", scn.ports["monitor"]),
        ("ports.litellm", scn.ports["litellm"]),
        ("ports.control", scn.ports["control"]),
    ]
    for i, g in enumerate(scn.gpus):
        where = f"gpus[{i}].port" if g.port is not None else f"ports.gpus_from (gpus[{i}])"
        wanted.append((where, scn.gpu_port(i)))
    for where, port in wanted:
        if port == 0:
            continue
        if port in used:
            raise ScenarioError(f"port {port} is also used by {used[port]}", where)
        used[port] = where
