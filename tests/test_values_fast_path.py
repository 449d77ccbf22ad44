"""``Fields``' common-case paths (issue 29: a JSON float or int in range, an ASCII string, a bool taken at
once): whatever the value and the bounds, the same reading and the same problems as the general path
(``Fields._number`` and the others: the readers as they were before the fast paths)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.parse.values import Fields


class Text(str):
    """A str subclass: never the fast path's ``type(raw) is str``."""


class Real(float):
    """A float subclass."""


_RAW = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**400), 10**400),
    st.sampled_from([0, -0.0, 0.0, 10**9, 10**9 + 1, 2**1024, -(2**1024), 1e308, -1e308, 200.0, 200.0000001]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", " ", "\t\n", "gpu-01", "\ud800x", "é", " RTX ", "x" * 300]),
    st.text(max_size=5).map(Text),
    st.floats(allow_nan=False).map(Real),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_BOUND = st.one_of(st.none(), st.sampled_from([0, 0.0, -1.0, 0.01, 100.0, 200, 1e6, 16 * 1024 * 1024.0, 10**9]),
                   st.floats(allow_nan=False, allow_infinity=True))


def _same(a, b):
    """Equal, and a float's sign and NaN-ness too (``-0.0 == 0.0``)."""
    if isinstance(a, float) and isinstance(b, float):
        return type(a) is type(b) and (math.isnan(a) and math.isnan(b) or (a == b and math.copysign(1, a) ==
                                                                            math.copysign(1, b)))
    return type(a) is type(b) and a == b


def _both(read, general, raw):
    """(reading, problems) of the fast path and of the general one, on the same field."""
    fast_problems: list[str] = []
    got = read(Fields({"k": raw}, "gpus[0]", fast_problems))
    general_problems: list[str] = []
    want = general(Fields({"k": raw}, "gpus[0]", general_problems))
    return (got, fast_problems), (want, general_problems)


@settings(max_examples=1500, deadline=None)
@given(_RAW, _BOUND, _BOUND)
def test_number_reads_as_the_general_path(raw, lo, hi):
    (got, p1), (want, p2) = _both(lambda f: f.number("k", lo=lo, hi=hi), lambda f: f._number("k", raw, lo, hi), raw)
    assert _same(got, want) and p1 == p2


@settings(max_examples=800, deadline=None)
@given(_RAW, st.sampled_from([0, 1, 1023, 10**9, 10**30]))
def test_count_reads_as_the_general_path(raw, hi):
    (got, p1), (want, p2) = _both(lambda f: f.count("k", hi=hi), lambda f: f._count("k", raw, hi), raw)
    assert _same(got, want) and p1 == p2


@settings(max_examples=800, deadline=None)
@given(_RAW, st.sampled_from([1, 5, 200, 253]))
def test_text_reads_as_the_general_path(raw, max_len):
    (got, p1), (want, p2) = _both(lambda f: f.text("k", max_len), lambda f: f._text("k", raw, max_len), raw)
    assert _same(got, want) and p1 == p2


@settings(max_examples=300, deadline=None)
@given(_RAW)
def test_flag_reads_as_the_general_path(raw):
    (got, p1), (want, p2) = _both(lambda f: f.flag("k"), lambda f: f._flag("k", raw), raw)
    assert _same(got, want) and p1 == p2


def test_the_fast_paths_keep_the_general_paths_verdicts():
    """A few the contract names: a string is not a number, NaN and out-of-range are faults, a surrogate is
    replaced and noted, a bool is not a count."""
    problems: list[str] = []
    f = Fields({"t": "99", "n": math.nan, "big": 201.0, "ok": 55.0, "s": "a\ud800", "c": True, "i": 7}, "g", problems)
    assert f.number("t", hi=200.0) is None and f.number("n") is None and f.number("big", hi=200.0) is None
    assert f.number("ok", hi=200.0) == 55.0 and f.count("i") == 7 and f.count("c") is None
    assert f.text("s") == "a\ufffd"
    assert len(problems) == 5
