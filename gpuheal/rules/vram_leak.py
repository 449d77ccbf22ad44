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
at fire time (core/vram_attribution.py). Not attributable: escalate with both snapshots, no
restart — the spec restarts llama-server only when it *is* the source, and a restart on a guess
frees the VRAM for an hour while the real source keeps growing.
"""

from __future__ import annotations

from gpuheal.core import timing
from gpuheal.core.engine import Finding
from gpuheal.rules._util import num, show
from gpuheal.signals import Need, Signal, needs

ID = "vram-leak"
SCOPE = "gpu"
SEVERITY = "warning"
NEEDS: tuple[Need, ...] = needs(Signal.VRAM, Signal.VRAM_TREND)


def _fit(view, alias, p, min_span_h=None, min_samples=None):
    fit = view.vram_fit(alias, float(p["window_h"]) * 3600, p.get("reload_jump_mb"))
    span_h = float(p["min_span_h"] if min_span_h is None else min_span_h)
    samples = p["min_samples"] if min_samples is None else min_samples
    if fit is None or fit.n < samples or not timing.at_least(fit.span_s, span_h * 3600, view.tolerance_s):
        return None
    return fit


def _sustained(view, alias, fit, threshold, ratio):
    halves = getattr(fit, "halves", None)  # a fit the source computed (Prometheus, issue 13)
    if halves is not None:
        return all(part >= threshold * ratio for part in halves)
    if getattr(fit, "halves", False) is None:
        return False  # the source measured no halves: not shown to be sustained
    mid = (fit.first_t + fit.last_t) / 2
    for lo, hi in ((fit.first_t, mid), (mid, fit.last_t)):
        part = view.sub_fit(alias, "vram_used_mb", lo, hi, 3600.0)
        if part is None or part.slope < threshold * ratio:
            return False
    return True


def detect(view, alias, p):
    fit = _fit(view, alias, p)
    if fit is None:
        return None
    threshold = float(p["mb_per_hour"])
    if fit.slope < threshold or not _sustained(view, alias, fit, threshold, float(p["sustain_ratio"])):
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


def recovered(view, alias, p, record):
    """The growth rate is below the threshold, fitted over at least ``recover_span_h`` of the
    (possibly restarted) window: after a restart, a couple of flat hours prove the fix without
    waiting for a whole new 6 h window, and a leak that persists shows again within them."""
    fit = _fit(view, alias, p, p.get("recover_span_h"), p.get("recover_min_samples"))
    if fit is None:
        return None
    return fit.slope < float(p["mb_per_hour"])
