"""The configuration as values: frozen dataclasses and the pure helpers on them (issue 10, point 3).

Nothing here reads a file, the environment or the network: ``core/``, ``rules/`` and the planners
may import this module. :mod:`gpuheal.config.load` builds these records from the YAML file.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import MISSING, FrozenInstanceError, dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, dataclass_transform

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from gpuheal.sinks import ZulipConfig
    from gpuheal.source_kinds.monitor import MonitorConfig
    from gpuheal.source_kinds.prometheus import PrometheusConfig

SSH_PORT = 22  # the SSH well-known port (RFC 4253): a protocol fact, not operator tuning

PLACEHOLDERS = frozenset({"alias", "host", "endpoint"})
NO_RULE: Mapping[str, Any] = MappingProxyType({})  # the parameters of a rule the config does not name
COMMAND_KEYS = (
    "restart_command",
    "start_command",
    "memcap_restart_command",
    "shed_load_command",
    "redirect_command",
    "restore_load_command",
    "power_limit_command",
    "kill_command",
    "smi_command",
    "ps_command",
    "journal_command",
)


@dataclass_transform(kw_only_default=True, frozen_default=True)
class ParamsRecord:
    """A typed, frozen parameter record: one field per parameter, keyword-only, units in the names.

    mypy checks a subclass as a frozen, keyword-only dataclass (PEP 681 ``dataclass_transform``);
    at run time it is built without ``dataclasses``' code generation, because defining a frozen
    dataclass costs about 1 ms (it compiles six methods) and the rules' records were 12 ms of every
    cron start (issue 19, "Performance"). :attr:`FIELDS` is what ``dataclasses.fields`` would say:
    each field, own and inherited, in order, with its type's name and its default (or ``MISSING``).
    """

    FIELDS: ClassVar[dict[str, tuple[str, Any]]] = {}

    def __init_subclass__(cls) -> None:
        own: dict[str, tuple[str, Any]] = {}
        for name, kind in vars(cls).get("__annotations__", {}).items():
            kind_name = kind if isinstance(kind, str) else str(getattr(kind, "__name__", kind))
            if not kind_name.startswith(("ClassVar", "typing.ClassVar")):
                own[name] = (kind_name, vars(cls).get(name, MISSING))
        cls.FIELDS = {**cls.FIELDS, **own}  # inherited first, as dataclasses order them

    def __init__(self, **values: Any) -> None:
        fields_ = type(self).FIELDS
        unknown = sorted(values.keys() - fields_.keys())
        missing = [name for name, (_, default) in fields_.items() if default is MISSING and name not in values]
        if unknown or missing:
            pairs = (("unexpected", unknown), ("missing", missing))
            what = [f"{word} {', '.join(names)}" for word, names in pairs if names]
            raise TypeError(f"{type(self).__qualname__}(): {'; '.join(what)}")
        for name, (_, default) in fields_.items():
            object.__setattr__(self, name, values.get(name, default))

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def field_values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParamsRecord) or type(other) is not type(self):
            return NotImplemented
        return other.field_values() == self.field_values()

    def __hash__(self) -> int:
        return hash((type(self), self.field_values()))

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__qualname__}({shown})"


class EngineParams(ParamsRecord):
    """The parameters every rule has, whether or not defaults.yaml lists them for it: the rules
    engine's holds and clearing (core/engine.py) and the heal step's verify window (steps/heal.py,
    falling back to the remedy's own). A rule's own ``Params`` record extends it (core/rule.py);
    these defaults are the values in force when a rule's defaults do not set them."""

    hold_polls: int = 1  # consecutive polls a finding must hold before the issue fires
    hold_s: float = 0.0  # and more than this long since it started (0: at once); with min_probes: seconds of evidence
    min_probes: int = 0  # >0: the hold may be met by hold_s s of evidence over this many probes (issue 28)
    clear_polls: int = 1  # consecutive polls of recovery before a firing issue resolves
    verify_within_s: float = 300.0  # how long a fix may take to show, judged from fresh data


class RemedyParams(EngineParams):
    """The parameters of a rule ``heal`` acts on: how many failed attempts of one occurrence before
    the humans are called (never more than ``heal.max_failed_verifications``)."""

    escalate_after_failures: int


# EngineParams as a mapping: the defaults that give their types to the strict schema (config/params.py)
ENGINE_PARAMS: dict[str, Any] = {name: default for name, (_, default) in EngineParams.FIELDS.items()}


@dataclass(frozen=True)
class LiteLLMConfig:
    url: str | None
    api_key: str
    timeout_s: float
    restart_command: tuple[str, ...] | None
    host: str | None
    transport: str
    admin_key_env: str = "LITELLM_MASTER_KEY"  # built-in load shedding via /model/update
    read_metrics: bool = False  # issue 20: LiteLLM's /metrics per poll as Rule 3's failure ratio
    read_spend_logs: bool = False  # issue 22: Rule 10 from /spend/logs/v2 (needs LiteLLM's database)
    spend_logs_max_rows: int = 20000  # more requests in Rule 10's window: not known
    config_file: str | None = None  # Rule 1.2 without a database: LiteLLM's config.yaml on litellm.host
    reload_wait_s: float = 120.0  # after restarting LiteLLM: wait this long for /health/liveliness

    def __repr__(self) -> str:  # never print the key (contract: no secret in any log line)
        return f"LiteLLMConfig(url={self.url!r}, api_key=<redacted>)"


@dataclass(frozen=True)
class Role:
    """``gpus[].role`` written as an object (issue 22, item 6; spec Rule 10 "designated role"): the
    request kinds the GPU should serve. Each criterion given must hold for a request to be inside the
    role: its model group among ``model_groups``, one of its tags among ``request_tags``, its prompt
    within ``min_prompt_tokens``..``max_prompt_tokens``. No criterion: the role is a name only."""

    name: str | None = None
    model_groups: tuple[str, ...] = ()
    request_tags: tuple[str, ...] = ()
    min_prompt_tokens: int | None = None
    max_prompt_tokens: int | None = None

    @property
    def judged(self) -> bool:
        return bool(self.model_groups or self.request_tags) or self.min_prompt_tokens is not None \
            or self.max_prompt_tokens is not None


@dataclass(frozen=True)
class GpuConfig:
    alias: str
    host: str
    endpoint: str
    vendor: str
    vram_total_mb: float | None
    baseline_tok_s: float | None
    vram_leak_mb_per_hour: float
    transport: str
    name: str | None = None
    ssh_user: str | None = None
    ssh_port: int = SSH_PORT
    role: str | None = None  # the role's name (a plain string, or role.name)
    weight: float | None = None
    role_kinds: Role | None = None  # role written as an object: what requests it should serve (Rule 10)
    n_ctx: int | None = None
    litellm_model_id: str | None = None  # the deployment's id in LiteLLM (built-in load shedding)
    litellm_rpm: int | None = None  # its normal rpm, restored after shedding
    paused: bool = False
    gpu_index: int | None = None  # index on its host (smi row, gpu-monitor ``index``); None = the only GPU
    unified_memory: bool | None = None  # AMD APU: GTT is the memory; None = decided from the product
    prometheus_match: str | None = None  # value of prometheus.labels.match for this GPU's series
    labels: dict[str, str] = field(default_factory=dict)  # grouping labels: rack, site (alerts.group_by)
    commands: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rules: dict[str, dict[str, Any]] = field(default_factory=dict)

    def command(self, key: str) -> tuple[str, ...] | None:
        """The argv template for ``key`` (e.g. ``restart_command``), placeholders unexpanded."""
        return self.commands.get(key)

    @property
    def index(self) -> int:
        """The GPU's index on its host: ``gpu_index``, else 0 (the host's only GPU)."""
        return self.gpu_index if self.gpu_index is not None else 0


# ------------------------------------------------------------------ the plain sections, typed
# Built once at load (:func:`section_record`) from the section after defaults.yaml is merged in and
# the schema has passed: the defaults live there and in schema.json, never here (issue 19 item 4).


@dataclass(frozen=True)
class ProbeConfig:
    """``probe:`` — the direct llama-server ``/health`` probes."""

    timeout_s: float
    max_workers: int
    # issue 20: {enabled, every_polls, n_predict, timeout_s} — a 1-token completion when no decode
    # progress was seen since the last poll (checked by the schema; read by sources/sense)
    canary: Mapping[str, Any] = field(default_factory=dict)


# ``alerts:`` keys that were ``zulip:`` keys before the sink seam (issue 19 item 3): still accepted there
ALERT_KEYS = ("repeat_interval_h", "all_clear_every", "max_messages_per_run", "group_by")


@dataclass(frozen=True)
class AlertsConfig:
    """``alerts:`` — what ``escalate`` sends, whatever the sink: reminders, the All Clear, grouping and
    the per-run budget (issue 21). The same keys under ``zulip:`` are still read (:data:`ALERT_KEYS`)."""

    repeat_interval_h: float
    all_clear_every: int
    max_messages_per_run: int
    group_by: str | None = None  # a gpus[].labels key: one message per issue and label value


@dataclass(frozen=True)
class StateConfig:
    """``state:`` — the state directory's lock."""

    lock_wait_s: float


@dataclass(frozen=True)
class HistoryConfig:
    """``history:`` — per-poll samples kept, then coarse buckets (state/history.py)."""

    raw_hours: float
    coarse_bucket_s: int
    coarse_days: float


@dataclass(frozen=True)
class BenchConfig:
    """``bench:`` — the benchmark inference test."""

    n_predict: int
    timeout_s: float
    warmup: bool
    keep_days: float
    prompt: str | None = None  # None: the built-in prompt


@dataclass(frozen=True)
class HealConfig:
    """``heal:`` — budgets, timeouts, SSH and the built-in load-side cooling."""

    max_restarts_per_hour: int
    max_failed_verifications: int
    startup_grace_s: float
    reload_wait_s: float
    verify_timeout_s: float
    fleet_guard_fraction: float
    ssh_connect_timeout_s: float
    command_timeout_s: float
    kill_unknown_processes: bool
    protect_processes: tuple[str, ...]
    gpu_monitor_transport: str
    shed_rpm_ratio: float
    restore_after_s: float
    redirect_rpm: int
    shed_power_ratio: float | None = 0.7  # built-in shed-load without LiteLLM: cap the board power at this share
    power_restore: str = "default"  # Rule 4.2: restore a throttled limit to the board's "default" or "max"
    competing_util_pct: float = 90.0  # Rule 4.1: "if >90%, other process is competing"
    leak_attribution_share: float = 0.5  # Rule 2: the grown process's least share of the summed growth
    leak_attribution_wait_s: float = 600.0  # Rule 2: from the onset snapshot to the remedy, at the least
    stop_timeout_s: float = 90.0  # the llama-server unit's TimeoutStopSec (issue 20: a hung server ignores SIGTERM)
    confirm_budget_s: float = 30.0  # issue 28: re-probe a hard fault within the run for at most this long
    confirm_interval_s: float = 5.0  # issue 28: one re-probe of each such GPU every this many seconds
    drain_first: bool = False  # issue 28: a hard fault's GPU leaves LiteLLM's config.yaml (a proxy restart each move)
    gpu_monitor_restart_command: str | list[str] | None = None
    gpu_monitor_host: str | None = None
    ssh_user: str | None = None
    ssh_key: str | None = None
    known_hosts: str | None = None
    system_known_hosts: bool = False


_Section = TypeVar("_Section", bound="DataclassInstance")
_COERCE: dict[str, Any] = {"float": float, "int": int, "bool": bool, "str": str, "tuple[str, ...]": tuple}


def section_record(cls: type[_Section], data: Mapping[str, Any]) -> _Section:
    """``cls`` from a validated, defaults-merged section: each field from its key, made the
    field's type (``60`` → ``60.0`` for a float; a list → a tuple); an optional key left out
    takes the field's own "absent" (``None``/``False``). Keys the record does not name are not
    read. Raises ``TypeError`` for a missing required key (a schema or defaults bug)."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in data:
            raw = data[f.name]
            coerce = _COERCE.get(str(f.type))
            values[f.name] = coerce(raw) if coerce is not None and raw is not None else raw
    return cls(**values)


# ------------------------------------------------------------------ the rules' typed parameters

_Params = TypeVar("_Params", bound=EngineParams)
PARAM_KINDS: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}


class ParamsMismatch(TypeError):
    """A rule's ``Params`` record and the parameters merged for it disagree: a programming error in
    the rule or in defaults.yaml, never the operator's (the loader has checked every value they set
    against defaults.yaml: contract "Rule parameters")."""


_KINDS_OF: dict[type, dict[str, type]] = {}


def param_kinds(cls: type[EngineParams]) -> dict[str, type]:
    """Each field of a parameter record and its type, one of :data:`PARAM_KINDS` (a rule's
    parameters are flat scalars, like their YAML); worked out once per record type."""
    known = _KINDS_OF.get(cls)
    if known is not None:
        return known
    kinds: dict[str, type] = {}
    for field_name, (name, _) in cls.FIELDS.items():
        if name not in PARAM_KINDS:
            raise ParamsMismatch(f"{cls.__module__}.{cls.__qualname__}.{field_name}: a parameter is one of "
                                 f"{', '.join(PARAM_KINDS)}, not {name}")
        kinds[field_name] = PARAM_KINDS[name]
    _KINDS_OF[cls] = kinds
    return kinds


def param_fits(kind: type, value: Any) -> bool:
    """Whether ``value`` may stand in a field of ``kind`` (a whole number in a float field may; a
    bool is never a number)."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, kind) or (kind is float and isinstance(value, int))


def params_record(cls: type[_Params], merged: Mapping[str, Any]) -> _Params:
    """``cls`` from the parameters merged for one rule and GPU (defaults.yaml ← fleet ← GPU), each
    value checked against its field's type (``85`` → ``85.0`` in a float field). A key the record
    does not name, a field without a value or a value of another type is :class:`ParamsMismatch`."""
    kinds = param_kinds(cls)
    values: dict[str, Any] = {}
    for name, value in merged.items():
        kind = kinds.get(name)
        if kind is None or not param_fits(kind, value):
            what = "no such field" if kind is None else f"{value!r} is not {kind.__name__}"
            raise ParamsMismatch(f"{cls.__module__}.{cls.__qualname__}.{name}: {what}")
        values[name] = float(value) if kind is float else value
    try:
        return cls(**values)
    except TypeError as exc:  # a field without a value (defaults.yaml lacks it)
        raise ParamsMismatch(f"{cls.__module__}.{cls.__qualname__}: {exc}") from None


@dataclass(frozen=True)
class WakeConfig:
    """``wake:`` (issue 22 item 7): the variable holding the webhook's bearer token, and the least
    time between two woken heal cycles. ``configured``: the file has a ``wake:`` section."""

    token_env: str = "GPUHEAL_WAKE_TOKEN"
    min_interval_s: float = 15.0
    configured: bool = False


@dataclass(frozen=True)
class Config:
    """The validated configuration. ``knowledge_graph`` and ``rules`` stay plain dicts; a rule reads
    its parameters as its typed ``Params`` record (:meth:`rule_record`), built once per config."""

    path: str | None
    litellm: LiteLLMConfig
    gpus: tuple[GpuConfig, ...]
    probe: ProbeConfig
    alerts: AlertsConfig
    state: StateConfig
    history: HistoryConfig
    bench: BenchConfig
    heal: HealConfig
    knowledge_graph: dict[str, Any]
    rules: dict[str, dict[str, Any]]
    metrics_file: str | None = None
    wake: WakeConfig = WakeConfig()
    # the GPU source's section record (at most one; none: nvidia-smi / rocm-smi per host) and each alert
    # sink's, by section name: each source declares its section in its module (gpuheal.source_kinds),
    # each sink in gpuheal.sinks.SINKS (issue 19 item 3)
    sections: Mapping[str, Any] = field(default_factory=dict)
    # rule_record's cache: id of a merged mapping → (that mapping, its record type, the record), and
    # (record type, its values) → the record, so GPUs with the same values share one; and rule_records':
    # ("every", record type, rule id) → the rule's distinct records over the fleet
    _records: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def zulip(self) -> ZulipConfig:
        """``zulip:``, as the Zulip sink reads it (always built: its defaults leave ``site`` unset)."""
        found: ZulipConfig = self.sections["zulip"]
        return found

    @property
    def monitor(self) -> MonitorConfig | None:
        """``monitor:`` (None: no gpu-monitor), as gpu-monitor's own code reads it."""
        found: MonitorConfig | None = self.sections.get("monitor")
        return found

    @property
    def prometheus(self) -> PrometheusConfig | None:
        """``prometheus:`` (None: not the source), as the Prometheus reader reads it."""
        found: PrometheusConfig | None = self.sections.get("prometheus")
        return found

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(g.alias for g in self.gpus)

    def gpu(self, alias: str) -> GpuConfig:
        for gpu in self.gpus:
            if gpu.alias == alias:
                return gpu
        raise KeyError(alias)

    def rule_params(self, rule_id: str, alias: str | None = None) -> dict[str, Any]:
        """Defaults ← fleet ``rules`` ← the GPU's own ``rules`` (already merged at load)."""
        if alias is not None:
            return self.gpu(alias).rules.get(rule_id, {})
        return self.rules.get(rule_id, {})

    def rule_record(self, cls: type[_Params], merged: Mapping[str, Any]) -> _Params:
        """:func:`params_record` of ``merged`` (one of this config's ``rules`` mappings), built
        once: the engine asks for every rule of every GPU at every poll, and 10,000 GPUs that
        override nothing share one mapping per rule (issue 13)."""
        hit = self._records.get(id(merged))
        if hit is not None and hit[0] is merged and hit[1] is cls:
            record: _Params = hit[2]
            return record
        by_value = (cls, tuple(merged.items()))
        try:
            shared: _Params | None = self._records.get(by_value)
        except TypeError:  # an unhashable value is no parameter: params_record says which
            shared = None
        record = params_record(cls, merged) if shared is None else shared
        self._records[by_value] = record
        self._records[id(merged)] = (merged, cls, record)  # holding ``merged`` keeps its id from being reused
        return record

    def rule_records(self, cls: type[_Params], rule_id: str) -> tuple[_Params, ...]:
        """The records of rule ``rule_id`` across the fleet — the fleet's values and every GPU's, each
        distinct one once — built once per config: a question about the whole fleet (``heal``'s "may any GPU
        meet this rule's hold in seconds?", at every run) then costs no lookup per GPU."""
        key = ("every", cls, rule_id)
        found: tuple[_Params, ...] | None = self._records.get(key)
        if found is None:
            tables = (self.rules, *(gpu.rules for gpu in self.gpus))
            distinct = {id(m): m for m in (table.get(rule_id, NO_RULE) for table in tables)}
            found = self._records[key] = tuple(dict.fromkeys(self.rule_record(cls, m) for m in distinct.values()))
        return found

    def params_as(self, cls: type[_Params], rule_id: str, subject: str | None = None) -> _Params:
        """The parameters of rule ``rule_id`` for ``subject`` (a GPU alias; anything else, ``fleet``
        included, gets the fleet's values) seen through ``cls``: the rule's own ``Params`` or a record
        it extends — :class:`EngineParams` for ``verify_within_s``, :class:`RemedyParams` for
        ``escalate_after_failures``. Typed, so that code outside a rule (heal's planner and attempts,
        the re-benchmark) never reads a parameter by its name as a string (issue 26 item 3). Keys
        ``cls`` does not name are left out; a field the rule's defaults do not list takes ``cls``'s
        default (EngineParams: the engine's values in force for every rule)."""
        gpu = next((g for g in self.gpus if g.alias == subject), None)
        merged = (self.rules if gpu is None else gpu.rules).get(rule_id, {})
        if merged.keys() <= cls.FIELDS.keys():  # the rule's own record: built once (rule_record)
            return self.rule_record(cls, merged)
        return params_record(cls, {k: v for k, v in merged.items() if k in cls.FIELDS})


def split_command(value: str | list[str]) -> tuple[str, ...]:
    """A string is split like a shell would (``shlex``) and later run without one (contract)."""
    if isinstance(value, str):
        return tuple(shlex.split(value))
    return tuple(value)
