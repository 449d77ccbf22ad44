"""Rule 3's verify after a restart (the :class:`~gpuheal.core.actions.WaitReady` step) against a real
llama-server: ``/health`` polled through the loading window, then a real completion; a server that
rejects the configured key is L1 (``unauthorized``), one that never comes back is "not ready"."""

from __future__ import annotations

import pytest

from gpuheal.actions.execute import wait_ready_then_complete

pytestmark = pytest.mark.realserver


def test_ready_server_proves_itself_with_a_real_completion(llama_server):
    out = wait_ready_then_complete(llama_server.url, llama_server.api_key, 15.0, 30.0, n_predict=4)
    assert out["ok"] is True and out["health"] == "ok", out
    assert out["completion_s"] is not None and out["completion_s"] < 30


def test_wrong_key_after_restart_is_unauthorized(llama_server):
    out = wait_ready_then_complete(llama_server.url, "sk-not-the-key-0000", 15.0, 30.0, n_predict=4)
    assert out["ok"] is False and out["error"] == "unauthorized", out


def test_a_server_still_loading_is_waited_for_not_failed(real_llama_server, slow_model):
    srv = real_llama_server(slow_model, wait=False, n_parallel=1, extra_args=["--load-mode", "none"])
    out = wait_ready_then_complete(srv.url, srv.api_key, 60.0, 30.0, n_predict=4)
    assert out["ok"] is True, (out, srv.log_text()[-2000:])


def test_a_stopped_server_is_not_ready_within_the_reload_wait(real_llama_server):
    srv = real_llama_server()
    srv.stop()
    out = wait_ready_then_complete(srv.url, srv.api_key, 1.5, 30.0, n_predict=4)
    assert out["ok"] is False and "not ready within 1.5 s" in out["error"], out
