"""The configuration as values: frozen dataclasses and the pure helpers on them (issue 10, point 3).

Nothing here reads a file, the environment or the network: ``core/``, ``rules/`` and the planners
may import this module. :mod:`gpuheal.config.load` builds these records from the YAML file.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

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
class MonitorConfig:
    url: str
    timeout_s: float
    connect_timeout_s: float
    max_response_bytes: int
    fallback_smi: bool = True  # Rule 7.3: smi over each GPU's transport while the monitor is unusable


@dataclass(frozen=True)
class PrometheusConfig:
    """``prometheus:`` — GPU readings from instant queries instead of gpu-monitor (contract:
    "Prometheus as a source"). ``queries`` maps a reading to its PromQL (``None``: not read);
    ``{selector}`` in a query is replaced by ``selector`` (one gpuheal per site, issue 13)."""

    url: str
    timeout_s: float
    connect_timeout_s: float
    max_response_bytes: int
    staleness_s: float
    selector: str
    max_workers: int
    labels: dict[str, str | None]
    queries: dict[str, str | None]
    trend_every_s: float  # Rule 2's fleet-wide trend queries at most this often (prometheus-trend.json between)
    probe_endpoints: bool = True  # False: llama-server liveness from Prometheus's `up` of its target

    def query(self, key: str) -> str | None:
        template = self.queries.get(key)
        return None if template is None else template.replace("{selector}", self.selector)


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

    def __repr__(self) -> str:  # never print the key (contract: no secret in any log line)
        return f"LiteLLMConfig(url={self.url!r}, api_key=<redacted>)"


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
    role: str | None = None
    weight: float | None = None
    n_ctx: int | None = None
    litellm_model_id: str | None = None  # the deployment's id in LiteLLM (built-in load shedding)
    litellm_rpm: int | None = None  # its normal rpm, restored after shedding
    paused: bool = False
    gpu_index: int | None = None  # index on its host (smi row, gpu-monitor ``index``); None = the only GPU
    unified_memory: bool | None = None  # AMD APU: GTT is the memory; None = decided from the product
    prometheus_match: str | None = None  # value of prometheus.labels.match for this GPU's series
    labels: dict[str, str] = field(default_factory=dict)  # grouping labels: rack, site (zulip.group_by)
    commands: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rules: dict[str, dict[str, Any]] = field(default_factory=dict)

    def command(self, key: str) -> tuple[str, ...] | None:
        """The argv template for ``key`` (e.g. ``restart_command``), placeholders unexpanded."""
        return self.commands.get(key)

    @property
    def index(self) -> int:
        """The GPU's index on its host: ``gpu_index``, else 0 (the host's only GPU)."""
        return self.gpu_index if self.gpu_index is not None else 0


@dataclass(frozen=True)
class WakeConfig:
    """``wake:`` (issue 22 item 7): the variable holding the webhook's bearer token, and the least
    time between two woken heal cycles. ``configured``: the file has a ``wake:`` section."""

    token_env: str = "GPUHEAL_WAKE_TOKEN"
    min_interval_s: float = 15.0
    configured: bool = False


@dataclass(frozen=True)
class Config:
    """The validated configuration. Sections not modelled as classes stay plain dicts."""

    path: str | None
    monitor: MonitorConfig | None  # None: no gpu-monitor; GPU readings from nvidia-smi / rocm-smi
    litellm: LiteLLMConfig
    gpus: tuple[GpuConfig, ...]
    probe: dict[str, Any]
    zulip: dict[str, Any]
    state: dict[str, Any]
    history: dict[str, Any]
    bench: dict[str, Any]
    heal: dict[str, Any]
    knowledge_graph: dict[str, Any]
    rules: dict[str, dict[str, Any]]
    metrics_file: str | None = None
    prometheus: PrometheusConfig | None = None  # set: the GPU data source is Prometheus, not gpu-monitor
    wake: WakeConfig = WakeConfig()

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
