"""Rule 9: context window optimisation — recommendations from benchmark tok/s vs baseline
(``info``: never changes the fleet's status).

The mean of the last ``samples`` successful results within ``max_age_h`` against the baseline:

- above ``headroom_above_ratio`` (110 %) → ``increase``: the context has headroom;
- below ``reduce_below_ratio`` (90 %) → ``reduce`` the context by ``reduce_by_ratio`` (25 %) and
  retest; or ``monitor`` when the GPU's ``settling`` param is true (the spec's Strix Halo case:
  "MONITOR but do not reduce yet — recent model swap may still be settling");
- otherwise optimal: no issue.

The spec says both "tok/s > baseline → headroom" and "within 10 % of baseline → optimal", and calls
the RTX 3090 at 74.9 / 74.8 tok/s (100 %) optimal; so "above baseline" means above the ±10 % optimal
band (``headroom_above_ratio`` 1.1 by default; set 1.0 for the literal reading).

The running context comes from the latest result's ``n_ctx`` (L3: running state, not docs), else the
config's ``n_ctx``. ``/props`` gives ``n_ctx`` per slot; llama-server's ``--ctx-size`` is shared by
its slots (``-np``), so the recommendation names the exact flag: the reduced per-slot context,
rounded down to 256 tokens, times the result's ``slots`` (llama-server.md: "Slots and context").

Verify and Escalate ("Re-benchmark after context change, confirm within 10% of target"; "If context
can't be adjusted without significant perf loss"): a change of the running context is seen between
polls (``memory.py``), asks for its re-benchmark and gets its verdict through the one re-benchmark
mechanism (``remedy.py``, :mod:`gpuheal.core.rebench`; judged in ``change.py``); while its re-benchmark is
below ``reduce_below_ratio`` of the target, this issue is that escalation (still ``info``; ``bench`` tells the
humans once per change, :func:`~gpuheal.rules.context_window.change.loss_message`).
"""

from __future__ import annotations

from typing import Final

from gpuheal.clock import format_epoch
from gpuheal.config.model import EngineParams
from gpuheal.core.issue import Finding
from gpuheal.core.remedy import Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.rules._util import num, show
from gpuheal.rules.context_window import change as context_change
from gpuheal.rules.context_window import remedy
from gpuheal.rules.context_window.memory import REMEMBER
from gpuheal.signals import Need, Signal, needs

ID: Final = "context-window"
SCOPE: Final = "gpu"
SEVERITY: Final = "info"
NEEDS: Final[tuple[Need, ...]] = needs(Signal.BENCHMARK)
INHIBITS: Final = None
JUDGED_FROM_BENCH: Final = True
recovered: Final = None  # back in the optimal band (detect quiet)
hold: Final = None  # the engine's hold_polls / hold_s
remember: Final = REMEMBER  # the running context, poll by poll (memory.py)


class Params(EngineParams):
    reduce_below_ratio: float  # mean tok/s below this share of the baseline: reduce the context
    headroom_above_ratio: float  # above this share: the context has headroom
    reduce_by_ratio: float  # the share of the context to cut
    samples: int  # the mean is over the last this many successful results ...
    max_age_h: float  # ... within this many hours
    settling: bool  # the GPU's model was just swapped: monitor, do not reduce yet

    @property
    def rebench_floor_ratio(self) -> float:
        """A context change's re-benchmark must reach this share of its target ("within 10 %")."""
        return self.reduce_below_ratio


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    escalated = context_change.escalation(view.memory, alias, format_epoch)  # Rule 9's "Escalate"
    if escalated is not None:
        return Finding(escalated, context_change.escalation_summary(alias, escalated))
    baseline, source = view.baseline(alias)
    since_s = view.now_s - p.max_age_h * 3600
    if p.samples >= 1:  # the schema's minimum: the last few, read from the newest back
        recent = view.bench_ok_last(alias, since_s, p.samples)
        results = recent  # empty exactly when every result is
    else:
        results = view.bench_ok(alias, since_s)
        recent = results[-p.samples :]
    if not baseline or not results:
        return None
    tok_s = sum(r["gen_tok_s"] for r in recent) / len(recent)
    ratio = tok_s / baseline
    n_ctx = next((r["n_ctx"] for r in reversed(recent) if isinstance(r.get("n_ctx"), int)), None)
    slots = next((r["slots"] for r in reversed(recent) if isinstance(r.get("slots"), int) and r["slots"] > 0), None)
    if n_ctx is None:
        n_ctx = view.gpu(alias).n_ctx
    suggested = ctx_size = None
    if ratio > p.headroom_above_ratio:
        recommendation = "increase"
        text = "context has headroom, consider increasing it"
    elif ratio < p.reduce_below_ratio:
        if p.settling:
            recommendation = "monitor"
            text = "monitor, do not reduce yet (model still settling)"
        else:
            recommendation = "reduce"
            if n_ctx:
                suggested = int(n_ctx * (1 - p.reduce_by_ratio))
            text = f"reduce the context by {show(100 * p.reduce_by_ratio, 0)} % and retest"
            if suggested:
                ctx_size = max(256, suggested // 256 * 256) * (slots or 1)
                each = f"{ctx_size // (slots or 1)} per slot x {slots} slots" if slots else "per slot: x -np if several"
                text += f": restart llama-server with --ctx-size {ctx_size} ({each})"
    else:
        return False
    return Finding(
        {
            "recommendation": recommendation,
            "gen_tok_s": num(tok_s, 2),
            "baseline_tok_s": num(baseline, 2),
            "baseline_source": source,
            "ratio_pct": num(100 * ratio),
            "results": len(recent),
            "n_ctx": n_ctx,
            "suggested_n_ctx": suggested,
            "ctx_size_arg": ctx_size,
        },
        f"{alias} at {show(100 * ratio, 0)} % of baseline ({show(tok_s)} / {show(baseline)} tok/s): {text}",
    )


# advice; a context change's perf loss is told once per change by ``bench`` (``change.py``), never reminded
REMEDY: Final = Remedy(automatic=False, why_escalate="", recommend=True, remind=False,
                       asks=remedy.asks, rebenched=remedy.rebenched)
