"""A poll reads each distinct ``/props`` body once (``llama_telemetry.read_props``, issue 29): whatever the bodies,
in whatever order and repeated however often, every server's answer is what :func:`sleeping_answer` says of its
own body; hostile bodies (not JSON, not an object, wrong types, huge, not bytes) included."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.sim import llama
from gpuheal.sources import llama_telemetry as lt
from gpuheal.sources.http import HttpResult

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _props_like(draw: st.DrawFn) -> bytes:
    """A /props-shaped document with its two read fields of any JSON value, or one of the sim's real bodies."""
    if draw(st.booleans()):
        return llama.props_body(draw(st.sampled_from(["/m/a.gguf", "/m/b-q4_k_m.gguf"])),
                                draw(st.integers(1, 1 << 20)), draw(st.integers(1, 8)), draw(st.booleans()))
    doc: dict[str, object] = {"model_path": draw(st.text(max_size=4))}
    if draw(st.booleans()):
        doc["is_sleeping"] = draw(_JSON)
    settings_ = draw(st.one_of(_JSON, st.fixed_dictionaries({"n_ctx": _JSON})))
    doc[draw(st.sampled_from(["default_generation_settings", "n_ctx"]))] = settings_
    return json.dumps(doc, allow_nan=True).encode()


_BODIES = st.one_of(
    st.composite(_props_like)(),
    st.binary(max_size=40),  # garbage, invalid UTF-8
    st.sampled_from([b"", b"[]", b"null", b"1e999", b'{"is_sleeping": true}', b'{"n_ctx": 4096}', b"{" * 3000,
                     b'\xef\xbb\xbf{"is_sleeping": false}', '{"is_sleeping": true}'.encode("utf-16"),
                     b'{"is_sleeping": true, "is_sleeping": false}', b'{"n_ctx": NaN}', b'{"n_ctx": 1' + b"0" * 5000 + b"}"]),
    _JSON.map(lambda v: json.dumps(v, allow_nan=True).encode()),
)


def _result(body: bytes) -> HttpResult:
    return HttpResult(status=200, body=body, elapsed_s=0.01)


@settings(max_examples=300, deadline=None)
@given(st.lists(_BODIES, min_size=1, max_size=6), st.lists(st.integers(0, 5), min_size=1, max_size=40))
def test_each_server_reads_what_its_own_body_says(bodies: list[bytes], order: list[int]) -> None:
    read: lt.PropsRead = {}
    for i in order:
        body = bodies[i % len(bodies)]
        assert lt.read_props(_result(body), read) == lt.sleeping_answer(_result(body))


def test_answers_that_are_not_a_reply_pass_through() -> None:
    refused = lt.Answer("refused", "GET /props: connection refused")
    read: lt.PropsRead = {}
    assert lt.read_props(refused, read) is refused
    assert read == {}


def test_a_body_is_parsed_once_a_poll_and_the_memo_stays_small(monkeypatch: object) -> None:
    calls: list[bytes] = []
    real = lt.sleeping_answer

    def counting(result: HttpResult | lt.Answer) -> lt.Answer:
        assert isinstance(result, HttpResult)
        calls.append(result.body)
        return real(result)

    monkeypatch.setattr(lt, "sleeping_answer", counting)  # type: ignore[attr-defined]
    body = llama.props_body("/m/a.gguf", 8192, 4, True)
    read: lt.PropsRead = {}
    answers = [lt.read_props(_result(body), read) for _ in range(100)]
    assert len(calls) == 1 and all(a == answers[0] for a in answers) and answers[0].n_ctx == 2048
    # many distinct bodies: each still read right, the memo bounded
    bodies = [json.dumps({"n_ctx": n, "is_sleeping": n % 2 == 0}).encode() for n in range(1, 200)]
    random.Random(1).shuffle(bodies)
    for b in bodies:
        assert lt.read_props(_result(b), read) == real(_result(b))
    assert len(read) == lt.PROPS_READ_MAX
    # a huge body is read every time, never kept
    huge = json.dumps({"n_ctx": 4096, "pad": "x" * lt.PROPS_READ_MAX_BYTES}).encode()
    calls.clear()
    for _ in range(3):
        assert lt.read_props(_result(huge), {}).n_ctx == 4096
    assert len(calls) == 3


def test_a_body_that_is_not_bytes_is_read_not_kept() -> None:
    read: lt.PropsRead = {}
    odd = HttpResult(status=200, body=bytearray(b'{"n_ctx": 512}'), elapsed_s=0.0)  # type: ignore[arg-type]
    assert lt.read_props(odd, read) == lt.sleeping_answer(odd) and read == {}
    assert lt.read_props(odd, None) == lt.sleeping_answer(odd)
