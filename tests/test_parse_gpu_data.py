"""gpu-monitor's ``/gpu-data`` is untrusted input (contract): a bad value is "not known" (None)
plus a note, never zero and never an exception other than :class:`InvalidDocument`."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import contract_document, gpu_entry

from gpuheal.parse.gpu_data import InvalidDocument, parse_gpu_data


def test_contract_sample_document():
    doc = parse_gpu_data(contract_document())
    assert doc.problems == []
    assert doc.generated_at == datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
    assert set(doc.hosts) == {"ct8", "ct15"}
    ct8 = doc.hosts["ct8"]
    assert ct8.name == "NVIDIA GeForce RTX 3090"
    assert ct8.values == {
        "temp_c": 64.0,
        "vram_used_mb": 21600.0,
        "vram_total_mb": 24576.0,
        "util_pct": 87.0,
        "power_w": 281.4,
        "power_limit_w": 350.0,
    }
    ct15 = doc.hosts["ct15"]
    assert ct15.running is True
    assert ct15.values["temp_c"] == 58 and ct15.values["vram_total_mb"] == 65536
    assert ct15.values["util_pct"] is None and ct15.values["power_w"] is None  # not known
    assert doc.benchmarks == {"ct8": (74.9, None)}
    counts = doc.models["ct8"]
    assert (counts.requests_60s, counts.failures_60s, counts.consecutive_timeouts) == (14, 0, 0)
    assert doc.breakers["ct110"].open is True
    assert doc.breakers["ct110"].opened_at == datetime(2026, 7, 18, 7, 48, tzinfo=UTC)


def test_strix_only_document_is_valid():
    doc = parse_gpu_data({"strix": {"hostname": "ct15", "temp_c": 50, "running": False}})
    assert doc.hosts["ct15"].values["temp_c"] == 50
    assert doc.hosts["ct15"].running is False


def test_gpus_entry_wins_over_strix_for_the_same_host():
    doc = parse_gpu_data(
        {"gpus": [gpu_entry("ct15", temp_c=40)], "strix": {"hostname": "ct15", "temp_c": 90, "running": True}}
    )
    assert doc.hosts["ct15"].values["temp_c"] == 40
    assert doc.hosts["ct15"].running is True


def test_first_of_duplicate_gpus_entries_wins():
    doc = parse_gpu_data({"gpus": [gpu_entry("a", temp_c=1), gpu_entry("a", temp_c=2)]})
    assert doc.hosts["a"].values["temp_c"] == 1


@pytest.mark.parametrize(
    "value",
    [None, [], "text", 42, 4.2, True, [{"gpus": []}]],
    ids=repr,
)
def test_non_object_document_is_invalid(value):
    with pytest.raises(InvalidDocument):
        parse_gpu_data(value)


@pytest.mark.parametrize(
    "value",
    [{}, {"summary": {}}, {"gpus": {"ct8": {}}}, {"gpus": "ct8"}, {"gpus": 3}],
    ids=repr,
)
def test_document_without_usable_gpus_is_invalid(value):
    with pytest.raises(InvalidDocument):
        parse_gpu_data(value)


GARBAGE_VALUES = [
    float("nan"),
    float("inf"),
    float("-inf"),
    -1,
    -0.5,
    "hot",
    "64 C",
    "",
    True,
    False,
    [64],
    {"v": 64},
    1e308,
    10**40,
]


def test_every_field_garbage():
    """Every field of every block holds nonsense: nothing raises, nothing is a number."""
    for bad in GARBAGE_VALUES:
        raw = {
            "generated_at": bad,
            "gpus": [
                {"hostname": "ct8", "name": bad, "vendor": bad, **dict.fromkeys(
                    ("temp_c", "vram_used_mb", "vram_total_mb", "util_pct", "power_w", "power_limit_w"), bad
                )},
                bad,
                {"hostname": bad, "temp_c": 50},
            ],
            "benchmarks": {"ct8": {"current_tok_s": bad, "measured_at": bad}, "x": bad},
            "summary": {
                "available_models": [
                    {"hostname": "ct8", "requests_60s": bad, "failures_60s": bad, "consecutive_timeouts": bad},
                    bad,
                ],
                "circuit_breakers": [{"hostname": "ct8", "open": bad, "opened_at": bad}, bad],
            },
            "strix": {"hostname": "ct15", "temp_c": bad, "running": bad},
        }
        doc = parse_gpu_data(json.loads(json.dumps(raw, allow_nan=True)))
        ct8 = doc.hosts["ct8"]
        assert all(v is None for v in ct8.values.values()), (bad, ct8.values)
        assert doc.hosts["ct15"].values["temp_c"] is None
        assert doc.hosts["ct15"].running in (None, bad)
        assert doc.generated_at is None
        assert doc.benchmarks.get("ct8", (None, None)) == (None, None)
        counts = doc.models.get("ct8")
        assert counts is None or (counts.requests_60s, counts.failures_60s, counts.consecutive_timeouts) == (None, None, None)
        if not isinstance(bad, bool):
            assert "ct8" not in doc.breakers
        assert doc.problems, bad  # every garbage reading is noted
        assert any("temp_c" in p for p in doc.problems)


def test_more_failures_than_requests_is_dropped_with_a_note():
    doc = parse_gpu_data(
        {"gpus": [gpu_entry("a")], "summary": {"available_models": [{"hostname": "a", "requests_60s": 2, "failures_60s": 5}]}}
    )
    assert (doc.models["a"].requests_60s, doc.models["a"].failures_60s) == (None, None)
    assert any("more failures than requests" in p for p in doc.problems)


def test_two_models_on_one_host_are_summed():
    doc = parse_gpu_data(
        {
            "gpus": [gpu_entry("a")],
            "summary": {
                "available_models": [
                    {"hostname": "a", "requests_60s": 10, "failures_60s": 1, "consecutive_timeouts": 0},
                    {"hostname": "a", "requests_60s": 5, "failures_60s": 4, "consecutive_timeouts": 2},
                ]
            },
        }
    )
    m = doc.models["a"]
    assert (m.requests_60s, m.failures_60s, m.consecutive_timeouts) == (15, 5, 2)


def test_an_open_breaker_is_not_hidden_by_a_closed_one():
    doc = parse_gpu_data(
        {
            "gpus": [gpu_entry("a")],
            "summary": {
                "circuit_breakers": [
                    {"hostname": "a", "open": True, "opened_at": "2026-07-18T07:00:00+02:00"},
                    {"hostname": "a", "open": False},
                ]
            },
        }
    )
    assert doc.breakers["a"].open is True
    assert doc.breakers["a"].opened_at == datetime(2026, 7, 18, 5, 0, tzinfo=UTC)


def test_deep_nesting_does_not_crash():
    deep: object = 1
    for _ in range(5000):
        deep = {"x": deep}
    doc = parse_gpu_data({"gpus": [gpu_entry("a", temp_c=deep, name=deep)], "summary": deep, "strix": deep})
    assert doc.hosts["a"].values["temp_c"] is None
    assert doc.hosts["a"].name is None


def test_huge_document_of_unknown_fields_is_ignored():
    doc = parse_gpu_data({"gpus": [gpu_entry("a", **{f"extra_{i}": i for i in range(1000)})], "unknown": [1] * 10000})
    assert doc.problems == []
    assert doc.hosts["a"].values["temp_c"] == 60


def test_long_hostnames_and_names_are_bounded():
    doc = parse_gpu_data({"gpus": [gpu_entry("h" * 10_000, name="n" * 10_000)]})
    (reading,) = doc.hosts.values()
    assert len(reading.hostname) <= 253
    assert len(reading.name) <= 200


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (64, 64.0),
        (64.5, 64.5),
        (0, 0.0),
        ("64", None),  # issue 9 point 2: a string is the wrong JSON type, not 64 degrees
        ("99", None),
        (-1, None),
        (float("nan"), None),
        (float("inf"), None),
        (True, None),
        ([1], None),
        ({"v": 1}, None),
        (10**400, None),  # used to raise OverflowError converting to float
        (201, None),
    ],
)
def test_a_reading_of_the_wrong_type_or_range_is_not_known_and_a_fault_naming_the_field(raw, expected):
    doc = parse_gpu_data({"gpus": [gpu_entry("a", temp_c=raw)]})
    assert doc.hosts["a"].values["temp_c"] == expected
    if expected is None:
        assert [p for p in doc.problems if p.startswith("gpus[0].temp_c: ")], doc.problems
    else:
        assert doc.problems == []


def test_counts_must_be_whole_non_negative_json_numbers():
    entry = {"hostname": "a", "requests_60s": "7", "failures_60s": 2.5, "consecutive_timeouts": 10**12}
    doc = parse_gpu_data({"gpus": [gpu_entry("a")], "summary": {"available_models": [entry]}})
    m = doc.models["a"]
    assert (m.requests_60s, m.failures_60s, m.consecutive_timeouts) == (None, None, None)
    assert {p.split(":")[0] for p in doc.problems} == {
        f"summary.available_models[0].{k}" for k in ("requests_60s", "failures_60s", "consecutive_timeouts")
    }
    ok = parse_gpu_data({"gpus": [gpu_entry("a")], "summary": {"available_models": [
        {"hostname": "a", "requests_60s": 7.0, "failures_60s": 0}]}})
    assert (ok.models["a"].requests_60s, ok.models["a"].failures_60s) == (7, 0)


def test_hostile_documents_from_issue_9_are_faults_not_crashes():
    doc = parse_gpu_data(json.loads('{"gpus": [{"hostname": "ct8", "name": "RTX \\ud800 3090", "temp_c": 1'
                                    + "0" * 400 + '}], "summary": {"available_models": 5}}'))
    reading = doc.hosts["ct8"]
    assert reading.values["temp_c"] is None
    assert reading.name == "RTX \ufffd 3090"
    reading.name.encode("utf-8")  # valid UTF-8 now
    assert any(p.startswith("gpus[0].temp_c: an integer of 401 digits") for p in doc.problems), doc.problems
    assert any(p.startswith("summary.available_models: 5 is not an array") for p in doc.problems), doc.problems


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)
FIELDS = st.sampled_from(["temp_c", "vram_used_mb", "vram_total_mb", "util_pct", "power_w", "power_limit_w", "hostname", "name"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.lists(st.dictionaries(FIELDS, JSON | st.just("ct8"), max_size=8) | JSON, max_size=4),
    strix=JSON,
    summary=JSON,
    benchmarks=JSON,
)
def test_fuzz_any_json_is_parsed_or_rejected_cleanly(gpus, strix, summary, benchmarks):
    raw = {"gpus": gpus, "strix": strix, "summary": summary, "benchmarks": benchmarks}
    try:
        doc = parse_gpu_data(raw)
    except InvalidDocument:
        return
    for reading in doc.hosts.values():
        for value in reading.values.values():
            assert value is None or (isinstance(value, float) and math.isfinite(value) and value >= 0)
    for tok_s, _ in doc.benchmarks.values():
        assert tok_s is None or (math.isfinite(tok_s) and tok_s >= 0)
