"""``doctor`` with Prometheus as the source (issue 13): each query returns a series for each GPU.

One row per query the poll would run (the readings and the trend queries; Rule 8's rise asked of
every GPU, where a poll asks it of the hot ones only), all at once under ``prometheus.timeout_s``:
✘ when Prometheus cannot answer it, or a core reading (temperature, VRAM) has no series for some
GPU; ⚠ when another reading or a trend has none (a llama-server not scraped, a series younger than
the window); ✔ with the count otherwise. Reads only.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from gpuheal.doctor import FAIL, OK, WARN, Check

if TYPE_CHECKING:
    from gpuheal.config.model import Config
    from gpuheal.source_kinds.prometheus import PrometheusConfig
    from gpuheal.sources.prometheus import SeriesKey, Vector

TARGET = "prometheus"
SHOWN = 5


def query_checks(cfg: Config, now_s: float | None = None) -> list[Check]:
    from gpuheal.sources import prometheus as source

    prom = cfg.prometheus
    if prom is None:  # the probe is the Prometheus source's own (source_kinds/prometheus.py)
        return []
    matcher = source.Matcher(cfg)
    now_s = time.time() if now_s is None else now_s
    queries = source.build_queries(cfg, source.PromMemory(), now_s, matcher, every_gpu=True)
    workers = max(1, min(prom.max_workers, len(queries)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="doctor-promql") as pool:
        futures = {
            name: pool.submit(source.run_query, cfg, name, q, matcher, by_inst, lo, hi)
            for name, (q, by_inst, lo, hi) in queries.items()
        }
        vectors = {name: f.result() for name, f in futures.items()}
    keys = [matcher.gpu_key(g) for g in cfg.gpus]
    endpoint_keys = [matcher.endpoint_key(g) for g in cfg.gpus]
    rows: list[Check] = []
    for name, vec in vectors.items():
        core = name in source.CORE
        check = f"query {name}"
        if vec.fault is not None:
            rows.append(
                Check(
                    TARGET, check, FAIL if core else WARN,
                    f"{prom.url}: {vec.fault.fault}: {vec.fault.detail[:160]}",
                    _fix(vec.fault.fault, prom),
                )
            )
            continue
        if name == "stale":
            rows.append(_stale_row(cfg, prom.staleness_s, vec, keys))
            continue
        if source.lists_only_the_gpus_concerned(name):
            rows.append(Check(TARGET, check, OK, "answers (it lists only the GPUs it is about)"))
            continue
        llama = name in source.LLAMA_READINGS
        missing: list[str] = []
        # llama.cpp's series and `up` (probe_endpoints: false) are matched by the endpoint's host:port
        for g, key in zip(cfg.gpus, endpoint_keys if queries[name][1] else keys, strict=True):
            value, problem = source.lookup(vec, key)
            if value is None:
                missing.append(f"{g.alias}" + (f" ({problem})" if problem else ""))
        if missing:
            shown = ", ".join(missing[:SHOWN]) + (f" (+{len(missing) - SHOWN} more)" if len(missing) > SHOWN else "")
            if llama:
                fix = (
                    "scrape each llama-server's /metrics (--metrics, with the api key); "
                    "its instance label is the endpoint's host:port"
                )
            elif "." in name:
                fix = "a trend needs two samples in the rule's window: wait for scrapes, or check the series exists"
            else:
                fix = (
                    f"each GPU needs a series with {matcher.host_label}=gpus[].host and "
                    f"{matcher.index_label}=gpus[].gpu_index "
                    "(or set prometheus.labels / prometheus.queries / prometheus.selector)"
                )
            rows.append(Check(TARGET, check, FAIL if core else WARN, f"no fresh series for {shown}", fix))
        else:
            rows.append(Check(TARGET, check, OK, f"a series for each of {len(cfg.gpus)} GPUs"))
    return rows


def _stale_row(cfg: Config, staleness_s: float, vec: Vector, keys: list[SeriesKey]) -> Check:
    """The GPUs whose temperature's newest sample is older than ``staleness_s``: the poll reads them
    as not known, though the reading rows count their series."""
    from gpuheal.sources import prometheus as source

    old = [g.alias for g, key in zip(cfg.gpus, keys, strict=True) if source.lookup(vec, key) != (None, None)]
    if not old:
        return Check(TARGET, "query stale", OK, f"every GPU has a sample newer than {staleness_s:g} s")
    shown = ", ".join(old[:SHOWN]) + (f" (+{len(old) - SHOWN} more)" if len(old) > SHOWN else "")
    detail = f"newest sample older than staleness_s ({staleness_s:g} s): {shown}"
    fix = "is Prometheus still scraping their exporter? (its timestamps, its clock; or raise prometheus.staleness_s)"
    return Check(TARGET, "query stale", FAIL, detail, fix)


def _fix(kind: str, prom: PrometheusConfig) -> str:
    return {
        "refused": "is Prometheus running at prometheus.url?",
        "timeout": "Prometheus is too slow for this query: raise prometheus.timeout_s or use a recording rule",
        "oversized": (
            f"raise prometheus.max_response_bytes ({prom.max_response_bytes}) "
            "or narrow prometheus.selector"
        ),
    }.get(kind, "prometheus.queries must be PromQL that returns an instant vector")
