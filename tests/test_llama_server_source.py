"""The benchmark inference test (``gpuheal.sources.llama_server``) against loopback look-alikes.

Bad input is normal input: null/absent timings, thinking models, 401, 503, hangs, garbage, huge
bodies, a server dying mid-benchmark. Nothing here may raise; every case is a BenchOutcome.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bench_fakes import (
    DROP,
    HANG,
    KILL,
    LOADING,
    NOT_FOUND,
    FakeLlama,
    Reply,
    chat_body,
    completion_body,
    dead_endpoint,
    props_body,
    timings,
)

from gpuheal.sources.llama_server import (
    DEFAULT_PROMPT,
    benchmark_inference,
    parse_props,
    read_props,
)

KEY = "sk-local-5678"


@pytest.fixture
def fake():
    servers = []

    def make(routes=None, **kw):
        srv = FakeLlama(routes, **kw)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


def bench(url, **kw):
    args = {"api_key": KEY, "n_predict": 32, "deadline_s": 5.0, "warmup": True}
    args.update(kw)
    return benchmark_inference(url, **args)


# ----------------------------------------------------------------------------- timings


def test_timings_present_props_warmup_and_request_shape(fake):
    srv = fake()
    out = bench(srv.url, n_predict=48)
    assert out.ok and out.error is None
    assert out.gen_tok_s == pytest.approx(74.9)
    assert out.prompt_tok_s == pytest.approx(812.5)
    assert out.tokens == 32
    assert out.api == "completion" and out.rate_source == "timings"
    assert out.model == "models/ThinkingCap-Qwen3.6-27B-Q4_K_M.gguf"
    assert out.n_ctx == 131072 and out.slots == 1
    assert out.status == 200 and out.requests == 3
    seen = srv.requests()
    assert [(s.method, s.path) for s in seen] == [
        ("GET", "/props"),
        ("POST", "/completion"),
        ("POST", "/completion"),
    ]
    for s in seen:
        assert s.headers["authorization"] == f"Bearer {KEY}"
    warm, main = seen[1].body, seen[2].body
    assert warm["n_predict"] == 8 and main["n_predict"] == 48
    assert main["prompt"] == DEFAULT_PROMPT
    assert main["cache_prompt"] is False and main["stream"] is False


def test_no_warmup_no_props_is_one_request(fake):
    srv = fake()
    out = bench(srv.url, warmup=False, props=False, prompt="custom prompt")
    assert out.ok and out.requests == 1
    assert out.model == "models/tiny.gguf"  # the completion's own "model" when /props was not read
    assert out.n_ctx is None
    assert srv.requests()[0].body["prompt"] == "custom prompt"


def test_null_rates_are_computed_from_counts(fake):
    t = timings(32)
    t["predicted_per_second"] = None
    t["prompt_per_second"] = None
    t["predicted_ms"] = 400.0
    t["prompt_ms"] = 20.0
    srv = fake({"POST /completion": Reply(200, completion_body(32, t))})
    out = bench(srv.url)
    assert out.ok and out.rate_source == "timings"
    assert out.gen_tok_s == pytest.approx(80.0)
    assert out.prompt_tok_s == pytest.approx(1100.0)


def test_timings_null_falls_back_to_chat_timings(fake):
    srv = fake({"POST /completion": Reply(200, completion_body(32, None))})
    out = bench(srv.url)
    assert out.ok and out.api == "chat" and out.rate_source == "timings"
    assert out.gen_tok_s == pytest.approx(70.1)
    assert out.tokens == 32
    # warm-up learnt that /completion has no timings: the measured request goes to chat directly
    paths = [s.path for s in srv.requests()]
    assert paths == ["/props", "/completion", "/v1/chat/completions", "/v1/chat/completions"]
    assert srv.requests("/v1/chat/completions")[-1].body["max_tokens"] == 32


def test_completion_missing_chat_without_timings_uses_usage_over_wall_time(fake):
    srv = fake(
        {
            "POST /completion": Reply(404, NOT_FOUND),
            "POST /v1/chat/completions": Reply(200, chat_body(16, "absent"), delay_s=0.2),
        }
    )
    out = bench(srv.url, n_predict=16)
    assert out.ok and out.api == "chat" and out.rate_source == "wall"
    assert out.tokens == 16
    assert 16 / 5 < out.gen_tok_s < 16 / 0.2 + 1e-6
    assert out.prompt_tok_s is None


def test_timings_absent_everywhere_uses_completion_tokens_over_wall(fake):
    srv = fake(
        {
            "POST /completion": Reply(200, completion_body(32, "absent"), delay_s=0.1),
            "POST /v1/chat/completions": Reply(404, NOT_FOUND),
        }
    )
    out = bench(srv.url, warmup=False)
    assert out.ok and out.api == "completion" and out.rate_source == "wall"
    assert out.tokens == 32 and out.gen_tok_s > 0


@pytest.mark.parametrize("bad", [float("nan"), "fast", -3, True, {"x": 1}])
def test_nonsense_rate_values_are_not_numbers(fake, bad):
    t = timings(32)
    t["predicted_per_second"] = bad
    t["predicted_ms"] = None
    body = json.dumps(completion_body(32, t)).replace("NaN", "null")
    srv = fake({"POST /completion": Reply(200, body.encode()), "POST /v1/chat/completions": Reply(404, NOT_FOUND)})
    out = bench(srv.url, warmup=False)
    assert out.ok and out.rate_source == "wall"  # never a garbage number as tok/s
    assert isinstance(out.gen_tok_s, float) and out.gen_tok_s > 0


# ----------------------------------------------------------------------------- thinking models


def test_thinking_model_empty_content_is_ok_when_tokens_were_predicted(fake):
    srv = fake(
        {
            "POST /completion": Reply(404, NOT_FOUND),
            "POST /v1/chat/completions": Reply(200, chat_body(32, content="", reasoning="The user wants")),
        }
    )
    out = bench(srv.url)
    assert out.ok and out.tokens == 32 and out.gen_tok_s == pytest.approx(70.1)


def test_completion_empty_content_is_ok_too(fake):
    srv = fake({"POST /completion": Reply(200, completion_body(32, content=""))})
    assert bench(srv.url).ok


def test_zero_tokens_is_empty(fake):
    t = timings(0, gen=None)
    srv = fake(
        {
            "POST /completion": Reply(200, completion_body(0, t, content="")),
            "POST /v1/chat/completions": Reply(200, chat_body(0, timings(0, gen=None), content="")),
        }
    )
    out = bench(srv.url, warmup=False)
    assert not out.ok and out.error == "empty"


# ----------------------------------------------------------------------------- L1/L2: 401


def test_401_is_unauthorized_after_exactly_one_request(fake):
    srv = fake(require_key="the-right-key")
    out = bench(srv.url)
    assert not out.ok and out.error == "unauthorized" and out.status == 401
    assert len(srv.requests()) == 1 and out.requests == 1
    assert out.key_sent == "sk-…(13 chars)"
    assert KEY not in json.dumps(out.to_dict())


def test_401_without_props_is_still_one_request(fake):
    srv = fake(require_key="the-right-key")
    out = bench(srv.url, props=False)
    assert out.error == "unauthorized"
    assert len(srv.requests()) == 1  # the warm-up's 401 stops it: no main request, no chat


def test_401_on_completion_only_stops_at_the_warmup(fake):
    srv = fake({"POST /completion": Reply(401, {"error": {"message": "Invalid API Key", "code": 401}})})
    out = bench(srv.url)
    assert out.error == "unauthorized" and out.detail.startswith("warm-up:")
    assert [s.path for s in srv.requests()] == ["/props", "/completion"]
    assert out.model and out.n_ctx == 131072  # /props did answer


def test_well_known_non_secret_is_named(fake):
    srv = fake(require_key="secret")
    out = bench(srv.url, api_key="not-needed")
    assert out.key_sent == "not-needed"


def test_no_key_configured_sends_no_header(fake):
    srv = fake()
    out = bench(srv.url, api_key="", warmup=False)
    assert out.ok
    assert all("authorization" not in s.headers for s in srv.requests())


# ----------------------------------------------------------------------------- 503, hang, garbage


def test_503_loading_is_loading_and_stops(fake):
    srv = fake({"GET /props": Reply(503, LOADING), "POST /completion": Reply(503, LOADING)})
    out = bench(srv.url)
    assert not out.ok and out.error == "loading" and out.status == 503
    assert "Loading model" in out.detail
    assert len(srv.requests()) == 1


def test_old_build_loading_body(fake):
    srv = fake({"POST /completion": Reply(503, {"status": "loading model"})})
    out = bench(srv.url, props=False)
    assert out.error == "loading" and "loading model" in out.detail


def test_hang_respects_the_deadline(fake):
    srv = fake({"GET /props": HANG, "POST /completion": HANG})
    started = time.monotonic()
    out = bench(srv.url, deadline_s=0.6)
    took = time.monotonic() - started
    assert not out.ok and out.error == "timeout"
    assert took < 2.0, f"took {took:.2f} s with a 0.6 s deadline"
    assert out.requests == 1  # a dead server costs one deadline, not three


def test_hang_on_the_measured_request(fake):
    srv = fake({"POST /completion": [Reply(200, completion_body(8)), HANG]})
    started = time.monotonic()
    out = bench(srv.url, deadline_s=0.5)
    assert out.error == "timeout" and time.monotonic() - started < 2.5
    assert out.model is not None  # what /props said is kept


def test_garbage_json(fake):
    srv = fake({"POST /completion": Reply(200, b"{not json"), "POST /v1/chat/completions": Reply(200, b"<html>")})
    out = bench(srv.url)
    assert not out.ok and out.error == "invalid"


def test_json_but_not_an_object(fake):
    srv = fake({"POST /completion": Reply(200, [1, 2, 3]), "POST /v1/chat/completions": Reply(404, NOT_FOUND)})
    out = bench(srv.url, warmup=False)
    assert out.error == "invalid"


def test_huge_body_is_capped(fake):
    huge = b'{"content":"' + b"x" * (6 << 20) + b'"}'
    srv = fake({"POST /completion": Reply(200, huge, chunked=True)})
    out = bench(srv.url, warmup=False, props=False)
    assert not out.ok and out.error == "invalid"
    assert "max_response_bytes" in out.detail


def test_huge_content_length_is_refused_before_reading(fake):
    srv = fake({"GET /props": Reply(200, b"x" * (2 << 20))})
    info = read_props(srv.url, KEY, 2.0)
    assert not info.ok and info.error == "invalid"


def test_plain_text_500(fake):
    srv = fake({"POST /completion": Reply(500, "Internal Server Error")})
    out = bench(srv.url, props=False)
    assert out.error == "http-500" and "Internal Server Error" in out.detail


def test_server_echoing_the_key_is_redacted(fake):
    srv = fake({"POST /completion": Reply(400, {"error": {"message": f"bad header Bearer {KEY}", "code": 400}})})
    out = bench(srv.url, props=False)
    assert out.error == "http-400"
    assert KEY not in out.detail


def test_refused(fake):
    out = bench(dead_endpoint())
    assert not out.ok and out.error == "refused" and out.requests == 1


def test_bad_url_is_invalid_not_an_exception():
    out = bench("ftp://example.invalid")
    assert out.error == "invalid"


# ----------------------------------------------------------------------------- killed mid-benchmark


def test_server_killed_mid_benchmark_is_a_clean_failure(fake):
    srv = fake({"POST /completion": [Reply(200, completion_body(8)), KILL]})
    out = bench(srv.url)
    assert not out.ok
    assert out.error in ("refused", "invalid", "timeout")
    assert out.requests == 3
    # and the next benchmark of that endpoint is refused outright
    again = bench(srv.url)
    assert again.error == "refused"


def test_connection_dropped_without_an_answer(fake):
    srv = fake({"POST /completion": DROP})
    out = bench(srv.url, props=False)
    assert not out.ok and out.error in ("refused", "invalid")


# ----------------------------------------------------------------------------- /props


def test_props_404_does_not_stop_the_benchmark(fake):
    srv = fake({"GET /props": Reply(404, NOT_FOUND)})
    out = bench(srv.url)
    assert out.ok and out.n_ctx is None and out.model == "models/tiny.gguf"


def test_parse_props_shapes():
    p = parse_props(props_body(n_ctx=1024, slots=2))
    assert p.n_ctx == 1024 and p.total_slots == 2 and p.build_info == "b11312-0c1e57098"
    assert p.is_sleeping is False
    old = parse_props({"n_ctx": 4096, "model_path": "/m/x.gguf"})
    assert old.n_ctx == 4096 and old.model == "/m/x.gguf"
    junk = parse_props({"default_generation_settings": {"n_ctx": "big"}, "model_alias": 7, "total_slots": -1})
    assert junk.n_ctx is None and junk.model is None and junk.total_slots is None


def test_read_props_401(fake):
    srv = fake(require_key="other")
    info = read_props(srv.url, KEY, 2.0)
    assert not info.ok and info.error == "unauthorized" and info.status == 401


# ----------------------------------------------------------------------------- fuzzed answers (issue 9)

_HOSTILE_JSON = [
    "1" + "0" * 400, "9" * 5000, "NaN", "Infinity", "-Infinity", '"74.9"', "true", "null", "[]", "{}", '"\\ud800"',
    "1e308", "-1", "0", "3.5", "1e-320",
]


def _hostile_body(rng_values: list[int], template: str) -> bytes:
    out = template
    for i, pick in enumerate(rng_values):
        out = out.replace(f"@{i}", _HOSTILE_JSON[pick % len(_HOSTILE_JSON)])
    return out.encode()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(picks=st.lists(st.integers(0, 100), min_size=8, max_size=8))
def test_fuzz_timings_usage_and_props_never_raise_nor_leak_non_finite_numbers(picks):
    completion = ('{"content": "x", "model": @0, "tokens_predicted": @1, "timings": {"predicted_n": @2, '
                  '"predicted_ms": @3, "predicted_per_second": @4, "prompt_per_second": @5}}')
    chat = '{"model": "m", "usage": {"completion_tokens": @6}, "timings": {"predicted_per_second": @7}}'
    props = ('{"default_generation_settings": {"n_ctx": @0}, "total_slots": @1, "model_alias": @2, '
             '"build_info": @3, "is_sleeping": @4}')
    srv = FakeLlama({
        "POST /completion": Reply(200, _hostile_body(picks, completion)),
        "POST /v1/chat/completions": Reply(200, _hostile_body(picks, chat)),
        "GET /props": Reply(200, _hostile_body(picks[3:] + picks[:3], props)),
    })
    try:
        out = bench(srv.url, n_predict=8, deadline_s=5.0)
    finally:
        srv.stop()
    for value in (out.gen_tok_s, out.prompt_tok_s):
        assert value is None or (value == value and abs(value) < 1e12)
    for value in (out.tokens, out.n_ctx, out.slots):
        assert value is None or (isinstance(value, int) and value >= 0)
    for text in (out.model, out.detail):
        (text or "").encode("utf-8")
    json.dumps(out.to_dict(), allow_nan=False, ensure_ascii=False).encode("utf-8")
