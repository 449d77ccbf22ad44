"""The in-process seam's shortcuts (issue 29, wave 10): ``gpuheal.sources.http._framed`` cuts a whole answer out at
once and remembers its head's parse; it must give exactly what the general path gives — :class:`_Response` fed the
whole answer (as the socket loop's ``_receive`` and ``_eof`` take it) — the first time and every time after (the
memo's hit). A request's bytes (``_request_head``, wave 12: no longer remembered) are what they were made as before.
"""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st
from test_http_framing import responses

from gpuheal.sources import http
from gpuheal.sources.http import Ask, HttpResult, _Job

reference = http._framed_by_response  # the general path: _Response fed the whole answer


HEADS = [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"HTTP/1.1 100 Continue\r\n\r\n",
         b"HTTP/1.0 204 No Content\r\nContent-Length: 9\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n",
         b"HTTP/1.1 200 OK\r\nContent-Length: x1\r\n\r\n", b"HTTP/1.1 2000 OK\r\n\r\n", b"junk\r\n\r\n",
         b"HTTP/1.1 503 Busy\r\nConnection: close\r\nContent-Length: 3\r\n\r\n", b"HTTP/1.1 200 OK\r\n"]


@settings(max_examples=400, deadline=None)
@given(st.one_of(responses().map(lambda case: case[0]), st.sampled_from(HEADS), st.binary(max_size=300)),
       st.lists(st.sampled_from(HEADS + [b"hello", b"\r\n\r\n", b"0\r\n\r\n"]), max_size=3),
       st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=3),
       st.integers(0, 3000), st.sampled_from(["GET", "HEAD", "POST"]))
def test_a_whole_answer_is_framed_as_the_socket_loop_frames_it(wire, tail, flips, cap, method):
    raw = bytearray(wire + b"".join(tail))
    for at, value in flips:
        if at < len(raw):
            raw[at] = value
    ask = Ask("/x", max_bytes=cap, method=method)
    want = reference(bytes(raw), ask, 0.25)
    for _ in range(2):  # the second: the head's parse remembered
        assert http._framed(bytes(raw), ask, 0.25) == want


def test_a_head_past_what_is_remembered_is_framed_as_the_socket_loop_frames_it():
    for size in (4090, 4100, 70_000):
        raw = b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * size + b"\r\nContent-Length: 2\r\n\r\nok"
        ask = Ask("/x")
        assert http._framed(raw, ask, 0.0) == reference(raw, ask, 0.0)


def test_a_remembered_head_s_headers_are_each_answer_s_own():
    raw = b"HTTP/1.1 200 OK\r\nX-A: b\r\nContent-Length: 2\r\n\r\nok"
    first = http._framed(raw, Ask("/x"), 0.0)
    assert isinstance(first, HttpResult)
    first.headers["x-a"] = "changed by a caller"
    again = http._framed(raw, Ask("/x"), 0.0)
    assert isinstance(again, HttpResult) and again.headers == {"x-a": "b", "content-length": "2"}


def _bytes_before(host, port, tls, path, query, ask) -> bytes:
    """``_request_bytes`` as it was before wave 12 (verbatim but for the job's fields): the reference."""
    host_ = f"[{host}]" if ":" in host else host
    target = (path.rstrip("/") + ask.path if ask.path else path or "/") + query
    asked = {name.lower() for name, _ in ask.headers}
    if port != (443 if tls else 80):
        host_ = f"{host_}:{port}"
    lines = [f"{ask.method} {target} HTTP/1.1", f"Host: {host_}"]
    lines += [f"{name}: {value}" for name, value in http._DEFAULT_HEADERS if name.lower() not in asked]
    lines += [f"{name}: {value}" for name, value in ask.headers]
    if ask.body is not None:
        lines.append(f"Content-Length: {len(ask.body)}")
    if http._BAD_TARGET.search(target):
        raise ValueError("the request target holds a space or a control character")
    if any(http._BAD_HEADER.search(text) for pair in ask.headers for text in pair):
        raise ValueError("a request header holds CR, LF or NUL")
    try:
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError("a request header or target is not latin-1 text") from None
    return head + (ask.body or b"")


TEXT = st.text(string.ascii_letters + string.digits + " /?&=:\r\n\x00\u2603\xe9-", max_size=12)
NAMES = st.one_of(TEXT, st.sampled_from(["Accept", "user-agent", "Authorization", "X-Api-Key"]))


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(["127.0.0.1", "::1", "gpu.example", "h\u2603"]), st.sampled_from([80, 443, 8080]),
       st.booleans(), st.sampled_from(["", "/", "/v1", "/a/", "/a b"]), st.sampled_from(["", "?x=1"]), TEXT,
       st.lists(st.tuples(NAMES, TEXT), max_size=3), st.sampled_from([None, b"", b"{}", b"x" * 5000]),
       st.sampled_from(["GET", "POST", "HEAD"]))
def test_a_request_s_bytes_are_what_they_were(host, port, tls, path, query, ask_path, headers, body, method):
    ask = Ask(ask_path, tuple(headers), 1 << 20, method, body)

    def outcome(make) -> bytes | str:
        try:
            return make(host, port, tls, path, query, ask)
        except ValueError as exc:
            return str(exc)

    want = outcome(_bytes_before)
    assert outcome(http._request_head) == want
    job = _Job(None, iter(()), host, port, path, query, 0.0, 0.0, tls=tls)  # type: ignore[arg-type]
    assert outcome(lambda *_: http._request_bytes(job, ask)) == want


def test_an_ask_whose_headers_are_a_list_is_still_sent():
    ask = Ask("/health", [("X-A", "b")])  # type: ignore[arg-type]  # a list, not the declared tuple
    got = http._request_head("127.0.0.1", 8080, False, "", "", ask)
    assert got.startswith(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n") and b"X-A: b\r\n" in got


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["http", "https", "ftp", "", "HTTP"]), st.sampled_from(["127.0.0.1", "[::1]", "", "h st", "gpu"]),
       st.sampled_from(["", ":0", ":8080", ":65536", ":x", ":-1"]), st.sampled_from(["", "/", "/v1?a=b", "?q"]))
def test_a_remembered_url_s_parts_are_its_parts(scheme, host, port, rest):
    url = f"{scheme}://{host}{port}{rest}" if scheme else f"{host}{port}{rest}"
    want = http._http_parts_new(url)
    assert http._http_parts(url) == want and http._http_parts(url) == want


def test_forgetting_empties_every_memo_and_the_answers_stay_the_same():
    """``benchmarks/chaos.py`` forgets between commands, as cron's new process for each run starts empty
    (issue 29: a week in one process must not reuse the minute before's work)."""
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    ask = Ask("/x", max_bytes=100)
    first = http._framed(raw, ask, 0.1)
    http._http_parts("http://127.0.0.1:8080/metrics")
    assert http._HEADS and http._PARTS
    http.forget_remembered()
    assert not (http._ENDPOINTS or http._HEADS or http._PARTS)
    assert http._framed(raw, ask, 0.1) == first


def test_the_chaos_week_forgets_before_each_command(monkeypatch, tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import chaos
    from chaos_inject import Layout

    calls = []
    monkeypatch.setattr(http, "forget_remembered", lambda: calls.append(1))
    week = chaos.run_system("gpuheal", Layout.of(2), [], 3 / 1440, 1, tmp_path)
    assert week.cycles == 3 and len(calls) >= 2 * week.cycles  # heal and escalate, each a new process
