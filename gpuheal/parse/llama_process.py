"""Is this process our llama-server? One answer for every rule that asks (Rules 2, 4 and 6.1). Pure.

By the program's base name, exactly: ``/app/llama-server``, ``./build/bin/llama-server`` and
``C:\\llama\\llama-server`` are; ``llama-server-exporter`` or ``python3 not-llama-server-wrapper.py``
are not (never a substring of something else's name). This GPU's own llama-server, of several on a
host, is the one listening on its endpoint's port: ``pgrep -af llama-server`` where the GPU's commands
run (:data:`PGREP_ARGV`, run by the heal step's context, which knows the endpoint's port), read by
:func:`read_pgrep`. The shell that
wraps a command over SSH also has ``llama-server`` in its argv; its program is ``sh``, so it is never
counted.
"""

from __future__ import annotations

LLAMA_SERVER = "llama-server"
PGREP_ARGV = ("pgrep", "-af", LLAMA_SERVER)
LLAMA_DEFAULT_PORT = 8080  # llama-server's --port default (llama-server.md)
PGREP_MAX_LINES = 500


def is_llama_server(name: str) -> bool:
    """Whether a process name (a program path, or a command line) is llama-server."""
    base = name.strip().replace("\\", "/").rsplit("/", 1)[-1]
    return base == LLAMA_SERVER or base.startswith(LLAMA_SERVER + " ")


def _port_of(words: list[str]) -> int | None:
    for n, word in enumerate(words):
        value = word.split("=", 1)[1] if word.startswith("--port=") else None
        if word == "--port" and n + 1 < len(words):
            value = words[n + 1]
        if value is not None:
            return int(value) if value.isdigit() else None
    return LLAMA_DEFAULT_PORT


def read_pgrep(stdout: str, port: int | None) -> tuple[int, ...]:
    """The pids of ``llama-server`` processes on ``port`` (any port: ``None``) in ``pgrep -af`` output."""
    found = []
    for line in stdout.splitlines()[:PGREP_MAX_LINES]:
        words = line.split()
        if len(words) < 2 or not words[0].isdigit() or not is_llama_server(words[1]):
            continue
        if port is None or _port_of(words[2:]) == port:
            found.append(int(words[0]))
    return tuple(found)
