"""``gpuheal init --from-litellm URL``: a starting ``gpuheal.yaml`` from the deployments LiteLLM
really routes to (issue 27 item 16; :mod:`gpuheal.core.topology` decides what is written).

The order is the safe one: the target must not exist (unless ``--force``) before anything is asked;
the admin key comes from the variable ``--admin-key-env`` names (default ``LITELLM_MASTER_KEY``;
environment or ``.env``), never from a flag, and goes nowhere but LiteLLM's ``Authorization``
header; LiteLLM down, slow, answering garbage or 401 is one line and exit 3 with nothing written;
gpu-monitor (``--monitor URL``) is optional, so its failure is a warning and a comment in the file.
The text is validated as ``gpuheal config validate`` would before it takes the target's name, and
without ``--force`` it takes it with a hard link, which fails rather than replace a file that
appeared meanwhile.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuheal.core import topology
from gpuheal.errors import GpuhealError

if TYPE_CHECKING:
    from gpuheal.runtime import CommandResult


MONITOR_MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class InitOptions:
    litellm_url: str
    monitor_url: str | None = None
    force: bool = False
    admin_key_env: str = "LITELLM_MASTER_KEY"
    timeout_s: float = 10.0


def command(target: Path, opts: InitOptions, now: datetime, environ: dict[str, str] | None = None) -> CommandResult:
    from gpuheal.clock import format_iso
    from gpuheal.credentials import lookup
    from gpuheal.runtime import CommandResult
    from gpuheal.sources import litellm_admin as la

    litellm_url = _checked_url(opts.litellm_url, "--from-litellm")
    monitor_url = _checked_url(opts.monitor_url, "--monitor") if opts.monitor_url else None
    if not opts.admin_key_env.isidentifier():
        raise GpuhealError(f"--admin-key-env {_shown(opts.admin_key_env)} is not a variable name")
    if target.exists() and not opts.force:
        raise GpuhealError(f"{target} exists: gpuheal init never overwrites a config (--force replaces it)")
    key, _where = lookup(opts.admin_key_env, str(target), environ)
    if not key:
        raise GpuhealError(f"no LiteLLM admin key: set ${opts.admin_key_env} (environment or .env) to the proxy's "
                           "master key; it is never taken from a flag")  # fmt: skip
    payload = la.read_model_info(litellm_url, key, opts.timeout_s)
    if isinstance(payload, la.AdminProblem):
        raise GpuhealError(f"cannot read LiteLLM's deployments at {litellm_url}: {payload.line()}")
    routes = topology.read_routes(payload)
    if isinstance(routes, str):
        raise GpuhealError(f"{litellm_url}: {routes}")
    monitor, monitor_state = _monitor(monitor_url, opts.timeout_s)
    entries = topology.plan_entries(routes, monitor)
    watched = [e for e in entries if e.problem is None]
    if not watched:
        first = next((f": {e.problem}" for e in entries), "")
        raise GpuhealError(f"LiteLLM at {litellm_url} lists {len(entries)} deployments, none a llama-server "
                           f"gpuheal can watch{first}; nothing written")  # fmt: skip
    text = topology.render_config(litellm_url, opts.admin_key_env, entries, monitor_url, monitor_state,
                                  format_iso(now))  # fmt: skip
    _place(target, text, opts.force)
    doc = {"path": str(target), "gpus": [e.alias for e in watched],
           "not_watched": [{"alias": e.alias, "why": e.problem} for e in entries if e.problem],
           "monitor": monitor_state if monitor_url else None}  # fmt: skip
    warnings = [f"gpu-monitor: {monitor_state}"] if monitor_url and isinstance(monitor, str) else []
    return CommandResult(doc, 0, lambda: _render(doc), warnings)


def _shown(text: str) -> str:
    from gpuheal.parse.values import printable

    return repr(printable(text, 80))


def _checked_url(url: str, flag: str) -> str:
    """An http(s) URL without userinfo or query: a key belongs in the environment, not a flag."""
    from gpuheal.core.urls import split_url

    parsed = split_url(url)
    if parsed is None:
        raise GpuhealError(f"{flag} {_shown(url)} is not an http(s) URL")
    if parsed.had_secret_parts:
        raise GpuhealError(f"{flag}: give the URL without a user, password or query (the admin key comes from the "
                           "environment)")  # fmt: skip
    return parsed.clean.rstrip("/") or parsed.origin


def _monitor(url: str | None, timeout_s: float) -> tuple[tuple[topology.MonitorGpu, ...] | str, str]:
    """gpu-monitor's GPUs and a word on how it answered; why there are none when it did not."""
    import json

    from gpuheal.parse.gpu_data import parse_gpu_data
    from gpuheal.parse.values import printable
    from gpuheal.sources.http import HttpFault, request

    if url is None:
        return "no --monitor given", ""
    got = request("GET", url, deadline_s=timeout_s, max_bytes=MONITOR_MAX_BYTES)
    if isinstance(got, HttpFault):
        why = f"gpu-monitor did not answer ({got.kind}: {printable(got.detail, 80)})"
    elif got.status != 200:
        why = f"gpu-monitor answered HTTP {got.status}"
    else:
        try:
            raw = json.loads(got.body)
            found = topology.monitor_gpus(parse_gpu_data(raw), raw)
        except (ValueError, RecursionError) as exc:  # not JSON; InvalidDocument (a ValueError)
            why = f"gpu-monitor's answer is not a /gpu-data document ({printable(str(exc), 80)})"
        else:
            hosts = sorted({m.hostname for m in found})
            return found, f"answered: {len(found)} GPUs on {len(hosts)} hosts"
    return why, why


def _place(target: Path, text: str, force: bool) -> None:
    """Validate the text as ``config validate`` does, then give it the target's name: replacing
    with ``--force``, else by a hard link that fails if the name exists by then."""
    from gpuheal.atomic import write_atomic
    from gpuheal.config import load_config

    tmp = target.with_name(f".{target.name}.init-{os.getpid()}.yaml")
    try:
        write_atomic(tmp, [text], mode=0o640)
        load_config(tmp)  # a ConfigError here is a bug in init: one line, nothing written
        if force:
            os.replace(tmp, target)
        else:
            os.link(tmp, target)
    except FileExistsError:
        raise GpuhealError(f"{target} appeared meanwhile: gpuheal init never overwrites a config") from None
    except OSError as exc:
        raise GpuhealError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _render(doc: dict[str, Any]) -> None:
    from gpuheal.render.human import clean, print_line

    shown = ", ".join(doc["gpus"][:20]) + (f", +{len(doc['gpus']) - 20} more" if len(doc["gpus"]) > 20 else "")
    print_line(f"wrote {clean(doc['path'], 200)}: {len(doc['gpus'])} GPUs ({clean(shown, 400)})")
    for row in doc["not_watched"][:20]:
        print_line(f"  not watched (a comment in the file): {clean(row['alias'], 63)}: {clean(row['why'], 160)}")
    if doc["monitor"]:
        print_line(f"  gpu-monitor: {clean(doc['monitor'], 160)}")
    print_line("next: fill in the values marked 'not known', then gpuheal config validate && gpuheal doctor")
