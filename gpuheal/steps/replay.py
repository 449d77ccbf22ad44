"""``gpuheal replay TRACE``: backtest the rules on a recorded trace (``check --record`` writes it).

Each JSON line is one :meth:`Observation.to_dict`; every observation goes through the very code
``check`` runs (history → monitor benchmarks → :func:`gpuheal.steps.evaluate.evaluate_poll` →
history compaction), with the trace's own clock, in memory: no state directory, no network. So
``replay`` answers "what would gpuheal have said", e.g. before raising a threshold (the spec raised
its VRAM thresholds "based on operational data").

Bad input (tested):

- a damaged trace (:mod:`gpuheal.trace` says which lines are) → one error naming the file and line
  number, exit 3: a backtest over a damaged trace would mislead;
- a GPU in the trace that is not in the config is ignored, with one warning per alias; a GPU missing
  from an observation is "no data" for that poll (its holds neither advance nor reset).

Exit status: 0 nothing fired; 1 a warning or critical issue fired at some poll of the trace (``info``
recommendations never count); 3 the trace could not be read.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuheal.clock import format_iso
from gpuheal.config import Config
from gpuheal.core.engine import Event, new_book
from gpuheal.core.issue import Issue
from gpuheal.core.view import NO_RESTARTS
from gpuheal.model import Observation
from gpuheal.state.history import History
from gpuheal.trace import read_trace

if TYPE_CHECKING:
    from gpuheal.runtime import CommandResult, Runtime


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


# --------------------------------------------------------------------------- replaying


def replay(cfg: Config, observations: list[Observation]) -> ReplayResult:
    """Feed ``observations`` (oldest first) through the rules exactly as ``check`` would, in memory."""
    from gpuheal import benchdata
    from gpuheal.steps.evaluate import evaluate_poll

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
        ev = evaluate_poll(cfg, obs, history, book, bench, NO_RESTARTS, now_s).evaluation
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

