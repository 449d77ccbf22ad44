"""One poll of every source, concurrently, into one :class:`Observation`.

gpu-monitor, every llama-server ``/health`` and LiteLLM's liveliness are fetched in parallel, each
under a hard deadline, so a sweep of N dead hosts costs about one deadline, not N (issue 2).
Every failure is a :class:`DataFault`; this function does not raise for anything the network does.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpuheal import provenance as prov
from gpuheal.config import Config
from gpuheal.core.taskloop import ANSWERED, HEALTH_OK, SILENT
from gpuheal.model import (
    ENDPOINT_OK,
    NO_VALUES,
    DataFault,
    GpuSample,
    Liveness,
    Observation,
    RoleTally,
    SourcePoll,
)
from gpuheal.sources import llama_telemetry as lt
from gpuheal.sources.http import HttpFault, request, run_exchanges, workers
from gpuheal.sources.litellm_spend import NO_DATABASE
from gpuheal.sources.llama_telemetry import PROBE_MAX_BYTES

if TYPE_CHECKING:
    from gpuheal.parse.litellm_metrics import LiteLLMRequests
    from gpuheal.sources.gpu_source import GpuSource

HEALTH_MAX_BYTES = PROBE_MAX_BYTES  # one byte cap for /health, /metrics, /slots, /props


def probe_health(endpoint: str, deadline_s: float) -> tuple[str, float | None, str]:
    """``GET {endpoint}/health`` → (state, latency_s, detail).

    state is ok | loading | refused | timeout | unauthorized | http-NNN (contract). 503 is a
    model still loading (formats.md §1.1), not a failure; an answer that is not HTTP at all is
    reported as refused (nothing there can serve).
    """
    state, latency, detail, _fault = _probe(endpoint, deadline_s)
    return state, latency, detail


def _probe(endpoint: str, deadline_s: float) -> tuple[str, float | None, str, str | None]:
    """:func:`probe_health` plus the contract's fault kind for this poll (``None``: no fault)."""
    return lt.health_state(request("GET", endpoint + "/health", deadline_s=deadline_s, max_bytes=HEALTH_MAX_BYTES))


def fetch_litellm(cfg: Config) -> DataFault | None:
    if not cfg.litellm.url:  # no LiteLLM configured: nothing to be unreachable
        return None
    url = cfg.litellm.url.rstrip("/") + "/health/liveliness"
    result = request("GET", url, deadline_s=cfg.litellm.timeout_s, max_bytes=HEALTH_MAX_BYTES)
    if isinstance(result, HttpFault):
        return DataFault("litellm", result.kind, result.detail)
    if result.status != 200:
        return DataFault("litellm", f"http-{result.status:03d}", lt.snippet(result.body))
    return None


def sense(cfg: Config, now: datetime, transports: Any = None, memory: Any = None) -> Observation:
    """Poll everything once through the configured source (:func:`~gpuheal.sources.gpu_source.gpu_source`):
    :func:`poll_fleet` for a caller without a check's plan (``trend``, tests)."""
    from gpuheal.sources.gpu_source import gpu_source

    return poll_fleet(cfg, gpu_source(cfg), now, transports, memory)


def poll_fleet(
    cfg: Config, source: GpuSource, now: datetime, transports: Any = None, memory: Any = None
) -> Observation:
    """Poll everything once. ``now`` stamps the observation (the run's single clock reading).

    The GPU readings come from ``source`` (``check`` builds it once, in its plan), whose reader returns the
    one typed poll (:class:`~gpuheal.model.SourcePoll`) whichever source it is; ``memory`` is what earlier
    runs left that shapes its queries (``SourceKind.memory``: Prometheus's trend cache); ``transports`` (a
    :class:`~gpuheal.transport.TransportPool` shared with the rest of the run: one SSH connection per
    host) carries smi calls, or a pool of its own (issue 12)."""
    polled = _poll(cfg, source, now, transports, memory)
    poll = polled.poll
    faults = list(poll.faults)
    gpus = {gpu.alias: _sample(gpu, polled, faults) for gpu in cfg.gpus}
    if isinstance(polled.litellm_requests, DataFault):  # LiteLLM's /metrics/ (issue 20): not known this poll
        faults.append(polled.litellm_requests)
    if isinstance(polled.spend, DataFault) and polled.spend.fault != NO_DATABASE:  # no database: doctor says so
        faults.append(polled.spend)  # Rule 10's spend logs (issue 22): not known this poll
    if polled.litellm_fault is not None:
        faults.append(polled.litellm_fault)
    return Observation(
        at=now,
        gpus=gpus,
        monitor_ok=poll.ok,
        source=str(poll.source),
        fallback_ok=poll.fallback_ok,
        litellm_ok=None if not cfg.litellm.url else polled.litellm_fault is None,
        faults=tuple(faults),
        warnings=tuple(poll.warnings),
        unmatched_hosts=poll.unmatched_hosts,
        lacking=poll.lacking,
    )


@dataclass(frozen=True)
class _Polled:
    """Every source's answer of one poll, before they are matched to the configured GPUs."""

    poll: SourcePoll
    litellm_fault: DataFault | None
    servers: dict[str, lt.ServerProbe]  # {} when not probed
    litellm_requests: LiteLLMRequests | DataFault | None = None  # litellm.read_metrics, issue 20
    spend: dict[str, RoleTally] | DataFault | None = None  # litellm.read_spend_logs, issue 22


def _poll(cfg: Config, source: GpuSource, now: datetime, transports: Any, memory: Any) -> _Polled:
    """The GPU source and LiteLLM on threads, every llama-server at once on this one
    (:func:`~gpuheal.sources.http_loop.run_exchanges`, at most ``probe.max_workers`` open)."""
    deadline = cfg.probe.timeout_s
    with workers(4, "probe") as pool:
        source_f = pool.submit(source.read, now, deadline, transports, memory)
        litellm_f = pool.submit(fetch_litellm, cfg) if cfg.litellm.url else None
        url = cfg.litellm.url
        requests_f = pool.submit(_litellm_requests, cfg, url) if url and cfg.litellm.read_metrics else None
        spend_f = pool.submit(_spend, cfg, url, now.timestamp()) if url and cfg.litellm.read_spend_logs else None
        key = cfg.litellm.api_key or None
        props_read: lt.PropsRead = {}  # this poll's /props bodies, each read once (issue 29)
        servers = run_exchanges(
            ((g.alias, g.endpoint, lambda: lt.server_exchange(key, deadline, props_read)) for g in cfg.gpus),
            deadline_s=deadline, max_open=cfg.probe.max_workers,
        ) if source.probes_endpoints else {}
        poll = source_f.result()
        litellm_fault = litellm_f.result() if litellm_f else None
        counted = requests_f.result() if requests_f else None
        spend = spend_f.result() if spend_f else None
    servers = _with_canaries(cfg, now, servers)
    return _Polled(poll, litellm_fault, servers, counted, spend)


def probe_servers(cfg: Config, aliases: Collection[str], canary: Collection[str] = ()) -> dict[str, GpuSample]:
    """An in-run re-probe (issue 28 item 1, ``steps/confirm``): the same direct probe a poll makes —
    ``/health``, then the task-loop endpoints — of only these GPUs, all at once under the probe
    deadline; the canary completion again for those in ``canary`` whose ``/health`` answered (it ran
    at the poll). Each GPU's reading holds only what its own server said; a GPU not configured is
    left out. Never raises for anything the network does."""
    deadline = cfg.probe.timeout_s
    key = cfg.litellm.api_key or None
    gpus = [g for g in cfg.gpus if g.alias in aliases]
    props_read: lt.PropsRead = {}  # this re-probe's /props bodies, each read once (issue 29)
    servers = run_exchanges(((g.alias, g.endpoint, lambda: lt.server_exchange(key, deadline, props_read))
                             for g in gpus), deadline_s=deadline, max_open=cfg.probe.max_workers)
    spec = cfg.probe.canary or {}
    ask = [g for g in gpus if g.alias in canary and g.alias in servers and servers[g.alias].state == ENDPOINT_OK]
    if spec.get("enabled") and ask:
        servers = _canaries(cfg, spec, servers, ask)
    return {alias: GpuSample(endpoint=p.state, endpoint_latency_s=p.latency_s, **p.values())
            for alias, p in servers.items()}


def _with_canaries(
    cfg: Config, now: datetime, servers: dict[str, lt.ServerProbe]
) -> dict[str, lt.ServerProbe]:
    """``probe.canary`` (issue 20): a real 1-token completion to each server whose task loop this poll
    says nothing about, all at once, each under the canary's own deadline."""
    canary = cfg.probe.canary or {}
    if not canary.get("enabled") or not servers:
        return servers

    def sample(alias: str) -> GpuSample:
        probe = servers[alias]
        return GpuSample(endpoint=probe.state, **probe.values())

    every = int(canary["every_polls"])
    due = [g for g in cfg.gpus if g.alias in servers and canary_due(sample(g.alias), now.timestamp(), every)]
    return _canaries(cfg, canary, servers, due) if due else servers


def canary_due(sample: GpuSample, now_s: float, every_polls: int) -> bool:
    """Whether this poll's canary completion runs for a GPU (``probe.canary``): ``/health`` ok and
    awake, and no decode progress can be seen otherwise — neither ``/metrics`` nor ``/slots``
    answered or went silent this poll (a server started without ``--metrics``/``--slots``). A server
    whose task loop answered ``/metrics`` is never loaded further; one whose endpoints are already
    silent needs no more proof. At most once per ``every_polls`` poll minutes. Beside the code that sends
    the canary: it decides what this poll asks (:mod:`gpuheal.core.taskloop` reads what was answered)."""
    if sample.endpoint != HEALTH_OK or sample.is_sleeping is True:
        return False
    if {sample.metrics, sample.slots} & (ANSWERED | {SILENT}):
        return False
    return int(now_s // 60) % max(1, int(every_polls)) == 0


def _canaries(
    cfg: Config, canary: Mapping[str, Any], servers: dict[str, lt.ServerProbe], ask: list[Any]
) -> dict[str, lt.ServerProbe]:
    """The canary completion to each server of ``ask``, all at once, each under the canary's own deadline;
    its state goes on that server's probe."""
    with workers(min(len(ask), cfg.probe.max_workers), "canary") as pool:
        states = dict(zip((g.alias for g in ask), pool.map(lambda g: _canary(cfg, g.endpoint, canary), ask),
                          strict=True))
    return {a: replace(p, canary=states[a]) if a in states else p for a, p in servers.items()}


def _canary(cfg: Config, endpoint: str, canary: Mapping[str, Any]) -> str:
    from gpuheal.sources.llama_server import completion_state

    return completion_state(endpoint, cfg.litellm.api_key or None, int(canary["n_predict"]), float(canary["timeout_s"]))


def _litellm_requests(cfg: Config, url: str) -> LiteLLMRequests | DataFault:
    from gpuheal.sources.litellm_metrics import fetch_requests

    return fetch_requests(url, cfg.litellm.api_key or None, cfg.litellm.timeout_s)


def _spend(cfg: Config, url: str, now_s: float) -> dict[str, RoleTally] | DataFault:
    """Rule 10's window of LiteLLM's spend logs, tallied per GPU against its role (issue 22)."""
    from gpuheal.core.routing import Deployment, tally
    from gpuheal.credentials import env_or_dotenv
    from gpuheal.rules import workload_misrouted
    from gpuheal.sources.litellm_spend import fetch_spend

    window_s = cfg.params_as(workload_misrouted.Params, workload_misrouted.ID).window_s
    key = env_or_dotenv(cfg.litellm.admin_key_env, cfg.path)
    got = fetch_spend(url, key, now_s - window_s, now_s, deadline_s=2 * cfg.litellm.timeout_s,
                      max_rows=cfg.litellm.spend_logs_max_rows)
    if isinstance(got, DataFault):
        return got
    gpus = [Deployment(g.alias, frozenset(n for n in (g.alias, g.litellm_model_id) if n is not None), g.endpoint,
                       g.role_kinds)
            for g in cfg.gpus]
    return tally(got.rows, gpus, window_s)


def _sample(gpu: Any, polled: _Polled, faults: list[DataFault]) -> GpuSample:
    """One configured GPU's reading of this poll from every source, each value with the request that
    gave it (:mod:`gpuheal.provenance`); its data faults go to ``faults``. The GPU source's part is its
    typed poll's (:class:`~gpuheal.model.GpuValues`), whichever source answered."""
    reading = polled.poll.gpus.get(gpu.alias, NO_VALUES)
    # the server's own answers when it was probed; else its liveness as the source reports it (Prometheus's
    # ``up``), if at all — a state None: the source does not say
    probe = polled.servers.get(gpu.alias)
    heard: lt.ServerProbe | Liveness = probe if probe is not None else reading.liveness or NOT_TOLD
    if heard.fault is not None:
        faults.append(DataFault(gpu.alias, heard.fault, heard.detail))
    faults.extend(reading.faults)
    if probe is not None:
        faults.extend(probe.faults(gpu.alias))
    got = prov.Origins()
    for asked, values in reading.parts:
        got.put(asked, values)
    if probe is not None:
        got.put_each(probe.values(), prov.SERVER_FIELDS, prov.METRICS)
    if polled.litellm_requests is not None and not isinstance(polled.litellm_requests, DataFault):
        counts = polled.litellm_requests.for_gpu(gpu.alias, gpu.endpoint)
        if counts is not None:
            got.put(prov.LITELLM, {"litellm_requests_total": counts.total, "litellm_failures_total": counts.failures,
                                   "litellm_model_group": counts.model_group})
    if isinstance(polled.spend, dict) and gpu.alias in polled.spend:
        got.put(prov.SPEND_LOGS, {"routing": polled.spend[gpu.alias]})
    got.put(heard.request, {"endpoint": heard.state, "endpoint_latency_s": heard.latency_s})
    return GpuSample(**got.values, provenance=got.provenance(got.values))


NOT_TOLD = Liveness(None, prov.HEALTH)  # neither probed nor reported by the source: not known


