"""``gpuheal bench`` as cron runs it: a subprocess, loopback llama-server look-alikes, exit codes,
and stdout that is exactly one JSON document with ``--json``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from test_bench_fakes import FakeLlama, dead_endpoint


@pytest.fixture
def fleet(tmp_path):
    good = FakeLlama()
    strict = FakeLlama(require_key="sk-right-key-1234")
    cfg = {
        "litellm": {"api_key": "not-needed"},
        "bench": {"n_predict": 16, "timeout_s": 3},
        "gpus": [
            {"alias": "gpu-dense", "host": "ct8", "endpoint": good.url, "baseline_tok_s": 74.8},
            {"alias": "strix-moe", "host": "ct15", "endpoint": dead_endpoint(), "vendor": "amd"},
        ],
    }
    path = tmp_path / "gpuheal.yaml"
    path.write_text(yaml.safe_dump(cfg))
    yield {"config": path, "state": tmp_path / "state", "good": good, "strict": strict, "raw": cfg}
    good.stop()
    strict.stop()


def gpuheal(fleet, *args, env_extra=None):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")}
    env["GPUHEAL_NOW"] = "2026-07-18T08:00:00Z"
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "gpuheal", "--config", str(fleet["config"]), "--state-dir", str(fleet["state"]), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_bench_json_is_exactly_one_document(fleet):
    proc = gpuheal(fleet, "bench", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # the whole of stdout: one document, nothing else
    assert set(doc) >= {"results", "issues", "regressions"}
    by = {r["gpu"]: r for r in doc["results"]}
    assert by["gpu-dense"]["ok"] and by["gpu-dense"]["gen_tok_s"] > 0
    assert by["strix-moe"]["error"] == "refused"
    assert "Traceback" not in proc.stderr
    state = json.loads((fleet["state"] / "benchmark-regression.json").read_text())
    assert state["schema_version"] == 1 and state["gpu-dense"]["trend"] == "stable"


def test_rejected_key_exits_1_and_names_the_key_described(fleet):
    fleet["raw"]["gpus"].append({"alias": "gpu-light", "host": "ct110", "endpoint": fleet["strict"].url})
    fleet["config"].write_text(yaml.safe_dump(fleet["raw"]))
    proc = gpuheal(fleet, "bench", "--json", "--gpu", "gpu-light")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    (r,) = doc["results"]
    assert r["error"] == "unauthorized" and r["key_sent"] == "not-needed"
    assert [i["issue"] for i in doc["issues"] if i["gpu"] == "gpu-light"] == ["api-key-mismatch"]
    assert len(fleet["strict"].requests()) == 1


def test_unknown_gpu_exits_3_with_the_known_aliases(fleet):
    proc = gpuheal(fleet, "bench", "--json", "--gpu", "gpu-nope")
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert "gpu-nope" in proc.stderr and "gpu-dense, strix-moe" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_human_output_when_piped_is_a_plain_table(fleet):
    proc = gpuheal(fleet, "bench")
    assert proc.returncode == 0, proc.stderr
    assert "gpu-dense" in proc.stdout and "refused" in proc.stdout
    assert "\x1b[" not in proc.stdout  # no terminal: no colours, no progress bar
    assert "\x1b[" not in proc.stderr


def test_progress_bar_goes_to_a_terminal_stderr_never_to_json_stdout(fleet):
    import os
    import pty

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")}
    env.update(GPUHEAL_NOW="2026-07-18T08:00:00Z", TERM="xterm", COLUMNS="100")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuheal", "--config", str(fleet["config"]), "--state-dir", str(fleet["state"]), "bench", "--json"],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    seen = bytearray()

    def drain() -> None:  # keep reading so a chatty bar can never block the child
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            seen.extend(chunk)

    import threading

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=60)
    reader.join(5)
    os.close(master)
    assert proc.returncode == 0
    json.loads(out)  # stdout untouched by the bar
    assert b"bench" in seen  # the bar was drawn on the terminal (stderr)
