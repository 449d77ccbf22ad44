"""The sim's per-answer shortcuts (issue 29, wave 10) say what they said before: ``/metrics`` formatted by one ``%``
(each value as C++ ``operator<<`` writes a double: ``format(float(v), ".6g")``), the ``Date`` of an instant
remembered by the world (``email.utils.formatdate`` of the virtual now), and a GPU's reported values copied
when nothing ramps."""

from __future__ import annotations

import email.utils
import hashlib
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.sim import Scenario, llama
from gpuheal.sim.world import World

NAMES = [line.split()[0].split(":", 1)[1] for line in llama.metrics_text({}).decode().splitlines()
         if not line.startswith("#")]
SCENARIO = {"gpus": [{"alias": "gpu-a", "host": "node-1", "vram_total_mb": 24576, "baseline_tok_s": 70.0}]}
NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**15), 10**15), st.booleans())


def test_the_body_of_zeros_is_the_captured_build_s_15_series():
    body = llama.metrics_text({})
    assert len(NAMES) == 15 and body.count(b"\n# HELP llamacpp:") == 14 and body.endswith(b" 0\n")
    # the body as formatted series by series before (wave 8), for all-zero values
    assert hashlib.sha256(body).hexdigest()[:16] == "033056262d2dfed7"


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(NAMES), NUMBER))
def test_each_value_is_written_as_a_double_with_6_significant_digits(values):
    lines = llama.metrics_text(values).decode("ascii").splitlines()
    zeros = llama.metrics_text({}).decode("ascii").splitlines()
    samples = [line for line in lines if not line.startswith("#")]
    assert [line for line in lines if line.startswith("#")] == [line for line in zeros if line.startswith("#")]
    assert samples == [f"llamacpp:{name} {format(float(values.get(name, 0)), '.6g')}" for name in NAMES]


def test_a_remembered_body_is_the_one_its_values_write():
    """Bodies are remembered by their values' bits: a negative zero, a NaN, an int and its float each
    get the text ``format(float(v), ".6g")`` writes, whichever of them was asked first."""
    for values in ({}, {"n_decode_total": -0.0}, {"n_decode_total": 0.0}, {"n_decode_total": 0},
                   {"n_decode_total": math.nan}, {"n_decode_total": -math.nan}, {"n_decode_total": True},
                   {"n_decode_total": 2**53 + 1}, {"n_decode_total": float(2**53)}, {"n_decode_total": -0.0}):
        for _ in range(2):
            line = [x for x in llama.metrics_text(values).decode().splitlines() if x.startswith("llamacpp:n_decode_total")]
            assert line == [f"llamacpp:n_decode_total {format(float(values.get('n_decode_total', 0)), '.6g')}"]
    assert b"n_decode_total -0\n" in llama.metrics_text({"n_decode_total": -0.0})
    assert b"n_decode_total 0\n" in llama.metrics_text({"n_decode_total": 0.0})


def test_the_date_header_is_the_virtual_now():
    world = World(Scenario.from_dict(SCENARIO))
    for step_s in (0.0, 0.4, 0.7, 59.0, 0.0, 3600.5, 86400 * 3):
        world.advance(step_s)
        for _ in range(2):  # the second: remembered for the instant
            assert world.http_date() == email.utils.formatdate(world.now().timestamp(), usegmt=True)


def test_reported_values_with_and_without_ramps_are_each_value_now():
    world = World(Scenario.from_dict(SCENARIO))
    g = world.gpus["gpu-a"]
    each = {k: g.value(k, world.t) for k in g.values}
    assert world.gpu_values("gpu-a") == each and not g.ramps
    g.start_ramp("temp_c", 6.0, world.t, None, 90.0, heals=True)
    world.advance(120)
    ramped = world.gpu_values("gpu-a")
    assert ramped == {k: g.value(k, world.t) for k in g.values}
    assert math.isclose(float(ramped["temp_c"]), float(each["temp_c"]) + 12.0)
