"""FleetView: what the rules may look at for one evaluation, at one instant. Pure.

A rule never reads files, the network or the clock: it gets a view built from this poll's
:class:`~gpuheal.model.Observation` (``None`` for a bench-only evaluation), the recorded
:class:`~gpuheal.state.history.History`, the benchmark data (``benchdata``), the engine's small
memory (request counts, when a breaker was first seen open) and the restarts ``heal`` recorded.
``now_s`` is the run's single clock reading (design: "time is a parameter").

Queries are cached per view: Rule 2 and the ``vram-trend`` file share one fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from gpuheal import benchdata
from gpuheal.config import Config, GpuConfig
from gpuheal.config.model import EngineParams
from gpuheal.core import timing
from gpuheal.core.heal_state import HealState, num
from gpuheal.core.memory import Memory
from gpuheal.core.trend import Fit, fit_window
from gpuheal.model import UNREACHABLE_STATES, GpuSample, Observation, SourceTrend
from gpuheal.signals import ALWAYS, Signal, per_gpu, serves_task_loop
from gpuheal.source_kinds import home, spec


class History(Protocol):
    """What a view reads of the recorded past: the per-poll samples, as columns per alias
    (``{"t": [...], "vram_used_mb": [...], ...}``). :class:`gpuheal.state.history.History` is one;
    declared here so that the pure core does not import the state layer (issue 10, item 3)."""

    raw: dict[str, dict[str, list[Any]]]


ParamsT = TypeVar("ParamsT", bound=EngineParams)
NUMBER = (int, float)  # what a recorded rate must be (a tuple: isinstance need not build a union each time)
NO_PARAMS: Mapping[str, Any] = MappingProxyType({})  # a rule without defaults (its record then says what is missing)


# A stored time, or None for anything that is not a finite number (damaged state).
epoch_or_none = num


@dataclass(frozen=True)
class Verifying:
    """An attempt ``heal`` executed and whose own verification passed in that run (a restart:
    ``/health``, then a real completion), waiting for fresh data (contract "Issue state after a
    remediation"). Its issue reads ``verifying`` until a poll from ``judge_from_s`` on sees it still
    broken (then ``firing`` again, and the attempt fails) or it resolves.

    ``judge_from_s``: the end of the startup grace when the attempt restarted the GPU (the first
    poll that evaluates the GPU again), else the attempt's ``verify_by`` (shedding load takes
    minutes to cool a GPU: still hot a minute later is not "still broken")."""

    since: str
    acted_s: float
    judge_from_s: float
    actions: tuple[str, ...]


@dataclass(frozen=True)
class Restarts:
    """``heal``'s record the rules read (``heal-state.json``): ``restarts`` ``{ALIAS: [epoch_s, ...]}``
    (the startup grace) and the executed attempts being verified (``attempts`` with status
    ``pending``; :class:`Verifying`, keyed by ``(gpu, issue)``)."""

    last: dict[str, float]
    grace_s: float
    verifying: dict[tuple[str, str], Verifying] = field(default_factory=dict)

    @classmethod
    def from_heal_state(cls, state: HealState, grace_s: float) -> Restarts:
        last = {alias: max(times) for alias, times in state.restarts.items() if times}
        all_times = {alias: set(times) for alias, times in state.restarts.items() if times}
        return cls(last=last, grace_s=float(grace_s), verifying=_verifying(state, all_times, float(grace_s)))

    def window_starts(self) -> dict[str, float]:
        """Where a restarted GPU's trend window starts (its last restart plus the startup grace), as
        Rule 2's history path restarts its fit there; a source computing trends runs that GPU's own window
        then (``Window.restarts``)."""
        return {alias: t + self.grace_s for alias, t in self.last.items()}


def _verifying(state: HealState, restarts: dict[str, set[float]], grace_s: float) -> dict[tuple[str, str], Verifying]:
    """The ``pending`` attempts (executed, their own verification passed) of the heal state; one
    without its occurrence (``since``) or its start time is skipped (a damaged state never crashes a run)."""
    out: dict[tuple[str, str], Verifying] = {}
    for a in state.attempts.values():
        if a.status != "pending" or a.since is None or a.started_at is None:
            continue
        acted, verify_by = a.started_at, a.verify_by
        restarted = acted in restarts.get(a.gpu, ())
        judge_from = acted + grace_s if restarted else (verify_by if verify_by is not None else acted)
        known = out.get((a.gpu, a.issue))
        if known is None or known.acted_s < acted:
            out[(a.gpu, a.issue)] = Verifying(since=a.since, acted_s=acted, judge_from_s=judge_from, actions=a.actions)
    return out


NO_RESTARTS = Restarts(last={}, grace_s=0.0)


@dataclass(frozen=True)
class SourceFit(Fit):
    """A :class:`Fit` the data source computed (Prometheus: ``deriv`` over the window, issue 13)
    instead of one fitted here from the history; ``halves`` are the slopes of the window's two
    halves (Rule 2's "sustained"), ``None`` when not measured."""

    halves: tuple[float, float] | None = None


def source_fit(trend: SourceTrend, now_s: float, last_v: float) -> SourceFit:
    return SourceFit(
        slope=trend.slope,
        n=trend.n,
        first_t=now_s - trend.span_s,
        last_t=now_s,
        last_v=last_v,
        per_s=trend.per_s,
        halves=trend.halves,
    )


class FleetView:
    """Read-only queries over one poll plus the recorded past."""

    def __init__(
        self,
        cfg: Config,
        now_s: float,
        obs: Observation | None,
        history: History,
        bench: dict[str, Any],
        memory: Memory | Mapping[str, Any],
        restarts: Restarts = NO_RESTARTS,
        tolerance_s: float | None = None,
    ) -> None:
        """``memory``: the issue book's store, or its stored form (``issues.json``'s ``memory``);
        ``tolerance_s``: the cadence's tolerance when it is not the history's (an in-run re-probe's)."""
        self.cfg = cfg
        self.now_s = now_s
        self.obs = obs
        self.history = history
        self.bench = bench
        self.memory = memory if isinstance(memory, Memory) else Memory.from_json(memory)
        self.restarts = restarts
        self.gpus: dict[str, GpuConfig] = {g.alias: g for g in cfg.gpus}
        self.aliases: tuple[str, ...] = tuple(self.gpus)
        self.cache: dict[tuple[Any, ...], Any] = {}  # per-evaluation memo, shared by rules
        self._tolerance_s: float | None = tolerance_s

    @property
    def tolerance_s(self) -> float:
        """How far from a threshold a duration still counts as the threshold (core/timing): a quarter
        of the poll cadence the history shows, at most 15 s."""
        if self._tolerance_s is None:
            times = next((c["t"] for c in self.history.raw.values() if len(c["t"]) > 1), [])
            self._tolerance_s = timing.tolerance(times)
        return self._tolerance_s

    # ------------------------------------------------------------------ config
    def rule_params(self, rule_id: str, params_type: type[ParamsT], subject: str) -> ParamsT:
        """The rule's typed parameter record for ``subject`` (a GPU alias, or ``fleet``: the fleet's
        values), built once per config (:meth:`Config.rule_record`)."""
        gpu = self.gpus.get(subject)  # asked for every rule of every GPU
        merged = (self.cfg.rules if gpu is None else gpu.rules).get(rule_id, NO_PARAMS)
        return self.cfg.rule_record(params_type, merged)

    def gpu(self, alias: str) -> GpuConfig:
        return self.gpus[alias]

    # ------------------------------------------------------------------ this poll
    @property
    def monitor_ok(self) -> bool | None:
        """Whether gpu-monitor was usable this poll; ``None`` when there was no poll (bench-only)."""
        return None if self.obs is None else self.obs.monitor_ok

    def sample(self, alias: str) -> GpuSample | None:
        """This poll's reading of ``alias``; ``None`` if the GPU is missing from the poll."""
        if self.obs is None:
            return None
        return self.obs.gpus.get(alias)

    def provided(self, subject: str) -> frozenset[Signal]:
        """The signals this poll delivered for ``subject`` (a GPU alias, or ``fleet``): what the poll's
        source declares (``gpuheal.source_kinds``) when it delivered, and the GPU's own llama-server probe."""
        key = ("provided", subject)
        if key not in self.cache:  # asked by every rule of every GPU: once per GPU and poll
            self.cache[key] = self._provided(subject)
        provided: frozenset[Signal] = self.cache[key]
        return provided

    def _provided(self, subject: str) -> frozenset[Signal]:
        obs = self.obs
        if obs is None:  # bench-only: gpuheal's own results
            return frozenset({Signal.BENCHMARK})
        source = spec(obs.source)
        base = source.provides if obs.readings_ok else source.provides & {Signal.SOURCE_HEALTH}
        sample = obs.gpus.get(subject)
        if sample is None:  # the fleet, or a GPU missing from the poll
            return base | ALWAYS if subject not in self.gpus else frozenset(base & {Signal.SOURCE_HEALTH})
        provided = per_gpu(base, serves_metrics=sample.metrics != "disabled" if sample.metrics else None,
                           reachable=self.reachable(subject),
                           serves_task_loop=serves_task_loop(sample.metrics, sample.slots, sample.canary))
        if sample.litellm_requests_total is not None:  # LiteLLM's own counters (issue 20)
            provided |= {Signal.FAILURE_RATIO, Signal.REQUEST_SHARE}
        if sample.routing is not None:  # LiteLLM's spend logs (issue 22)
            provided |= {Signal.REQUEST_SHARE}
        return provided

    def gap(self, subject: str) -> frozenset[Signal]:
        """What the configured source declares but this poll did not deliver (gpu-monitor down, its
        Rule 7.3 fallback answering): a rule with alternatives reads a finding of such a signal as
        "not known" this poll, never as quiet (issue 19: the hold neither advances nor resets)."""
        if self.obs is None:
            return frozenset()
        return spec(home(self.obs.source)).provides - self.provided(subject)

    def _trend_from_source(self) -> bool:
        """The poll's source computed the trends itself (it keeps its own history: Prometheus); a
        per-poll source's readings are fitted over gpuheal's own history, whichever it was."""
        return self.obs is not None and spec(self.obs.source).computes_trends

    def monitor_sample(self, alias: str) -> GpuSample | None:
        """The reading, only when gpu-monitor was usable this poll (its fields are trusted)."""
        if self.obs is None or not self.obs.monitor_ok:
            return None
        return self.obs.gpus.get(alias)

    def endpoint(self, alias: str) -> str | None:
        s = self.sample(alias)
        return None if s is None else s.endpoint

    def reachable(self, alias: str) -> bool | None:
        """The direct probe got an HTTP answer (``None``: not probed / not known)."""
        state = self.endpoint(alias)
        if state is None:
            return None
        return state not in UNREACHABLE_STATES

    # ------------------------------------------------------------------ restarts
    def last_restart(self, alias: str) -> float | None:
        return self.restarts.last.get(alias)

    def muted(self, alias: str) -> bool:
        """Inside the startup grace after ``heal`` restarted this GPU (issue 4: the rules of a
        freshly restarted host are muted while the model loads)."""
        last = self.restarts.last.get(alias)
        if last is None or self.now_s < last:
            return False
        return timing.less_than(self.now_s - last, self.restarts.grace_s, self.tolerance_s)

    # ------------------------------------------------------------------ history
    def columns(self, alias: str) -> dict[str, list[Any]] | None:
        return self.history.raw.get(alias)

    def vram_fit(self, alias: str, window_s: float, jump_mb: float | None) -> Fit | None:
        """Least squares of VRAM (MB per hour) over the window; the window starts after the last
        restart's grace, and again after any jump of ``jump_mb`` between consecutive samples (an
        external reload), so a reload never looks like a leak (Rule 2)."""
        key = ("vram", alias, window_s, jump_mb)
        fit: Fit | None
        if key in self.cache:
            fit = self.cache[key]
            return fit
        sample = self.sample(alias)
        if self._trend_from_source():
            fit = None  # the source computed the trend (PromQL), or nothing is known
            if sample is not None and sample.vram_trend is not None and sample.vram_used_mb is not None:
                fit = source_fit(sample.vram_trend, self.now_s, sample.vram_used_mb)
            self.cache[key] = fit
            return fit
        cols = self.history.raw.get(alias)
        fit = None
        if cols:
            start, end = timing.window(self.now_s, window_s, self.tolerance_s)
            last = self.restarts.last.get(alias)
            if last is not None:
                start = max(start, timing.since(last + self.restarts.grace_s, self.tolerance_s))
            fit = fit_window(cols["t"], cols["vram_used_mb"], start, end, 3600.0, jump_mb)
        self.cache[key] = fit
        return fit

    def sub_fit(self, alias: str, metric: str, start_s: float, end_s: float, per_s: float) -> Fit | None:
        """A fit over ``[start_s, end_s]``, each bound taking the samples within the tolerance of it
        (a sample at a window's midpoint belongs to both halves at any clock jitter)."""
        cols = self.history.raw.get(alias)
        if not cols:
            return None
        tol = self.tolerance_s
        return fit_window(cols["t"], cols[metric], start_s - tol, end_s + tol, per_s)

    def temp_rise(self, alias: str, window_s: float) -> Fit | None:
        """Least squares of temperature (°C per minute) over the last ``window_s`` (Rule 8)."""
        key = ("temp", alias, window_s)
        fit: Fit | None
        if key in self.cache:
            fit = self.cache[key]
            return fit
        sample = self.sample(alias)
        if self._trend_from_source():
            fit = None
            if sample is not None and sample.temp_trend is not None and sample.temp_c is not None:
                fit = source_fit(sample.temp_trend, self.now_s, sample.temp_c)
            self.cache[key] = fit
            return fit
        cols = self.history.raw.get(alias)
        fit = None
        if cols:
            start, end = timing.window(self.now_s, window_s, self.tolerance_s)
            fit = fit_window(cols["t"], cols["temp_c"], start, end, 60.0)
        self.cache[key] = fit
        return fit

    def vram_total_mb(self, alias: str) -> float | None:
        s = self.sample(alias)
        if s is not None and s.vram_total_mb:
            return s.vram_total_mb
        return self.gpus[alias].vram_total_mb

    # ------------------------------------------------------------------ benchmarks
    def bench_results(self, alias: str) -> Sequence[dict[str, Any]]:
        """Every recorded result of ``alias`` (gpuheal's ``bench`` and new monitor measurements),
        oldest first: a list, or from the index a :class:`~gpuheal.benchdata.IndexedResults` (its newest
        results built, older ones as they are read: read from the newest back where that is enough)."""
        results: Sequence[dict[str, Any]] = self.bench.get("results", {}).get(alias, [])
        return results

    def bench_ok(self, alias: str, since_s: float | None = None) -> list[dict[str, Any]]:
        """The successful results of ``alias`` (a positive ``gen_tok_s``) from ``since_s`` on, oldest first.
        A week of results is read for every GPU at every poll (Rules 4 and 9): the bound is worked out
        once, not once per result."""
        key = ("bench_ok", alias, since_s)
        if key not in self.cache:
            floor = None if since_s is None else timing.since(since_s, self.tolerance_s)
            self.cache[key] = [
                r
                for r in self.bench_results(alias)
                if r.get("ok")
                and isinstance(r.get("gen_tok_s"), NUMBER)
                and r["gen_tok_s"] > 0
                and (floor is None or r["at"] >= floor)
            ]
        ok: list[dict[str, Any]] = self.cache[key]
        return ok

    def bench_ok_last(self, alias: str, since_s: float, count: int) -> list[dict[str, Any]]:
        """``bench_ok(alias, since_s)[-count:]`` — the last ``count`` successful results from ``since_s`` on,
        oldest first — read from the newest back, stopping at the ``count``-th: Rule 9 reads the last few of a
        week of results for every GPU at every poll. The results are benchdata's (``normalise``: objects with a
        numeric ``at``), so a result not read has nothing to say about the answer. ``count`` >= 1 (the schema's
        minimum of Rule 9's ``samples``): empty exactly when ``bench_ok`` is."""
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        cached: list[dict[str, Any]] | None = self.cache.get(("bench_ok", alias, since_s))
        if cached is not None:
            return cached[-count:]
        floor = timing.since(since_s, self.tolerance_s)
        found = []
        for r in reversed(self.bench_results(alias)):
            if r.get("ok") and isinstance(r.get("gen_tok_s"), NUMBER) and r["gen_tok_s"] > 0 and r["at"] >= floor:
                found.append(r)
                if len(found) == count:
                    break
        found.reverse()
        return found

    def baseline(self, alias: str) -> tuple[float | None, str]:
        return benchdata.baseline(self.bench, alias, self.gpus[alias].baseline_tok_s)


# --------------------------------------------------------------------------- public trend objects


def last_known(cols: dict[str, list[Any]] | None, metric: str) -> tuple[float, float] | None:
    """(t, value) of the newest known sample of ``metric``."""
    if not cols:
        return None
    ts, vs = cols["t"], cols[metric]
    for i in range(len(vs) - 1, -1, -1):
        if vs[i] is not None:
            return ts[i], vs[i]
    return None
