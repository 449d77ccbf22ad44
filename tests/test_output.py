"""Output hygiene (issue 2, item 9): strings from the network are data, never markup or terminal
control; NO_COLOR is respected; a pipe gets plain text. The rich path is exercised for real:
gpuheal runs with its stdout on a pseudo-terminal, as an operator at a terminal would see it."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import time

import pytest
from servers import (
    HEALTH_OK,
    LoopbackServer,
    Reply,
    closed_url,
    fleet_config,
    gpu_entry,
    gpuheal_argv,
    json_reply,
    run_gpuheal,
    write_config,
)

from gpuheal.render.human import clean, fmt_vram

NOW = "2026-07-18T08:00:00Z"
MARKUP = "[bold red]x[/]"
EVIL_ESC = "\x1b[5;31m"  # blink + red: must never reach the terminal from the network
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def run_on_pty(args: list[str], env: dict[str, str], timeout: float = 30) -> tuple[int, str, str]:
    """Run gpuheal with stdout on a pty (rich sees a terminal); returns (rc, stdout, stderr)."""
    master, slave = pty.openpty()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_") and k not in ("NO_COLOR", "FORCE_COLOR")}
    full_env.update({"TERM": "xterm-256color", "COLUMNS": "240", "LINES": "50"}, **env)
    proc = subprocess.Popen([*gpuheal_argv(), *args], stdout=slave, stderr=subprocess.PIPE, env=full_env)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed its end
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                # drain whatever is left, then stop
                ready, _, _ = select.select([master], [], [], 0.1)
                if not ready:
                    break
    finally:
        os.close(master)
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        proc.wait(timeout)
    return proc.returncode, b"".join(chunks).decode("utf-8", "replace"), stderr


@pytest.fixture
def hostile_fleet(tmp_path):
    """A fleet whose monitor names the GPU with markup and an escape, and whose LiteLLM answers
    500 with the same in its body (that text reaches the output as a fault detail)."""
    name = f"{MARKUP} {EVIL_ESC}EVIL\x1b[0m\x07"
    doc = {"gpus": [gpu_entry("ct8", name=name, temp_c=91), gpu_entry("ct110", temp_c=60)]}
    with (
        LoopbackServer({"/gpu-data": json_reply(doc)}) as monitor,
        LoopbackServer({"/health/liveliness": Reply(500, f"{MARKUP} {EVIL_ESC}LITELLM-BODY")}) as litellm,
        LoopbackServer({"/health": HEALTH_OK}) as gpu,
    ):
        cfg = fleet_config(
            monitor.url + "/gpu-data",
            [("gpu-dense", "ct8", gpu.url), ("gpu-light", "ct110", closed_url())],
            litellm_url=litellm.url,
            timeout_s=1.0,
        )
        config = write_config(tmp_path / "gpuheal.yaml", cfg)
        yield ["--config", str(config), "--state-dir", str(tmp_path / "state"), "check"]


def color_params(text: str) -> set[int]:
    out: set[int] = set()
    for match in SGR.finditer(text):
        for part in filter(None, match.group(1).split(";")):
            out.add(int(part))
    return out


def test_rich_table_on_a_terminal_prints_network_strings_literally(hostile_fleet):
    rc, out, err = run_on_pty(hostile_fleet, {"GPUHEAL_NOW": NOW})
    assert rc in (1, 2), (out, err)  # a fault (litellm 500, gpu-light refused)
    assert "Traceback" not in err
    assert SGR.search(out), "expected rich to style the output on a terminal"
    plain = SGR.sub("", out)
    assert MARKUP in plain  # markup printed as text, not interpreted
    assert "EVIL" in plain and "LITELLM-BODY" in plain
    assert EVIL_ESC not in out  # the network's escape never reaches the terminal
    assert "\x07" not in out
    assert 5 not in color_params(out)  # nothing blinks
    assert "gpu-dense" in plain and "gpu-light" in plain


def test_no_color_is_respected_on_a_terminal(hostile_fleet):
    rc, out, err = run_on_pty(hostile_fleet, {"GPUHEAL_NOW": NOW, "NO_COLOR": "1"})
    assert rc in (1, 2), (out, err)
    colours = {p for p in color_params(out) if 30 <= p <= 49 or 90 <= p <= 107}
    assert colours == set(), colours
    plain = SGR.sub("", out)
    assert MARKUP in plain and EVIL_ESC not in out


def test_term_dumb_gets_plain_text_even_on_a_terminal(hostile_fleet):
    rc, out, _ = run_on_pty(hostile_fleet, {"GPUHEAL_NOW": NOW, "TERM": "dumb"})
    assert rc in (1, 2)
    assert "\x1b" not in out
    assert MARKUP in out


def test_piped_output_is_plain_and_safe(hostile_fleet):
    proc = run_gpuheal(*hostile_fleet, env={"GPUHEAL_NOW": NOW, "TERM": "xterm-256color"})
    assert proc.returncode in (1, 2), proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert MARKUP in proc.stdout and "EVIL" in proc.stdout and "LITELLM-BODY" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert "\x1b" not in proc.stderr


def test_json_output_keeps_the_string_exactly(hostile_fleet):
    proc = run_gpuheal(*hostile_fleet, "--json", env={"GPUHEAL_NOW": NOW})
    doc = json.loads(proc.stdout)
    assert doc["gpus"]["gpu-dense"]["name"].startswith(f"{MARKUP} {EVIL_ESC}EVIL")  # data unchanged
    assert "\x1b" not in proc.stdout  # but escaped in the document


# --------------------------------------------------------------------------- render helpers


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "-"),
        ("plain", "plain"),
        (MARKUP, MARKUP),
        ("a\x1b[31mb", "a [31mb"),
        ("tab\there\nnew", "tab here new"),
        ("\u202eevil", "evil"),  # the override gone (parse.values.printable: whitespace collapsed)
        (42, "42"),
    ],
)
def test_clean(value, expected):
    assert clean(value) == expected


def test_clean_bounds_length():
    assert len(clean("x" * 1000, limit=50)) == 50
    assert clean("x" * 1000, limit=50).endswith("…")


@pytest.mark.parametrize(
    ("used", "total", "expected"),
    [(12288, 24576, "12.0/24.0G 50%"), (None, 24576, "?/24.0G"), (1024, None, "1.0G/?"), (None, None, "?"), (0, 0, "0.0/0.0G")],
)
def test_fmt_vram_never_shows_unknown_as_zero(used, total, expected):
    assert fmt_vram(used, total) == expected
