"""Rule 9's remedy hooks: a context change's re-benchmark, through the one re-benchmark mechanism
(:mod:`gpuheal.core.rebench`, the one Rule 4's fixes use). Pure.

- :func:`asks` (``Remedy.asks``) — after each poll's fold: every change of Rule 9's memory still
  waiting for its verdict (pending, or at a perf loss, judged again by each later result) is an ask —
  so a change stored by an older release, before asks had a store, is asked for too — with the audit
  line of the change this poll saw (from, to, when: a re-benchmark is due);
- :func:`rebenched` (``Remedy.rebenched``) — in ``bench``: the verdict kept in the GPU's row
  (:func:`~gpuheal.rules.context_window.change.verdict_on`), its audit line when the verdict is new,
  and a new perf loss told to the humans once per change (the spec's "Escalate: If context can't be
  adjusted without significant perf loss": the GPU, the old and new ``n_ctx``, the tok/s before and
  after, the ``--ctx-size`` to go back to — issue 27 item 3). Every verdict is shown by ``bench``
  (``context_changes``); a perf loss keeps its ask open.
"""

from __future__ import annotations

from gpuheal.clock import format_epoch
from gpuheal.core.memory import Memory
from gpuheal.core.rebench import Raised, Rebenched, Told
from gpuheal.rules.context_window import change as cc


def asks(memory: Memory, now_s: float) -> tuple[Raised, ...]:
    """The re-benchmarks Rule 9's memory holds; the audit line of a change seen at this poll (``now_s``)."""
    out = []
    for alias, row in cc.rows(memory).items():
        record = row.change
        if record is None or record.state not in (cc.AWAITING_BENCH, cc.PERF_LOSS):
            continue
        line = None
        if record.state == cc.AWAITING_BENCH and record.at_s == now_s:
            line = cc.detected_audit(cc.change_of(alias, record), format_epoch, "")
            del line["run_id"]  # the answerer's: this run's
        out.append(Raised(cc.ask_for(alias, record), line))
    return tuple(out)


def rebenched(r: Rebenched) -> Told:
    """What a context change's re-benchmark says (module docstring); nothing when the GPU's change is no
    longer the one asked about (a newer change has its own ask)."""
    verdict = cc.verdict_on(r.memory, r.ask, r.result, r.measure, r.results)
    if verdict is None:
        return Told()
    audit, alerts = [], []
    if verdict.is_news:  # a perf loss judged again the same is no new line
        line = cc.verdict_audit(verdict, r.now_iso, format_epoch, "")
        del line["run_id"]
        if verdict.state == cc.PERF_LOSS:
            from gpuheal.core.alerts import issue_alert  # only bench tells the humans: not on check's path

            message = cc.loss_message(verdict, format_epoch)
            line["reason"] = message
            detected = {**cc.verdict_fields(verdict, format_epoch), "before_tok_s": verdict.before_tok_s,
                        "ctx_size_back": cc.ctx_size_back(verdict)[0]}
            # keyed by the change (its time): judged again, the same change is never told twice
            alerts.append(issue_alert(verdict.change.gpu, cc.ISSUE, "escalated", format_epoch(verdict.change.at_s),
                                      r.now_s, message, run_id=None, detected=detected, tried=[], attempts=0))
        audit.append(line)
    return Told(tuple(audit), tuple(alerts), section="context_changes",
                shown=cc.verdict_fields(verdict, format_epoch), keep=verdict.state == cc.PERF_LOSS)
