"""The spec's ``vram-trend`` object of one GPU (``vram-trend.json``, ``gpuheal trend``): Rule 2's own fit,
over its own window, so that what the file shows is what the rule judges. Pure."""

from __future__ import annotations

from typing import Any

from gpuheal.core.view import FleetView, last_known


def vram_trend(view: FleetView, alias: str) -> dict[str, Any]:
    """The least-squares fit Rule 2 uses, over its window (restarted after a restart's grace or a
    reload); ``rate_mb_per_hour`` is ``None`` until two samples exist, ``projected_full_in_hours`` is
    ``None`` unless VRAM is growing and the total is known."""
    from gpuheal.rules.vram_leak import ID, Params  # the rule module's own record (it imports none of this)

    p = view.rule_params(ID, Params, alias)
    fit = view.vram_fit(alias, p.window_h * 3600, p.reload_jump_mb)
    last = last_known(view.columns(alias), "vram_used_mb")
    current = fit.last_v if fit is not None else (last[1] if last else None)
    total = view.vram_total_mb(alias)
    rate = fit.slope if fit is not None else None
    full_in = None
    if rate is not None and rate > 0 and total and current is not None:
        full_in = round(max(total - current, 0.0) / rate, 2)
    return {
        "gpu": alias,
        "current_mb": current,
        "rate_mb_per_hour": None if rate is None else round(rate, 1),
        "projected_full_in_hours": full_in,
        "samples": 0 if fit is None else fit.n,
        "span_h": 0.0 if fit is None else round(fit.span_s / 3600, 2),
    }
