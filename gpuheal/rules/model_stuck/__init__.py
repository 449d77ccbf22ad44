"""Rule 3: model inference timeout / GPU stuck — seen from gpu-monitor's request counts, or from
llama-server's own decode counters (issue 12). Either source may find it; ``detected["source"]``
says which.

**gpu-monitor**: more than 50 % of requests failing over the trailing 60 s, still so after a 30 s
grace. ``requests_60s``/``failures_60s`` are the 60 s window; the engine's hold is ``hold_polls`` (2)
and ``grace_s`` (30): at a 60 s cadence the issue fires at the 2nd consecutive bad poll (contract).
Fewer than ``min_requests`` requests is not enough to judge (one stuck request is not a stuck GPU):
not known. Recovers when the failure rate drops to ``clear_failure_ratio`` (the spec's verify: 0 %).

**llama-server ``/metrics``** (contract "Rule 3 from llama-server", ``memory.py``):
requests in flight and ``n_decode_total`` unchanged since the previous poll is a stalled poll; the
finding starts at the first poll of the run (``started_at``) and is reported from the 1st stalled
poll on, so the same hold — 2 polls and more than ``grace_s`` since the run began — fires it at the
3rd consecutive poll with requests in flight and no decode since the first of them. ``/health`` says
ok all along: this is the hung decode only the server's own counters show. A counter that went down
is a restart, never a stall. Recovers once a poll sees a decode, or nothing in flight.

**A hung task loop** (issue 20, :mod:`gpuheal.core.taskloop`): ``/health`` ok while ``/metrics``,
``/slots`` (and the canary completion, when configured) do not answer within the probe deadline is a
stalled poll — the failure of llama.cpp#27388, where ``/metrics`` itself hangs so no counter exists.
Same hold: the finding starts at the first stalled poll and fires at the 3rd. ``detected`` lists the
endpoints that answered and those that did not. A busy server answers ``/metrics`` between decode
steps, so it never stalls. Recovers once a task-loop endpoint answers.

**A model loading** (issue 29): while ``/health`` answers 503 ``Loading model`` (a deploy, an
``n_ctx`` change, any restart: a real server answers so on every path until the model is in memory),
the requests sent to it fail — a failure ratio of 100 % from gpu-monitor and from LiteLLM alike. That
server is doing what it was told, and a restart would only start its load over: no finding, whichever
source counts the failures (a pending one is dropped). A load that does not end is a fault of its own:
past ``loading_max_s`` since the first poll that saw it (``memory.py``), the rule finds it from
``/health`` alone (traffic or not), with the same hold; it recovers once ``/health`` says ok.
Prometheus's ``up`` cannot tell a loading server from a refused one, so through Prometheus a load is
not seen (Rule 6 reads ``up == 0``).

Deferred requests growing poll over poll while no request finishes are reported in ``detected``.
Needs the llama-server to answer its probe: a server that does not is Rule 6's. The rule reads
gpu-monitor only when it was usable this poll, so it works without gpu-monitor.
"""

from __future__ import annotations

from typing import Final

from gpuheal.config.model import RemedyParams
from gpuheal.core import timing
from gpuheal.core.issue import Finding, IssueRecord
from gpuheal.core.remedy import Remedy
from gpuheal.core.rule import Detection
from gpuheal.core.view import FleetView
from gpuheal.model import ENDPOINT_OK
from gpuheal.rules._util import num, show
from gpuheal.rules.model_stuck import remedy
from gpuheal.rules.model_stuck.memory import REMEMBER, decode_state, litellm_window, loading_since, taskloop_state
from gpuheal.signals import Need, Signal, needs

ID: Final = "model-stuck"
SCOPE: Final = "gpu"
SEVERITY: Final = "critical"
NEEDS: Final[tuple[Need, ...]] = needs(
    Signal.ENDPOINT, (Signal.FAILURE_RATIO, Signal.DECODE_PROGRESS, Signal.TASK_LOOP)
)
INHIBITS: Final = None
JUDGED_FROM_BENCH: Final = False

SOURCE_MONITOR = "gpu-monitor"
SOURCE_METRICS = "llama-server /metrics"
SOURCE_TASKLOOP = remedy.SOURCE_TASKLOOP
SOURCE_LITELLM = "LiteLLM /metrics"
SOURCE_LOADING = "llama-server /health"


class Params(RemedyParams):
    failure_ratio: float  # more than this share of requests failing is a bad poll
    min_requests: int  # fewer requests than this say nothing (one stuck request is not a stuck GPU)
    grace_s: float  # the finding fires only once it started more than this long ago
    clear_failure_ratio: float  # a firing issue clears at or below this share (the spec: 0 %)
    loading_max_s: float  # /health saying "Loading model" longer than this is a stuck load, not a load
    silent_hold_s: float  # a task loop answering nothing: its seconds of evidence within a run (min_probes)


def hold(p: Params) -> tuple[int, float]:
    return p.hold_polls, p.grace_s


remember: Final = REMEMBER  # decode progress, a hung task loop, LiteLLM's counters (memory.py)


def _counts(view: FleetView, alias: str) -> tuple[int, int, int | None] | None:
    sample = view.monitor_sample(alias)
    if sample is None or sample.requests_60s is None or sample.failures_60s is None:
        return None
    return sample.requests_60s, sample.failures_60s, sample.consecutive_timeouts


def _from_litellm(view: FleetView, alias: str, p: Params) -> Detection:
    """What users saw through LiteLLM since the previous poll (its ``prometheus`` callback, issue 20):
    the spec's "> 50 % failures over 60 s" without gpu-monitor."""
    window = litellm_window(view.memory, alias, view.now_s)
    if window is None or window[0] < p.min_requests:
        return None
    requests, failed = window
    ratio = failed / requests
    if ratio <= p.failure_ratio:
        return False
    return Finding(
        {"source": SOURCE_LITELLM, "failure_pct": num(100 * ratio), "threshold_pct": num(100 * p.failure_ratio),
         "requests": num(requests), "failures": num(failed), "endpoint": view.endpoint(alias)},
        f"{alias}: LiteLLM saw {show(failed, 0)} of {show(requests, 0)} requests fail since the last poll "
        f"({show(100 * ratio, 0)} % > {show(100 * p.failure_ratio, 0)} %)",
    )


def _from_monitor(view: FleetView, alias: str, p: Params) -> Detection:
    counts = _counts(view, alias)
    if counts is None:
        return None
    requests, failures, timeouts = counts
    if requests < p.min_requests:
        return None
    ratio = failures / requests
    if ratio <= p.failure_ratio:
        return False
    return Finding(
        {
            "source": SOURCE_MONITOR,
            "failure_pct": num(100 * ratio),
            "threshold_pct": num(100 * p.failure_ratio),
            "requests_60s": requests,
            "failures_60s": failures,
            "consecutive_timeouts": timeouts,
            "endpoint": view.endpoint(alias),
        },
        f"{alias}: {failures} of {requests} requests failed in 60 s "
        f"({show(100 * ratio, 0)} % > {show(100 * p.failure_ratio, 0)} %)",
    )


def _from_metrics(view: FleetView, alias: str) -> Detection:
    state = decode_state(view.memory, alias, view.now_s)
    if state is None:
        return None
    polls = state.polls
    if polls < 2:
        return False
    first_s = state.first_s
    sample = view.sample(alias)
    detected = {
        "source": SOURCE_METRICS,
        "requests_processing": state.busy,
        "requests_deferred": state.deferred,
        "deferred_growing_polls": state.deferred_growing,
        "n_decode_total": state.n,
        "polls_without_decode": polls,
        "slots_busy": None if sample is None else sample.slots_busy,
        "endpoint": view.endpoint(alias),
    }
    stalled_s = view.now_s - first_s if first_s is not None else None
    waiting = f", {state.deferred} deferred" if state.deferred else ""
    return Finding(
        detected,
        f"{alias}: {state.busy} request(s) in flight{waiting} and no decode for {polls} polls "
        f"({show(stalled_s, 0)} s) while /health says {view.endpoint(alias)}",
        started_at=first_s,
    )


def _from_taskloop(view: FleetView, alias: str, p: Params) -> Detection:
    """A hung task loop, held in seconds of evidence for ``silent_hold_s`` (not ``grace_s``) when re-probed
    within a run: the spec's 30 s grace is for its "> 50 % failure rate" ("not just a single stuck
    request"); a task loop that answers neither ``/metrics`` nor ``/slots`` is every request stuck — the hard
    fault issue 28 confirms in seconds, like a refused server (``host-unreachable``'s 20 s). A busy
    server answers ``/metrics`` between decode steps, so a long generation never reads silent. At cron's
    cadence the poll hold (``hold_polls`` and ``grace_s``) fires first, as before."""
    state = taskloop_state(view.memory, alias, view.now_s)
    if state is None:
        return None
    polls = state.polls
    if polls < 2:
        return False
    first_s = state.first_s
    silent, answered = list(state.silent), list(state.answered)
    detected = {"source": SOURCE_TASKLOOP, "answered": answered, "not_answered": silent,
                "polls_stalled": polls, "endpoint": view.endpoint(alias)}
    stalled_s = None if first_s is None else view.now_s - first_s
    return Finding(
        detected,
        f"{alias}: /health says ok but {', '.join(silent)} did not answer for {polls} polls "
        f"({show(stalled_s, 0)} s): the task loop is hung",
        started_at=first_s,
        evidence_hold_s=p.silent_hold_s,
    )


def _loading(view: FleetView, alias: str, p: Params, since_s: float) -> Detection:
    """A server loading its model: not stuck (``False``) until it has loaded for more than
    ``loading_max_s``; then stuck, from ``/health`` alone, since the load began."""
    loading_s = view.now_s - since_s
    if not timing.more_than(loading_s, p.loading_max_s, view.tolerance_s):
        return False
    return Finding(
        {"source": SOURCE_LOADING, "endpoint": view.endpoint(alias), "loading_s": num(loading_s),
         "loading_max_s": num(p.loading_max_s)},
        f"{alias}: /health has answered 503 'Loading model' for {show(loading_s, 0)} s "
        f"(> {show(p.loading_max_s, 0)} s): still loading its model",
        started_at=since_s,
    )


def detect(view: FleetView, alias: str, p: Params) -> Detection:
    since_s = loading_since(view.memory, alias, view.now_s)
    if since_s is not None:
        return _loading(view, alias, p, since_s)  # its requests fail because it loads: not a failure ratio
    found = [f for f in (_from_metrics(view, alias), _from_taskloop(view, alias, p), _from_monitor(view, alias, p),
                         _from_litellm(view, alias, p)) if f is not None]
    hits = [f for f in found if isinstance(f, Finding)]
    if hits:
        if len(hits) == 1:
            return hits[0]
        first = hits[0]
        merged = {k: v for hit in reversed(hits) for k, v in hit.detected.items()}
        source = " + ".join(str(hit.detected["source"]) for hit in hits)
        holds = [hit.evidence_hold_s for hit in hits if hit.evidence_hold_s is not None]  # a silent task loop's
        return Finding({**merged, "source": source}, first.summary, first.started_at, min(holds, default=None))
    if Signal.FAILURE_RATIO in view.gap(alias):
        return None  # gpu-monitor's failure ratio is missing this poll: quiet elsewhere is not quiet here
    return False if found else None


def recovered(view: FleetView, alias: str, p: Params, record: IssueRecord) -> bool | None:
    """Judged by the source(s) that found it: a monitor-found issue is not cleared because the
    server's ``/metrics`` shows nothing in flight (LiteLLM may simply have stopped sending it work),
    and a stall is not cleared by a monitor that has not seen the failures yet."""
    source = str(record.detected.get("source") or SOURCE_MONITOR)
    judged = []
    if SOURCE_MONITOR in source:
        counts = _counts(view, alias)
        if counts is not None:
            requests, failures, _ = counts
            judged.append(failures == 0 or (requests > 0 and failures / requests <= p.clear_failure_ratio))
    if SOURCE_METRICS in source:
        state = decode_state(view.memory, alias, view.now_s)
        if state is not None:
            judged.append(state.polls < 2)
    if SOURCE_LITELLM in source:
        window = litellm_window(view.memory, alias, view.now_s)
        if window is not None:
            sent, failed = window
            judged.append(failed == 0 or (sent > 0 and failed / sent <= p.clear_failure_ratio))
    if SOURCE_LOADING in source:
        health = view.endpoint(alias)
        if health is not None:
            judged.append(health == ENDPOINT_OK)
    if SOURCE_TASKLOOP in source:
        loop = taskloop_state(view.memory, alias, view.now_s)
        if loop is not None:
            judged.append(loop.polls < 2)
    return all(judged) if judged else None


REMEDY: Final = Remedy(
    ("restart-llama-server",),
    why_escalate="still failing after restarts — GPU hardware check (Rule 3)",
    cannot_serve=True,
    drain=remedy.hard_fault,
)
