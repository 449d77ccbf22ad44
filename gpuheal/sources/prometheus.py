"""Prometheus as the GPU data source (issue 13; contract: "Prometheus as a source").

Each poll runs a handful of instant queries (``GET {url}/api/v1/query``), one per signal for the
whole fleet — never one per GPU — concurrently, each through the deadline-bounded HTTP client with
its byte cap (``sources/http.py``), so a hung or flooding Prometheus costs one deadline, not N.

- **Readings**: dcgm-exporter's series by default (``DCGM_FI_DEV_GPU_TEMP``, ``_FB_USED``,
  ``_FB_FREE``, ``_GPU_UTIL``, ``_POWER_USAGE``; total VRAM = used + free) and llama.cpp's own
  ``llamacpp:*`` series. Every query and label is configuration (``prometheus.queries``,
  ``prometheus.labels``), so AMD's exporter, nvidia_gpu_exporter or a recording rule work by config.
- **Matching**: a series belongs to the GPU whose (``host``, ``gpu_index``) equals its
  (``labels.host``, ``labels.gpu_index``) — or, with ``labels.match``, whose ``prometheus_match``
  equals that label; llama.cpp series by ``labels.instance`` = the endpoint's ``host:port``.
- **Freshness**: a series Prometheus has marked stale (gone from its target) is absent at once, and
  a GPU whose temperature's newest sample is older than ``staleness_s`` is not known
  (:func:`fresh`, :func:`stale_probe`): "not known", never an old value.
- **At the poll's instant** (``at_poll_time``, off by default): every query carries ``time=`` the
  poll's clock (:func:`run_query`), so a poll reads what Prometheus held at the instant it records.
- **Trends where the data lives**: Rule 2's slope over its window and Rule 8's rise come from
  ``deriv()`` over the rule's window, with ``count_over_time`` and the window's covered span, so
  gpuheal keeps no per-poll history of those series (``check`` skips the history file). A GPU that
  ``heal`` restarted inside the window gets its own queries over the part after the restart's
  grace, as the history path does. Rule 8's rise is asked, after the temperatures, only of the GPUs
  near enough its threshold to need it (:func:`hot_queries`).
- **Bad answers** (refused, hung, oversized, not JSON, ``"status": "error"``, a ``resultType`` other
  than ``vector``, NaN/±Inf/out-of-range values, one GPU matched by two series) are data faults with
  ``"source": "prometheus"``; the affected readings are "not known". When a core reading (temperature
  or VRAM) cannot be read at all, the source is unusable this poll (Rule 7, as for gpu-monitor).
  Nothing here raises for what the network does.
"""

from __future__ import annotations

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple
from urllib.parse import urlencode, urlsplit

from gpuheal import provenance as prov
from gpuheal.config import Config, GpuConfig
from gpuheal.core import timing
from gpuheal.errors import GpuhealError
from gpuheal.model import (
    ENDPOINT_OK,
    ENDPOINT_REFUSED,
    DataFault,
    GpuValues,
    Liveness,
    Observation,
    SourcePoll,
    SourceTrend,
)
from gpuheal.parse.values import parse_decimal, printable
from gpuheal.signals import Signal, Window
from gpuheal.source_kinds.prometheus import PrometheusConfig, rule_trends
from gpuheal.sources.http import HttpFault, request

SOURCE = "prometheus"
CORE = ("temp_c", "vram_used_mb")  # either unreadable → the source is unusable this poll (Rule 7)
GPU_READINGS = ("temp_c", "vram_used_mb", "vram_free_mb", "vram_total_mb", "util_pct", "power_w")
LLAMA_READINGS = ("requests_processing", "requests_deferred", "n_decode_total")
# physical range of each reading (a value outside is garbage, not a measurement)
RANGES: dict[str, tuple[float, float]] = {
    "temp_c": (0.0, 200.0),
    "vram_used_mb": (0.0, 1e8),
    "vram_free_mb": (0.0, 1e8),
    "vram_total_mb": (0.0, 1e8),
    "util_pct": (0.0, 100.0),
    "power_w": (0.0, 1e5),
    "requests_processing": (0.0, 1e9),
    "requests_deferred": (0.0, 1e9),
    "n_decode_total": (0.0, 1e18),
}
# a plain series selector: a metric name and/or ``{...}`` label matchers (quoted values may hold braces),
# nothing after it — ``a{x="1"} or b{y="2"}`` is not one
_QUOTED = r"""[^{}"'`]|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`"""  # a matcher's character or string
_SELECTOR = re.compile(
    rf"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(?P<matchers>\{{(?:{_QUOTED})*\}})?", re.ASCII | re.DOTALL
)
MAX_SHOWN = 3


def section(cfg: Config) -> PrometheusConfig:
    """``prometheus:``. This reader runs only where Prometheus is the configured source (the config
    loader makes a source without its section a config error); one clear line otherwise."""
    prom = cfg.prometheus
    if prom is None:
        raise GpuhealError("Prometheus is not configured: the config has no prometheus: section")
    return prom


# a series' matching key: ("g", host, gpu index or None), ("m", match label value) or ("i", host:port)
SeriesKey = tuple[str | None, ...]
# one query of a poll: (promql, matched by instance, lowest and highest value that is a reading)
QuerySpec = tuple[str, bool, float, float]
# one GPU's trend: (slope per s, samples, span_s proven covered, first half's mean, second half's mean)
Trend = tuple[float, int, float, float | None, float | None]


@dataclass
class Vector:
    """One query's answer keyed by the matching key: ``values`` (finite, in range), ``dup`` (keys
    matched by more than one series), ``bad`` (keys whose value was not a reading), ``fault``;
    ``hosts``: host → its keys, filled while parsing (a GPU configured without ``gpu_index`` takes
    its host's only series: a fleet of 10,000 looks up 10,000 times per answer)."""

    values: dict[SeriesKey, float] = field(default_factory=dict)
    names: dict[SeriesKey, str] = field(default_factory=dict)
    dup: set[SeriesKey] = field(default_factory=set)
    bad: dict[SeriesKey, str] = field(default_factory=dict)
    fault: DataFault | None = None
    hosts: dict[str | None, list[SeriesKey]] = field(default_factory=dict)

    def keys_of_host(self, host: str | None) -> list[SeriesKey]:
        return self.hosts.get(host, [])


@dataclass(frozen=True)
class PromReading:
    """What the source read for the fleet: per alias the GpuSample fields, the faults, and whether
    the source was usable (``ok``)."""

    values: dict[str, dict[str, Any]]
    faults: list[DataFault]
    warnings: list[str]
    ok: bool


@dataclass(frozen=True)
class PromMemory:
    """What earlier runs left that shapes this poll's queries (the source's memory,
    ``source_kinds/prometheus.py``: :func:`load_memory`, :func:`save_memory`): where a restarted GPU's
    trend window starts (its last restart plus the startup grace; that GPU gets its own window's
    queries), and the fleet-wide trend asked of every GPU (:func:`remembered_window`: Rule 2's) while
    younger than ``prometheus.trend_every_s`` (``None``: query it this poll). A 6-hour fit over 10,000
    series costs Prometheus ~2.5 s of CPU whatever the sample rate (issue 13 benchmark,
    ``--history-h``); it moves little in five minutes."""

    window_starts: dict[str, float] = field(default_factory=dict)
    trends: dict[str, SourceTrend] | None = None
    key: str | None = None  # this config's queries of that trend (remembered_key), what the trends answer

    def own_window(self, alias: str, now_s: float, window_s: float) -> float | None:
        """Where ``alias``'s own window starts: a restart (plus grace) inside the fleet's window and
        already past; ``None`` for a GPU the fleet-wide trend covers."""
        start = self.window_starts.get(alias)
        if start is None or start <= now_s - window_s or start >= now_s:
            return None
        return start


# --------------------------------------------------------------------------- parsing


def decimal(text: Any) -> float | None:
    """Prometheus's sample value (a string: ``"45"``, ``"1.5e+03"``, ``"NaN"``, ``"+Inf"``) → a finite
    float, else ``None`` — through the one strict value reader (``parse/values.py``)."""
    return parse_decimal(text)


def parse_answer(status: int, body: bytes) -> tuple[list[Any] | None, str, str]:
    """An ``/api/v1/query`` answer's envelope → (its ``data.result`` list, fault kind, detail).

    The list is ``None`` on a fault: ``http-NNN`` (Prometheus's 400/422/503 carry ``errorType`` and
    ``error``, shown), ``invalid`` (not JSON, not the envelope, ``status`` not ``success``, a
    ``resultType`` other than ``vector``). Its entries are checked one by one in :func:`_fill`."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:
        if status != 200:
            return None, f"http-{status:03d}", printable(body[:120].decode("utf-8", "replace"))
        return None, "invalid", f"not JSON: {printable(str(exc))[:120]}"
    if not isinstance(doc, dict):
        return None, "invalid", "the answer is not a JSON object"
    if doc.get("status") != "success":
        what = f"{printable(str(doc.get('errorType')))[:40]}: {printable(str(doc.get('error')))[:160]}"
        fault = f"http-{status:03d}" if status != 200 else "invalid"
        return None, fault, f"status {printable(str(doc.get('status')))[:20]}, {what}"
    if status != 200:
        return None, f"http-{status:03d}", "status success on a non-200 answer"
    data = doc.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        return None, "invalid", "no data.result list"
    if data.get("resultType") != "vector":
        return None, "invalid", f"resultType {printable(str(data.get('resultType')))[:20]!r}, expected 'vector'"
    return data["result"], "", ""


def vector_of(status: int, body: bytes, name: str, matcher: Matcher, by_instance: bool, lo: float, hi: float) -> Vector:
    """One query's answer, keyed for matching: a fault, or every series' value (see :class:`Vector`)."""
    vec = Vector()
    result, kind, detail = parse_answer(status, body)
    if result is None:
        vec.fault = DataFault(SOURCE, kind, f"{name}: {detail}")
        return vec
    malformed = _fill(vec, result, name, matcher, by_instance, lo, hi)
    if malformed:
        vec.fault = DataFault(SOURCE, "invalid", f"{name}: {malformed} malformed result entries")
    return vec


# --------------------------------------------------------------------------- matching


class Matcher:
    """Maps series labels to the configured GPUs (and llama.cpp series to endpoints)."""

    def __init__(self, cfg: Config) -> None:
        prom = section(cfg)
        self.host_label = prom.labels.get("host") or "Hostname"
        self.index_label = prom.labels.get("gpu_index") or "gpu"
        self.name_label = prom.labels.get("name")
        self.instance_label = prom.labels.get("instance") or "instance"
        self.match_label = prom.labels.get("match")
        self.gpus = cfg.gpus
        # a GPU configured without gpu_index takes its host's only series: answers index series by host
        self.by_host = not self.match_label and any(getattr(g, "gpu_index", None) is None for g in cfg.gpus)

    def key_labels(self, by_instance: bool) -> tuple[str, str, str | None]:
        """(tag, label, second label) of a series' matching key: ``(tag, value, second value)``, or
        ``(tag, value)`` without a second label — as :meth:`gpu_key` and :meth:`endpoint_key` build
        it for a configured GPU."""
        if by_instance:
            return "i", self.instance_label, None
        if self.match_label:
            return "m", self.match_label, None
        return "g", self.host_label, self.index_label

    def gpu_key(self, gpu: GpuConfig) -> SeriesKey:
        if self.match_label:
            return ("m", gpu.prometheus_match)
        index = getattr(gpu, "gpu_index", None)
        return ("g", gpu.host, None if index is None else str(index))

    @staticmethod
    def endpoint_key(gpu: GpuConfig) -> SeriesKey:
        return ("i", urlsplit(gpu.endpoint).netloc)

    def gpu_matchers(self, gpu: GpuConfig) -> str:
        """PromQL label matchers selecting this GPU's series (for its own restart window)."""
        if self.match_label:
            pairs = [(self.match_label, gpu.prometheus_match)]
        else:
            pairs = [(self.host_label, gpu.host)]
            index = getattr(gpu, "gpu_index", None)
            if index is not None:
                pairs.append((self.index_label, str(index)))
        return ",".join(f"{name}={json.dumps(str(value))}" for name, value in pairs)


def lookup(vec: Vector, key: SeriesKey) -> tuple[float | None, str | None]:
    """(value, problem) of one GPU in one answer. A GPU configured without ``gpu_index`` takes the
    host's only series; a host with several (or a key with two series) is ambiguous: not known."""
    if key[0] == "g" and key[2] is None:
        hits = vec.hosts.get(key[1])
        if not hits:
            return None, None
        if len(hits) > 1:
            return None, f"{len(hits)} series for host {key[1]!r}; set gpus[].gpu_index"
        key = hits[0]
    value = vec.values.get(key)
    if value is not None:
        return value, None
    if key in vec.dup:
        return None, "matched by more than one series"
    return None, vec.bad.get(key)


# --------------------------------------------------------------------------- queries


def fresh(query: str, staleness_s: float) -> str:
    """``query`` as a reading. A plain selector is asked as it is: its instant value leaves out a
    series Prometheus has marked stale (gone from its target, or replaced by one with new labels
    after an exporter restart) at once, and :func:`stale_probe` leaves out a GPU whose newest sample
    is older than ``staleness_s``. That is the cheapest form: at 10,000 series Prometheus spent about
    twice the CPU on ``X and last_over_time(X[s])`` and four times on ``timestamp()``. Any other
    expression keeps the ``timestamp()`` form: a value now, and recent enough."""
    if is_selector(query):
        return query
    return f"({query}) and ((time() - timestamp({query})) <= {staleness_s:g})"


def stale_probe(query: str, staleness_s: float) -> str | None:
    """The series of a plain selector whose newest sample is older than ``staleness_s`` (and younger
    than Prometheus's lookback, five minutes): asked of the temperature, it makes such a GPU not
    known, all its readings with it (samples stamped in the past, a Prometheus restarted, a stalled
    federation). Empty on a healthy fleet. ``None`` for another expression, whose reading checks
    its own freshness."""
    if not is_selector(query):
        return None
    return f"{query} unless last_over_time({query}[{ms(staleness_s)}])"


def is_selector(query: str) -> bool:
    m = _SELECTOR.fullmatch(query.strip())
    return m is not None and bool(m.group("name") or m.group("matchers"))


def ms(seconds: float) -> str:
    return f"{max(1, int(round(seconds * 1000)))}ms"


def trend_queries(
    series: str, window_s: float, spans: list[float], halves_from: float | None, hot_from: float | None = None
) -> dict[str, str]:
    """PromQL for a least-squares trend of ``series`` over ``window_s``: ``deriv`` (per second) and
    the sample count; for each span in ``spans``, the series too young to cover it (present now, no
    sample older than the span in the window: a range scan of the window's early part, where a
    ``timestamp()`` subquery cost 3 s at 10,000 GPUs); with ``halves_from`` (per second), the slope
    of each half of the window (Rule 2's "sustained") where it reaches that; with ``hot_from``, all
    of it only for the series whose value is at least that now (Rule 8 needs the rise of a GPU
    hotter than its threshold only).

    The young, the halves and the hot answers hold only the few series they are about, not every
    GPU of the fleet: at 10,000 GPUs each full answer is ~2 MB for Prometheus to write and gpuheal
    to parse (issue 13 benchmark)."""
    w = ms(window_s)
    hot = "" if hot_from is None else f" and {series} >= {hot_from:g}"
    out = {"slope": f"deriv({series}[{w}]){hot}", "n": f"count_over_time({series}[{w}]){hot}"}
    for span in spans:
        if 0 < span < window_s:
            # not filtered by ``hot_from``: a GPU left out of this answer counts as proven to cover the span
            old = f"count_over_time({series}[{ms(window_s - span)}] offset {ms(span)})"
            out[f"young{int(span * 1000)}"] = f"{series} unless {old}"
    if halves_from is not None:
        h = ms(window_s / 2)
        out["h1"] = f"deriv({series}[{h}] offset {h}) >= {halves_from:g}"
        out["h2"] = f"deriv({series}[{h}]) >= {halves_from:g}"
    return out


def with_matchers(series: str, matchers: str) -> str | None:
    """``series`` (a selector) with extra label matchers; ``None`` when it is not a plain selector."""
    series = series.strip()
    if not is_selector(series):
        return None
    if "{" not in series:
        return f"{series}{{{matchers}}}"
    inner = series[series.index("{") + 1 : -1].strip().rstrip(",")
    return f"{series[: series.index('{')]}{{{inner + ',' if inner else ''}{matchers}}}"


def run_query(
    cfg: Config, name: str, promql: str, matcher: Matcher, by_instance: bool, lo: float, hi: float,
    at_s: float | None = None,
) -> Vector:
    """One instant query, evaluated at ``at_s`` (epoch seconds; ``None``: Prometheus's own now).

    With ``prometheus.at_poll_time`` a poll passes its own clock: the readings and windows are those
    of the poll's instant, the one its trace records ("time is a parameter"), so a pinned clock
    (``GPUHEAL_NOW``) asks what gpuheal would have judged then — a post-mortem against a Prometheus
    that holds the past, or the source-mode matrix's backfilled TSDB. Off by default: a gpuheal host
    whose clock ran ahead of Prometheus's by more than ``staleness_s`` would see every GPU "not
    known" (stale), and a simulated clock (the demo's, the benchmarks') is not Prometheus's."""
    prom = section(cfg)
    args = {"query": promql} if at_s is None else {"query": promql, "time": f"{at_s:.3f}"}
    url = f"{prom.url}/api/v1/query?" + urlencode(args)
    result = request(
        "GET", url, deadline_s=prom.timeout_s, connect_timeout_s=prom.connect_timeout_s,
        max_bytes=prom.max_response_bytes,
    )
    if isinstance(result, HttpFault):
        return Vector(fault=DataFault(SOURCE, result.kind, f"{name}: {result.detail}"))
    return vector_of(result.status, result.body, name, matcher, by_instance, lo, hi)


def _fill(vec: Vector, result: list[Any], name: str, matcher: Matcher, by_instance: bool, lo: float, hi: float) -> int:
    """Key every series of one answer's ``result`` into ``vec``; the number of malformed entries
    (an entry without a ``metric`` object and a ``[time, value]`` pair; one that is not an object
    at all is skipped). One pass of a few dict operations per series: 10,000 series an answer and
    16 answers a poll are issue 13's benchmark, where this loop was a quarter of gpuheal's CPU. A
    sample value or a name label is read once per distinct text."""
    tag, label, second = matcher.key_labels(by_instance)
    name_label = None if by_instance or name not in GPU_READINGS else matcher.name_label
    hosts = vec.hosts if matcher.by_host and not by_instance else None
    values, bad, dup, seen = vec.values, vec.bad, vec.dup, set()
    numbers: dict[Any, float | None] = {}
    names: dict[Any, str] = {}
    malformed = 0
    for entry in result:
        if type(entry) is not dict:
            continue
        metric, pair = entry.get("metric"), entry.get("value")
        if type(metric) is not dict or type(pair) is not list or len(pair) != 2:
            malformed += 1
            continue
        first = metric.get(label)
        if type(first) is not str:
            malformed += not metric  # no labels (an aggregate): the query is wrong; no key label: not ours
            continue
        if second is None:
            key: SeriesKey = (tag, first)
        else:
            index = metric.get(second)
            key = (tag, first, index if type(index) is str else None)
        if key in seen:
            dup.add(key)
            values.pop(key, None)
            bad.pop(key, None)
            continue
        seen.add(key)
        if hosts is not None:
            hosts.setdefault(key[1], []).append(key)
        raw = pair[1]
        try:
            value = numbers[raw]
        except KeyError:
            value = numbers[raw] = decimal(raw)
        except TypeError:  # not hashable: not a sample value
            value = None
        if value is None or not lo <= value <= hi:
            bad[key] = f"{name} = {printable(str(raw))[:24]!r} is not a reading"
            continue
        values[key] = value
        if name_label:
            shown = metric.get(name_label)
            if type(shown) is str:
                if shown not in names:
                    names[shown] = printable(shown)[:100]
                vec.names[key] = names[shown]
    return malformed


def build_queries(
    cfg: Config, memory: PromMemory, now_s: float, matcher: Matcher, every_gpu: bool = False
) -> dict[str, QuerySpec]:
    """Every query of this poll that needs no other answer first: name → (promql, by_instance, lo,
    hi). Rule 2's fleet-wide trend only when ``memory`` holds none; Rule 8's only with
    ``every_gpu`` (``doctor``: to show which GPUs have none) — a poll asks it of the hot GPUs once
    their temperatures are in (:func:`hot_queries`)."""
    prom = section(cfg)
    out: dict[str, QuerySpec] = {}
    for key in GPU_READINGS + LLAMA_READINGS:
        q = prom.query(key)
        if q:
            lo, hi = RANGES[key]
            out[key] = (fresh(q, prom.staleness_s), key in LLAMA_READINGS, lo, hi)
    probe = stale_probe(prom.query("temp_c") or "", prom.staleness_s)
    if probe:
        out["stale"] = (probe, False, -math.inf, math.inf)
    up = prom.query("endpoint_up")
    if up and not prom.probe_endpoints:
        out["endpoint_up"] = (up, True, 0.0, 1.0)
    windows = trend_windows(cfg)
    kept = next((tw for tw in windows if tw.remembered), None) if memory.trends is not None else None
    for tw in windows:
        series = prom.query(tw.series.series_key)
        if not series or (tw.hot_from is not None and not every_gpu):
            continue
        if tw is not kept:
            out.update(_trend_specs(tw.series.kind, trend_queries(series, tw.window_s, tw.spans, tw.halves_from)))
        if tw.restarts:
            out.update(_own_windows(cfg, tw, series, memory, now_s, matcher))
    return out


def _trend_specs(prefix: str, queries: dict[str, str]) -> dict[str, QuerySpec]:
    return {f"{prefix}.{part}": (q, False, -math.inf, math.inf) for part, q in queries.items()}


def _own_windows(
    cfg: Config, tw: TrendWindow, series: str, memory: PromMemory, now_s: float, matcher: Matcher
) -> dict[str, QuerySpec]:
    """A GPU restarted inside a trend's window (``Window.restarts``: Rule 2's): its own window after the
    restart's grace (as Rule 2's history path restarts its fit there)."""
    out: dict[str, QuerySpec] = {}
    for gpu in cfg.gpus:
        start = memory.own_window(gpu.alias, now_s, tw.window_s)
        if start is None:
            continue
        own = with_matchers(series, matcher.gpu_matchers(gpu))
        if own is not None:
            queries = trend_queries(own, now_s - start, tw.spans, tw.halves_from)
            out.update(_trend_specs(f"{tw.series.kind}@{gpu.alias}", queries))
    return out


# Rule 8's trend names the hot GPUs' hosts in its selector up to this many; past it (a heat wave)
# it is asked of the whole fleet, filtered by temperature in PromQL
MAX_HOT_NAMED = 100


def hot_queries(cfg: Config, tw: TrendWindow, now: Vector, matcher: Matcher) -> dict[str, QuerySpec]:
    """The queries of a trend judged only above a threshold (Rule 8's rise, ``Window.above``) for the
    GPUs ``now`` (this poll's answer of the trended reading) shows at or above their :func:`hot_line`:
    none in a fleet running cool, which spares Prometheus three queries over every GPU each poll
    (issue 13 benchmark). A GPU not named has no trend, which its rules read only above the threshold."""
    series = section(cfg).query(tw.series.series_key)
    if tw.hot_from is None or not series or now.fault is not None:
        return {}
    lines = {id(rules): hot_line(rules, tw) for rules in _rule_sets(cfg)}
    hot: set[str] = set()
    for gpu in cfg.gpus:
        value, _ = lookup(now, matcher.gpu_key(gpu))
        line = lines[id(gpu.rules)]
        name = gpu.prometheus_match if matcher.match_label else gpu.host
        if value is not None and line is not None and value >= line and name is not None:
            hot.add(name)
    if not hot:
        return {}
    label = matcher.match_label or matcher.host_label
    named = None
    if len(hot) <= MAX_HOT_NAMED:
        named = with_matchers(series, f"{label}=~{json.dumps(_alternatives(hot))}")
    kind = tw.series.kind
    if named is None:  # a heat wave, or a series that is not a plain selector
        return _trend_specs(kind, trend_queries(series, tw.window_s, tw.spans, None, tw.hot_from))
    return _trend_specs(kind, trend_queries(named, tw.window_s, tw.spans, None))


def _alternatives(values: set[str]) -> str:
    """An RE2 alternation matching exactly these label values: its metacharacters escaped, and only
    those (Prometheus matches an alternation of plain literals without running the regex)."""
    return "|".join(_RE2_META.sub(r"\\\g<0>", v) for v in sorted(values))


_RE2_META = re.compile(r"[\\.+*?()|\[\]{}^$]")


def lists_only_the_gpus_concerned(name: str) -> bool:
    """A query whose answer holds only the GPUs it is about (samples too old; too young for a span;
    a half steep enough to matter), not one series per GPU — as
    ``build_queries(every_gpu=True)`` asks."""
    part = name.rpartition(".")[2]
    return name == "stale" or part in ("h1", "h2") or part.startswith("young")


def remembered_window(cfg: Config) -> TrendWindow | None:
    """The fleet-wide trend asked at most every ``prometheus.trend_every_s`` and remembered between
    (``PromMemory``): the first one asked of every GPU (not judged only above a threshold) — Rule 2's."""
    return next((tw for tw in trend_windows(cfg) if tw.remembered and section(cfg).query(tw.series.series_key)),
                None)


def remembered_key(cfg: Config) -> str | None:
    """The remembered trend's queries as this config asks them: a remembered answer (``PromMemory``) is
    used only while the config still asks the same."""
    tw = remembered_window(cfg)
    series = None if tw is None else section(cfg).query(tw.series.series_key)
    if tw is None or not series:
        return None
    return " | ".join(trend_queries(series, tw.window_s, tw.spans, tw.halves_from).values())


class TrendSeries(NamedTuple):
    """A trend signal as Prometheus gives it: the query names' prefix, its series (a
    ``prometheus.queries`` key), the reading it trends, the :class:`~gpuheal.model.GpuSample` field
    the trend fills and the seconds its slope is per; ``margin``: how far below a threshold it is
    asked (``Window.above``)."""

    kind: str
    series_key: str
    reading: str
    field: str
    per_s: float
    margin: float = 0.0


# The trend signals Prometheus computes (PromQL ``deriv``). Rule 8's rise is asked for the GPUs from
# 5 °C below their threshold up: the rules read the poll's temperature answer, the one the hot GPUs are
# picked from; in a heat wave (the fleet-wide form) the filter runs a moment later in PromQL, and a GPU
# crossing the threshold in between is "not known" for that poll (never a false issue) only if it
# jumped this much within one scrape.
SERIES: dict[Signal, TrendSeries] = {
    Signal.VRAM_TREND: TrendSeries("vram", "vram_series", "vram_used_mb", "vram_trend", 3600.0),
    Signal.TEMP_TREND: TrendSeries("temp", "temp_series", "temp_c", "temp_trend", 60.0, margin=5.0),
}


class TrendWindow(NamedTuple):
    """One trend as asked of Prometheus, derived from the rules that read it (their ``NEEDS``'
    :class:`~gpuheal.signals.Window`, :func:`~gpuheal.source_kinds.prometheus.rule_trends`): the
    series, the window, the spans its fit must be proven to cover, and the filters that keep the
    answers to the GPUs the rules can judge (``halves_from``: a slope per second; ``hot_from``: a value
    now); ``reads``: those rules and how each reads it; ``remembered``: asked of every GPU (no rule
    reads it only above a threshold); ``restarts``: a restarted GPU gets its own window."""

    series: TrendSeries
    window_s: float
    spans: list[float]
    halves_from: float | None
    hot_from: float | None
    reads: tuple[tuple[str, Window], ...]
    remembered: bool
    restarts: bool


def trend_windows(cfg: Config) -> list[TrendWindow]:
    """Each trend the rules read, as one PromQL window for the fleet (config load refuses per-GPU
    windows, and two windows for one trend, with Prometheus): the first reading rule's window, every
    rule's spans (the fleet's values).

    "Sustained" (``Window.sustained``: Rule 2) needs each half at rate × ratio of the GPU's own
    parameters; a half below that reads as one not measured (not sustained either), so only halves
    from half the fleet's lowest such rate up are asked for: the margin covers a slope moving between
    queries, which Prometheus evaluates a moment apart.

    A trend judged only above a threshold (``Window.above``: both Rule 8 tiers, and the first
    clears at once at or below it) is asked only from the series' ``margin`` below the fleet's lowest
    such threshold up: in a healthy fleet its answers are empty."""
    out: list[TrendWindow] = []
    for signal, reads in rule_trends().items():
        ts = SERIES.get(signal)
        first_id, first = reads[0]
        window = cfg.rules.get(first_id, {}).get(first.window)
        if ts is None or not window:
            continue
        spans = sorted({float(cfg.rules[r][k]) * w.unit_s for r, w in reads for k in w.spans
                        if cfg.rules.get(r, {}).get(k)})
        halves_from = None
        if any(w.sustained for _, w in reads):
            rates = [float(rules[r][w.sustained[0]]) * float(rules[r][w.sustained[1]])
                     for rules in _rule_sets(cfg) for r, w in reads if w.sustained and rules.get(r)]
            halves_from = max(0.0, min(rates, default=0.0)) / ts.per_s / 2
        above = any(w.above for _, w in reads)
        tw = TrendWindow(ts, float(window) * first.unit_s, spans, halves_from, None, reads, not above,
                         any(w.restarts for _, w in reads))
        out.append(tw._replace(hot_from=_hot_from(cfg, tw)) if above else tw)
    return out


def _hot_from(cfg: Config, tw: TrendWindow) -> float | None:
    """The lowest :func:`hot_line` of any GPU; ``None`` (every GPU) when some GPU has none."""
    lines = [hot_line(rules, tw) for rules in _rule_sets(cfg)] or [hot_line(cfg.rules, tw)]
    return None if None in lines else min(lines)  # type: ignore[type-var]


def _rule_sets(cfg: Config) -> list[dict[str, Any]]:
    """Each distinct set of the GPUs' rule parameters: the GPUs that override none share one (config
    load), so a fleet of 10,000 is a handful here, not 10,000 to look through on every call."""
    return list({id(gpu.rules): gpu.rules for gpu in cfg.gpus}.values())


def hot_line(rules: dict[str, Any], tw: TrendWindow) -> float | None:
    """The series' margin below the lowest threshold (``Window.above``) of the rules reading ``tw``, in
    ``rules``; ``None`` when one of them has none."""
    thresholds = [(rules.get(rule_id) or {}).get(w.above) for rule_id, w in tw.reads if w.above]
    numbers = [float(t) for t in thresholds if isinstance(t, int | float) and not isinstance(t, bool)]
    if len(numbers) != len(thresholds):
        return None
    return min(numbers) - tw.series.margin


# --------------------------------------------------------------------------- the poll


def read(cfg: Config, now_s: float, memory: PromMemory | None = None) -> PromReading:
    """Run this poll's queries concurrently and map the answers to ``gpus[]``."""
    matcher = Matcher(cfg)
    memory = memory or PromMemory()
    queries = build_queries(cfg, memory, now_s, matcher)
    workers = max(1, min(section(cfg).max_workers, len(queries) + 3))  # + Rule 8's, asked next
    at_s = now_s if section(cfg).at_poll_time else None

    def submit(specs: dict[str, QuerySpec]) -> None:
        for name, (q, by_inst, lo, hi) in specs.items():
            futures[name] = pool.submit(run_query, cfg, name, q, matcher, by_inst, lo, hi, at_s)

    windows = trend_windows(cfg)
    futures: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="promql") as pool:
        submit(queries)
        for tw in windows:  # a trend judged only above a threshold: asked once its reading is in
            if tw.hot_from is not None and tw.series.reading in futures:
                submit(hot_queries(cfg, tw, futures[tw.series.reading].result(), matcher))
        vectors = {name: f.result() for name, f in futures.items()}
    faults = merge_faults([v.fault for v in vectors.values() if v.fault is not None])
    ok = all(k in vectors and vectors[k].fault is None for k in CORE if section(cfg).query(k))
    answers = Answers.of(vectors)
    values: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    kept = next((tw for tw in windows if tw.remembered), None) if memory.trends is not None else None
    trends = tuple((tw, memory.trends if tw is kept else None) for tw in windows)
    for gpu in cfg.gpus:
        values[gpu.alias] = _gpu_values(gpu, answers, matcher, problems, faults if ok else None, trends)
    if problems:
        shown = "; ".join(problems[:MAX_SHOWN])
        more = f" (+{len(problems) - MAX_SHOWN} more)" if len(problems) > MAX_SHOWN else ""
        faults.append(DataFault(SOURCE, "invalid", shown + more))
    return PromReading(values=values, faults=faults, warnings=[], ok=ok)


def read_poll(cfg: Config, now: datetime, deadline_s: float, transports: Any, memory: Any) -> SourcePoll:
    """The Prometheus source's reader (``source_kinds/prometheus.py``): :func:`read` as the typed poll
    every source returns — each GPU's readings and trends with their provenance (the instant
    queries), and its llama-server's liveness from its target's ``up`` where gpuheal does not probe."""
    from gpuheal.source_kinds.prometheus import KIND

    got = read(cfg, now.timestamp(), memory)
    gpus: dict[str, GpuValues] = {}
    for alias, values in got.values.items():
        up = values.get("endpoint")
        if up is not None:
            values = {k: v for k, v in values.items() if k != "endpoint"}
        parts = ((prov.PROMETHEUS, values),) if got.ok and values else ()
        liveness = None if up is None else UP_OK if up == ENDPOINT_OK else UP_DOWN
        gpus[alias] = GpuValues(parts, liveness=liveness) if liveness is not None or parts else _NOTHING
    return SourcePoll(KIND.name, bool(got.ok), gpus, tuple(got.faults), tuple(got.warnings))


# --------------------------------------------------------------------------- the source's memory (SourceKind.memory)


def load_memory(cfg: Config, saved: Any, window_starts: dict[str, float], now_s: float) -> PromMemory:
    """What this poll's queries depend on from earlier runs: restarted GPUs' windows (``window_starts``),
    and the remembered fleet-wide trend from the memory file (``saved``) while it is younger than
    ``prometheus.trend_every_s`` and was asked as this config asks it. Pure: ``check`` reads the file."""
    memory = PromMemory(window_starts=window_starts, key=remembered_key(cfg))
    at_s = saved.get("at_s") if isinstance(saved, dict) else None
    if not isinstance(at_s, int | float) or saved.get("query") != memory.key:
        return memory
    if not timing.within_last(now_s, float(at_s), section(cfg).trend_every_s):
        return memory
    rows = saved.get("trends")
    if not isinstance(rows, dict):
        return memory
    aliases = set(cfg.aliases)
    known = {a: SourceTrend.from_row(row) for a, row in rows.items() if a in aliases}
    trends = {a: t for a, t in known.items() if t is not None}
    if not trends or len(trends) < len(known):
        return memory  # a damaged row (or none for this fleet): ask again
    return PromMemory(memory.window_starts, trends, memory.key)


def save_memory(cfg: Config, memory: PromMemory, obs: Observation) -> dict[str, Any] | None:
    """After a poll that asked the remembered trend: each GPU's, for the next ``trend_every_s`` — not
    one a restarted GPU's own window gave (that is asked every poll). ``None`` (nothing to write) when
    it was remembered, or none came (Prometheus down: the next poll asks again)."""
    tw = remembered_window(cfg)
    if memory.trends is not None or not section(cfg).trend_every_s or tw is None:
        return None
    now_s, field_name = obs.at.timestamp(), tw.series.field
    rows = {}
    for alias, sample in obs.gpus.items():
        trend = getattr(sample, field_name)
        if trend is not None and (not tw.restarts or memory.own_window(alias, now_s, tw.window_s) is None):
            rows[alias] = trend.to_row()
    return {"at_s": now_s, "query": memory.key, "trends": rows} if rows else None


# ``up`` of a GPU's llama-server target: 1 is ``ok``; 0 is ``refused`` (Prometheus's scrape failed; it cannot
# tell refused, timeout and a model still loading apart); no series is not known
UP_OK = Liveness(ENDPOINT_OK, prov.PROMETHEUS_UP)
UP_DOWN = Liveness(ENDPOINT_REFUSED, prov.PROMETHEUS_UP, "Prometheus: up == 0 for its llama-server target",
                   ENDPOINT_REFUSED)
_NOTHING = GpuValues()


def merge_faults(faults: list[DataFault]) -> list[DataFault]:
    """One fault per (kind, cause): a Prometheus that is down fails every query the same way, and
    that is one line ("16 queries: connection refused"), not sixteen."""
    groups: dict[tuple[str, str], list[str]] = {}
    for f in faults:
        name, _, cause = f.detail.partition(": ")
        groups.setdefault((f.fault, cause), []).append(name)
    out = []
    for (kind, cause), names in groups.items():
        more = ", ..." if len(names) > 3 else ""
        who = names[0] if len(names) == 1 else f"{len(names)} queries ({', '.join(names[:3])}{more})"
        out.append(DataFault(SOURCE, kind, f"{who}: {cause}"))
    return out


@dataclass(frozen=True)
class Answers:
    """This poll's usable answers (those without a fault), with each trend kind's ``young`` answers
    listed once as (span_s, answer) — not searched for again for each of 10,000 GPUs."""

    vectors: dict[str, Vector]
    young: dict[str, list[tuple[float, Vector]]]

    @classmethod
    def of(cls, vectors: dict[str, Vector]) -> Answers:
        usable = {name: vec for name, vec in vectors.items() if vec.fault is None}
        young: dict[str, list[tuple[float, Vector]]] = {}
        for name, vec in usable.items():
            kind, _, part = name.rpartition(".")
            if kind and part.startswith("young") and part[5:].isdigit():
                young.setdefault(kind, []).append((int(part[5:]) / 1000, vec))
        return cls(usable, young)


def _gpu_values(
    gpu: GpuConfig, answers: Answers, matcher: Matcher, problems: list[str], faults: list[DataFault] | None,
    trends: tuple[tuple[TrendWindow, dict[str, SourceTrend] | None], ...],
) -> dict[str, Any]:
    """One GPU's readings from this poll's answers, and each trend the rules read (``trends``: each
    window with its remembered answers, ``None`` when asked this poll)."""
    key = matcher.gpu_key(gpu)
    vectors = answers.vectors
    out: dict[str, Any] = {}
    seen = False
    stale = vectors.get("stale")
    for name in GPU_READINGS if stale is None or lookup(stale, key) == (None, None) else ():
        vec = vectors.get(name)
        if vec is None:
            continue
        value, problem = lookup(vec, key)
        if problem:
            problems.append(f"{gpu.alias}: {name}: {problem}")
        if value is not None:
            out[name] = value
            seen = True
            if "name" not in out and vec.names:
                named = key if key in vec.names else _host_key(vec, key)
                label = None if named is None else vec.names.get(named)
                if label:
                    out["name"] = label
    free = out.pop("vram_free_mb", None)
    if "vram_total_mb" not in out and free is not None and "vram_used_mb" in out:
        out["vram_total_mb"] = out["vram_used_mb"] + free
    _endpoint_values(out, vectors, matcher.endpoint_key(gpu))
    if faults is not None and not seen:
        faults.append(DataFault(gpu.alias, "invalid", f"Prometheus has no fresh series for {_describe(key)}"))
    for tw, remembered in trends:
        ts = tw.series
        if ts.reading not in out:
            continue
        found = _source_trend(answers, f"{ts.kind}@{gpu.alias}", key, ts.per_s) if tw.restarts else None
        if found is None:
            found = _source_trend(answers, ts.kind, key, ts.per_s) if remembered is None else remembered.get(gpu.alias)
        if found is not None:
            out[ts.field] = found
    return out


def _endpoint_values(out: dict[str, Any], vectors: dict[str, Vector], endpoint_key: SeriesKey) -> None:
    """The GPU's llama-server readings, matched by its endpoint's ``host:port``."""
    up_vec = vectors.get("endpoint_up")
    if up_vec is not None:
        up, _ = lookup(up_vec, endpoint_key)
        if up is not None:
            out["endpoint"] = "ok" if up == 1 else "down"
    for name in LLAMA_READINGS:
        vec = vectors.get(name)
        if vec is not None:
            value, _ = lookup(vec, endpoint_key)
            if value is not None:
                out[name] = value


def _host_key(vec: Vector, key: SeriesKey) -> SeriesKey | None:
    if key[0] == "g" and key[2] is None:
        hits = vec.keys_of_host(key[1])
        return hits[0] if len(hits) == 1 else None
    return None


def _describe(key: SeriesKey) -> str:
    if key[0] == "m":
        return f"match label {key[1]!r}"
    return f"host {key[1]!r}" + (f" gpu {key[2]!r}" if key[2] is not None else "")


def _trend(answers: Answers, kind: str, key: SeriesKey) -> Trend | None:
    """(slope per s, n, span_s, h1, h2) from the trend answers; ``None`` if slope or n is not known.
    ``span_s`` is the longest span proven covered: its ``young`` answer came and does not hold the
    series (0 when none is proven: too young for the rules, or that query failed). A half is ``None``
    where its answer does not hold the series (a slope below where the halves are asked for)."""
    vectors = answers.vectors
    slope_vec, n_vec = vectors.get(f"{kind}.slope"), vectors.get(f"{kind}.n")
    if slope_vec is None or n_vec is None:
        return None
    slope, problem = lookup(slope_vec, key)
    if slope is None or problem:
        return None
    n, problem = lookup(n_vec, key)
    if n is None or problem:
        return None
    span = 0.0
    for span_s, vec in answers.young.get(kind, ()):
        if lookup(vec, key) == (None, None):  # not among the young (nor two series, nor garbage)
            span = max(span, span_s)
    halves = []
    for part in ("h1", "h2"):
        half = vectors.get(f"{kind}.{part}")
        halves.append(None if half is None else lookup(half, key)[0])
    return slope, int(n), span, halves[0], halves[1]


def _source_trend(answers: Answers, kind: str, key: SeriesKey, per_s: float) -> SourceTrend | None:
    trend = _trend(answers, kind, key)
    return None if trend is None else SourceTrend(trend[0] * per_s, trend[1], trend[2], per_s, _halves(trend, per_s))


def _halves(trend: Trend, per_s: float) -> tuple[float, float] | None:
    h1, h2 = trend[3], trend[4]
    if h1 is None or h2 is None:
        return None
    return (h1 * per_s, h2 * per_s)
