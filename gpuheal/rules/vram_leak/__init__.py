"""Rule 2: VRAM leak — least-squares growth over the 6 h window at or above the GPU's tier.

Tiered thresholds per GPU (300 / 300 / 200 MB/h; ``vram_leak_mb_per_hour`` in the config). The fit
needs ``min_samples`` samples spanning ``min_span_h`` of the window, else the rule does not know
(a young window neither fires nor clears). The window restarts after ``heal``'s last restart (plus
its startup grace) and after any jump of ``reload_jump_mb`` between consecutive samples (an
external reload), so a reload never reads as a leak. "Sustained": each half of the window must
also grow at ``sustain_ratio`` of the threshold, so one step up (a bigger KV cache allocated once)
is not a leak. Recovers when the rate drops below the threshold (the spec's verify), fitted over
``recover_span_h`` (2 h) of fresh data.

The fix ("If llama-server is the growth source → restart with memory cap flag; if unknown process
→ kill and alert") acts on the process that GREW between a per-process snapshot at onset and one
at fire time (``attribution.py``; the hooks in ``remedy.py``). Not attributable: escalate with both snapshots, no
restart — the spec restarts llama-server only when it *is* the source, and a restart on a guess
frees the VRAM for an hour while the real source keeps growing.
"""

from __future__ import annotations

from typing import Final

from gpuheal.config.model import RemedyParams
from gpuheal.core import timing
from gpuheal.core.issue import Finding, IssueRecord
from gpuheal.core.remedy import Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.trend import Fit
from gpuheal.core.view import FleetView, SourceFit
from gpuheal.rules._util import num, show
from gpuheal.rules.vram_leak import remedy
from gpuheal.signals import Need, Signal, needs, trend

ID: Final = "vram-leak"
SCOPE: Final = "gpu"
SEVERITY: Final = "warning"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.VRAM, trend(
    Signal.VRAM_TREND, "window_h", unit_s=3600.0, spans=("min_span_h", "recover_span_h"),
    sustained=("mb_per_hour", "sustain_ratio"), restarts=True))
INHIBITS: Final = None
JUDGED_FROM_BENCH: Final = False
hold: Final = None  # the engine's hold_polls / hold_s (the fit itself spans hours)
remember: Final = None


class Params(RemedyParams):
    window_h: float  # the least-squares window
    min_samples: int  # a fit needs this many samples ...
    min_span_h: float  # ... spanning this much of the window, else not known
    mb_per_hour: float  # the GPU's tier: growth at or above this is a leak (vram_leak_mb_per_hour)
    sustain_ratio: float  # each half of the window grows at this share of the threshold too
    reload_jump_mb: float  # a jump this big between two samples is a reload: the window restarts
    recover_span_h: float  # recovery is fitted over this much fresh data (after a restart) ...
    recover_min_samples: int  # ... and this many samples


def _fit(view: FleetView, alias: str, p: Params, min_span_h: float, min_samples: int) -> Fit | None:
    fit = view.vram_fit(alias, p.window_h * 3600, p.reload_jump_mb)
    if fit is None or fit.n < min_samples or not timing.at_least(fit.span_s, min_span_h * 3600, view.tolerance_s):
        return None
    return fit


def _sustained(view: FleetView, alias: str, fit: Fit, threshold: float, ratio: float) -> bool:
    if isinstance(fit, SourceFit):  # a fit the source computed (Prometheus, issue 13)
        if fit.halves is None:
            return False  # the source measured no halves: not shown to be sustained
        return all(part >= threshold * ratio for part in fit.halves)
    mid = (fit.first_t + fit.last_t) / 2
    for lo, hi in ((fit.first_t, mid), (mid, fit.last_t)):
        part = view.sub_fit(alias, "vram_used_mb", lo, hi, 3600.0)
        if part is None or part.slope < threshold * ratio:
            return False
    return True


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    fit = _fit(view, alias, p, p.min_span_h, p.min_samples)
    if fit is None:
        return None
    threshold = p.mb_per_hour
    if fit.slope < threshold or not _sustained(view, alias, fit, threshold, p.sustain_ratio):
        return False
    total = view.vram_total_mb(alias)
    full_in = (total - fit.last_v) / fit.slope if total and fit.slope > 0 else None
    return Finding(
        {
            "rate_mb_per_hour": num(fit.slope),
            "threshold_mb_per_hour": threshold,
            "current_mb": fit.last_v,
            "vram_total_mb": total,
            "projected_full_in_hours": num(max(full_in, 0.0), 2) if full_in is not None else None,
            "samples": fit.n,
            "span_h": num(fit.span_s / 3600, 2),
        },
        f"{alias} VRAM growing {show(fit.slope, 0)} MB/h over {show(fit.span_s / 3600, 1)} h "
        f"(threshold {show(threshold, 0)} MB/h)",
    )


def recovered(view: FleetView, alias: str, p: Params, record: IssueRecord) -> bool | None:
    """The growth rate is below the threshold, fitted over at least ``recover_span_h`` of the
    (possibly restarted) window: after a restart, a couple of flat hours prove the fix without
    waiting for a whole new 6 h window, and a leak that persists shows again within them."""
    fit = _fit(view, alias, p, p.recover_span_h, p.recover_min_samples)
    if fit is None:
        return None
    return fit.slope < p.mb_per_hour


REMEDY: Final = Remedy(
    ("snapshot-processes", "restart-llama-server-memcap"),
    why_escalate="leak persists after restart — hardware investigation (Rule 2)",
    state_file=remedy.STATE_FILE,
    track=remedy.track,
    guard=remedy.guard,
    before_step=remedy.before_step,
)
