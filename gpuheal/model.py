"""Values that flow through the pipeline: what was sensed, and what was concluded.

All frozen; ``None`` always means "not known" and never zero (design: "Not known is not zero").
Observations serialise to one JSON object (``to_dict``/``from_dict``) so ``check --record`` and
``replay`` share one format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any

from gpuheal.clock import format_iso_exact, parse_iso
from gpuheal.provenance import Provenance, from_json, to_json

# Endpoint states (contract: gpu-health "endpoint").
ENDPOINT_OK = "ok"
ENDPOINT_LOADING = "loading"
ENDPOINT_REFUSED = "refused"
ENDPOINT_TIMEOUT = "timeout"
ENDPOINT_UNAUTHORIZED = "unauthorized"
UNREACHABLE_STATES = frozenset({ENDPOINT_REFUSED, ENDPOINT_TIMEOUT})


@dataclass(frozen=True)
class DataFault:
    """One source that failed this poll: ``source`` is ``monitor``, ``litellm`` or an alias."""

    source: str
    fault: str
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"source": self.source, "fault": self.fault, "detail": self.detail}


@dataclass(frozen=True)
class Breaker:
    """A LiteLLM circuit breaker (cooldown) as gpu-monitor reports it (Rule 5)."""

    open: bool
    opened_at: datetime | None = None


@dataclass(frozen=True)
class SourceTrend:
    """A least-squares trend the data source computed where the data lives (issue 13: PromQL's
    ``deriv`` over the rule's window), so gpuheal keeps no per-poll history of the series.

    ``slope`` is per ``per_s`` seconds (3600: MB/h for Rule 2, 60: °C/min for Rule 8); ``n`` samples
    spanning at least ``span_s`` seconds up to the poll (the longest of the rule's spans the source
    proved covered: ``min_span``, ``recover_span``; 0 when none); ``halves``: the slopes of the window's first and
    second half (Rule 2's "sustained"), when the source measured them.
    """

    slope: float
    n: int
    span_s: float
    per_s: float
    halves: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"slope": self.slope, "n": self.n, "span_s": self.span_s, "per_s": self.per_s}
        if self.halves is not None:
            out["halves"] = list(self.halves)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> SourceTrend | None:
        """From a recorded trace; ``None`` for anything that is not a well-formed trend."""
        if not isinstance(data, dict):
            return None
        try:
            halves = data.get("halves")
            return cls(
                slope=_finite(data["slope"]),
                n=int(_finite(data["n"])),
                span_s=_finite(data["span_s"]),
                per_s=_finite(data["per_s"]),
                halves=None if halves is None else (_finite(halves[0]), _finite(halves[1])),
            )
        except (KeyError, TypeError, ValueError, IndexError):
            return None

    def to_row(self) -> list[float]:
        """``[slope, n, span_s, per_s]``, then the halves when measured: the compact form a state file
        keeps for each of 10,000 GPUs (``prometheus-trend.json``)."""
        return [self.slope, self.n, self.span_s, self.per_s, *(self.halves or ())]

    @classmethod
    def from_row(cls, row: Any) -> SourceTrend | None:
        """The inverse of :meth:`to_row`; ``None`` for anything that is not one."""
        if not isinstance(row, list) or len(row) not in (4, 6):
            return None
        halves = row[4:] or None
        return cls.from_dict({"slope": row[0], "n": row[1], "span_s": row[2], "per_s": row[3], "halves": halves})


@dataclass(frozen=True)
class RoleTally:
    """One GPU's requests over Rule 10's window as LiteLLM's spend logs record them, judged against the
    GPU's configured role (issue 22, item 6): how many fell outside it, and how many could not be
    judged (a row without the field the role names). ``outside_by``: ``[[criterion, n], ...]``;
    ``traffic``: ``[[criterion, value, n], ...]`` — which model group, tag or prompt size the requests
    outside the role were (issue 27 item 11: the recommendation names the traffic to move)."""

    requests: int
    outside: int
    unknown: int
    window_s: float
    outside_by: tuple[tuple[str, int], ...] = ()
    traffic: tuple[tuple[str, str, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {"requests": self.requests, "outside": self.outside, "unknown": self.unknown,
               "window_s": self.window_s, "outside_by": [list(p) for p in self.outside_by]}
        if self.traffic:
            out["traffic"] = [list(t) for t in self.traffic]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> RoleTally | None:
        """From a recorded trace; ``None`` for anything that is not a well-formed tally (a trace written
        before ``traffic`` has none)."""
        if not isinstance(data, dict):
            return None
        try:
            by = tuple((str(k), int(_finite(n))) for k, n in data.get("outside_by") or ())
            traffic = tuple((str(c), str(v), int(_finite(n))) for c, v, n in data.get("traffic") or ())
            return cls(int(_finite(data["requests"])), int(_finite(data["outside"])), int(_finite(data["unknown"])),
                       _finite(data["window_s"]), by, traffic)
        except (KeyError, TypeError, ValueError, OverflowError):
            return None


def _finite(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value in (
        float("inf"),
        float("-inf"),
    ):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)


@dataclass(frozen=True)
class GpuSample:
    """Everything sensed about one configured GPU in one poll.

    Monitor fields are ``None`` when the monitor did not report them (or reported garbage);
    ``endpoint`` is the direct llama-server probe (``None`` = not probed).
    """

    temp_c: float | None = None
    vram_used_mb: float | None = None
    vram_total_mb: float | None = None
    util_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    name: str | None = None
    endpoint: str | None = None
    endpoint_latency_s: float | None = None
    running: bool | None = None
    requests_60s: int | None = None
    failures_60s: int | None = None
    consecutive_timeouts: int | None = None
    breaker: Breaker | None = None
    bench_tok_s: float | None = None
    bench_measured_at: datetime | None = None
    bench_baseline_tok_s: float | None = None  # gpu-monitor's baseline for the host (issue 27 item 14)
    # llama-server's own telemetry (issue 12): its ``/metrics``, ``/slots``, ``/props`` is_sleeping —
    # read directly, or by Prometheus scraping ``/metrics`` (issue 13).
    # ``metrics``/``slots``: ok | disabled | unauthorized | loading | timeout | refused | invalid | http-NNN
    metrics: str | None = None
    n_decode_total: float | None = None
    tokens_predicted_total: float | None = None
    requests_processing: float | None = None
    requests_deferred: float | None = None
    slots: str | None = None
    slots_total: int | None = None
    slots_busy: int | None = None
    is_sleeping: bool | None = None
    canary: str | None = None  # issue 20: the canary completion's state (probe.canary), when one ran
    n_ctx: int | None = None  # Rule 9: the running per-slot context from /props (rules/context_window/change)
    # LiteLLM's own counters of this GPU's deployment since the proxy started (issue 20; cumulative)
    litellm_requests_total: float | None = None
    litellm_failures_total: float | None = None
    litellm_model_group: str | None = None  # that deployment's model group (Rule 10's role, issue 22)
    routing: RoleTally | None = None  # Rule 10 from LiteLLM's spend logs over its window (issue 22)
    # trends computed by the source (Prometheus: PromQL over the rule's window), issue 13
    vram_trend: SourceTrend | None = None
    temp_trend: SourceTrend | None = None
    # which request gave each value above (issue 19; ``gpuheal.provenance``); ``None``: not known
    # (built by hand, or a trace recorded before it)
    provenance: Provenance | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name == "provenance":
                value = to_json(value)
            elif isinstance(value, Breaker):
                value = {
                    "open": value.open,
                    "opened_at": format_iso_exact(value.opened_at) if value.opened_at else None,
                }
            elif isinstance(value, datetime):
                value = format_iso_exact(value)
            elif isinstance(value, SourceTrend | RoleTally):
                value = value.to_dict()
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSample:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        breaker = kwargs.get("breaker")
        if isinstance(breaker, dict):
            opened = breaker.get("opened_at")
            kwargs["breaker"] = Breaker(
                open=bool(breaker.get("open")), opened_at=parse_iso(opened) if opened else None
            )
        for key in ("vram_trend", "temp_trend"):
            if key in kwargs:
                kwargs[key] = SourceTrend.from_dict(kwargs[key])
        if "routing" in kwargs:
            kwargs["routing"] = RoleTally.from_dict(kwargs["routing"])
        if "provenance" in kwargs:
            kwargs["provenance"] = from_json(kwargs["provenance"])
        if isinstance(kwargs.get("bench_measured_at"), str):
            kwargs["bench_measured_at"] = parse_iso(kwargs["bench_measured_at"])
        return cls(**kwargs)


@dataclass(frozen=True)
class Liveness:
    """A GPU's llama-server as the GPU source reports it, for a fleet gpuheal does not probe itself
    (``prometheus.probe_endpoints: false``: the ``up`` of its scrape target): the endpoint state
    (``None``: not known), the request that told (provenance), and the data fault it is, if any."""

    state: str | None
    request: str
    detail: str = ""
    fault: str | None = None
    latency_s: float | None = None


@dataclass(frozen=True)
class GpuValues:
    """One configured GPU's values from the GPU source in one poll (issue 26 item 5): the
    :class:`GpuSample` fields, in groups each written by one request (the request names its
    provenance, :mod:`gpuheal.provenance`), in the order they were read; the GPU's own data faults
    of the source (an entry it cannot match); and its llama-server's liveness where the source
    reports it. A GPU the source could not read has no values."""

    parts: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    faults: tuple[DataFault, ...] = ()
    liveness: Liveness | None = None


NO_VALUES = GpuValues()


@dataclass(frozen=True)
class SourcePoll:
    """One poll of the configured GPU source, whichever it is: what every source's reader returns
    (``SourceKind.reader``), so ``sense`` merges it without asking which source answered.

    - ``source``: the name of what the readings came from (a registered source's, or a stand-in's:
      ``smi-fallback`` while gpu-monitor is unusable, Rule 7.3); ``ok``: the source itself answered
      and was usable (the observation's ``monitor_ok``); ``fallback_ok``: a stand-in answered;
    - ``gpus``: alias → :class:`GpuValues` (a GPU absent: nothing known of it from the source);
    - ``lacking``: the configured GPUs an answer of the source did not list (the spec's "returns no
      GPUs"; contract "Rule timing"), read through the fallback: Rule 7 judges the source unusable for them;
    - ``faults`` and ``warnings`` of the poll; ``unmatched_hosts``: hosts it listed that no GPU is
      configured on."""

    source: str
    ok: bool
    gpus: Mapping[str, GpuValues] = field(default_factory=dict)
    faults: tuple[DataFault, ...] = ()
    warnings: tuple[str, ...] = ()
    fallback_ok: bool = False
    lacking: tuple[str, ...] = ()
    unmatched_hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Observation:
    """One poll of every source, at one instant (the run's clock)."""

    at: datetime
    gpus: dict[str, GpuSample]
    monitor_ok: bool
    litellm_ok: bool | None = None
    faults: tuple[DataFault, ...] = ()
    warnings: tuple[str, ...] = ()
    unmatched_hosts: tuple[str, ...] = field(default=())
    # where this poll's GPU readings came from (a gpuheal.signals.Source value): "monitor"
    # (gpu-monitor), "prometheus" (issue 13), "smi" (nvidia-smi / rocm-smi on each host: neither
    # configured, issue 12) or "smi-fallback" (gpu-monitor unusable, Rule 7.3; ``monitor_ok`` is then
    # false and ``fallback_ok`` says whether any host's smi answered)
    source: str = "monitor"
    fallback_ok: bool = False
    # the configured GPUs the source's answer did not list this poll (``SourcePoll.lacking``): read
    # through the Rule 7.3 fallback, and Rule 7's "returns no GPUs" for them
    lacking: tuple[str, ...] = ()

    @property
    def readings_ok(self) -> bool:
        """This poll delivered GPU readings from some source (the configured one or the fallback)."""
        from gpuheal.source_kinds import home

        return self.fallback_ok if home(self.source) != self.source else self.monitor_ok

    def faults_for(self, source: str) -> list[DataFault]:
        return [f for f in self.faults if f.source == source]

    @property
    def breakers_known(self) -> bool:
        """LiteLLM's circuit breakers are known this poll: only gpu-monitor reports them (Rule 5). With
        Prometheus or smi as the source, a breaker is "not known", never "closed" (issue 13)."""
        from gpuheal.signals import Signal
        from gpuheal.source_kinds import spec

        return self.monitor_ok and Signal.BREAKERS in spec(self.source).provides

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": format_iso_exact(self.at),  # the poll's own time, as history stores it (issue 9)
            "monitor_ok": self.monitor_ok,
            "litellm_ok": self.litellm_ok,
            "gpus": {alias: s.to_dict() for alias, s in self.gpus.items()},
            "faults": [f.to_dict() for f in self.faults],
            "warnings": list(self.warnings),
            "unmatched_hosts": list(self.unmatched_hosts),
            **({} if self.source == TRACE_DEFAULT_SOURCE else {"source": self.source}),
            **({"fallback_ok": True} if self.fallback_ok else {}),
            **({"lacking": list(self.lacking)} if self.lacking else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Observation:
        """Inverse of :meth:`to_dict`; raises ``ValueError``/``KeyError``/``TypeError`` on junk."""
        if not isinstance(data, dict):
            raise ValueError("an observation must be a JSON object")
        gpus = data.get("gpus") or {}
        if not isinstance(gpus, dict):
            raise ValueError("'gpus' must be an object")
        return cls(
            at=parse_iso(data["at"]),
            gpus={str(a): GpuSample.from_dict(s) for a, s in gpus.items() if isinstance(s, dict)},
            monitor_ok=bool(data.get("monitor_ok")),
            litellm_ok=data.get("litellm_ok"),
            faults=tuple(
                DataFault(str(f.get("source")), str(f.get("fault")), str(f.get("detail", "")))
                for f in data.get("faults") or []
                if isinstance(f, dict)
            ),
            warnings=tuple(str(w) for w in data.get("warnings") or []),
            unmatched_hosts=tuple(str(h) for h in data.get("unmatched_hosts") or []),
            source=_source(data.get("source")),
            fallback_ok=data.get("fallback_ok") is True,
            lacking=_aliases(data.get("lacking")),
        )


TRACE_DEFAULT_SOURCE = "monitor"  # the trace format: a poll without "source" (before issue 13) is gpu-monitor's


def _aliases(value: Any) -> tuple[str, ...]:
    """A recorded list of aliases; anything else (a damaged trace) is none."""
    if not isinstance(value, list):
        return ()
    return tuple(a[:200] for a in value[:100_000] if isinstance(a, str))


def _source(value: Any) -> str:
    """A recorded poll's source, as it ran (a trace recorded without gpu-monitor replays as one, issue
    19); absent (traces before issue 13) is gpu-monitor; anything else provides nothing."""
    from gpuheal.source_kinds import SOURCES  # every registered source's name, and its stand-ins'

    if value is None:
        return TRACE_DEFAULT_SOURCE
    return value if isinstance(value, str) and value in SOURCES else f"unknown:{str(value)[:40]}"


# Benchmark error values (a subset of the contract's endpoint / fault words, plus "empty"). The
# outcome is measured by sources/llama_server.py and judged by the pure core/bench.py (issue 10).
ERR_UNAUTHORIZED = "unauthorized"
ERR_LOADING = "loading"
ERR_TIMEOUT = "timeout"
ERR_REFUSED = "refused"
ERR_INVALID = "invalid"
ERR_EMPTY = "empty"


@dataclass(frozen=True)
class BenchOutcome:
    """One benchmark inference test. ``ok`` means HTTP 200 and at least one token predicted."""

    ok: bool
    gen_tok_s: float | None = None
    prompt_tok_s: float | None = None
    tokens: int | None = None
    elapsed_s: float = 0.0            # wall time of the measured request (not the warm-up)
    status: int | None = None         # HTTP status of the last answer, None = no HTTP answer
    error: str | None = None
    detail: str = ""
    model: str | None = None
    n_ctx: int | None = None
    slots: int | None = None
    api: str | None = None            # completion | chat: which endpoint gave the figures
    rate_source: str | None = None    # timings | wall: how gen_tok_s was obtained
    requests: int = 0                 # requests sent to the server, all kinds together
    key_sent: str | None = None       # describe_key() of the key, set on "unauthorized" only

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
