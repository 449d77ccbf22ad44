"""``check`` under mutated gpu-monitor documents (issue 9, "Done when"): no internal error, no
traceback, exit 0/1/2, valid UTF-8, one JSON document. The full 2,000-document run is
``benchmarks/fuzz_monitor.py``; this is the same corpus generator, smaller, plus hypothesis
documents, through the real CLI entry point against a loopback fleet."""

from __future__ import annotations

import json

import pytest
from fuzz_docs import (
    HOSTILE,
    HOSTS,
    base_document,
    judge,
    mutated_documents,
    run_in_process,
    serialize,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import HEALTH_OK, LoopbackServer, Reply, fleet_config, write_config


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    with (
        LoopbackServer({"/gpu-data": Reply(200, b"{}")}, record=False) as monitor,
        LoopbackServer({"/health": HEALTH_OK}, ports=3, record=False) as gpus,
    ):
        cfg = fleet_config(monitor.url + "/gpu-data",
                           [(a, h, u) for (a, h), u in zip(HOSTS.items(), gpus.urls, strict=True)], timeout_s=2)
        config = write_config(tmp / "gpuheal.yaml", cfg)
        yield monitor, ["--config", str(config), "--state-dir", str(tmp / "state")]


def _check(fleet, body: bytes, minute: int, json_out: bool = True) -> str | None:
    monitor, base = fleet
    monitor.set("/gpu-data", Reply(200, body))
    code, out, err = run_in_process([*base, "check", *(["--json"] if json_out else [])],
                                    f"2026-07-18T{8 + minute // 60 % 16:02d}:{minute % 60:02d}:00Z")
    return judge(code, out, err, json_out)


def test_200_mutated_documents_through_check(fleet):
    problems = []
    for i, body in enumerate(mutated_documents(200, seed=2026)):
        problem = _check(fleet, body, i, json_out=i % 2 == 0)
        if problem:
            problems.append((i, problem, body[:200]))
    assert problems == []


def test_the_fuzzer_judges_an_internal_error_and_bad_json_as_failures():
    # the judge itself must be able to fail, or the zero above means nothing
    assert judge(3, "", "gpuheal: internal error: OverflowError: int too large\n", True).startswith("internal error")
    assert judge(1, "{", "", True).startswith("--json is not one JSON document")
    assert judge(1, json.dumps({"gpus": {"a": {"temp_c": 99999}}}), "", True) == "a.temp_c is 99999"
    assert judge(1, "\ud800", "", False).startswith("output is not valid UTF-8")
    assert judge(1, json.dumps({"gpus": {}}), "", True) is None


LEAF = st.sampled_from(HOSTILE) | st.integers() | st.floats() | st.text(max_size=8)
ENTRY = st.dictionaries(st.sampled_from(["hostname", "name", "temp_c", "vram_used_mb", "util_pct", "power_w",
                                         "running", "index"]), LEAF | st.sampled_from(list(HOSTS.values())))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(gpus=st.lists(ENTRY, max_size=3), summary=LEAF | st.fixed_dictionaries({"available_models": LEAF | st.lists(ENTRY)}),
       strix=LEAF | ENTRY, minute=st.integers(0, 10_000))
def test_hypothesis_documents_through_check_json(fleet, gpus, summary, strix, minute):
    doc = base_document(minute)
    doc.update(gpus=gpus, summary=summary, strix=strix)
    assert _check(fleet, serialize(doc), minute) is None
