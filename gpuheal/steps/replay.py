"""``gpuheal replay TRACE``: backtest the rules on a recorded trace (``check --record`` writes it).

Each JSON line is one :meth:`Observation.to_dict`; every observation goes through the very code
``check`` runs (history → monitor benchmarks → :func:`gpuheal.steps.evaluate.evaluate_poll` →
history compaction), with the trace's own clock, in memory: no state directory, no network. So
``replay`` answers "what would gpuheal have said", e.g. before raising a threshold (the spec raised
its VRAM thresholds "based on operational data").

Bad input (decided here, and tested):

- a line that is not JSON, not an observation, or carries a reading of the wrong type → one error
  naming the file and line number, exit 3: a backtest over a damaged trace would mislead. Only a
  final line without its newline (a ``check`` killed mid-write) is skipped, with a warning;
- blank lines are skipped; an observation not later than the previous one is skipped with a
  warning (the same as the history does);
- a GPU in the trace that is not in the config is ignored, with one warning per alias; a GPU missing
  from an observation is "no data" for that poll (its holds neither advance nor reset).

Exit status: 0 nothing fired; 1 a warning or critical issue fired at some poll of the trace (``info``
recommendations never count); 3 the trace could not be read.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuheal.clock import format_iso
from gpuheal.config import Config
from gpuheal.core.engine import Event, new_book
from gpuheal.core.issue import Issue
from gpuheal.core.view import NO_RESTARTS
from gpuheal.errors import GpuhealError
from gpuheal.model import Observation
from gpuheal.state.history import History

if TYPE_CHECKING:
    from gpuheal.runtime import CommandResult, Runtime


NUMBER_FIELDS = (
    "temp_c",
    "vram_used_mb",
    "vram_total_mb",
    "util_pct",
    "power_w",
    "power_limit_w",
    "endpoint_latency_s",
    "requests_60s",
    "failures_60s",
    "consecutive_timeouts",
    "bench_tok_s",
    "bench_baseline_tok_s",
    # llama-server's own telemetry (issue 12)
    "n_decode_total",
    "tokens_predicted_total",
    "requests_processing",
    "requests_deferred",
    "slots_total",
    "slots_busy",
    "n_ctx",  # Rule 9: the running context from /props (rules/context_window/change)
)
TEXT_FIELDS = ("endpoint", "name", "bench_measured_at", "metrics", "slots")


@dataclass
class ReplayResult:
    polls: int = 0
    timeline: list[dict[str, Any]] = field(default_factory=list)
    open_at_end: list[Issue] = field(default_factory=list)  # typed; the document's are their JSON
    warnings: list[str] = field(default_factory=list)
    start: str | None = None
    end: str | None = None
    rules_off: list[dict[str, Any]] = field(default_factory=list)  # as the trace's last poll's check said

    @property
    def fired(self) -> list[dict[str, Any]]:
        """Warning/critical issues that went firing at some poll (what would have alerted)."""
        return [t for t in self.timeline if t["event"] == Event.FIRING and t["severity"] != "info"]


# --------------------------------------------------------------------------- reading


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number gpuheal accepts")


def _check_sample(alias: str, sample: Any) -> None:
    if not isinstance(sample, dict):
        raise ValueError(f"gpus.{alias}: not an object")
    for key in NUMBER_FIELDS:
        value = sample.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"gpus.{alias}.{key}: {str(value)[:40]!r} is not a valid reading")
    for key in TEXT_FIELDS:
        value = sample.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"gpus.{alias}.{key}: must be a string")
    breaker = sample.get("breaker")
    if breaker is not None and (not isinstance(breaker, dict) or not isinstance(breaker.get("open"), bool)):
        raise ValueError(f"gpus.{alias}.breaker: must be {{\"open\": true|false, ...}}")
    for key in ("running", "is_sleeping"):
        flag = sample.get(key)
        if flag is not None and not isinstance(flag, bool):
            raise ValueError(f"gpus.{alias}.{key}: must be true or false")


def parse_observation(text: str) -> Observation:
    """One trace line → an Observation; ``ValueError`` naming the problem."""
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ValueError(f"not JSON ({str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if not isinstance(data.get("at"), str):
        raise ValueError("no 'at' time")
    if not isinstance(data.get("monitor_ok"), bool):
        raise ValueError("'monitor_ok' must be true or false")
    gpus = data.get("gpus")
    if not isinstance(gpus, dict):
        raise ValueError("'gpus' must be an object of ALIAS: reading")
    for alias, sample in gpus.items():
        _check_sample(str(alias), sample)
    try:
        return Observation.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not an observation ({type(exc).__name__}: {str(exc)[:80]})") from None


def read_trace(path: Path) -> tuple[list[Observation], list[str]]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise GpuhealError(f"trace not found: {path}") from None
    except OSError as exc:
        raise GpuhealError(f"cannot read trace {path}: {exc.strerror}") from None
    lines = raw.split(b"\n")
    complete = raw.endswith(b"\n")
    observations: list[Observation] = []
    warnings: list[str] = []
    last_at = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        is_last = number == len(lines)
        try:
            obs = parse_observation(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            if is_last and not complete:
                warnings.append(f"{path} line {number}: incomplete last line skipped ({exc})")
                continue
            raise GpuhealError(f"{path} line {number}: {exc}") from None
        if last_at is not None and obs.at <= last_at:
            warnings.append(
                f"{path} line {number}: {format_iso(obs.at)} is not after {format_iso(last_at)}; skipped"
            )
            continue
        last_at = obs.at
        observations.append(obs)
    if not observations:
        raise GpuhealError(f"trace {path} holds no observations (record one with `gpuheal check --record FILE`)")
    return observations, warnings


# --------------------------------------------------------------------------- replaying


def replay(cfg: Config, observations: list[Observation]) -> ReplayResult:
    """Feed ``observations`` (oldest first) through the rules exactly as ``check`` would, in memory."""
    from gpuheal import benchdata
    from gpuheal.steps.evaluate import evaluate_poll, ingest_monitor_bench

    result = ReplayResult()
    known = set(cfg.aliases)
    unknown_seen: set[str] = set()
    history = History()
    book = new_book()
    bench = benchdata.empty()
    hist_cfg = cfg.history
    ev = None
    for index, obs in enumerate(observations):
        strangers = [a for a in obs.gpus if a not in known]
        if strangers:
            for alias in strangers:
                if alias not in unknown_seen:
                    unknown_seen.add(alias)
                    result.warnings.append(f"trace GPU {alias!r} is not in the config; ignored")
            obs = replace(obs, gpus={a: s for a, s in obs.gpus.items() if a in known})
        now_s = obs.at.timestamp()
        history.add(obs, cfg.aliases)
        ingest_monitor_bench(cfg, bench, obs, book, NO_RESTARTS)
        ev, _ = evaluate_poll(cfg, obs, history, book, bench, NO_RESTARTS, now_s)
        history.compact(
            now_s,
            hist_cfg.raw_hours,
            hist_cfg.coarse_bucket_s,
            hist_cfg.coarse_days,
        )
        for t in ev.transitions:
            result.timeline.append({"poll": index, **t})
    result.polls = len(observations)
    result.start = format_iso(observations[0].at) if observations else None
    result.end = format_iso(observations[-1].at) if observations else None
    result.open_at_end = list(ev.issues) if ev is not None else []
    if observations:  # from the source each poll recorded, never from this config's sections (issue 19)
        from gpuheal.core.coverage import rules_off
        from gpuheal.rules import ALL

        result.rules_off = rules_off(observations[-1].source, observations[-1], ALL)
    return result


def document(result: ReplayResult, trace: Path, cfg: Config) -> dict[str, Any]:
    """``replay --json``::

        {"trace", "polls", "start", "end", "gpus": [ALIAS, ...],
         "timeline": [{"poll", "at", "gpu", "issue", "severity",
                       "event": "pending|firing|resolved|dropped", "since", "summary", "detected"}],
         "fired": N, "resolved": N, "open_at_end": [ISSUE, ...], "rules_off": [...], "warnings": [...]}
    """
    return {
        "trace": str(trace),
        "polls": result.polls,
        "start": result.start,
        "end": result.end,
        "gpus": list(cfg.aliases),
        "timeline": result.timeline,
        "fired": len(result.fired),
        "resolved": sum(1 for t in result.timeline if t["event"] == "resolved"),
        "open_at_end": [i.to_json() for i in result.open_at_end],
        "rules_off": result.rules_off,
        "warnings": result.warnings,
    }


def command(rt: Runtime, trace_path: Path) -> CommandResult:
    """CLI adapter: 0 nothing fired, 1 something fired, 3 unreadable trace (via GpuhealError)."""
    from gpuheal import exit_codes
    from gpuheal.runtime import CommandResult

    observations, warnings = read_trace(Path(trace_path))
    result = replay(rt.cfg, observations)
    result.warnings[:0] = warnings
    doc = document(result, Path(trace_path), rt.cfg)

    def render() -> None:
        from gpuheal.render.timeline import render_timeline

        render_timeline(doc)

    return CommandResult(
        document=doc,
        exit_code=exit_codes.ATTENTION if result.fired else exit_codes.OK,
        render=render,
        warnings=list(result.warnings),
    )

