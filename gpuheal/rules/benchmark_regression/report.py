"""``benchmark-regression.json``, the spec's benchmark-regression object per GPU, written by ``bench``
after recording its results. Pure: values in, values out (the step writes the file)."""

from __future__ import annotations

from typing import Any

from gpuheal import benchdata
from gpuheal.clock import format_epoch
from gpuheal.config.model import Config
from gpuheal.rules import api_key_mismatch
from gpuheal.rules.benchmark_regression import ID, Params


def regression_document(cfg: Config, data: dict[str, Any], now_s: float) -> dict[str, dict[str, Any]]:
    """``benchmark-regression.json`` (without ``schema_version``): one entry per configured GPU, with
    Rule 4's state over the recorded results (the very :func:`~gpuheal.benchdata.regression_state` its
    ``detect`` reads, with its own parameters) and a rejected key's alert (Lesson L1)."""

    def iso(epoch: float) -> str:
        return format_epoch(epoch)

    window_start = now_s - 30 * benchdata.DAY_S
    out: dict[str, dict[str, Any]] = {}
    for g in cfg.gpus:
        p = cfg.rule_record(Params, cfg.rule_params(ID, g.alias))
        base, source = benchdata.baseline(data, g.alias, g.baseline_tok_s)
        state = benchdata.regression_state(
            data,
            g.alias,
            base,
            drop_ratio=p.drop_ratio,
            min_results=p.min_results,
            recovered_within_ratio=p.recovered_within_ratio,
            since_s=now_s - p.max_age_h * 3600 if p.max_age_h else None,
        )
        alerts: list[dict[str, Any]] = []
        if state["trend"] == "regressing":
            drop = 100 * (1 - state["current_tok_s"] / base)
            alerts.append(
                {
                    "issue": ID,
                    "severity": "warning",
                    "since": iso(state["regressing_since"]),
                    "message": (
                        f"{state['current_tok_s']:.1f} tok/s, {drop:.0f}% below the baseline "
                        f"{base:.1f} (alert below {state['threshold_tok_s']:.1f}; "
                        f"recovered at {state['recovered_tok_s']:.1f})"
                    ),
                }
            )
        key_alert = api_key_mismatch.key_alert(data, g.alias, iso)
        if key_alert:
            alerts.append(key_alert)
        usable = [
            r for r in benchdata.ok_results(data, g.alias, window_start) if not r.get("excluded")
        ]
        out[g.alias] = {
            "gpu": g.alias,
            "baseline_tok_sec": base,
            "current_tok_sec": state["current_tok_s"],
            "trend": state["trend"],
            "alerts": alerts,
            "baseline_source": source,
            "samples": len(usable),
            "alert_below_tok_sec": state["threshold_tok_s"],
            "updated_at": iso(now_s),
        }
    return out
