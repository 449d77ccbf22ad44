"""Rule 4: benchmark regression — generation tok/s more than 20 % below baseline over 3+
benchmarks (not one slow run).

Judged by :func:`gpuheal.benchdata.regression_state` over the recorded results (``bench`` runs, and
gpu-monitor measurements that carried a new ``measured_at``; excluded-from-baseline results still
count), the same function that writes ``benchmark-regression.json``, so the file and the issue never
disagree: a regression starts with ``min_results`` consecutive results below ``baseline × (1 −
drop_ratio)`` and lasts until a result is back within ``recovered_within_ratio`` (10 %) of the baseline
(the spec's verify); results older than ``max_age_h`` say nothing now. The baseline is the rolling
30-day one once computed, else the config's seed (Design Decision 6). ``since`` is the first slow
result of the run. The evidence carries what Rule 4's fixes check: utilisation, power, heat.
"""

from __future__ import annotations

from typing import Any, Final

from gpuheal import benchdata
from gpuheal.config.model import RemedyParams
from gpuheal.core.issue import Finding
from gpuheal.core.remedy import Incident, Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.rules._util import THERMAL, num, show
from gpuheal.rules.benchmark_regression import remedy
from gpuheal.signals import Need, Signal, needs

ID: Final = "benchmark-regression"
SCOPE: Final = "gpu"
SEVERITY: Final = "warning"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.BENCHMARK)
INHIBITS: Final = None
JUDGED_FROM_BENCH: Final = True
recovered: Final = None  # regression_state says when a result is back near the baseline
hold: Final = None  # the engine's: min_results slow results are the hold
remember: Final = None


class Params(RemedyParams):
    drop_ratio: float  # a result more than this share below the baseline is slow
    min_results: int  # this many consecutive slow results start a regression (not one slow run)
    recovered_within_ratio: float  # it ends with a result back within this share of the baseline
    max_age_h: float  # results older than this say nothing now

    @property
    def rebench_floor_ratio(self) -> float:
        """A fix's re-benchmark proves it back at this share of the baseline ("within 10% of baseline")."""
        return 1 - self.recovered_within_ratio


def state(view: FleetView, alias: str, p: Params) -> tuple[float | None, str, dict[str, Any]]:
    baseline, source = view.baseline(alias)
    key = ("regression", alias, baseline)
    if key not in view.cache:
        view.cache[key] = benchdata.regression_state(
            view.bench,
            alias,
            baseline,
            drop_ratio=p.drop_ratio,
            min_results=p.min_results,
            recovered_within_ratio=p.recovered_within_ratio,
            since_s=view.now_s - p.max_age_h * 3600,
        )
    st: dict[str, Any] = view.cache[key]
    return baseline, source, st


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    baseline, source, st = state(view, alias, p)
    if st["trend"] == "unknown":
        return None
    if st["trend"] != "regressing" or not baseline:  # without a baseline it is "unknown" above
        return False
    current = st["current_tok_s"]
    recent = [r["gen_tok_s"] for r in view.bench_ok(alias, view.now_s - p.max_age_h * 3600)]
    sample = view.sample(alias)
    detected = {
        "baseline_tok_s": num(baseline, 2),
        "baseline_source": source,
        "current_tok_s": num(current, 2),
        "recent_tok_s": [num(v, 2) for v in recent[-p.min_results :]],
        "threshold_tok_s": st["threshold_tok_s"],
        "recovered_tok_s": st["recovered_tok_s"],
        "drop_pct": num(100 * (1 - current / baseline)),
        "slow_run": st["slow_run"],
        "util_pct": None if sample is None else sample.util_pct,
        "power_w": None if sample is None else sample.power_w,
        "power_limit_w": None if sample is None else sample.power_limit_w,
        "temp_c": None if sample is None else sample.temp_c,
    }
    return Finding(
        detected,
        f"{alias} at {show(current)} tok/s, {show(100 * (1 - current / baseline), 0)} % below its "
        f"baseline {show(baseline)} tok/s over {p.min_results}+ benchmarks",
        started_at=st["regressing_since"],
    )


REMEDY: Final = Remedy(
    ("snapshot-processes", "restore-power-limit"),
    why_escalate="persistent regression — possible hardware degradation (Rule 4)",
    # a hot GPU's regression is one incident with its thermal issue (Rule 4.3): carried in the messages
    # of the tiers above the lowest, and planned as part of them (remedy.guard)
    incident=Incident(THERMAL, 0),
    guard=remedy.guard,
    conclude=remedy.conclude,
)
