"""One poll of every source, concurrently, into one :class:`Observation`.

gpu-monitor, every llama-server ``/health`` and LiteLLM's liveliness are fetched in parallel, each
under a hard deadline, so a sweep of N dead hosts costs about one deadline, not N (issue 2).
Every failure is a :class:`DataFault`; this function does not raise for anything the network does.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuheal.config import Config
from gpuheal.model import (
    ENDPOINT_LOADING,
    ENDPOINT_OK,
    ENDPOINT_REFUSED,
    ENDPOINT_TIMEOUT,
    ENDPOINT_UNAUTHORIZED,
    DataFault,
    GpuSample,
    Observation,
)
from gpuheal.parse.gpu_data import InvalidDocument, MonitorDocument, parse_gpu_data
from gpuheal.sources import llama_telemetry as lt
from gpuheal.sources.http import HttpFault, request
from gpuheal.sources.llama_telemetry import PROBE_MAX_BYTES

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
    """:func:`probe_health` plus the contract's fault kind for this poll (``None``: no fault).

    A reply larger than :data:`HEALTH_MAX_BYTES` is an ``oversized`` fault (issue 9, point 8: it was
    labelled by its status, ``http-200``, as if the status were the problem); its endpoint state
    stays the HTTP status it answered with."""
    result = request("GET", endpoint + "/health", deadline_s=deadline_s, max_bytes=HEALTH_MAX_BYTES)
    if isinstance(result, HttpFault):
        if result.kind == "timeout":
            return ENDPOINT_TIMEOUT, None, result.detail, ENDPOINT_TIMEOUT
        if result.kind == "refused":
            return ENDPOINT_REFUSED, None, result.detail, ENDPOINT_REFUSED
        if result.kind == "oversized":
            return f"http-{result.status or 0:03d}", None, result.detail, "oversized"
        return ENDPOINT_REFUSED, None, f"not an HTTP answer: {result.detail}", ENDPOINT_REFUSED
    if result.status == 200:
        return ENDPOINT_OK, result.elapsed_s, "", None
    if result.status == 503:
        return ENDPOINT_LOADING, result.elapsed_s, "503 loading model", None
    if result.status == 401:
        return ENDPOINT_UNAUTHORIZED, result.elapsed_s, "401 on a public path", "http-401"
    state = f"http-{result.status:03d}"
    return state, result.elapsed_s, _snippet(result.body), state


def fetch_monitor(cfg: Config) -> tuple[MonitorDocument | None, list[DataFault], list[str]]:
    """Fetch and parse gpu-monitor; (document or None, faults, warnings)."""
    mon = cfg.monitor
    result = request(
        "GET",
        mon.url,
        deadline_s=mon.timeout_s,
        connect_timeout_s=mon.connect_timeout_s,
        max_bytes=mon.max_response_bytes,
    )
    if isinstance(result, HttpFault):
        warnings = []
        if result.kind == "oversized":
            warnings.append(
                f"gpu-monitor response larger than max_response_bytes ({mon.max_response_bytes}); "
                "skipping the monitor this cycle (Lesson L5)"
            )
        return None, [DataFault("monitor", result.kind, result.detail)], warnings
    if result.status != 200:
        return (
            None,
            [DataFault("monitor", f"http-{result.status:03d}", _snippet(result.body))],
            [],
        )
    try:
        decoded = json.loads(result.body)
        doc = parse_gpu_data(decoded)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, InvalidDocument
        reason = str(exc) if isinstance(exc, InvalidDocument) else f"not JSON: {str(exc)[:120]}"
        return None, [DataFault("monitor", "invalid", reason)], []
    faults = []
    if doc.problems:
        shown = "; ".join(doc.problems[:3])
        more = f" (+{len(doc.problems) - 3} more)" if len(doc.problems) > 3 else ""
        faults.append(DataFault("monitor", "invalid", shown + more))
    return doc, faults, []


def fetch_litellm(cfg: Config) -> DataFault | None:
    url = cfg.litellm.url.rstrip("/") + "/health/liveliness"
    result = request("GET", url, deadline_s=cfg.litellm.timeout_s, max_bytes=HEALTH_MAX_BYTES)
    if isinstance(result, HttpFault):
        return DataFault("litellm", result.kind, result.detail)
    if result.status != 200:
        return DataFault("litellm", f"http-{result.status:03d}", _snippet(result.body))
    return None


def sense(
    cfg: Config, now: datetime, transports: Any = None, window_starts: dict[str, float] | None = None
) -> Observation:
    """Poll everything once. ``now`` stamps the observation (the run's single clock reading).

    With ``prometheus:`` the GPU readings come from Prometheus instead of gpu-monitor;
    ``window_starts`` (alias → epoch s: a restart plus its grace) lets it start a restarted GPU's
    trend window there (``sources/prometheus.py``). With neither (no ``monitor:``) they come from
    nvidia-smi / rocm-smi, one call per host, over ``transports`` (a
    :class:`~gpuheal.transport.TransportPool` shared with the rest of the run: one SSH connection
    per host) or a pool of its own (issue 12)."""
    deadline = float(cfg.probe["timeout_s"])
    workers = max(1, min(int(cfg.probe["max_workers"]), len(cfg.gpus) + 2))
    prom = None
    readings = None
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe") as pool:
        monitor_f = smi_f = None
        if cfg.prometheus is not None:
            from gpuheal.sources import prometheus

            monitor_f = pool.submit(prometheus.read, cfg, now.timestamp(), window_starts)
        elif cfg.monitor is not None:
            monitor_f = pool.submit(fetch_monitor, cfg)
        else:
            smi_f = pool.submit(_sense_smi, cfg, deadline, transports)
        litellm_f = pool.submit(fetch_litellm, cfg) if cfg.litellm.url else None
        key = cfg.litellm.api_key or None
        probing = cfg.prometheus is None or cfg.prometheus.probe_endpoints
        tele_pool = ThreadPoolExecutor(max_workers=max(1, min(TELEMETRY_WORKERS, len(cfg.gpus))),
                                       thread_name_prefix="telemetry")
        probes = (
            {g.alias: pool.submit(probe_server, g.endpoint, key, deadline, tele_pool) for g in cfg.gpus}
            if probing else {}
        )
        if cfg.prometheus is not None:
            prom = monitor_f.result()
            doc, faults, warnings = None, list(prom.faults), list(prom.warnings)
        elif monitor_f is not None:
            doc, faults, warnings = monitor_f.result()
        else:
            readings = smi_f.result()
            doc, faults, warnings = None, list(readings.faults), []
        litellm_fault = litellm_f.result() if litellm_f else None
        probe_results = {alias: f.result()[0] for alias, f in probes.items()}
        server = {alias: _resolved(f.result()[1]) for alias, f in probes.items()}
        tele_pool.shutdown(wait=True)

    gpus: dict[str, GpuSample] = {}
    shared: dict[str, int] = {}
    for gpu in cfg.gpus:
        shared[gpu.host] = shared.get(gpu.host, 0) + 1
    for gpu in cfg.gpus:
        if probing:
            state, latency, detail, kind = probe_results[gpu.alias]
        else:  # llama-server's liveness from Prometheus's scrape of it (prometheus.probe_endpoints: false)
            state, latency, detail, kind = _from_up(prom, gpu.alias)
        if kind is not None:
            faults.append(DataFault(gpu.alias, kind, detail))
        values: dict = {}
        if prom is not None and prom.ok:
            values.update(prom.values[gpu.alias])
            values.pop("endpoint", None)
        if doc is not None:
            found, problem = monitor_values(doc, gpu, shared[gpu.host] > 1)
            values.update(found)
            if problem:
                faults.append(DataFault(gpu.alias, "invalid", problem))
        if readings is not None:
            values.update(readings.values.get(gpu.alias, {}))
        if gpu.alias in server:  # probed directly (not with prometheus.probe_endpoints: false)
            values.update(server[gpu.alias].values(state))
            faults.extend(server[gpu.alias].faults(gpu.alias, state))
        gpus[gpu.alias] = GpuSample(endpoint=state, endpoint_latency_s=latency, **values)

    if litellm_fault is not None:
        faults.append(litellm_fault)
    configured = {g.host for g in cfg.gpus}
    unmatched = tuple(sorted(h for h in (doc.hosts if doc else {}) if h not in configured))
    return Observation(
        at=now,
        gpus=gpus,
        monitor_ok=(doc is not None or (prom is not None and prom.ok)) if readings is None else readings.hosts_ok > 0,
        source="smi" if readings is not None else "monitor" if prom is None else "prometheus",
        litellm_ok=None if not cfg.litellm.url else litellm_fault is None,
        faults=tuple(faults),
        warnings=tuple(warnings),
        unmatched_hosts=unmatched,
    )


def monitor_values(doc: MonitorDocument, gpu: Any, shared_host: bool) -> tuple[dict, str]:
    """gpu-monitor's readings of one configured GPU, matched by (host, index) (contract "Direct
    sensing"): the entry with ``index`` = ``gpu_index`` when the monitor sends indexes, else the
    host's entry — but on a host several configured GPUs share, never another GPU's entry. Model
    counts and breakers by ``name`` / ``model`` = the alias, else (one GPU on the host) by hostname;
    the host's benchmark only for the host's only GPU. → (values, problem or "")."""
    values: dict = {}
    problem = ""
    reading = doc.by_index.get((gpu.host, gpu.gpu_index)) if gpu.gpu_index is not None else None
    if reading is None:
        entries = doc.host_entries.get(gpu.host, 0)
        if gpu.host not in doc.hosts:
            problem = f"gpu-monitor reports no GPU with hostname {gpu.host!r}"
        elif gpu.gpu_index is not None and any(h == gpu.host for h, _ in doc.by_index):
            problem = f"gpu-monitor reports no GPU with index {gpu.gpu_index} on {gpu.host!r}"
        elif shared_host or entries > 1:
            problem = (f"gpu-monitor lists {entries} GPU entr{'y' if entries == 1 else 'ies'} for {gpu.host!r} "
                       "without an index: cannot tell which is this GPU")
        else:
            reading = doc.hosts[gpu.host]
    if reading is not None:
        values.update(reading.values)
        values["name"] = reading.name
        values["running"] = reading.running
    counts = doc.models_by_name.get(gpu.alias) or (None if shared_host else doc.models.get(gpu.host))
    if counts is not None:
        values["requests_60s"] = counts.requests_60s
        values["failures_60s"] = counts.failures_60s
        values["consecutive_timeouts"] = counts.consecutive_timeouts
    values["breaker"] = doc.breakers_by_model.get(gpu.alias) or (None if shared_host else doc.breakers.get(gpu.host))
    bench = None if shared_host else doc.benchmarks.get(gpu.host)
    if bench is not None:
        values["bench_tok_s"], values["bench_measured_at"] = bench
    return values, problem


def _sense_smi(cfg: Config, deadline_s: float, transports: Any):
    """nvidia-smi / rocm-smi on every host, within the probe deadline (no gpu-monitor)."""
    from gpuheal.sources.smi_sense import pool_runner, sense_smi

    if transports is not None:
        return sense_smi(cfg, deadline_s, pool_runner(cfg, transports), int(cfg.probe["max_workers"]))
    from gpuheal.transport import TransportPool

    with TransportPool.from_config(cfg.heal) as own:
        return sense_smi(cfg, deadline_s, pool_runner(cfg, own), int(cfg.probe["max_workers"]))


@dataclass(frozen=True)
class ServerTelemetry:
    """One llama-server's ``/metrics``, ``/slots`` and ``/props`` answers of this poll."""

    metrics: lt.Answer
    slots: lt.Answer
    props: lt.Answer

    def values(self, endpoint_state: str) -> dict:
        """The :class:`GpuSample` fields; nothing is known from a server whose /health failed."""
        if self.metrics is NOT_ASKED:
            return {}
        m, sl = self.metrics.metrics, self.slots.slots
        out: dict = {"metrics": self.metrics.state, "slots": self.slots.state,
                     "is_sleeping": self.props.is_sleeping}
        if m is not None:
            out.update(n_decode_total=m.n_decode_total, tokens_predicted_total=m.tokens_predicted_total,
                       requests_processing=m.requests_processing, requests_deferred=m.requests_deferred)
        if sl is not None:
            out.update(slots_total=sl.total, slots_busy=sl.busy)
        elif self.slots.state == lt.IDLE:
            out["slots_busy"] = 0
        return out

    def faults(self, alias: str, endpoint_state: str) -> list[DataFault]:
        """A wrong key, garbage or a hang on /metrics or /slots is this poll's data fault; a 501
        (not enabled) is not — ``check`` lists it once among the rules that are off. When /health
        itself failed its fault says it all."""
        if endpoint_state != ENDPOINT_OK or self.metrics is NOT_ASKED:
            return []
        out = []
        for answer in (self.metrics, self.slots):
            if answer.state not in lt.QUIET_STATES:
                kind = "http-401" if answer.state == lt.UNAUTHORIZED else answer.state
                out.append(DataFault(alias, kind, answer.detail))
            elif answer.state == lt.OK and answer.detail:  # parsed, but some series were garbage
                out.append(DataFault(alias, "invalid", answer.detail))
        return out


NOT_ASKED = lt.Answer("not-asked")


# Threads for the telemetry of servers that answered /health: they are CPU work (HTTP parsing,
# the Prometheus text) and 256 runnable threads cost ~0.9 s more CPU per 1000 GPUs than 64 in GIL
# hand-offs (issue 12 benchmark); the /health probes keep probe.max_workers, since a dead host only
# waits and N dead hosts must cost one deadline.
TELEMETRY_WORKERS = 64


def probe_server(
    endpoint: str, api_key: str | None, deadline_s: float, telemetry_pool: Any = None
) -> tuple[tuple[str, float | None, str, str | None], Any]:
    """One llama-server, all within one deadline: ``/health``; then, when it answered 200, its
    telemetry (:func:`read_telemetry`) — on ``telemetry_pool`` when given (→ a future), else here
    (→ a :class:`ServerTelemetry`). A dead or stopped server costs one request and one deadline."""
    started = time.monotonic()
    health = _probe(endpoint, deadline_s)
    if health[0] != ENDPOINT_OK:
        return health, ServerTelemetry(NOT_ASKED, NOT_ASKED, NOT_ASKED)
    if telemetry_pool is not None:
        return health, telemetry_pool.submit(read_telemetry, endpoint, api_key, deadline_s, started)
    return health, read_telemetry(endpoint, api_key, deadline_s, started)


def read_telemetry(endpoint: str, api_key: str | None, deadline_s: float, started: float) -> ServerTelemetry:
    """``/metrics``; then ``/slots`` — only of a server that is awake, since ``/slots`` wakes a
    sleeping one (llama-server.md §5). A server with requests processing is awake; an idle one
    (``requests_processing`` 0) is not asked further: its busy slots are 0 and it may sleep.
    Without usable ``/metrics``, ``/props`` says whether it sleeps. All within what is left of the
    deadline that started at ``started`` (the /health probe); a busy server costs three requests."""

    def ask(fetch, path: str) -> lt.Answer:
        remaining = deadline_s - (time.monotonic() - started)
        if remaining < 0.05:
            return lt.Answer("timeout", f"GET {path}: no time left in the probe deadline")
        return fetch(endpoint, api_key, remaining)

    metrics = ask(lt.fetch_metrics, "/metrics")
    busy = metrics.metrics.requests_processing if metrics.metrics is not None else None
    if metrics.state == lt.UNAUTHORIZED:  # the same key on /props and /slots: no more 401s
        return ServerTelemetry(metrics, lt.Answer(lt.UNAUTHORIZED, metrics.detail), NOT_ASKED)
    if busy == 0:
        return ServerTelemetry(metrics, lt.Answer(lt.IDLE, "GET /slots not asked: nothing in flight"), NOT_ASKED)
    if busy is not None:
        return ServerTelemetry(metrics, ask(lt.fetch_slots, "/slots"), NOT_ASKED)
    props = ask(lt.fetch_sleeping, "/props")
    if props.is_sleeping:
        slots = lt.Answer(lt.SLEEPING, "GET /slots not asked: the server sleeps (it would wake it)")
    elif props.state in (lt.UNAUTHORIZED, lt.LOADING, "refused", "timeout"):
        slots = lt.Answer(props.state, props.detail.replace("/props", "/slots (after /props)"))
    else:
        slots = ask(lt.fetch_slots, "/slots")
    return ServerTelemetry(metrics=metrics, slots=slots, props=props)


def _resolved(telemetry: Any) -> ServerTelemetry:
    return telemetry.result() if hasattr(telemetry, "result") else telemetry


def _from_up(prom, alias: str) -> tuple[str | None, None, str, str | None]:
    """(state, latency, detail, fault kind) from the ``up`` of the GPU's llama-server target: 1 is
    ``ok``; 0 is ``refused`` (Prometheus's scrape failed; it cannot tell refused, timeout and a
    model still loading apart); no series is not known."""
    up = prom.values[alias].get("endpoint") if prom is not None else None
    if up is None:
        return None, None, "", None
    if up == ENDPOINT_OK:
        return ENDPOINT_OK, None, "", None
    return ENDPOINT_REFUSED, None, "Prometheus: up == 0 for its llama-server target", ENDPOINT_REFUSED


def _snippet(body: bytes, limit: int = 120) -> str:
    text = body[:limit].decode("utf-8", "replace")
    return "".join(ch if ch.isprintable() else " " for ch in text).strip()
