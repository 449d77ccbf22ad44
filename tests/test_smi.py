"""Parsers for nvidia-smi / rocm-smi / ps output (formats.md §2, §3): real shapes and junk."""

from __future__ import annotations

import pytest

from gpuheal.parse.smi import (
    parse_compute_apps,
    parse_ps,
    parse_query_gpu,
    parse_rocm_smi,
)


def test_compute_apps_real_shapes():
    text = (
        "1106871, /app/llama-server, 23342\n"
        "312710, [Not Found], [N/A]\n"
        "4242, /opt/my, weird, name, 512\n"
    )
    procs = parse_compute_apps(text)
    assert [(p.pid, p.name, p.used_mb) for p in procs] == [
        (1106871, "/app/llama-server", 23342.0),
        (312710, "[Not Found]", None),
        (4242, "/opt/my, weird, name", 512.0),
    ]


@pytest.mark.parametrize("junk", ["", "pid, process_name, used_gpu_memory [MiB]\n", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "\x00\xff garbage", "x, y, z\n" * 1000])
def test_compute_apps_junk_yields_nothing(junk):
    assert parse_compute_apps(junk) == []


def test_query_gpu_positional_with_sentinels():
    text = "0, NVIDIA GeForce RTX 3090, 29, 23358, 24576, 0, 118.42, 350.00\n0, NVIDIA GB10, 35, [N/A], [N/A], 0, 11.17, [N/A]\nFailed to initialize NVML: Driver/library version mismatch\n"
    rows = parse_query_gpu(text)
    assert rows[0]["temp_c"] == 29 and rows[0]["vram_used_mb"] == 23358 and rows[0]["power_limit_w"] == 350
    assert rows[1]["vram_used_mb"] is None and rows[1]["power_limit_w"] is None
    assert len(rows) == 2


def test_rocm_smi_strings_and_apu_gtt():
    dgpu = '{"card0": {"Temperature (Sensor edge) (C)": "45.0", "Temperature (Sensor junction) (C)": "52.0", "Current Socket Graphics Package Power (W)": "35.0", "GPU use (%)": "5", "VRAM Total Memory (B)": "21458059264", "VRAM Total Used Memory (B)": "27856896"}}'
    row = parse_rocm_smi(dgpu)[0]
    assert row["temp_c"] == 52.0 and row["power_w"] == 35.0 and round(row["vram_total_mb"]) == 20464
    # issue 12: an APU is known by what it is (gfx id / product name), never by a GTT/VRAM ratio
    memory = '"VRAM Total Memory (B)": "536870912", "VRAM Total Used Memory (B)": "423624704", "GTT Total Memory (B)": "137438953472", "GTT Total Used Memory (B)": "10737418240"'
    apu = 'WARNING: something\n{"card0": {"Temperature (Sensor edge) (C)": "38.0", "Card Series": "AMD Radeon 8060S", "GFX Version": "gfx1151", ' + memory + "}}"
    row = parse_rocm_smi(apu)[0]
    assert row["vram_total_mb"] == 131072 and row["vram_used_mb"] == 10240 and row["unified"] is True
    assert row["carveout_total_mb"] == 512
    unnamed = '{"card0": {' + memory + "}}"
    row = parse_rocm_smi(unnamed)[0]  # rocm-smi said nothing of the product: its VRAM, as reported
    assert row["vram_total_mb"] == 512 and row["unified"] is None
    assert parse_rocm_smi(unnamed, unified=True)[0]["vram_total_mb"] == 131072  # gpus[].unified_memory


@pytest.mark.parametrize(
    ("product", "gfx", "apu"),
    [("Radeon 8060S Graphics", None, True), (None, "gfx1151", True), ("Phoenix3", None, True),
     ("AMD Radeon 780M", None, True), ("Arcturus GL-XL [Instinct MI100]", "gfx908", False),
     ("Radeon RX 7900 XT", "gfx1100", False), ("Navi 22 [Radeon RX 6700/6700 XT/6750 XT / 6800M]", None, False),
     (None, None, None)],
)
def test_apu_from_what_the_gpu_is(product, gfx, apu):
    from gpuheal.parse.smi import is_apu

    assert is_apu(product, gfx) is apu


def test_a_discrete_mi100_is_not_taken_for_an_apu():
    """The real MI100 capture reports GTT 3.93x its VRAM — 2 % from the old 4x cut-off."""
    from tests.smi_captures import ROCM_CAPTURES, rocm_json

    for capture in ("rocm-smi__mi100_rocm571.json", "rocm-smi__mi100_rocm602.json"):
        if capture not in ROCM_CAPTURES:
            pytest.skip("the real smi captures are not here")
        for row in parse_rocm_smi(rocm_json(capture)):
            assert row["unified"] is False
            assert round(row["vram_total_mb"]) == 32752 and row["gtt_total_mb"] > 3.9 * row["vram_total_mb"]


@pytest.mark.parametrize("junk", ["", "WARNING: No JSON data to report", "[1, 2", '{"card0": "N/A"}', '{"card0": {"GPU use (%)": "N/A"}}', "{" * 5000])
def test_rocm_smi_junk(junk):
    rows = parse_rocm_smi(junk)
    assert all(r.get("util_pct") is None for r in rows)


def test_ps_parse_and_junk():
    text = "  PID USER       RSS COMMAND\n 1234 llama  9000000 /usr/bin/llama-server -m m.gguf --api-key sk-secret-123456\nnonsense line\n"
    procs = parse_ps(text)
    assert len(procs) == 1 and procs[0].pid == 1234 and procs[0].rss_mb == pytest.approx(8789.1, abs=0.1)


# --------------------------------------------------------------------------- issue 12: per-GPU rows


def test_every_row_of_a_multi_gpu_host_is_parsed_and_selected_by_index():
    from gpuheal.parse.smi import select_row
    from tests.smi_captures import NVIDIA_CAPTURES, multi_gpu_csv

    if not NVIDIA_CAPTURES:
        pytest.skip("the real smi captures are not here")
    rows = parse_query_gpu(multi_gpu_csv(NVIDIA_CAPTURES, "idle"))
    assert [r["index"] for r in rows] == list(range(len(NVIDIA_CAPTURES)))
    for index, row in enumerate(rows):
        assert select_row(rows, index) is row
    assert select_row(rows, len(rows)) is None  # more GPUs configured than the host has
    assert select_row(rows, None) is rows[0]    # no gpu_index on a multi-GPU host: index 0
    assert select_row(rows[3:4], None) is rows[3]  # the host's only GPU, whatever its index


def test_rocm_smi_cards_are_selected_by_card_number():
    from gpuheal.parse.smi import select_row
    from tests.smi_captures import ROCM_CAPTURES, rocm_json

    if "rocm-smi__mi100_rocm571.json" not in ROCM_CAPTURES:
        pytest.skip("the real smi captures are not here")
    rows = parse_rocm_smi(rocm_json("rocm-smi__mi100_rocm571.json"))
    assert len(rows) == 6
    for index in range(6):
        assert select_row(rows, index)["card"] == f"card{index}"
    assert select_row(rows, 6) is None


@pytest.mark.parametrize(
    "rows",
    [[], [{"index": 1}, {"index": 1}], [{"card": "card"}, {"card": "cardx"}], [{"index": True}]],
)
def test_select_row_never_guesses(rows):
    from gpuheal.parse.smi import select_row

    assert select_row(rows, 1) is None


# --------------------------------------------------------------------------- issue 12: bad smi input


def test_issue12_bad_smi_rows_are_not_known_never_zero():
    from gpuheal.parse.smi import select_row

    text = (
        "0, NVIDIA GeForce RTX 3090, [N/A], 23358, 24576, [Unknown Error], 118.42, 350.00\n"
        "1, NVIDIA GeForce RTX 3090, 71 C, 22875 MiB, 24576 MiB, 98 %, 347.91 W, 350.00 W\n"  # units left in
        "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error\n"
        "3, NVIDIA H100, 40, 10, 81559, 0, 70.1, 700.00\n"  # index 2 is missing
        "4, extra GPU nobody configured, 40, 10, 81559, 0, 70.1, 700.00\n"
    )
    rows = parse_query_gpu(text)
    zero, one = select_row(rows, 0), select_row(rows, 1)
    assert zero["temp_c"] is None and zero["util_pct"] is None and zero["vram_used_mb"] == 23358
    assert (one["temp_c"], one["vram_used_mb"], one["util_pct"], one["power_w"]) == (71, 22875, 98, 347.91)
    assert select_row(rows, 2) is None  # a missing row is not known, never another GPU's row
    assert select_row(rows, 3)["name"] == "NVIDIA H100"


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_CELL = st.one_of(
    st.sampled_from(["[N/A]", "[Not Supported]", "[Unknown Error]", "0", "-1", "1e309", "nan", "71 C", "350.00 W",
                     "98 %", "22875 MiB", "", "0x0000000000000024"]),
    st.text(max_size=8),
    st.floats(allow_nan=True).map(str),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 9), st.lists(_CELL, min_size=6, max_size=9)), max_size=8),
       st.one_of(st.none(), st.integers(0, 9)))
def test_fuzz_multi_gpu_rows_and_selection(rows_spec, gpu_index):
    from gpuheal.parse.smi import select_row

    text = "\n".join(", ".join([str(i), "GPU", *cells]) for i, cells in rows_spec)
    rows = parse_query_gpu(text)
    row = select_row(rows, gpu_index)
    if row is not None and gpu_index is not None:
        assert row["index"] == gpu_index
    for r in rows:
        for key in ("temp_c", "vram_used_mb", "vram_total_mb", "util_pct", "power_w", "power_limit_w"):
            value = r[key]
            assert value is None or (value == value and value >= 0)
