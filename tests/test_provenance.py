"""Per-value provenance (issue 19: "each value keeps its provenance: which source and which request"):
the last request that wrote a value is its provenance, a value not known has none, GPUs read the same
way share one record, and a damaged trace's provenance is "not known" without losing its values. The
real sense over loopback, in every source mode, is ``tests/test_source_modes.py``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal import provenance as prov
from gpuheal.model import GpuSample, Observation


def merged(**writes):
    got = prov.Origins()
    for request, values in writes.items():
        got.put(request, values)
    return got.provenance(got.values)


def test_the_last_writer_of_a_value_is_its_provenance_and_an_unknown_value_has_none():
    got = prov.Origins()
    got.put(prov.PROMETHEUS, {"temp_c": 70.0, "requests_processing": 1.0, "util_pct": None})
    got.put_each({"requests_processing": 2.0, "slots": "ok", "canary": None}, prov.SERVER_FIELDS, prov.METRICS)
    got.put(prov.HEALTH, {"endpoint": "ok", "endpoint_latency_s": None})
    assert prov.to_json(got.provenance(got.values)) == {
        prov.PROMETHEUS: ["temp_c"], prov.METRICS: ["requests_processing"], prov.SLOTS: ["slots"],
        prov.HEALTH: ["endpoint"]}


def test_gpus_read_the_same_way_share_one_record():
    a = merged(**{prov.MONITOR: {"temp_c": 50.0}, prov.HEALTH: {"endpoint": "ok"}})
    b = merged(**{prov.MONITOR: {"temp_c": 91.0}, prov.HEALTH: {"endpoint": "refused"}})
    assert a is b
    assert prov.from_json(json.loads(json.dumps(prov.to_json(a)))) is a  # a replayed trace shares it too


def test_smi_names_the_tool_and_the_transport_never_a_host_or_url():
    assert prov.smi("amd", "ssh") == "rocm-smi over ssh"
    assert prov.smi("nvidia", None) == "nvidia-smi over local"


@pytest.mark.parametrize("garbage", [[], "monitor", 3, {"r": "temp_c"}, {"r": [1]}, {"r": None}, None,
                                     {f"r{i}": ["temp_c"] for i in range(10_000)}, {"r": ["temp_c"] * 10_000}])
def test_a_damaged_provenance_is_not_known_and_the_values_stay(garbage):
    obs = Observation.from_dict({"at": "2026-07-18T08:00:00Z", "monitor_ok": True,
                                 "gpus": {"g": {"temp_c": 71.5, "provenance": garbage}}})
    assert obs.gpus["g"].temp_c == 71.5 and obs.gpus["g"].provenance is None


def test_a_sample_round_trips_with_its_provenance_and_without_one():
    shape = merged(**{prov.MONITOR: {"temp_c": 50.0}})
    for sample in (GpuSample(temp_c=50.0, provenance=shape), GpuSample(temp_c=50.0)):
        assert GpuSample.from_dict(json.loads(json.dumps(sample.to_dict()))) == sample


def test_a_huge_recorded_request_name_is_cut():
    back = prov.from_json({"x" * 10_000: ["y" * 10_000]})
    assert back is not None and len(back[0][0]) == 200 and len(back[0][1][0]) == 64


def _provenance_before(got: prov.Origins, known: dict) -> prov.Provenance:
    """``Origins.provenance`` before issue 29's loop (one ``setdefault`` a field): the reference."""
    groups: dict[str, list[str]] = {}
    for key, value in known.items():
        request = got.by.get(key)
        if value is not None and request is not None:
            groups.setdefault(request, []).append(key)
    return prov.share(tuple((request, tuple(keys)) for request, keys in groups.items()))


_FIELD = st.sampled_from([f"f{i}" for i in range(12)])
_REQUEST = st.sampled_from([prov.METRICS, prov.SLOTS, prov.PROPS, prov.HEALTH, prov.MONITOR, "other"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_REQUEST, st.dictionaries(_FIELD, st.none() | st.integers() | st.text(max_size=2)))),
       st.dictionaries(_FIELD, st.none() | st.integers() | st.floats(allow_nan=True)))
def test_the_provenance_is_grouped_as_before(puts: list, extra: dict) -> None:
    got = prov.Origins()
    for request, values in puts:
        got.put(request, values)
    known = {**got.values, **extra}
    assert got.provenance(known) == _provenance_before(got, known)
