"""Rule 4's readings from gpu-monitor: its ``benchmarks`` entry, folded into the recorded results before
the rules judge the poll (contract "Rule 4"), so ``check`` and ``replay`` see the same results.

A measurement counts only with a new ``measured_at``; one from more than 5 minutes ahead is a clock
problem, not a measurement. A result taken inside a startup grace or while the GPU has a firing (non-info)
issue is ``excluded`` from the baseline (issue 5), and still counts for the "3+ benchmarks". gpu-monitor's
own baseline is kept as Rule 4's seed when the config has none (issue 27 item 14).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable
from typing import Any

from gpuheal import benchdata
from gpuheal.core import timing
from gpuheal.core.issue import FIRING, IssueRecord
from gpuheal.core.view import FleetView
from gpuheal.model import GpuSample

FUTURE_SLACK_S = 300.0  # a measurement further ahead of the poll than this is a clock problem


def ingest(bench: dict[str, Any], view: FleetView, records: Iterable[IssueRecord]) -> bool:
    """Fold the poll's gpu-monitor measurements and baselines into ``bench`` (the results the view reads,
    before any rule reads them); ``records``: the issue book's (a GPU with a firing one is in an incident).
    Returns whether ``bench`` changed, so an unchanged one is not rewritten every poll. Nothing without a
    usable gpu-monitor answer. Time is the poll's own (``obs.at``). A measurement is recorded whole (every
    field of a result), newer than its GPU's last recorded one (:func:`gpuheal.state.bench_store.save_recorded`
    relies on both)."""
    obs = view.obs
    if obs is None or not obs.monitor_ok:
        return False
    now_s = obs.at.timestamp()
    incidents = {rec.gpu for rec in records if rec.state == FIRING and rec.severity != "info"}
    changed = False
    for alias in view.aliases:
        sample = obs.gpus.get(alias)
        if sample is None:
            continue
        at = _new_measurement(bench, alias, sample, now_s)
        if at is not None and sample.bench_tok_s is not None:
            reason = _excluded_because(view, alias, at, alias in incidents)
            items = bench["results"].setdefault(alias, [])
            insort(items, _result(at, sample.bench_tok_s, reason), key=lambda r: r["at"])
            changed = True
        if benchdata.note_monitor_baseline(bench, alias, sample.bench_baseline_tok_s, now_s):
            changed = True
    return changed


def _new_measurement(bench: dict[str, Any], alias: str, sample: GpuSample, now_s: float) -> float | None:
    """The time of ``sample``'s measurement when it is one to record (newer than the last one recorded,
    not from the future); ``None`` otherwise."""
    if sample.bench_tok_s is None or sample.bench_measured_at is None:
        return None
    at = sample.bench_measured_at.timestamp()
    if at > now_s + FUTURE_SLACK_S:
        return None
    items = bench["results"].get(alias, ())
    last_monitor = benchdata.last_monitor_at(items)
    if last_monitor is not None and at <= last_monitor:
        return None
    return at


def _excluded_because(view: FleetView, alias: str, at_s: float, in_incident: bool) -> str | None:
    last = view.restarts.last.get(alias)
    if last is not None and timing.within_last(at_s, last, view.restarts.grace_s):  # counted in polls (issue 9)
        return "startup grace"
    return "open incident" if in_incident else None


def _result(at_s: float, gen_tok_s: float, reason: str | None) -> dict[str, Any]:
    return {
        "at": at_s,
        "gen_tok_s": gen_tok_s,
        "prompt_tok_s": None,
        "tokens": None,
        "ok": True,
        "error": None,
        "source": "monitor",
        "model": None,
        "n_ctx": None,
        "excluded": reason is not None,
        "excluded_reason": reason,
    }
