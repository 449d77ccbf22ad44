"""``gpuheal check``: poll every source once, record, evaluate, write ``gpu-health.json``.

Changes nothing on the fleet (contract). The other commands that start with a check (``heal``)
call :func:`run` and build on its result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpuheal import trace
from gpuheal.config import Config
from gpuheal.core.heal_state import HealState
from gpuheal.core.health import health_document
from gpuheal.core.view import Restarts
from gpuheal.model import Observation
from gpuheal.state import files, history_store
from gpuheal.state.files import GPU_HEALTH as HEALTH_FILE  # noqa: E402
from gpuheal.state.history import History
from gpuheal.state.store import StateDir

if TYPE_CHECKING:
    from gpuheal.core.engine import Evaluation
    from gpuheal.core.issue import Issue
    from gpuheal.runtime import CommandResult, Runtime
    from gpuheal.sources.gpu_source import GpuSource
    from gpuheal.transport import TransportPool



@dataclass
class CheckResult:
    """``check``'s poll and what the rules made of it: ``issues`` typed (:class:`~gpuheal.core.issue.Issue`),
    ``health`` the document (its ``issues`` their JSON)."""

    obs: Observation
    history: History
    issues: list[Issue]
    health: dict[str, Any]
    evaluation: Evaluation  # also what resolved, and what is inhibited
    extra: dict[str, Any] = field(default_factory=dict)


class _LoadMemory(Protocol):
    def __call__(self, cfg: Config, saved: Any, window_starts: dict[str, float], now_s: float) -> Any: ...


class _SaveMemory(Protocol):
    def __call__(self, cfg: Config, memory: Any, obs: Observation) -> Any: ...


@dataclass(frozen=True)
class KeptMemory:
    """A source's memory between runs (``SourceKind.memory``: Prometheus's trend cache) with its two pure
    functions found once, at the plan: ``load`` shapes this poll's queries, ``save`` gives the document
    the next run reads (``None``: nothing to write)."""

    file: str
    load: _LoadMemory
    save: _SaveMemory


@dataclass(frozen=True)
class CheckPlan:
    """What one check needs of the config and of what earlier runs left, resolved once before the poll, so
    each step below receives exactly its part: the configured GPU source (built once: the poll reads through
    it), whether this run keeps the per-poll history, the GPUs' restarts from ``heal``'s record (a trend
    window and the rules' startup grace start there), what the source keeps between runs and, for a poll,
    what it kept last time (``recalled``: ``None`` when it keeps nothing or no poll was planned)."""

    source: GpuSource
    keep_history: bool
    restarts: Restarts
    window_starts: dict[str, float]  # where a restarted GPU's trend window starts again (Restarts.window_starts)
    memory: KeptMemory | None = None
    recalled: Any = None


def plan_check(
    cfg: Config, heal_state: HealState, store: StateDir | None = None, now: datetime | None = None
) -> CheckPlan:
    """The plan; with ``store`` (and ``now``) the plan of a poll, which also reads what the source's earlier
    runs left that shapes its queries (Prometheus's trend cache, its restarted GPUs' windows). Read-only
    on the state directory (``trend`` plans a poll too)."""
    # a source that computes trends where its data lives (Prometheus: PromQL) needs no per-poll
    # history (issue 13: the state directory stays flat as the fleet grows); every per-poll source
    # — gpu-monitor, smi, the Rule 7.3 fallback — is recorded alike and fitted there (issue 19)
    from gpuheal.named import resolve
    from gpuheal.sources.gpu_source import gpu_source

    source = gpu_source(cfg)
    kept = source.kind.memory
    memory = KeptMemory(kept.file, resolve(kept.load), resolve(kept.save)) if kept is not None else None
    saved = store.read(memory.file, {}) if memory is not None and store is not None else None
    restarts = Restarts.from_heal_state(heal_state, cfg.heal.startup_grace_s)
    window_starts = restarts.window_starts()
    recalled = None
    if memory is not None and saved is not None and now is not None:
        recalled = memory.load(cfg, saved, window_starts, now.timestamp())
    return CheckPlan(source, not source.spec.computes_trends, restarts, window_starts, memory, recalled)


def run(
    cfg: Config,
    store: StateDir,
    now: datetime,
    record: Path | None = None,
    obs: Observation | None = None,
    transports: TransportPool | None = None,
    heal_state: HealState | None = None,
) -> CheckResult:
    """One straight line: the plan, the poll (sensed, or ``obs`` given), its record, the rules' judgement
    (:func:`gpuheal.steps.evaluate.run_full`), what this run keeps for the next (:func:`_keep`), the health
    document. ``transports``: the run's transport
    pool (``heal`` shares its SSH connections with the smi sensing of a config without gpu-monitor: one
    connection per host per run). ``heal_state``: ``heal-state.json`` as its caller read it under this lock
    (``heal``'s books), so that a run parses it once; ``None``: read here."""
    from gpuheal.core.coverage import from_litellm, rules_off
    from gpuheal.rules import ALL
    from gpuheal.rules.model_stuck.memory import progress_columns
    from gpuheal.steps import evaluate

    if heal_state is None:  # read once: for the plan and the rules
        heal_state = HealState.from_json(store.read(files.HEAL, {}))
    plan = plan_check(cfg, heal_state, store if obs is None else None, now)  # a poll's plan when it senses
    memory_doc = None  # what the source leaves for the next run, written with the history below
    if obs is None:
        obs, history, memory_doc = _sense_and_load(cfg, plan, store, now, transports)
    else:
        history = history_store.load_history(store) if plan.keep_history else History()
    if plan.keep_history:
        history.add(obs, cfg.aliases)
    if record is not None:  # ``check --record FILE``: the poll trace ``replay`` reads, before the judgement
        trace.append(record, obs)
    evaluation = evaluate.run_full(cfg, store, obs, history, now, heal_state, plan.restarts)  # every rule
    _keep(cfg, plan, store, history, memory_doc, now)
    columns = progress_columns(evaluation.memory, obs.gpus, now.timestamp())
    lite = cfg.litellm
    litellm_reads = from_litellm(lite.url, lite.read_metrics, lite.read_spend_logs)
    off = rules_off(obs.source, obs, ALL, litellm_reads)
    health = health_document(obs, evaluation.issues, actions=[], columns=columns, extra={"rules_off": off})
    return CheckResult(obs=obs, history=history, issues=evaluation.issues, health=health, evaluation=evaluation)


def _sense_and_load(
    cfg: Config, plan: CheckPlan, store: StateDir, now: datetime, transports: TransportPool | None
) -> tuple[Observation, History, Any]:
    """The poll, shaped by what the source's earlier runs left (:attr:`CheckPlan.recalled`), and meanwhile
    the recorded history read on a thread: the poll mostly waits on the network and a 1000-GPU history takes
    ~0.3 s to unpack (issue 12 benchmark). Also what a source that keeps a memory leaves for the next
    poll (``SourceKind.memory``), or ``None``: computed here, written by :func:`_keep` with the history."""
    from gpuheal.sources.http import workers
    from gpuheal.sources.sense import poll_fleet

    with workers(1, "history") as pool:
        loading = pool.submit(history_store.load_history, store) if plan.keep_history else None
        obs = poll_fleet(cfg, plan.source, now, transports, plan.recalled)
        history = loading.result() if loading is not None else History()
    doc = plan.memory.save(cfg, plan.recalled, obs) if plan.memory is not None else None
    return obs, history, doc


def _keep(cfg: Config, plan: CheckPlan, store: StateDir, history: History, memory_doc: Any, now: datetime) -> None:
    """What this run leaves for the next, written after the judgement (its decisions first, the IO after):
    the per-poll history, compacted (issue 13), and the source's memory document when it gave one."""
    if plan.keep_history:
        kept = cfg.history
        history.compact(now.timestamp(), kept.raw_hours, kept.coarse_bucket_s, kept.coarse_days)
        history_store.save_history(store, history)  # the coarse tier only when it changed
    if plan.memory is not None and memory_doc is not None:
        store.write(plan.memory.file, memory_doc)


# the contract's "gpus" readings: always in the file, null = not known
SENSED_ALWAYS = frozenset({"temp_c", "vram_used_mb", "vram_total_mb", "util_pct", "power_w", "endpoint"})


def save_health(store: StateDir, health: dict[str, Any]) -> None:
    """``gpu-health.json``: the printed document, but a GPU row's other fields (its name, llama-server's
    telemetry of issue 12) only when known — absent reads as null. Their nulls were 2.3 MB of the
    3.7 MB file at 10,000 GPUs behind Prometheus (issue 13: the state directory ≤ 5 MB)."""
    gpus = health.get("gpus")
    doc = {"schema_version": 1, **health}
    if isinstance(gpus, dict):
        doc["gpus"] = {alias: _known(row) for alias, row in gpus.items()}
    store.write_raw(HEALTH_FILE, doc)


def _known(row: Any) -> Any:
    """The row's known fields, less its per-value ``provenance``: ~200 B a GPU, about 2 MB of the 5 MB state
    budget at 10,000 GPUs; ``check --json`` prints it and ``check --record`` keeps it."""
    if not isinstance(row, dict):
        return row
    return {k: v for k, v in row.items() if (v is not None or k in SENSED_ALWAYS) and k != "provenance"}


def command(rt: Runtime, store: StateDir, record: Path | None = None) -> CommandResult:
    """CLI adapter: exit 0/1/2 from the status (contract)."""
    from gpuheal import exit_codes
    from gpuheal.runtime import CommandResult

    result = run(rt.cfg, store, rt.now, record=record)
    save_health(store, result.health)

    def render() -> None:
        from gpuheal.render.human import render_health

        render_health(result.health, config_rows(rt.cfg))

    return CommandResult(
        document=result.health,
        exit_code=exit_codes.BY_STATUS[result.health["status"]],
        render=render,
        warnings=list(result.obs.warnings),
    )


def config_rows(cfg: Config) -> list[dict[str, Any]]:
    return [
        {"alias": g.alias, "host": g.host, "name": g.name, "vram_total_mb": g.vram_total_mb}
        for g in cfg.gpus
    ]
