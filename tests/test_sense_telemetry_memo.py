"""The telemetry answers remembered by their bodies (issue 29, ``llama_telemetry._ReadOnce``): whatever the
body — a real llama-server's, an edited one, JSON, garbage, bytes that are not UTF-8 — and whatever came
before it, the remembered answer is exactly the body's fresh reading; the memo stays bounded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuheal.sources import llama_telemetry as lt
from gpuheal.sources.http import HttpResult

DATA = Path(__file__).parent / "data" / "llama"
READERS = {
    "metrics": (lt.metrics_answer, lt.metrics_body_answer, lt._METRICS_READ),
    "slots": (lt.slots_answer, lt.slots_body_answer, lt._SLOTS_READ),
    "props": (lt.sleeping_answer, lt.props_body_answer, lt._PROPS_READ),
}


def real(name: str) -> bytes:
    return (DATA / name).read_bytes()


REAL = [real(p.name) for p in sorted(DATA.iterdir()) if p.suffix in (".txt", ".json")]
PROPS = json.dumps({"default_generation_settings": {"n_ctx": 8192}, "is_sleeping": False}).encode()


def reply(body: bytes) -> HttpResult:
    return HttpResult(status=200, body=body, elapsed_s=0.01)


@st.composite
def _edited(draw):
    """A real body (or a small /props) with a slice replaced by other bytes: plain, or not at all."""
    body = draw(st.sampled_from([*REAL, PROPS]))
    if draw(st.booleans()):
        start = draw(st.integers(0, len(body)))
        end = draw(st.integers(start, min(len(body), start + 40)))
        body = body[:start] + draw(st.sampled_from([b"", b"0", b"9e9", b"NaN", b"\xff", b"\n", b'"', b"true", b"[",
                                                    b"# TYPE x gauge\n", b"llamacpp:n_decode_total 7\n"])) + body[end:]
    return body


_BODIES = st.one_of(_edited(), st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8", "replace")))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_BODIES, min_size=1, max_size=8), st.sampled_from(sorted(READERS)))
def test_a_remembered_answer_is_the_bodys_fresh_reading(bodies, which):
    answer, fresh, _ = READERS[which]
    for body in [*bodies, *reversed(bodies)]:  # each body read at least twice, after others
        assert answer(reply(bytes(body))) == fresh(body)


@pytest.mark.parametrize("which", sorted(READERS))
def test_an_ok_body_is_read_once(which, monkeypatch):
    answer, fresh, memo = READERS[which]
    body = {"metrics": real("metrics-busy-deferred.txt"), "slots": real("slots-busy.json"), "props": PROPS}[which]
    monkeypatch.setattr(memo, "answers", {})
    calls = []
    monkeypatch.setattr(memo, "read", lambda b: calls.append(b) or fresh(b))
    first = answer(reply(bytes(body)))
    assert first.state == lt.OK
    assert answer(reply(bytes(body))) is first  # a new bytes object, the same answer
    assert calls == [body]


def test_a_body_that_is_not_ok_is_read_each_time(monkeypatch):
    monkeypatch.setattr(lt._SLOTS_READ, "answers", {})
    calls = []
    monkeypatch.setattr(lt._SLOTS_READ, "read", lambda b: calls.append(b) or lt.slots_body_answer(b))
    for _ in range(2):
        assert lt.slots_answer(reply(b"not json")).state == "invalid"
    assert len(calls) == 2 and lt._SLOTS_READ.answers == {}


def test_the_memo_stays_bounded(monkeypatch):
    memo = lt._PROPS_READ
    monkeypatch.setattr(memo, "answers", {})
    monkeypatch.setattr(memo, "held_bytes", 0)
    monkeypatch.setattr(memo, "MAX_ANSWERS", 3)
    for n in range(7):  # 3 answers, then it starts again empty
        lt.sleeping_answer(reply(json.dumps({"n_ctx": 1000 + n}).encode()))
        assert len(memo.answers) == n % 3 + 1
    big = json.dumps({"n_ctx": 4096, "chat_template": "x" * memo.MAX_BODY_BYTES}).encode()
    assert lt.sleeping_answer(reply(big)).n_ctx == 4096
    assert big not in memo.answers  # past MAX_BODY_BYTES: read, not kept
    monkeypatch.setattr(memo, "MAX_ANSWERS", 1024)
    monkeypatch.setattr(memo, "MAX_HELD_BYTES", 100)
    monkeypatch.setattr(memo, "answers", {})
    monkeypatch.setattr(memo, "held_bytes", 0)
    for n in range(20):
        lt.sleeping_answer(reply(json.dumps({"n_ctx": 2000 + n}).encode()))
        assert memo.held_bytes == sum(map(len, memo.answers)) <= 100


def test_a_bytearray_body_is_read_not_remembered():
    body = bytearray(real("metrics-after.txt"))
    assert lt.metrics_answer(reply(body)) == lt.metrics_body_answer(bytes(body))  # type: ignore[arg-type]
