"""The configuration as values: frozen dataclasses and the pure helpers on them (issue 10, point 3).

Nothing here reads a file, the environment or the network: ``core/``, ``rules/`` and the planners
may import this module. :mod:`gpuheal.config.load` builds these records from the YAML file.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from gpuheal.sinks import ZulipConfig
    from gpuheal.source_kinds.monitor import MonitorConfig
    from gpuheal.source_kinds.prometheus import PrometheusConfig

# Parameters read for every rule, whether or not defaults.yaml lists them for it: the rules
# engine's holds and clearing (core/engine.py) and the heal step's verify window (steps/heal.py,
# falling back to the remedy's own). These are the values in force when a rule's defaults do not
# set them, and the defaults that give their types to the strict schema (config/params.py).
ENGINE_PARAMS: dict[str, Any] = {"hold_polls": 1, "hold_s": 0, "clear_polls": 1, "verify_within_s": 300}

SSH_PORT = 22  # the SSH well-known port (RFC 4253): a protocol fact, not operator tuning

PLACEHOLDERS = frozenset({"alias", "host", "endpoint"})
COMMAND_KEYS = (
    "restart_command",
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
    power_restore: str = "default"  # Rule 4.2: restore a throttled limit to the board's "default" or "max"
    competing_util_pct: float = 90.0  # Rule 4.1: "if >90%, other process is competing"
    leak_attribution_share: float = 0.5  # Rule 2: the grown process's least share of the summed growth
    leak_attribution_wait_s: float = 600.0  # Rule 2: from the onset snapshot to the remedy, at the least
    stop_timeout_s: float = 90.0  # the llama-server unit's TimeoutStopSec (issue 20: a hung server ignores SIGTERM)
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


@dataclass(frozen=True)
class WakeConfig:
    """``wake:`` (issue 22 item 7): the variable holding the webhook's bearer token, and the least
    time between two woken heal cycles. ``configured``: the file has a ``wake:`` section."""

    token_env: str = "GPUHEAL_WAKE_TOKEN"
    min_interval_s: float = 15.0
    configured: bool = False


@dataclass(frozen=True)
class Config:
    """The validated configuration. ``knowledge_graph`` and ``rules`` stay plain dicts (the rules'
    typed parameter records come with the signal model, issue 19)."""

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


def split_command(value: str | list[str]) -> tuple[str, ...]:
    """A string is split like a shell would (``shlex``) and later run without one (contract)."""
    if isinstance(value, str):
        return tuple(shlex.split(value))
    return tuple(value)
