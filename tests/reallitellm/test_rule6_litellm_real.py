"""Rule 6's LiteLLM half against the real LiteLLM 1.108.7 (issue 27 item 9): with no
``gpus[].litellm_model_id``, each GPU's deployments are found in ``/v1/model/info`` by their ``api_base``
and asked (``/health?model_id=``); a LiteLLM that does not answer is "not known", never a pass, and the
attempt says what that means for its verdict."""

from __future__ import annotations

import socket

import pytest

from gpuheal.actions.context import Context
from gpuheal.actions.effects import Effects
from gpuheal.config import load_config_dict
from gpuheal.core.remedy import Proving
from gpuheal.rules.host_unreachable import remedy as rule6

from .conftest import SOLO

pytestmark = pytest.mark.reallitellm


def config(url: str, endpoints: dict[str, str], **gpu_extra):
    """One GPU per llama-server of the simulated fleet (each its own host), no litellm_model_id."""
    return load_config_dict({
        "litellm": {"url": url, "timeout_s": 10, "api_key": "not-needed"},
        "heal": {"verify_timeout_s": 60},
        "gpus": [{"alias": a, "host": f"ct{i}", "endpoint": e, "transport": "local", **gpu_extra.get(a, {})}
                 for i, (a, e) in enumerate(endpoints.items())],
    })  # fmt: skip


def context(cfg, alias: str, effects: Effects) -> Context:
    complete = lambda a: {"ok": True, "completion_s": 0.2, "gen_tok_s": 50.0, "error": None}  # noqa: E731
    return Context(cfg, alias, "host-unreachable", 0.0, effects.run, (), None, effects.model_health, complete)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_deployments_are_found_by_api_base_and_asked(real_litellm, sim_backends, monkeypatch):
    monkeypatch.setenv("LITELLM_MASTER_KEY", real_litellm.master_key)
    endpoints = dict(sim_backends.endpoints)
    endpoints["gpu-elsewhere"] = f"http://127.0.0.1:{closed_port()}"  # LiteLLM routes nothing here
    cfg = config(real_litellm.url, endpoints)
    effects = Effects(cfg)
    seen = effects.model_health("gpu-dense")
    assert seen["litellm"] == "healthy" and seen["litellm_model_ids"] == ["gpu-dense"], seen
    nowhere = effects.model_health("gpu-elsewhere")
    assert nowhere["litellm"] == "not known" and "lists no deployment at" in nowhere["litellm_detail"], nowhere
    sim_backends.apply({"gpu": SOLO, "fault": "dead"})  # its llama-server refuses: LiteLLM files it unhealthy
    try:
        down = effects.model_health(SOLO)
        held = rule6.verify(Proving(SOLO, "host-unreachable", "monitor", True, {}, frozenset()),
                            context(cfg, SOLO, effects))  # fmt: skip
    finally:
        sim_backends.apply({"gpu": SOLO, "fault": "none"})
    assert down["litellm"] == "unhealthy" and down["litellm_model_ids"] == [SOLO], down
    assert held["ok"] is False and held["litellm"] == "unhealthy"  # not resolved while LiteLLM says unhealthy
    ok = rule6.verify(Proving("gpu-dense", "host-unreachable", "monitor", True, {}, frozenset()),
                      context(cfg, "gpu-dense", effects))  # fmt: skip
    assert ok["ok"] is True and ok["litellm"] == "healthy" and "litellm_means" not in ok


@pytest.mark.parametrize("why", ["not answering", "wrong admin key"])
def test_a_litellm_that_does_not_answer_is_not_known_never_passed(real_litellm, sim_backends, monkeypatch, why):
    url = f"http://127.0.0.1:{closed_port()}" if why == "not answering" else real_litellm.url
    monkeypatch.setenv("LITELLM_MASTER_KEY", "sk-wrong-key-1" if why == "wrong admin key" else real_litellm.master_key)
    cfg = config(url, dict(sim_backends.endpoints))
    effects = Effects(cfg)
    seen = effects.model_health("gpu-dense")
    assert seen["litellm"] == "not known" and seen["litellm_detail"] and "sk-wrong-key-1" not in str(seen), seen
    proved = rule6.verify(Proving("gpu-dense", "host-unreachable", "monitor", True, {}, frozenset()),
                          context(cfg, "gpu-dense", effects))  # fmt: skip
    # resolved on the direct probe and the real completion alone, and the record says so
    assert proved["ok"] is True and proved["litellm"] == "not known" and proved["litellm_means"] == rule6.NOT_KNOWN_MEANS
