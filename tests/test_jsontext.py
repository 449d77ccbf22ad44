"""``render.jsontext.dumps`` writes what ``json.dumps(indent=2, ensure_ascii=False, allow_nan=False)``
writes, byte for byte, whatever the document (issue 13: the fast ``--json`` text)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.render.jsontext import dumps

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
KEYS = st.text() | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False, allow_infinity=False)
DOCS = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5)
    | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=40,
)


def _std(doc, indent=2):
    return json.dumps(doc, indent=indent, ensure_ascii=False, allow_nan=False)


@settings(max_examples=400, deadline=None)
@given(DOCS, st.sampled_from([0, 1, 2, 4]))
def test_same_text_as_the_standard_encoder(doc, indent):
    assert dumps(doc, indent) == _std(doc, indent)


def test_a_check_document_shape():
    doc = {
        "status": "degraded",
        "issues": [{"gpu": "a", "issue": "thermal", "detected": {"temp_c": 91.5, "polls": 2}, "tags": []}],
        "actions": [],
        "gpus": {f"gpu-{i}": {"name": "RTX ☃", "temp_c": 55.0 + i, "endpoint": "ok", "slots": None} for i in range(3)},
        "faults": [{"source": "prometheus", "fault": "invalid", "detail": "line\nbreak \"quoted\" \u2028"}],
        "rules_off": {},
    }
    assert dumps(doc) == _std(doc)


@pytest.mark.parametrize("bad", [math.nan, math.inf, {"x": [1, -math.inf]}, {"x": {"y": object()}}, {1: {"a": [math.nan]}}])
def test_what_json_refuses_it_refuses(bad):
    with pytest.raises((ValueError, TypeError)) as std:
        _std(bad)
    with pytest.raises(std.type):
        dumps(bad)


def test_rows_with_a_nested_provenance_and_strings_shaped_like_its_placeholders():
    """A GPU row is scalars plus its ``provenance`` map: encoded whole with a placeholder per nested
    value. A peer's string shaped like a placeholder (NUL, hex, NUL) is text, never a slot."""
    forged = [f"\x00{'0' * 16}{i}\x00" for i in range(3)] + ["\x00", "\\u0000", '"\x000\x00"']
    rows = {
        f"gpu-{i}": {"name": forged[i % len(forged)], "temp_c": 55.5, "endpoint": "ok", "slots": None,
                     "provenance": {"gpu-monitor GET /gpu-data": ["temp_c", "name"], "llama-server GET /health": []},
                     "empty": {}, "tail": [forged[0], {"deep": [1, [2, {}]]}]}
        for i in range(12)
    }
    doc = {"status": "healthy", "gpus": rows, "issues": []}
    for indent in (0, 1, 2, 4):
        assert dumps(doc, indent) == _std(doc, indent)
