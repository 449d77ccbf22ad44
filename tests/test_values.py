"""The strict value-reading layer (issue 9, points 2 and 5) and the parsers built on it, fuzzed.

Each parser is fed real output mutated at random — characters replaced by the hostile ones the
issue found (``'²'``, ``'³'``, a lone surrogate, NaN, a 5,000-digit number) — and must return
values or "not known", never raise, and never hand back a string that cannot be encoded.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuheal.parse.gpu_data import parse_gpu_data
from gpuheal.parse.smi import (
    parse_compute_apps,
    parse_ps,
    parse_query_gpu,
    parse_rocm_smi,
)
from gpuheal.parse.values import (
    Bad,
    Fields,
    check_bool,
    check_number,
    check_text,
    check_time,
    clean_text,
    parse_decimal,
    parse_integer,
    shown,
)
from gpuheal.sources.llama_server import parse_props

HOSTILE_TEXT = ["1²234", "³0", "٣", "1_000", "nan", "inf", "-inf", "1e999", "9" * 5000, "0x10", "", " ", "\ud800"]


@pytest.mark.parametrize("text", HOSTILE_TEXT)
def test_text_that_isdigit_or_float_accept_is_not_a_number_here(text):
    assert parse_decimal(text) is None
    assert parse_integer(text) is None


@pytest.mark.parametrize(("text", "value"), [("64", 64.0), (" -1.5 ", -1.5), ("2.5e3", 2500.0), (".5", 0.5), ("7.", 7.0)])
def test_ascii_decimal_text_is_read(text, value):
    assert parse_decimal(text) == value


def test_parse_integer_bounds():
    assert parse_integer("42") == 42
    assert parse_integer("-1") is None  # lo=0 by default
    assert parse_integer("-1", lo=None) == -1
    assert parse_integer("5", hi=4) is None
    assert parse_integer("1" * 65) is None  # longer than any reading: never handed to int()


@pytest.mark.parametrize(
    ("raw", "kwargs", "expected"),
    [
        (64, {}, 64.0),
        (64.0, {"integer": True}, 64),
        (64.5, {"integer": True}, "Bad"),
        ("64", {}, "Bad"),
        (True, {}, "Bad"),
        (False, {"integer": True}, "Bad"),
        (None, {}, None),
        (float("nan"), {"lo": None}, "Bad"),
        (float("-inf"), {"lo": None}, "Bad"),
        (10**400, {"lo": None}, "Bad"),  # no upper bound: too large for a float, still no OverflowError
        (10**400, {"hi": 200}, "Bad"),
        (-(10**400), {"lo": 0}, "Bad"),
        (-1, {}, "Bad"),
        (-1, {"lo": None}, -1.0),
        ([64], {}, "Bad"),
        ({"v": 64}, {}, "Bad"),
    ],
)
def test_check_number(raw, kwargs, expected):
    got = check_number(raw, **kwargs)
    if expected == "Bad":
        assert isinstance(got, Bad), got
    else:
        assert got == expected and type(got) is type(expected)


def test_text_bool_time():
    assert check_text("RTX \ud800 3090") == "RTX \ufffd 3090"
    assert isinstance(check_text(5), Bad)
    assert check_text("   ") is None
    assert len(check_text("x" * 1000, 10)) == 10
    assert check_bool(True) is True and isinstance(check_bool("maybe"), Bad) and isinstance(check_bool(1), Bad)
    assert check_time("2026-07-18T08:00:00Z").year == 2026
    for bad in ("0001-01-01T00:00:00+01:00", "yesterday", 5, "9" * 100):
        assert isinstance(check_time(bad), Bad), bad


def test_fields_names_each_wrong_field_once():
    problems: list[str] = []
    f = Fields({"a": "1", "b": 2, "c": [1], "d": {}}, "gpus[3]", problems)
    assert (f.number("a"), f.count("b"), f.text("c"), f.flag("d"), f.number("missing")) == (None, 2, None, None, None)
    assert [p.split(":")[0] for p in problems] == ["gpus[3].a", "gpus[3].c", "gpus[3].d"]


def test_shown_never_raises_on_huge_or_deep_values():
    deep: object = 1
    for _ in range(10000):
        deep = [deep]
    assert shown(deep) == "a JSON array"
    assert shown(10**5000) == "an integer of 5001 digits"
    assert shown("\ud800") == repr("\ufffd")


# --------------------------------------------------------------------------- fuzzing the parsers

SMI_CSV = (
    "0, NVIDIA GeForce RTX 3090, 29, 23358, 24576, 0, 118.42, 350.00\n"
    "1, NVIDIA H200, 35, [N/A], 143771, 0, 11.17, [N/A]\n"
)
COMPUTE_APPS = "1106871, /app/llama-server, 23342\n312710, [Not Found], [N/A]\n"
PS = "  PID USER       RSS COMMAND\n 1234 llama  9000000 /usr/bin/llama-server -m m.gguf\n"
ROCM = json.dumps(
    {
        "card0": {
            "Temperature (Sensor junction) (C)": "52.0",
            "Current Socket Graphics Package Power (W)": "35.0",
            "GPU use (%)": "5",
            "VRAM Total Memory (B)": "21458059264",
            "VRAM Total Used Memory (B)": "27856896",
        }
    }
)
EVIL = st.sampled_from(["²", "³", "٣", "\ud800", "\x00", "\n", ", ", "[N/A]", "nan", "-", "9" * 5000, "{", '"', "e999"])


@st.composite
def mutated(draw, text: str) -> str:
    """Real output with a few spans replaced by hostile characters."""
    chars = list(text)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(chars)))
        span = draw(st.integers(0, 4))
        chars[at : at + span] = [draw(EVIL | st.text(max_size=3))]
    return "".join(chars)


def _encodable(value) -> None:
    if isinstance(value, str):
        value.encode("utf-8")
    if isinstance(value, float):
        assert math.isfinite(value)


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(csv=mutated(SMI_CSV), apps=mutated(COMPUTE_APPS), ps=mutated(PS), rocm=mutated(ROCM))
def test_fuzz_smi_and_ps_parsers_never_raise(csv, apps, ps, rocm):
    for row in parse_query_gpu(csv) + parse_rocm_smi(rocm):
        for value in row.values():
            _encodable(value)
    for proc in parse_compute_apps(apps) + parse_ps(ps):
        assert 0 < proc.pid <= 2**22
        for value in (proc.name, proc.user, proc.used_mb, proc.rss_mb):
            _encodable(value)


JSON_LEAF = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12) | st.sampled_from([10**400, -(10**400), "\ud800", "1²234", "99"])
)
JSON = st.recursive(
    JSON_LEAF,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
PROPS_KEYS = st.sampled_from(["default_generation_settings", "n_ctx", "model_alias", "model_path", "total_slots",
                              "build_info", "is_sleeping"])


@FUZZ
@given(doc=st.dictionaries(PROPS_KEYS, JSON | st.dictionaries(st.just("n_ctx"), JSON), max_size=7))
def test_fuzz_llama_server_props(doc):
    props = parse_props(doc)
    for value in (props.model, props.build_info):
        _encodable(value)
    for value in (props.n_ctx, props.total_slots):
        assert value is None or (isinstance(value, int) and value >= 0)


GPU_KEYS = st.sampled_from(["hostname", "name", "temp_c", "vram_used_mb", "vram_total_mb", "util_pct", "power_w",
                            "power_limit_w", "running"])


@FUZZ
@given(
    gpus=st.lists(st.dictionaries(GPU_KEYS, JSON | st.just("ct8"), max_size=9), max_size=3),
    summary=JSON | st.fixed_dictionaries({"available_models": JSON, "circuit_breakers": JSON}),
    benchmarks=JSON,
    generated_at=JSON,
)
def test_fuzz_gpu_monitor_document_with_hostile_leaves(gpus, summary, benchmarks, generated_at):
    doc = parse_gpu_data({"gpus": gpus, "summary": summary, "benchmarks": benchmarks, "generated_at": generated_at})
    for host, reading in doc.hosts.items():
        _encodable(host)
        _encodable(reading.name)
        for value in reading.values.values():
            assert value is None or (type(value) is float and math.isfinite(value) and value >= 0)
    for problem in doc.problems:
        _encodable(problem)
    json.dumps(doc.problems, ensure_ascii=False).encode("utf-8")


@given(st.text())
def test_clean_text_is_always_utf8(text):
    clean_text(text).encode("utf-8")


# --------------------------------------------------------------------------- printable (issue 19 item 6)


@pytest.mark.parametrize(("raw", "limit", "shown"), [
    ("plain", 200, "plain"),
    ("a\x1b[31mb\r\nc", 200, "a [31mb c"),  # escape and line break: spaces, collapsed
    ("\u202eevil\udc80", 200, "evil"),  # bidi override, lone surrogate
    ("  spaced   out  ", 200, "spaced out"),
    ("x" * 500, 200, "x" * 200),
    ("y" * 500, None, "y" * 500),
    (ValueError("bad\nthing"), 200, "bad thing"),
])
def test_printable_is_the_one_peer_text_cleaner(raw, limit, shown):
    from gpuheal.parse.values import printable

    out = printable(raw, limit)
    assert out == shown and out.isprintable()
    out.encode("utf-8")  # valid UTF-8 whatever came in


def test_no_module_keeps_its_own_copy_of_the_printable_filter():
    """One copy (issue 19 item 6); sources/http.py keeps its own until the one-client rewrite."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "gpuheal"
    copies = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                    if 'ch if ch.isprintable() else " "' in p.read_text())
    assert copies in (["parse/values.py"], ["parse/values.py", "sources/http.py"])
