"""``gpuheal trend``: VRAM growth and temperature rise per GPU, from the recorded history — or, with a
source that computes trends where its data lives (Prometheus), from one poll of it, as ``check``.

The VRAM rate is the very least-squares fit Rule 2 judges (its 6 h window, restarted after a
restart or reload); the temperature rise is Rule 8's (°C/min over its few-minute window). Read-only
on the state directory except that, for the whole fleet, it refreshes ``vram-trend.json``.

``--json``::

    {"generated_at": ISO,
     "vram_trend": {ALIAS: {"gpu", "current_mb", "rate_mb_per_hour", "projected_full_in_hours",
                            "samples", "span_h"}},          # the vram-trend object
     "leak_threshold_mb_per_hour": {ALIAS: float},
     "temp_c": {ALIAS: float | null},                      # newest recorded temperature
     "temp_rise_c_per_min": {ALIAS: float | null},
     "attention": [{"gpu", "issue": ISSUE-ID, "detail"}]}     # Rule 2's leak, Rule 8's warning

Exit status: 0 done; 1 some GPU needs attention (a leak by Rule 2's test, or hotter than Rule 8's
tier-1 temperature and rising faster than its rate); 3 could not run (e.g. an unknown ``--gpu``).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuheal.config import Config
from gpuheal.core.engine import iso
from gpuheal.core.heal_state import HealState
from gpuheal.core.issue import Finding
from gpuheal.core.view import FleetView, Restarts, last_known
from gpuheal.errors import GpuhealError
from gpuheal.model import GpuSample, Observation
from gpuheal.state import files
from gpuheal.state.history import History

if TYPE_CHECKING:
    from gpuheal.runtime import CommandResult, Runtime
    from gpuheal.state.store import StateDir


NO_SAMPLE = GpuSample()


def build(cfg: Config, history: History, now_s: float, restarts: Restarts, aliases: tuple[str, ...],
          obs: Observation | None = None) -> dict[str, Any]:
    """``obs``: a poll of a source that computes the trends itself (Prometheus), read instead of the
    history it does not keep (:func:`source_poll`)."""
    from gpuheal import benchdata
    from gpuheal.rules import thermal_warning, vram_leak
    from gpuheal.rules.vram_leak.trend import vram_trend

    view = FleetView(cfg, now_s, obs, history, benchdata.empty(), {}, restarts)
    doc: dict[str, Any] = {
        "generated_at": iso(now_s),
        "vram_trend": {},
        "leak_threshold_mb_per_hour": {},
        "temp_c": {},
        "temp_rise_c_per_min": {},
        "attention": [],
    }
    for alias in aliases:
        trend = vram_trend(view, alias)
        leak_p = view.rule_params(vram_leak.ID, vram_leak.Params, alias)
        doc["vram_trend"][alias] = trend
        doc["leak_threshold_mb_per_hour"][alias] = leak_p.mb_per_hour
        last = last_known(view.columns(alias), "temp_c")
        temp = last[1] if last and now_s - last[0] <= 600 else None
        if obs is not None:  # the poll's own reading: no history is kept of it
            temp = (view.sample(alias) or NO_SAMPLE).temp_c
        warn_p = view.rule_params(thermal_warning.ID, thermal_warning.Params, alias)
        fit = thermal_warning.rise(view, alias, warn_p)  # Rule 8's rise over its window
        rise = None if fit is None else round(fit.slope, 2)
        doc["temp_c"][alias] = temp
        doc["temp_rise_c_per_min"][alias] = rise
        finding = vram_leak.detect(view, alias, leak_p)
        if isinstance(finding, Finding):
            doc["attention"].append({"gpu": alias, "issue": vram_leak.ID, "detail": finding.summary})
        if temp is not None and rise is not None and temp > warn_p.temp_c and rise > warn_p.rise_c_per_min:
            doc["attention"].append(
                {"gpu": alias, "issue": thermal_warning.ID, "detail": f"{alias} at {temp:g} °C rising {rise:g} °C/min"}
            )
    return doc


def source_poll(cfg: Config, store: StateDir, now: datetime) -> Observation | None:
    """A source that computes trends where its data lives (Prometheus: PromQL over each rule's window)
    keeps no history here, so ``trend`` asks it — one poll with its memory, as ``check`` does (issue 27
    defect 4: ``vram-trend.json`` was rewritten with null rates) — without writing that memory back.
    ``None`` for a per-poll source: its trends are fitted over the recorded history."""
    from gpuheal.sources.gpu_source import gpu_source

    if not gpu_source(cfg).spec.computes_trends:
        return None
    from gpuheal.core.heal_state import HealState
    from gpuheal.sources.sense import sense
    from gpuheal.state import files
    from gpuheal.steps.check import plan_check

    plan = plan_check(cfg, HealState.from_json(store.read(files.HEAL, {})), store, now)
    return sense(cfg, now, None, plan.recalled)


def command(rt: Runtime, store: StateDir, gpu: str | None = None) -> CommandResult:
    from gpuheal import exit_codes
    from gpuheal.runtime import CommandResult
    from gpuheal.state.history_store import load_history

    cfg = rt.cfg
    if gpu is not None and gpu not in cfg.aliases:
        raise GpuhealError(f"unknown GPU alias {gpu!r} (known: {', '.join(cfg.aliases)})", key_path="--gpu")
    aliases = (gpu,) if gpu else cfg.aliases
    history = load_history(store)
    restarts = Restarts.from_heal_state(HealState.from_json(store.read(files.HEAL, {})), cfg.heal.startup_grace_s)
    now_s = rt.now.timestamp()
    doc = build(cfg, history, now_s, restarts, aliases, source_poll(cfg, store, rt.now))
    if gpu is None:
        store.write_raw(files.VRAM_TREND, {"schema_version": 1, **doc["vram_trend"]})

    def render() -> None:
        from gpuheal.render.trend import render_trend

        render_trend(doc, history, now_s, cfg)

    return CommandResult(
        document=doc,
        exit_code=exit_codes.ATTENTION if doc["attention"] else exit_codes.OK,
        render=render,
    )
