"""The console entry point (``gpuheal/entry.py``, issue 19 "Performance"): cron's plain ``check`` runs
without Typer, and gives exactly what the Typer app gives for the same command line — output,
files and exit status — healthy, degraded, and failing; every other command line goes to Typer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import HEALTH_OK, LoopbackServer, fleet_config, json_reply, monitor_document, write_config

from gpuheal.entry import plain_check

NOW = "2026-07-18T08:00:00Z"
HOSTS = {"gpu-dense": "ct8", "gpu-light": "ct110", "strix-moe": "ct15"}
TYPER = "import sys; from gpuheal.cli import main; main(sys.argv[1:])"  # the Typer app, as before
ENTRY = "import sys; from gpuheal.entry import main; main(sys.argv[1:])"  # what the console script runs


def run(code: str, args: list[str], now: str = NOW) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")} | {"TERM": "dumb", "GPUHEAL_NOW": now}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def config(tmp_path):
    """A loopback fleet (gpu-monitor, LiteLLM, three llama-servers, the last one down) and its config."""
    doc = monitor_document(HOSTS.values())
    monitor, litellm = LoopbackServer({"/gpu-data": json_reply(doc)}), LoopbackServer({"/health/liveliness": HEALTH_OK})
    with monitor, litellm, LoopbackServer({"/health": HEALTH_OK}, ports=2) as servers:
        urls = dict(zip(HOSTS, [*servers.urls, "http://127.0.0.1:9"], strict=True))  # port 9: refused
        cfg = fleet_config(monitor.url + "/gpu-data", [(alias, HOSTS[alias], urls[alias]) for alias in HOSTS],
                           litellm_url=litellm.url, timeout_s=1.0, lock_wait_s=0.5)
        yield write_config(tmp_path / "gpuheal.yaml", cfg)


@pytest.mark.parametrize(
    "form",
    [["--config", "{c}", "--state-dir", "{s}", "check", "--json"],
     ["-c", "{c}", "--state-dir", "{s}", "--metrics-file", "{s}.prom", "check"],
     ["--state-dir", "{s}", "--config", "{c}", "check", "--json"]],
    ids=["json", "human+metrics", "order"],
)
def test_a_plain_check_gives_what_the_typer_app_gives(config, tmp_path, form):
    outcomes = []
    for name, code in (("typer", TYPER), ("entry", ENTRY)):
        state = tmp_path / name
        args = [word.format(c=config, s=state) for word in form]
        assert plain_check(args) is not None
        procs = [run(code, args, now) for now in (NOW, "2026-07-18T08:01:10Z", "2026-07-18T08:02:20Z")]
        files = {p.name: p.read_text() for p in sorted(state.iterdir()) if p.suffix in (".json", ".jsonl")}
        prom = Path(f"{state}.prom")
        outcomes.append(([(p.returncode, p.stdout, p.stderr) for p in procs], files,
                         prom.read_text() if prom.exists() else None))
    assert outcomes[0][0][0][0] == 1, outcomes[0][0]  # one GPU down: degraded, as both say
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize(
    "text",
    [None, "gpus: [\n", "gpus:\n  - {alias: a, host: b, endpoint: 'http://x', vram_total_mb: 0}\n"],
    ids=["missing", "not-yaml", "invalid"],
)
def test_a_plain_check_that_cannot_run_fails_as_the_typer_app_does(tmp_path, text):
    config = tmp_path / "gpuheal.yaml"
    if text is not None:
        config.write_text(text)
    args = ["--config", str(config), "--state-dir", str(tmp_path / "state"), "check", "--json"]
    typer, entry = (run(code, args) for code in (TYPER, ENTRY))
    assert (entry.returncode, entry.stdout, entry.stderr) == (typer.returncode, typer.stdout, typer.stderr)
    assert entry.returncode == 3 and entry.stdout == "" and entry.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "args",
    [["check"], ["check", "--json"], ["--config", "c.yaml", "check"], ["-c", "c", "--state-dir", "s", "check"],
     ["--metrics-file", "m", "check", "--json"]],
)
def test_the_plain_forms(args):
    assert plain_check(args) is not None


@pytest.mark.parametrize(
    "args",
    [[], ["--help"], ["check", "--help"], ["check", "--json", "--json"], ["--json", "check"], ["heal"],
     ["check", "--record", "t.jsonl"], ["--config=c.yaml", "check"], ["-v", "check"], ["--config", "check"],
     ["--config", "-c", "check"], ["--config", "a", "--config", "b", "check"], ["--version"], ["check", "extra"],
     ["config", "validate"]],
)
def test_every_other_command_line_goes_to_typer(args):
    assert plain_check(args) is None


def test_the_entry_hands_other_command_lines_to_typer_and_a_plain_check_never_imports_it(config, tmp_path):
    version = run(ENTRY, ["--version"])
    assert version.returncode == 0 and version.stdout.startswith("gpuheal ")
    usage = run(ENTRY, ["check", "--bogus"])
    assert usage.returncode == 3 and "No such option" in usage.stderr
    args = ["--config", str(config), "--state-dir", str(tmp_path / "state"), "check", "--json"]
    argv = [sys.executable, "-X", "importtime", "-m", "gpuheal", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")}
    plain = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert plain.returncode == 1 and plain.stdout.startswith("{")
    assert "typer" not in {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in plain.stderr.splitlines()}
    record = subprocess.run([*argv, "--record", str(tmp_path / "t.jsonl")], capture_output=True, text=True, env=env)
    assert record.returncode == 1 and "| typer" in record.stderr and (tmp_path / "t.jsonl").exists()
