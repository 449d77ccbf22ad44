"""Credentials: the environment, then Lesson L4's ``.env`` fallback, and the list of every secret
gpuheal knows of (for redaction). No network, no config parsing: both ``gpuheal.config`` and
``gpuheal.zulip`` use this module, so neither has to import the other (issue 10, point 3).

Lookup order (L4: "check the source"): the environment variable, else a ``.env`` file in the
working directory, else one next to the config file. Values are never written, logged or printed.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

log = logging.getLogger("gpuheal")

SECRET_ENV_SUFFIXES = ("_API_KEY", "_APIKEY", "_TOKEN", "_PASSWORD", "_SECRET")


def read_dotenv(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``export`` prefix, quotes and ``#`` comments allowed); {} if absent."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        if key:
            out[key] = value
    return out


def dotenv_paths(config_path: str | None) -> list[Path]:
    """Where the L4 fallback looks, in order: ``./.env``, then ``.env`` next to the config."""
    paths = [Path.cwd() / ".env"]
    if config_path:
        beside = Path(config_path).resolve().parent / ".env"
        if beside not in paths:
            paths.append(beside)
    return paths


def lookup(name: str, config_path: str | None, environ: dict[str, str] | None = None) -> tuple[str | None, str]:
    """(value, where it came from: ``environment`` or the ``.env`` path); (None, "") if nowhere."""
    env = os.environ if environ is None else environ
    value = env.get(name)
    if value:
        return value, "environment"
    for path in dotenv_paths(config_path):
        found = read_dotenv(path).get(name)
        if found:
            _warn_if_readable(path)
            return found, str(path)
    return None, ""


def env_or_dotenv(name: str, config_path: str | None) -> str | None:
    """The credential ``name`` from the environment or a ``.env`` file; ``None`` when neither has it."""
    return lookup(name, config_path)[0]


_warned: set[Path] = set()


def _warn_if_readable(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if mode & (stat.S_IRGRP | stat.S_IROTH) and path not in _warned:
        _warned.add(path)
        log.warning("%s holds credentials and is readable by other users; chmod 600 it", path)


def secrets_for(cfg: Any, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Every secret value gpuheal can know of, for :func:`gpuheal.redact.redact`.

    The Zulip key (environment or ``.env``), the LiteLLM/llama-server api key, the LiteLLM admin
    key, and the value of any environment variable named like a secret (``*_API_KEY``, ``*_TOKEN``).
    """
    env = os.environ if environ is None else environ
    config_path = getattr(cfg, "path", None)
    values: list[str] = []
    key_env = str(cfg.zulip.api_key_env or "ZULIP_API_KEY")
    key, _ = lookup(key_env, config_path, environ)
    if key:
        values.append(key)
    api_key = getattr(cfg.litellm, "api_key", "") or ""
    if api_key:
        values.append(api_key)
    admin_env = getattr(cfg.litellm, "admin_key_env", None)
    if admin_env:  # the LiteLLM admin key used by built-in load shedding
        admin, _ = lookup(admin_env, config_path, environ)
        if admin:
            values.append(admin)
    for name, value in env.items():
        if value and name.upper().endswith(SECRET_ENV_SUFFIXES) and len(value) >= 8:
            values.append(value)
    # longest first: a secret that contains another is removed whole
    return tuple(sorted(set(values), key=len, reverse=True))
