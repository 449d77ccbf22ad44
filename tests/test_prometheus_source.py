"""The Prometheus source against answers the real engine cannot be made to give on demand (issue 13
"Bad input"): a hang, a 50 MB body, ``"status": "error"``, a matrix, NaN/+Inf, duplicated series,
garbage. Each is a data fault with ``"source": "prometheus"`` or "not known", bounded by the deadline,
never a crash and never a false issue. What the real Prometheus answers is checked in
``tests/realprom``; the canned bodies here copy its envelope (``docs/formats.md`` §6.3)."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.config import load_config_dict
from gpuheal.errors import ConfigError
from gpuheal.model import Observation
from gpuheal.sources import prometheus
from gpuheal.sources.prometheus import Matcher, decimal, fresh, trend_queries, vector_of, with_matchers


def _series(metric: str, host: str, value: str, gpu: str = "0", **extra: str) -> dict:
    labels = {"__name__": metric, "Hostname": host, "gpu": gpu, "UUID": f"GPU-{host}", "modelName": "RTX", **extra}
    return {"metric": labels, "value": [1700000000.5, value]}


def _ok(result: list) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


class Canned:
    """A stand-in for Prometheus's query API: ``answer(query) -> (status, body) | "hang"``."""

    def __init__(self, answer):
        self.answer = answer
        self.queries: list[str] = []
        self.times: list[str | None] = []  # each query's ``time=`` (None: Prometheus's own now)
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                args = parse_qs(urlsplit(self.path).query)
                q = args.get("query", [""])[0]
                canned.queries.append(q)
                canned.times.append(args.get("time", [None])[0])
                got = canned.answer(q)
                if got == "hang":
                    time.sleep(3)
                    return
                status, body = got
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _reading(query: str, metric: str) -> bool:
    """``query`` is the poll's reading of ``metric`` (a plain selector: not a trend, not the stale probe)."""
    return _metric_of(query) == metric and prometheus.is_selector(query)


def _metric_of(query: str) -> str:
    for name in ("GPU_TEMP", "FB_USED", "FB_FREE", "GPU_UTIL", "POWER_USAGE", "llamacpp"):
        if name in query:
            return name
    return "?"


def healthy(query: str, temps=None) -> tuple[int, bytes]:
    """Two GPUs (h1, h2), every reading and trend known."""
    temps = temps or {"h1": "50", "h2": "60"}
    m = _metric_of(query)
    if " unless " in query:  # the series too young for a span, or with samples too old: none
        return 200, _ok([])
    if query.startswith(("deriv", "count_over_time")):
        value = {"deriv": "0", "count_over_time": "40"}[query.split("(")[0]]
        return 200, _ok([_series("", h, value) for h in ("h1", "h2")])
    values = {"GPU_TEMP": temps, "FB_USED": {"h1": "1000", "h2": "2000"}, "FB_FREE": {"h1": "23576", "h2": "22576"},
              "GPU_UTIL": {"h1": "10", "h2": "20"}, "POWER_USAGE": {"h1": "100.500000", "h2": "200"}}.get(m)
    if values is None:
        return 200, _ok([])
    return 200, _ok([_series("DCGM", h, v) for h, v in values.items()])


def _cfg_dict(url: str, **prom) -> dict:
    return {
        "prometheus": {"url": url, "timeout_s": 5, "connect_timeout_s": 2, **prom},
        "gpus": [
            {"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:9"},
            {"alias": "b", "host": "h2", "endpoint": "http://127.0.0.1:9"},
        ],
    }


def _cfg(url: str, **prom) -> object:
    return load_config_dict(_cfg_dict(url, **prom))


@pytest.fixture
def canned():
    made = []

    def make(answer):
        c = Canned(answer)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_healthy_answer_maps_every_reading_to_its_gpu(canned):
    srv = canned(healthy)
    got = prometheus.read(_cfg(srv.url), time.time())
    assert got.ok and got.faults == []
    a = got.values["a"]
    assert a["temp_c"] == 50.0 and a["vram_used_mb"] == 1000.0 and a["vram_total_mb"] == 24576.0
    assert a["power_w"] == 100.5 and a["util_pct"] == 10.0 and a["name"] == "RTX"
    # covered spans proven: Rule 2's min_span_h (5.75 h) and recover_span_h (2 h)
    assert a["vram_trend"].n == 40 and a["vram_trend"].span_s == 5.75 * 3600 and a["vram_trend"].halves == (0.0, 0.0)
    assert got.values["b"]["temp_c"] == 60.0
    # one query per signal for the whole fleet, not one per GPU; staleness in every reading query
    assert len(srv.queries) == len(set(srv.queries))
    temp_q = [q for q in srv.queries if _reading(q, "GPU_TEMP")]
    assert temp_q == ["DCGM_FI_DEV_GPU_TEMP"]
    assert "DCGM_FI_DEV_GPU_TEMP unless last_over_time(DCGM_FI_DEV_GPU_TEMP[120000ms])" in srv.queries


def test_queries_run_at_prometheus_now_unless_asked_at_the_poll_clock(canned):
    """``at_poll_time`` (off by default): every query, Rule 8's asked after the temperatures too, is
    evaluated at the poll's clock, to the millisecond (the source-mode matrix's backfilled TSDB)."""
    srv = canned(lambda q: healthy(q, {"h1": "72", "h2": "60"}))  # h1 hot: Rule 8's queries follow
    prometheus.read(_cfg(srv.url), 1784361660.4567)
    assert srv.times and set(srv.times) == {None}
    srv.queries.clear()
    srv.times.clear()
    prometheus.read(_cfg(srv.url, at_poll_time=True), 1784361660.4567)
    assert any(q.startswith("deriv(DCGM_FI_DEV_GPU_TEMP") for q in srv.queries), srv.queries
    assert set(srv.times) == {"1784361660.457"}


def test_selector_goes_into_every_query(canned):
    srv = canned(healthy)
    prometheus.read(_cfg(srv.url, selector='{site="eu1"}'), time.time())
    dcgm = [q for q in srv.queries if "DCGM" in q or "llamacpp" in q]
    assert dcgm and all('{site="eu1"}' in q for q in dcgm)


@pytest.mark.parametrize(
    "answer, kind",
    [
        ((503, json.dumps({"status": "error", "errorType": "unavailable", "error": "shutting down"}).encode()), "http-503"),
        ((422, json.dumps({"status": "error", "errorType": "execution", "error": "query too big"}).encode()), "http-422"),
        ((200, json.dumps({"status": "error", "errorType": "bad_data", "error": "x"}).encode()), "invalid"),
        ((200, b"<html>proxy says hi</html>"), "invalid"),
        ((502, b"<html>Bad Gateway</html>"), "http-502"),
        ((200, json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}).encode()), "invalid"),
        ((200, json.dumps({"status": "success", "data": {"resultType": "vector"}}).encode()), "invalid"),
        ((200, b"[1, 2, 3]"), "invalid"),
        ((200, b"[" * 100000), "invalid"),
    ],
)
def test_a_bad_answer_is_a_prometheus_fault_and_rule7_input(canned, answer, kind):
    srv = canned(lambda q: answer)
    got = prometheus.read(_cfg(srv.url), time.time())
    assert not got.ok
    assert {f.source for f in got.faults} == {"prometheus"}
    assert got.faults[0].fault == kind
    assert all(f.detail.isprintable() for f in got.faults)


def test_hang_is_bounded_by_the_deadline(canned):
    srv = canned(lambda q: "hang")
    started = time.monotonic()
    got = prometheus.read(_cfg(srv.url, timeout_s=1, connect_timeout_s=0.5), time.time())
    assert time.monotonic() - started < 2.5  # timeout_s 1: the queries run concurrently
    assert not got.ok and got.faults[0].fault == "timeout"


def test_huge_answer_is_oversized(canned):
    big = _ok([_series("T", f"x{i}", "1") for i in range(1000)])
    srv = canned(lambda q: (200, big))
    got = prometheus.read(_cfg(srv.url, max_response_bytes=4096), time.time())
    assert not got.ok and got.faults[0].fault == "oversized"


def test_a_50_mb_answer_is_oversized_at_the_default_cap(canned):
    body = b'{"status":"success","data":{"resultType":"vector","result":[' + b" " * (50 << 20) + b"]}}"
    srv = canned(lambda q: (200, body))
    cfg = _cfg(srv.url)
    assert cfg.prometheus.max_response_bytes < len(body)
    got = prometheus.read(cfg, time.time())
    assert not got.ok and {f.fault for f in got.faults} == {"oversized"}


def test_refused_is_a_fault():
    got = prometheus.read(_cfg("http://127.0.0.1:9"), time.time())
    assert not got.ok and got.faults[0].fault == "refused"


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "-5", "1e999", "0x10", "", "٣", "1_0", None, 5, ["1"]])
def test_a_value_that_is_not_a_reading_is_not_known(canned, bad):
    def answer(q):
        if _reading(q, "GPU_TEMP"):
            s = _series("T", "h1", "50")
            s["value"][1] = bad
            return 200, _ok([s, _series("T", "h2", "60")])
        return healthy(q)

    srv = canned(answer)
    got = prometheus.read(_cfg(srv.url), time.time())
    assert got.ok
    assert "temp_c" not in got.values["a"] and got.values["b"]["temp_c"] == 60.0
    assert any(f.source == "prometheus" and "a: temp_c" in f.detail for f in got.faults)


def test_one_gpu_matched_by_two_series_is_not_known(canned):
    def answer(q):
        if _reading(q, "GPU_TEMP"):
            return 200, _ok([_series("T", "h1", "50", DCGM_FI_DRIVER_VERSION="535"),
                             _series("T", "h1", "99", DCGM_FI_DRIVER_VERSION="550"), _series("T", "h2", "60")])
        return healthy(q)

    srv = canned(answer)
    got = prometheus.read(_cfg(srv.url), time.time())
    assert "temp_c" not in got.values["a"]
    assert any("more than one series" in f.detail for f in got.faults)


def test_empty_result_leaves_the_gpu_not_known_with_a_fault_naming_it(canned):
    def answer(q):
        status, body = healthy(q)
        doc = json.loads(body)
        doc["data"]["result"] = [r for r in doc["data"]["result"] if r["metric"]["Hostname"] != "h2"]
        return status, json.dumps(doc).encode()

    srv = canned(answer)
    got = prometheus.read(_cfg(srv.url), time.time())
    assert got.ok and got.values["b"] == {}
    assert any(f.source == "b" and "no fresh series for host 'h2'" in f.detail for f in got.faults)


def test_host_with_several_gpus_needs_gpu_index(canned):
    def answer(q):
        if _reading(q, "GPU_TEMP"):
            return 200, _ok([_series("T", "h1", "50", gpu="0"), _series("T", "h1", "51", gpu="1"), _series("T", "h2", "6")])
        return healthy(q)

    got = prometheus.read(_cfg(canned(answer).url), time.time())
    assert "temp_c" not in got.values["a"]
    assert any("set gpus[].gpu_index" in f.detail for f in got.faults)


def test_match_label_maps_by_uuid(canned):
    srv = canned(healthy)
    cfg = load_config_dict(
        {
            "prometheus": {"url": srv.url, "labels": {"match": "UUID"}},
            "gpus": [{"alias": "a", "host": "anything", "endpoint": "http://127.0.0.1:9", "prometheus_match": "GPU-h2"}],
        }
    )
    got = prometheus.read(cfg, time.time())
    assert got.values["a"]["temp_c"] == 60.0


def test_restarted_gpu_gets_its_own_window(canned):
    srv = canned(healthy)
    now = time.time()
    prometheus.read(_cfg(srv.url), now, prometheus.PromMemory({"a": now - 600, "b": now - 10 * 3600}))
    own = [q for q in srv.queries if 'Hostname="h1"' in q]
    assert own and all("600000ms" in q or "300000ms" in q for q in own)
    assert not [q for q in srv.queries if 'Hostname="h2"' in q]  # its restart is outside the window


# --------------------------------------------------------------------------- the full poll


def test_sense_with_prometheus_down_is_rule7_input_never_a_crash():
    from gpuheal.sources.sense import sense

    obs = sense(_cfg("http://127.0.0.1:9"), datetime.now(UTC))
    assert obs.source == "prometheus" and not obs.monitor_ok
    assert obs.faults_for("prometheus")[0].fault == "refused"
    again = Observation.from_dict(json.loads(json.dumps(obs.to_dict())))
    assert again.source == "prometheus" and again.faults == obs.faults


# --------------------------------------------------------------------------- pure parts


_MATCHER = Matcher(_cfg("http://127.0.0.1:9"))


def _vector(body: bytes, status: int = 200):
    return vector_of(status, body, "temp_c", _MATCHER, False, 0.0, 200.0)


@given(st.binary(max_size=300), st.sampled_from([200, 400, 422, 503]))
@settings(max_examples=200, deadline=None)
def test_an_answer_of_any_bytes_is_a_vector_or_a_fault(body, status):
    vec = _vector(body, status)
    assert vec.fault is not None or status == 200
    assert vec.fault is None or vec.fault.detail.isprintable()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@given(json_values)
@settings(max_examples=300, deadline=None)
def test_any_json_in_the_envelope_never_raises_and_keeps_only_readings(doc):
    vec = _vector(json.dumps({"status": "success", "data": {"resultType": "vector", "result": doc}}).encode())
    assert all(isinstance(v, float) and 0 <= v <= 200 for v in vec.values.values())
    _vector(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "entries, malformed",
    [
        ([{"metric": {"Hostname": "h1"}, "value": [1, "50"]}], 0),
        ([{"metric": {}, "value": [1, "50"]}], 1),  # an aggregate without labels: the query is wrong
        ([{"metric": {"job": "x"}, "value": [1, "50"]}], 0),  # not a GPU series: not ours, no fault
        ([{"metric": {"Hostname": "h1"}, "value": [1]}, {"metric": "h1", "value": [1, "2"]}], 2),
        ([{"metric": {"Hostname": "h1"}}, {"value": [1, "2"]}, 5, None], 2),  # a non-object entry is skipped
    ],
)
def test_malformed_entries_are_counted_in_one_fault(entries, malformed):
    vec = _vector(_ok(entries))
    assert (vec.fault is None) == (malformed == 0)
    if malformed:
        assert vec.fault.fault == "invalid" and f"{malformed} malformed result entries" in vec.fault.detail


def test_a_key_seen_twice_is_dropped_whatever_the_values():
    vec = _vector(_ok([_series("T", "h1", "50"), _series("T", "h1", "NaN", job="b"), _series("T", "h2", "60")]))
    assert ("g", "h1", "0") in vec.dup and ("g", "h1", "0") not in vec.values and ("g", "h1", "0") not in vec.bad
    assert vec.values == {("g", "h2", "0"): 60.0}


@given(st.text(max_size=80))
def test_decimal_takes_only_finite_ascii_numbers(text):
    value = decimal(text)
    assert value is None or value == value and abs(value) != float("inf")


def test_trend_queries_are_promql_over_the_window():
    q = trend_queries('X{site="eu1"}', 21600, [7200, 20700], 0.02)
    assert q["slope"] == 'deriv(X{site="eu1"}[21600000ms])'
    assert q["n"] == 'count_over_time(X{site="eu1"}[21600000ms])'
    assert q["h1"] == 'deriv(X{site="eu1"}[10800000ms] offset 10800000ms) >= 0.02'
    assert q["h2"] == 'deriv(X{site="eu1"}[10800000ms]) >= 0.02'
    assert q["young20700000"] == 'X{site="eu1"} unless count_over_time(X{site="eu1"}[900000ms] offset 20700000ms)'
    assert q["young7200000"] == 'X{site="eu1"} unless count_over_time(X{site="eu1"}[14400000ms] offset 7200000ms)'
    assert "h1" not in trend_queries("X", 300, [120], None)


def test_halves_are_asked_from_half_the_lowest_sustained_rate_of_the_fleet():
    cfg = load_config_dict(
        {
            "prometheus": {"url": "http://x:1"},
            "gpus": [
                {"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:9"},  # 300 MB/h × 0.5
                {"alias": "b", "host": "h2", "endpoint": "http://127.0.0.1:9", "rules": {"vram-leak": {"mb_per_hour": 200}}},
            ],
        }
    )
    queries = prometheus.build_queries(cfg, prometheus.PromMemory(), time.time(), Matcher(cfg))
    assert queries["vram.h2"][0].endswith(f" >= {200 * 0.5 / 3600 / 2:g}")


def _young_answer(query: str, young: dict[str, list[str]]) -> tuple[int, bytes] | None:
    """The ``young`` answers of a scenario: span in ms → the hosts too young for it."""
    if " unless count_over_time(" not in query:
        return None
    for span_ms, hosts in young.items():
        if f"offset {span_ms}ms" in query:
            return 200, _ok([_series("DCGM", h, "1000") for h in hosts])
    return 200, _ok([])


@pytest.mark.parametrize(
    "young, span_a, span_b",
    [
        ({}, 5.75 * 3600, 5.75 * 3600),  # every GPU covers both spans
        ({"20700000": ["h1"]}, 2 * 3600, 5.75 * 3600),  # a: 2 h proven, not 5.75 h
        ({"20700000": ["h1", "h2"], "7200000": ["h1"]}, 0.0, 2 * 3600),
    ],
)
def test_the_span_proven_is_the_longest_the_gpu_is_not_too_young_for(canned, young, span_a, span_b):
    srv = canned(lambda q: _young_answer(q, young) or healthy(q))
    got = prometheus.read(_cfg(srv.url), time.time())
    assert got.values["a"]["vram_trend"].span_s == span_a and got.values["b"]["vram_trend"].span_s == span_b


def test_a_failed_young_query_proves_no_span(canned):
    def answer(q):
        if " unless count_over_time(" in q and "offset 7200000ms" in q:
            return 503, json.dumps({"status": "error", "errorType": "unavailable", "error": "busy"}).encode()
        return healthy(q)

    got = prometheus.read(_cfg(canned(answer).url), time.time())
    # 5.75 h is proven (its own query answered): a failure proves nothing, never "covered"
    assert got.values["a"]["vram_trend"].span_s == 5.75 * 3600
    assert any(f.source == "prometheus" and "young7200000" in f.detail for f in got.faults)


def test_a_half_below_where_halves_are_asked_for_is_not_measured(canned):
    def answer(q):
        if q.startswith("deriv(") and "[10800000ms])" in q and "offset" not in q:  # h2: only h2's GPU b
            return 200, _ok([_series("", "h2", "0.5")])
        return healthy(q)

    got = prometheus.read(_cfg(canned(answer).url), time.time())
    assert got.values["a"]["vram_trend"].halves is None  # Rule 2: not shown to be sustained
    assert got.values["b"]["vram_trend"].halves == (0.0, 0.5 * 3600)


@pytest.mark.parametrize(
    "series, out",
    [
        ("X", 'X{Hostname="h"}'),
        ('X{site="eu1"}', 'X{site="eu1",Hostname="h"}'),
        ("X{}", 'X{Hostname="h"}'),
        ('{__name__="X"}', '{__name__="X",Hostname="h"}'),
        ('X{a="}{"}', 'X{a="}{",Hostname="h"}'),
        ("rate(X[5m])", None),
        ('X{a="1"} or Y{b="2"}', None),
        ("X[5m]", None),
        ("X offset 5m", None),
        ("", None),
    ],
)
def test_with_matchers(series, out):
    assert with_matchers(series, 'Hostname="h"') == out


@pytest.mark.parametrize(
    "query, promql",
    [
        ('X{site="eu1"}', 'X{site="eu1"}'),
        ("rate(X[5m])", "(rate(X[5m])) and ((time() - timestamp(rate(X[5m]))) <= 120)"),
        ('X{a="1"} or Y', '(X{a="1"} or Y) and ((time() - timestamp(X{a="1"} or Y)) <= 120)'),
    ],
)
def test_freshness_is_a_cheap_range_for_a_selector_and_timestamp_for_any_expression(query, promql):
    assert fresh(query, 120) == promql


@pytest.mark.parametrize(
    "data, path",
    [
        ({"monitor": {"url": "http://127.0.0.1:1"}}, "prometheus"),
        ({"prometheus": {"url": "http://x:1", "selector": 'site="eu1"'}}, "prometheus.selector"),
        ({"prometheus": {"url": "http://x:1", "trend_every_s": -1}}, "prometheus.trend_every_s"),
        ({"prometheus": {"url": "http://x:1", "trend_every_s": "5m"}}, "prometheus.trend_every_s"),
        ({"prometheus": {"url": "http://x:1", "trend_every_s": 1e300}}, "prometheus.trend_every_s"),
        ({"prometheus": {"url": "http://x:1", "labels": {"match": "UUID"}}}, "gpus[0].prometheus_match"),
        ({"prometheus": {"url": "http://x:1"}, "rules": {"thermal-rising": {"window_s": 60}}}, "rules.thermal-rising.window_s"),
        ({"prometheus": {"url": "ftp://x"}}, "prometheus.url"),
        ({"prometheus": {"url": "http://x:1", "queries": {"temp_c": 5}}}, "prometheus.queries.temp_c"),
    ],
)
def test_config_errors_name_the_key(data, path):
    gpu = {"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:9"}
    if data.get("monitor"):
        data = {**data, "prometheus": {"url": "http://x:1"}}
    with pytest.raises(ConfigError) as err:
        load_config_dict({**data, "gpus": [gpu]})
    assert err.value.key_path == path


def test_per_gpu_trend_window_is_refused_with_prometheus():
    with pytest.raises(ConfigError) as err:
        load_config_dict(
            {
                "prometheus": {"url": "http://x:1"},
                "gpus": [{"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:9", "rules": {"vram-leak": {"window_h": 3}}}],
            }
        )
    assert err.value.key_path == "gpus[0].rules.vram-leak.window_h"


def test_endpoint_liveness_from_up_instead_of_probes(canned):
    """``probe_endpoints: false``: no /health probe per GPU; each llama-server's state is the ``up``
    of its scrape target (instance = the endpoint's host:port)."""
    from gpuheal.sources.sense import sense

    def answer(q):
        if q == "up":
            return 200, _ok([{"metric": {"__name__": "up", "job": "llama", "instance": "127.0.0.1:8081"}, "value": [1, "1"]},
                             {"metric": {"__name__": "up", "job": "llama", "instance": "127.0.0.1:8082"}, "value": [1, "0"]}])
        return healthy(q)

    srv = canned(answer)
    cfg = load_config_dict(
        {
            "prometheus": {"url": srv.url, "probe_endpoints": False},
            "gpus": [
                {"alias": "a", "host": "h1", "endpoint": "http://127.0.0.1:8081"},
                {"alias": "b", "host": "h2", "endpoint": "http://127.0.0.1:8082"},
                {"alias": "c", "host": "h3", "endpoint": "http://127.0.0.1:8083"},
            ],
        }
    )
    obs = sense(cfg, datetime.now(UTC))  # nothing listens on 8081-8083: a probe would say refused
    assert obs.gpus["a"].endpoint == "ok" and obs.gpus["b"].endpoint == "refused"
    assert obs.gpus["c"].endpoint is None  # no up series: not known
    assert [f.source for f in obs.faults if f.fault == "refused"] == ["b"]


@pytest.mark.parametrize(("source", "shown"), [("prometheus", None), ("smi", None), ("monitor", False)])
def test_breakers_are_not_known_without_gpu_monitor(source, shown):
    """circuit-breaker-status.json said ``"open": false`` for every GPU behind Prometheus, where nothing
    is known of LiteLLM's breakers; and such a poll reset a breaker gpu-monitor had seen open."""
    from gpuheal import benchdata
    from gpuheal.core import engine
    from gpuheal.core.heal_state import HealState
    from gpuheal.core.memory import Memory
    from gpuheal.core.view import FleetView
    from gpuheal.model import GpuSample
    from gpuheal.rules import ALL
    from gpuheal.rules.circuit_breaker_stuck.memory import open_since
    from gpuheal.state.history import History
    from gpuheal.steps.evaluate import breaker_status

    cfg = _cfg("http://127.0.0.1:9")
    at = datetime(2026, 7, 18, 8, 0, 0, 400000, tzinfo=UTC)
    obs = Observation(at=at, gpus={"a": GpuSample(temp_c=60.0), "b": GpuSample(temp_c=61.0)}, monitor_ok=True,
                      source=source)
    memory = Memory.from_json({"breaker_open_since": {"a": at.timestamp() - 600}})
    view = FleetView(cfg, at.timestamp(), obs, History(), benchdata.empty(), memory)
    engine.remember(ALL, view, memory)
    assert breaker_status(view, HealState.from_json({}))["a"]["open"] is shown
    # still open since then after a poll that does not know the breakers; reset by one that saw it closed
    assert open_since(memory, "a") == (at.timestamp() - 600 if shown is None else None)


# --------------------------------------------------------------------------- Rule 2's remembered trend


def _check_at(cfg, state_dir, at_s: float):
    from gpuheal.state.store import StateDir
    from gpuheal.steps import check

    with StateDir(state_dir) as store:
        return check.run(cfg, store, datetime.fromtimestamp(at_s, UTC))


def _asked_rule2(srv) -> int:
    asked = sum(1 for q in srv.queries if q.startswith("deriv(DCGM_FI_DEV_FB_USED[21600000ms])"))
    srv.queries.clear()
    return asked


def test_rule2_trend_is_asked_every_trend_every_s_and_remembered_between(canned, tmp_path):
    srv = canned(healthy)
    cfg = _cfg(srv.url)
    t0 = 1_790_000_000.0
    # cron's minute, each start up to two seconds late; 300 s later (or a little less) asks again
    asked = [_asked_rule2(srv) if _check_at(cfg, tmp_path, t0 + dt) else 0 for dt in (0, 61.4, 120.2, 181.9, 240.7, 298.8, 360.3)]
    assert asked == [1, 0, 0, 0, 0, 1, 0]
    obs = _check_at(cfg, tmp_path, t0 + 421.0).obs
    assert obs.gpus["a"].vram_trend.n == 40 and obs.gpus["a"].vram_trend.span_s == 5.75 * 3600


def test_a_changed_rule2_window_asks_again(canned, tmp_path):
    srv = canned(healthy)
    t0 = 1_790_000_000.0
    _check_at(_cfg(srv.url), tmp_path, t0)
    _asked_rule2(srv)
    shorter = load_config_dict({**_cfg_dict(srv.url), "rules": {"vram-leak": {"window_h": 5, "min_span_h": 4.75}}})
    _check_at(shorter, tmp_path, t0 + 60)
    assert any(q.startswith("deriv(DCGM_FI_DEV_FB_USED[18000000ms])") for q in srv.queries)


@pytest.mark.parametrize("saved", [b"", b"{", b"[]", b'{"at_s": "x"}', b'{"at_s": 1e400}', b'{"at_s": 1790000000, "trends": 5}'])
def test_a_damaged_remembered_trend_is_asked_again(canned, tmp_path, saved):
    srv = canned(healthy)
    (tmp_path / "prometheus-trend.json").write_bytes(saved)
    result = _check_at(_cfg(srv.url), tmp_path, 1_790_000_030.0)
    assert _asked_rule2(srv) == 1 and result.obs.gpus["a"].vram_trend is not None


@pytest.mark.parametrize(
    "row", ["x", [], [1, 2, 3], [1, "n", 3, 3600], [1, 2, 3, 4, 5], [float("nan"), 2, 3, 3600], [1, 2, 3, True], None]
)
def test_a_damaged_remembered_row_is_asked_again(canned, tmp_path, row):
    srv = canned(healthy)
    cfg = _cfg(srv.url)
    _check_at(cfg, tmp_path, 1_790_000_000.0)
    saved = json.loads((tmp_path / "prometheus-trend.json").read_text())
    assert saved["data"]["trends"]["a"] == [0.0, 40, 5.75 * 3600, 3600.0, 0.0, 0.0]
    saved["data"]["trends"]["a"] = row
    (tmp_path / "prometheus-trend.json").write_text(json.dumps(saved))
    _asked_rule2(srv)
    result = _check_at(cfg, tmp_path, 1_790_000_061.0)
    assert _asked_rule2(srv) == 1 and result.obs.gpus["a"].vram_trend.n == 40


@pytest.mark.parametrize("restarted_s_ago, remembered", [(10 * 3600, True), (600, False), (-30, True)])
def test_a_gpu_restarted_long_ago_is_remembered_one_in_its_own_window_is_not(canned, tmp_path, restarted_s_ago, remembered):
    """A GPU whose last restart is older than Rule 2's window (or whose grace has not ended) reads
    the fleet-wide trend, so it is remembered; one in its own window is asked every poll instead."""
    from gpuheal.sources.prometheus import PromMemory

    srv = canned(healthy)
    cfg = _cfg(srv.url)
    obs = _check_at(cfg, tmp_path / "first", 1_790_000_000.0).obs
    memory = PromMemory({"a": 1_790_000_000.0 - restarted_s_ago}, key=prometheus.remembered_key(cfg))
    rows = prometheus.save_memory(cfg, memory, obs)["trends"]
    assert ("a" in rows) == remembered and "b" in rows


def test_nothing_is_remembered_when_prometheus_gave_no_trend(canned, tmp_path):
    down = _check_at(_cfg("http://127.0.0.1:9"), tmp_path, 1_790_000_000.0)
    assert not down.obs.monitor_ok and not (tmp_path / "prometheus-trend.json").exists()
    srv = canned(healthy)
    _check_at(_cfg(srv.url), tmp_path, 1_790_000_060.0)
    assert _asked_rule2(srv) == 1  # the next poll asks


def test_trend_every_s_zero_asks_every_poll(canned, tmp_path):
    srv = canned(healthy)
    cfg = _cfg(srv.url, trend_every_s=0)
    assert [_asked_rule2(srv) if _check_at(cfg, tmp_path, 1_790_000_000.0 + 60 * i) else 0 for i in range(3)] == [1, 1, 1]


# --------------------------------------------------------------------------- Rule 8: hot GPUs only


def _selecting(temps: dict[str, str]):
    """``healthy`` with these temperatures, and trend answers holding only the hosts a
    ``Hostname=~"..."`` matcher selects (as the real engine answers; ``tests/realprom`` checks it)."""
    import re

    def answer(q):
        status, body = healthy(q, temps)
        m = re.search(r'Hostname=~("(?:[^"\\]|\\.)*")', q)
        if m:
            pattern = json.loads(m.group(1))
            doc = json.loads(body)
            doc["data"]["result"] = [r for r in doc["data"]["result"] if re.fullmatch(pattern, r["metric"]["Hostname"])]
            body = json.dumps(doc).encode()
        return status, body

    return answer


def _rule8(srv) -> list[str]:
    """The Rule 8 trend queries the poll sent (deriv, count, young over the temperature series)."""
    return [q for q in srv.queries if "GPU_TEMP" in q and "last_over_time" not in q and not prometheus.is_selector(q)]


def test_a_fleet_running_cool_asks_no_rule8_trend(canned):
    """Both Rule 8 tiers judge the rise only above their ``temp_c`` (70 °C): below 65 °C on every GPU
    the poll asks none of its three trend queries (each an answer of every GPU at 10,000 GPUs)."""
    srv = canned(lambda q: healthy(q, {"h1": "50", "h2": "64.9"}))
    got = prometheus.read(_cfg(srv.url), time.time())
    assert got.ok and got.faults == [] and _rule8(srv) == []
    assert "temp_trend" not in got.values["a"] and "temp_trend" not in got.values["b"]
    assert got.values["b"]["temp_c"] == 64.9 and got.values["a"]["vram_trend"].n == 40


def test_the_rule8_trend_names_the_hot_gpus_hosts(canned):
    srv = canned(_selecting({"h1": "50", "h2": "65"}))
    got = prometheus.read(_cfg(srv.url, selector='{site="eu1"}'), time.time())
    assert sorted(_rule8(srv)) == sorted([
        'deriv(DCGM_FI_DEV_GPU_TEMP{site="eu1",Hostname=~"h2"}[300000ms])',
        'count_over_time(DCGM_FI_DEV_GPU_TEMP{site="eu1",Hostname=~"h2"}[300000ms])',
        'DCGM_FI_DEV_GPU_TEMP{site="eu1",Hostname=~"h2"} unless '
        'count_over_time(DCGM_FI_DEV_GPU_TEMP{site="eu1",Hostname=~"h2"}[180000ms] offset 120000ms)',
    ])
    b = got.values["b"]["temp_trend"]
    assert b.slope == 0 and b.n == 40 and b.span_s == 120  # min_span_s proven
    assert "temp_trend" not in got.values["a"]


def test_in_a_heat_wave_the_rule8_trend_is_filtered_in_promql(canned, monkeypatch):
    """Past ``MAX_HOT_NAMED`` hot GPUs a selector naming each would be huge: the fleet-wide query
    keeps only the series from 65 °C up."""
    monkeypatch.setattr(prometheus, "MAX_HOT_NAMED", 1)
    srv = canned(lambda q: healthy(q, {"h1": "81", "h2": "90"}))
    got = prometheus.read(_cfg(srv.url), time.time())
    assert sorted(_rule8(srv)) == sorted([
        "deriv(DCGM_FI_DEV_GPU_TEMP[300000ms]) and DCGM_FI_DEV_GPU_TEMP >= 65",
        "count_over_time(DCGM_FI_DEV_GPU_TEMP[300000ms]) and DCGM_FI_DEV_GPU_TEMP >= 65",
        # not filtered: a GPU left out counts as proven to cover the span, so one that cooled
        # between the queries must not be left out
        "DCGM_FI_DEV_GPU_TEMP unless count_over_time(DCGM_FI_DEV_GPU_TEMP[180000ms] offset 120000ms)",
    ])
    assert got.values["a"]["temp_trend"].n == 40 and got.values["b"]["temp_trend"].n == 40


@pytest.mark.parametrize("bad", ["+Inf", "NaN", "1e999", "999", "-5", "hot", ""])
def test_a_temperature_that_is_not_a_reading_asks_no_rule8_trend(canned, bad):
    """A garbage temperature is not known, so it cannot make its GPU hot: no trend is asked for it."""
    srv = canned(_selecting({"h1": bad, "h2": "50"}))
    got = prometheus.read(_cfg(srv.url), time.time())
    assert _rule8(srv) == [] and "temp_c" not in got.values["a"] and "temp_trend" not in got.values["a"]


def test_a_failed_temperature_answer_asks_no_rule8_trend(canned):
    def answer(q):
        if _reading(q, "GPU_TEMP"):
            return 200, json.dumps({"status": "error", "errorType": "timeout", "error": "query timed out"}).encode()
        return healthy(q, {"h1": "90", "h2": "90"})

    srv = canned(answer)
    got = prometheus.read(_cfg(srv.url), time.time())
    assert not got.ok and _rule8(srv) == []
    assert "temp_trend" not in got.values["a"]


def test_a_gpu_with_a_lower_rule8_threshold_lowers_the_hot_line(canned):
    cfg = _cfg_dict("http://127.0.0.1:9")
    cfg["gpus"][0]["rules"] = {"thermal-warning": {"temp_c": 50}}  # h1 is judged from 50 °C: asked from 45
    srv = canned(_selecting({"h1": "46", "h2": "60"}))  # h2 keeps 70 °C: asked from 65
    cfg["prometheus"]["url"] = srv.url
    got = prometheus.read(load_config_dict(cfg), time.time())
    assert _rule8(srv) and all('Hostname=~"h1"}' in q for q in _rule8(srv))
    assert got.values["a"]["temp_trend"].n == 40 and "temp_trend" not in got.values["b"]


def test_the_rule8_trend_of_a_gpu_matched_by_label_names_that_label(canned):
    srv = canned(lambda q: healthy(q, {"h1": "50", "h2": "75"}))
    cfg = load_config_dict(
        {
            "prometheus": {"url": srv.url, "labels": {"match": "UUID"}},
            "gpus": [{"alias": "a", "host": "x", "endpoint": "http://127.0.0.1:9", "prometheus_match": "GPU-h2"}],
        }
    )
    got = prometheus.read(cfg, time.time())
    assert 'deriv(DCGM_FI_DEV_GPU_TEMP{UUID=~"GPU-h2"}[300000ms])' in _rule8(srv)  # "-" is no RE2 metacharacter
    assert got.values["a"]["temp_trend"].n == 40


def test_doctor_asks_the_rule8_trend_of_every_gpu():
    """``doctor`` shows which GPUs have no trend, so it asks the fleet-wide queries a cool poll skips."""
    cfg = _cfg("http://127.0.0.1:9")
    m = Matcher(cfg)
    assert "temp.slope" not in prometheus.build_queries(cfg, prometheus.PromMemory(), 0.0, m)
    full = prometheus.build_queries(cfg, prometheus.PromMemory(), 0.0, m, every_gpu=True)
    assert full["temp.slope"][0] == "deriv(DCGM_FI_DEV_GPU_TEMP[300000ms])"


@settings(max_examples=300, deadline=None)
@given(st.sets(st.text(min_size=1, max_size=12), min_size=1, max_size=4), st.text(max_size=12))
def test_the_hot_hosts_regex_matches_exactly_those_names(names, other):
    """Label values are data: every regex metacharacter is escaped (RE2 reads ``re.escape``'s
    escapes as the characters themselves; Python's engine stands in for it here)."""
    import re

    pattern = prometheus._alternatives(names)
    assert all(re.fullmatch(pattern, n, re.DOTALL) for n in names)
    assert bool(re.fullmatch(pattern, other, re.DOTALL)) == (other in names)


# --------------------------------------------------------------------------- samples too old


def test_a_gpu_whose_samples_are_too_old_is_not_known(canned):
    """A GPU whose temperature's newest sample is older than ``staleness_s`` is listed by the stale
    probe and reads as nothing at all, not as readings up to Prometheus's five-minute lookback old
    (a GPU gone from its target is absent from every plain selector at once: ``tests/realprom``)."""

    def answer(q):
        if q == "DCGM_FI_DEV_GPU_TEMP unless last_over_time(DCGM_FI_DEV_GPU_TEMP[120000ms])":
            return 200, _ok([_series("DCGM_FI_DEV_GPU_TEMP", "h1", "50")])
        return healthy(q)

    srv = canned(answer)
    got = prometheus.read(_cfg(srv.url), time.time())
    assert got.ok and got.values["a"] == {} and got.values["b"]["temp_c"] == 60.0
    assert [f.detail for f in got.faults] == ["Prometheus has no fresh series for host 'h1'"]


def test_a_failed_stale_probe_is_a_fault_and_the_readings_stand(canned):
    def answer(q):
        if q.startswith("DCGM_FI_DEV_GPU_TEMP unless last_over_time"):
            return 200, b'{"status": "error", "errorType": "execution", "error": "boom"}'
        return healthy(q)

    got = prometheus.read(_cfg(canned(answer).url), time.time())
    assert got.ok and got.values["a"]["temp_c"] == 50.0
    assert [(f.source, f.detail) for f in got.faults] == [("prometheus", "stale: status error, execution: boom")]


def test_no_stale_probe_for_a_temperature_expression():
    """Another expression's reading (``timestamp()`` of its value now) checks its own freshness."""
    cfg = _cfg("http://127.0.0.1:9", queries={"temp_c": "max by (Hostname, gpu) (T)"})
    assert "stale" not in prometheus.build_queries(cfg, prometheus.PromMemory(), 0.0, Matcher(cfg))
    assert prometheus.stale_probe('T{site="eu1"}', 60) == 'T{site="eu1"} unless last_over_time(T{site="eu1"}[60000ms])'
