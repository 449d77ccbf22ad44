"""Credentials: the environment, then Lesson L4's ``.env`` fallback, and the list of every secret
gpuheal knows of (for redaction), derived from what each source and sink declares (``secrets``:
:class:`gpuheal.secret.Secret`). No network, no config parsing: both ``gpuheal.config`` and
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

from gpuheal.secret import Secret

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


# LiteLLM's (a core section, neither a GPU source nor an alert sink): the key gpuheal sends to it and
# to llama-server, and the admin key built-in load shedding uses
LITELLM_SECRETS = (Secret(field="api_key", in_config=True), Secret(field="admin_key_env"))


def declared(cfg: Any) -> list[tuple[Any, Secret]]:
    """Every declared secret with its config section's record (``None``: not written, or none): each
    registered GPU source's (:mod:`gpuheal.source_kinds`) and alert sink's (:mod:`gpuheal.sinks`),
    configured or not (a secret in the environment is redacted either way), and LiteLLM's."""
    from gpuheal.sinks import SINKS
    from gpuheal.source_kinds import REGISTRY

    sections = getattr(cfg, "sections", {}) or {}
    owners = [(k.section, k.secrets) for k in REGISTRY] + [(k.section, k.secrets) for k in SINKS]
    out = [(sections.get(section) if section else None, s) for section, secrets in owners for s in secrets]
    return out + [(getattr(cfg, "litellm", None), s) for s in LITELLM_SECRETS]


def secret_value(secret: Secret, section: Any, config_path: str | None,
                 environ: dict[str, str] | None = None) -> str | None:
    """The value of one declared secret: the section's field itself (``in_config``), else the variable
    the field names (or ``secret.env``) from the environment or ``.env``; ``None`` where there is none."""
    named = getattr(section, secret.field, None) if secret.field and section is not None else None
    if secret.in_config:
        return str(named) if named else None
    return lookup(str(named or secret.env), config_path, environ)[0] if (named or secret.env) else None


def secrets_for(cfg: Any, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Every secret value gpuheal can know of, for :func:`gpuheal.redact.redact`: each declared one
    (:func:`declared`), and the value of any environment variable named like a secret (``*_API_KEY``,
    ``*_TOKEN``)."""
    env = os.environ if environ is None else environ
    config_path = getattr(cfg, "path", None)
    values = [v for section, secret in declared(cfg) if (v := secret_value(secret, section, config_path, environ))]
    for name, value in env.items():
        if value and name.upper().endswith(SECRET_ENV_SUFFIXES) and len(value) >= 8:
            values.append(value)
    # longest first: a secret that contains another is removed whole
    return tuple(sorted(set(values), key=len, reverse=True))
