"""Rule 9's context change against a real llama-server (b11312) on 127.0.0.1: the server is restarted
on the same port with another ``--ctx-size``, and ``check`` sees the change from the real ``/props``
(``default_generation_settings.n_ctx``, per slot); a restart that keeps the context is not a change;
``bench --gpu`` re-benchmarks it with a real completion and records the verdict. The clock is
jittered (cron starts a second or two late); the server's real restarts happen between the polls."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import pytest

from gpuheal.config import load_config_dict
from gpuheal.state import files
from gpuheal.state.store import StateDir
from gpuheal.steps import bench, check

pytestmark = pytest.mark.realserver

T0 = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
JITTER = random.Random(9)


def tick(i: int) -> datetime:
    return T0 + timedelta(seconds=60 * i + JITTER.uniform(0.3, 2.7))


def restart_on(old, factory, ctx_size: int):
    """Stop ``old``; start the same binary and model on the same port with ``-c ctx_size -np 2``."""
    old.stop()
    args = ["-c", str(ctx_size), "-np", "2", "-t", "2", "--metrics"]
    new = type(old)(old.binary, old.model, port=old.port, api_key=old.api_key, args=args,
                      log_path=old.log_path.with_name(f"{old.log_path.stem}-c{ctx_size}.log"))
    factory.servers.append(new)  # reaped at teardown whatever happens
    new.wait_ready()
    return new


def test_a_real_restart_with_another_ctx_size_is_seen_and_re_benchmarked(real_llama_server, tmp_path):
    srv = real_llama_server(ctx_size=2048, n_parallel=2)  # 1024 per slot
    cfg = load_config_dict({
        "litellm": {"api_key": srv.api_key},
        "probe": {"timeout_s": 5},
        "bench": {"n_predict": 8, "timeout_s": 30},
        # the tiny model's speed is the machine's: a target it meets, the verdict's arithmetic is the unit tests'
        "gpus": [{"alias": "real", "host": "127.0.0.1", "endpoint": srv.url, "transport": "local",
                  "baseline_tok_s": 1.0}],
    })
    with StateDir(tmp_path / "state") as store:
        first = check.run(cfg, store, tick(0))
        assert first.obs.gpus["real"].n_ctx == 1024
        srv = restart_on(srv, real_llama_server, 2048)  # same context: not a change
        assert check.run(cfg, store, tick(1)).obs.gpus["real"].n_ctx == 1024
        srv = restart_on(srv, real_llama_server, 1024)  # 512 per slot: the change
        seen = check.run(cfg, store, tick(2))
        assert seen.health["gpus"]["real"]["n_ctx"] == 512
        check.run(cfg, store, tick(3))  # seen once, not again
        audit = [json.loads(line) for line in (store.path / files.AUDIT_LOG).read_text().splitlines()]
        changes = [a for a in audit if a["action"] == "context-change"]
        assert [(a["detected"]["context_change"]["from_n_ctx"], a["detected"]["context_change"]["to_n_ctx"])
                for a in changes] == [(1024, 512)]
        assert changes[0]["detected"]["context_change"]["changed_at"].startswith("2026-07-18T08:02:0")

        run = bench.run(cfg, store, tick(4), gpu="real")
    [result] = run.results
    assert result["ok"] and result["n_ctx"] == 512, result
    [verdict] = run.document()["context_changes"]
    assert (verdict["state"], verdict["from_n_ctx"], verdict["to_n_ctx"]) == ("verified", 1024, 512)
    assert verdict["gen_tok_s"] == pytest.approx(result["gen_tok_s"], abs=0.01)
