"""The fleet as LiteLLM routes it (issue 27 item 16): ``/v1/model/info`` turned into starting
``gpus[]`` entries for ``gpuheal init --from-litellm``, and compared with a config for the
doctor's drift check.

Why LiteLLM: the spec names gpu-fleet as the source of truth, but gpu-fleet publishes nothing we can
read; the deployment list that really serves traffic is LiteLLM's. Each deployment's ``api_base``
(``http://host:port/v1``) gives the GPU's host and llama-server endpoint, its ``model_name`` the
model group, its ``model_info.id`` the ``litellm_model_id``; gpu-monitor (where it answers) gives
the GPU's name, memory, index and baseline. Everything else is not known, and the written file says
so beside each value instead of guessing.

Pure: payloads and parsed documents in, records and YAML text out (``steps/init.py`` does the IO).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpuheal.core.urls import Url, split_url
from gpuheal.parse.gpu_data import MonitorDocument
from gpuheal.parse.values import check_number

ALIAS = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")  # config schema: gpus[].alias
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")  # config schema: gpus[].host
MODEL_ID = re.compile(r"[^{}\s]{1,200}")  # config schema: gpus[].litellm_model_id
LABEL_CHARS = 64  # config schema: a label value's length
NVIDIA_WORDS = ("nvidia", "geforce", "rtx", "quadro", "tesla", "a100", "h100", "h200", "l40")
AMD_WORDS = ("amd", "radeon", "instinct", "strix", "ryzen", "mi300", "mi250")


@dataclass(frozen=True)
class Route:
    """One deployment LiteLLM routes to, as ``/v1/model/info`` lists it (strings as sent, capped)."""

    group: str
    model_id: str | None
    api_base: str | None
    model: str | None = None


@dataclass(frozen=True)
class MonitorGpu:
    """One GPU gpu-monitor reports: what ``init`` can fill in for the GPU on that host."""

    hostname: str
    index: int | None
    name: str | None
    vram_total_mb: float | None
    baseline_tok_s: float | None
    gpus_on_host: int = 1


@dataclass(frozen=True)
class GpuEntry:
    """A starting ``gpus[]`` entry. ``problem``: why it is written commented out (an ``api_base``
    that is not a llama-server URL gpuheal can watch); ``unknown``: the values left for a human."""

    alias: str
    group: str
    model_id: str | None
    api_base: str | None
    host: str | None = None
    endpoint: str | None = None
    vendor: str | None = None
    name: str | None = None
    vram_total_mb: int | None = None
    baseline_tok_s: float | None = None
    gpu_index: int | None = None
    monitor_note: str = ""
    problem: str | None = None
    index_guessed: bool = False  # several servers on one host: the config needs an index for each


def _text(value: object, limit: int = 200) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    return value[:limit]


def read_routes(payload: object) -> tuple[Route, ...] | str:
    """``/v1/model/info``'s ``data`` list → routes, or why the answer is not one. An entry that is
    not an object or has no group is skipped (a damaged entry must not hide the others)."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return "LiteLLM's /v1/model/info has no 'data' list (is this LiteLLM's URL?)"
    routes = []
    for entry in data:
        if not isinstance(entry, dict) or _text(entry.get("model_name")) is None:
            continue
        info, params = entry.get("model_info"), entry.get("litellm_params")
        info = info if isinstance(info, dict) else {}
        params = params if isinstance(params, dict) else {}
        routes.append(Route(str(_text(entry["model_name"])), _text(info.get("id")), _text(params.get("api_base"), 500),
                            _text(params.get("model"))))  # fmt: skip
    return tuple(routes)


def _baseline(raw: object, hostname: str) -> float | None:
    """``benchmarks.<host>.baseline_tok_s`` of the raw document (the parser keeps the current rate)."""
    bench = raw.get("benchmarks") if isinstance(raw, dict) else None
    entry = bench.get(hostname) if isinstance(bench, dict) else None
    value = check_number(entry.get("baseline_tok_s"), lo=0.001, hi=1e6) if isinstance(entry, dict) else None
    return float(value) if isinstance(value, int | float) else None


def monitor_gpus(doc: MonitorDocument, raw: object = None) -> tuple[MonitorGpu, ...]:
    """Every GPU gpu-monitor reported (``doc``, parsed from ``raw``), with the number on its host
    (``gpu_index`` is needed then) and its host's ``baseline_tok_s``."""
    out = []
    counts = {h: 1 for h in doc.hosts} | doc.host_entries  # strix's host is in hosts only
    for hostname, count in counts.items():
        indexed = [r for (h, _i), r in sorted(doc.by_index.items(), key=lambda kv: kv[0][1]) if h == hostname]
        readings = indexed if count > 1 and indexed else [doc.hosts[hostname]] if hostname in doc.hosts else []
        baseline = _baseline(raw, hostname)
        for r in readings:
            out.append(MonitorGpu(hostname, r.index, r.name, r.values.get("vram_total_mb"), baseline, count))
    return tuple(out)


def vendor_of(name: str | None) -> str | None:
    low = (name or "").lower()
    if any(w in low for w in AMD_WORDS):
        return "amd"
    if any(w in low for w in NVIDIA_WORDS):
        return "nvidia"
    return None


def endpoint_of(url: Url) -> str:
    """The llama-server's base URL: LiteLLM's ``api_base`` less its OpenAI ``/v1``."""
    path = url.path.rstrip("/")
    path = path[: -len("/v1")] if path.endswith("/v1") else path
    return url.origin + path


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.")[:63]


def _alias(route: Route, url: Url | None, taken: set[str]) -> str:
    """The deployment's model id when it is a valid alias (``gpu-dense``), else group-host-port."""
    wanted = [route.model_id.lower()] if route.model_id else []
    if url is not None:
        wanted.append(_slug(f"{route.group}-{url.host}-{url.port or ''}"))
    wanted.append(_slug(route.group) or "gpu")
    for cand in wanted:
        if ALIAS.fullmatch(cand) and cand not in taken:
            return cand
    base = next((c for c in wanted if ALIAS.fullmatch(c)), "gpu")[:58]
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def _problem(route: Route, url: Url | None) -> str | None:
    if route.api_base is None:
        return "no api_base: a hosted provider, not a llama-server gpuheal can watch"
    if url is None:
        return "its api_base is not an http(s) URL with a host and a valid port"
    if HOST.fullmatch(url.host) is None:
        return "its api_base's host is an IPv6 address: gpus[].host takes a name or an IPv4 address"
    if route.model_id is not None and MODEL_ID.fullmatch(route.model_id) is None:
        return "its model_info.id has spaces or braces: gpus[].litellm_model_id cannot hold it"
    return None


def plan_entries(routes: Iterable[Route], monitor: tuple[MonitorGpu, ...] | str) -> tuple[GpuEntry, ...]:
    """One entry per route, in LiteLLM's order; gpu-monitor's readings for the host where it has
    exactly one GPU there (several: which one is not known, so ``gpu_index`` is left to a human).
    ``monitor``: gpu-monitor's GPUs, or why there are none (not asked, did not answer)."""
    taken: set[str] = set()
    out = []
    for route in routes:
        url = split_url(route.api_base)
        alias = _alias(route, url, taken)
        taken.add(alias)
        problem = _problem(route, url)
        if problem is not None or url is None:
            out.append(GpuEntry(alias, route.group, route.model_id, route.api_base, problem=problem))
            continue
        endpoint = endpoint_of(url)
        out.append(GpuEntry(alias, route.group, route.model_id, route.api_base, host=url.host, endpoint=endpoint))
    shared = _shared_hosts(out)
    return tuple(e if e.problem else _filled(e, shared.get(e.alias), monitor) for e in out)


def _shared_hosts(entries: list[GpuEntry]) -> dict[str, int]:
    """alias → its position among the servers of a host that has several: the config matches GPUs
    by (host, index), so each needs a ``gpu_index``; which GPU each server uses is not known."""
    by_host: dict[str, list[str]] = {}
    for e in entries:
        if e.problem is None and e.host is not None:
            by_host.setdefault(e.host, []).append(e.alias)
    return {alias: i for aliases in by_host.values() if len(aliases) > 1 for i, alias in enumerate(aliases)}


def _filled(entry: GpuEntry, index: int | None, monitor: tuple[MonitorGpu, ...] | str) -> GpuEntry:
    if index is not None:
        entry = replace(entry, gpu_index=index, index_guessed=True)
    if isinstance(monitor, str):
        return replace(entry, monitor_note=monitor)
    found = [m for m in monitor if m.hostname.lower() == entry.host]
    if index is not None:  # the reading of the index assigned, where gpu-monitor gives indexes
        found = [m for m in found if m.index == index] or found
    return _with_monitor(entry, found)


def _with_monitor(entry: GpuEntry, found: list[MonitorGpu]) -> GpuEntry:
    if not found:
        return replace(entry, monitor_note=f"gpu-monitor reports no GPU on host {entry.host}")
    if len(found) > 1:
        return replace(entry, monitor_note=f"gpu-monitor reports {len(found)} GPUs on host {entry.host}: "
                                           "set gpu_index to this deployment's")  # fmt: skip
    m = found[0]
    vram = int(m.vram_total_mb) if m.vram_total_mb else None
    index = entry.gpu_index if entry.index_guessed else m.index
    return replace(entry, vendor=vendor_of(m.name), name=m.name, vram_total_mb=vram, baseline_tok_s=m.baseline_tok_s,
                   gpu_index=index, monitor_note="from gpu-monitor")  # fmt: skip


# --------------------------------------------------------------------------- the file


def _q(value: str) -> str:
    """A YAML scalar that is always read back as this string: a JSON string (YAML's double-quoted
    style), every control character and non-ASCII character escaped."""
    return json.dumps(value)


def _c(value: object, limit: int = 160) -> str:
    """A value inside a comment: one printable line (a newline would end the comment and start YAML)."""
    text = json.dumps(value) if isinstance(value, str) else "(none)" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _gpu_lines(e: GpuEntry) -> list[str]:
    assert e.host is not None and e.endpoint is not None
    lines = [f"  - alias: {_q(e.alias)}", f"    host: {_q(e.host)}",
             f"    endpoint: {_q(e.endpoint)}   # from api_base {_c(e.api_base)}"]  # fmt: skip
    if e.model_id is not None:
        lines.append(f"    litellm_model_id: {_q(e.model_id)}")
    if len(e.group) <= LABEL_CHARS:
        lines.append(f"    labels: {{model_group: {_q(e.group)}}}   # LiteLLM's model group")
    else:
        lines.append(f"    # LiteLLM's model group: {_c(e.group)} (too long for a label)")
    known = {"vendor": e.vendor, "name": e.name, "vram_total_mb": e.vram_total_mb,
             "baseline_tok_s": e.baseline_tok_s, "gpu_index": e.gpu_index}  # fmt: skip
    why = {"vendor": "nvidia or amd (gpuheal assumes nvidia)", "name": "the GPU's product name",
           "vram_total_mb": "the GPU's memory in MiB", "baseline_tok_s": "`gpuheal bench` measures it",
           "gpu_index": "the GPU's index on its host (only when it has several)"}  # fmt: skip
    for key, value in known.items():
        if key == "gpu_index" and e.index_guessed:
            lines.append(f"    gpu_index: {value}   # not known: which of host {_c(e.host)}'s GPUs this server uses "
                         "(numbered in LiteLLM's order; check with nvidia-smi / rocm-smi)")  # fmt: skip
        elif value is not None:
            lines.append(f"    {key}: {_q(value) if isinstance(value, str) else value}   # {e.monitor_note}")
        elif key != "gpu_index" or "set gpu_index" in e.monitor_note:
            lines.append(f"    # {key}:   # not known: {why[key]} ({e.monitor_note})")
    lines += ["    # transport: ssh   # not known: ssh (the default) or local, how gpuheal reaches this host",
              "    # restart_command: systemctl restart llama-server   # not known: how this server restarts (Rule 6)"]
    return lines


def render_config(litellm_url: str, admin_key_env: str, entries: tuple[GpuEntry, ...], monitor_url: str | None,
                  monitor_state: str, written_at: str) -> str:  # fmt: skip
    """The starting ``gpuheal.yaml``. Every string from the network is a quoted scalar or a quoted
    value in a comment, so nothing LiteLLM or gpu-monitor sends can add a key."""
    watched = [e for e in entries if e.problem is None]
    lines = [
        f"# gpuheal.yaml, written by `gpuheal init --from-litellm` at {written_at}",
        f"# from LiteLLM's /v1/model/info ({len(entries)} deployments, {len(watched)} watched here)"
        + (f" and gpu-monitor ({monitor_state})." if monitor_url else "."),
        "# A value gpuheal could not know is a comment saying so: fill those in, then run",
        "#   gpuheal config validate && gpuheal doctor",
        "litellm:",
        f"  url: {_q(litellm_url)}",
        f"  admin_key_env: {_q(admin_key_env)}   # the admin key stays in the environment or .env, never here",
        "  # api_key: \"...\"   # not known: the key every llama-server accepts, if they run with --api-key",
    ]
    if monitor_url:
        lines += ["monitor:", f"  url: {_q(monitor_url)}   # {_c(monitor_state)}"]
    lines.append("gpus:")
    for e in entries:
        if e.problem is None:
            lines += _gpu_lines(e)
        else:
            lines += [f"  # not watched: deployment {_c(e.model_id)} of model group {_c(e.group)}: {e.problem}",
                      f"  # - {{alias: {_c(e.alias)}, api_base: {_c(e.api_base)}}}"]  # fmt: skip
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- drift (the doctor)


@dataclass(frozen=True)
class Drift:
    """LiteLLM's deployments against ``gpus[]``: ``unwatched`` routes no configured GPU is (matched
    by ``litellm_model_id``, else by host and port), ``unrouted`` aliases LiteLLM sends nothing to,
    ``moved`` (alias, route) whose id matches but whose api_base is not the GPU's endpoint."""

    unwatched: tuple[Route, ...]
    unrouted: tuple[str, ...]
    moved: tuple[tuple[str, Route], ...]
    hosted: int  # deployments without an api_base (a hosted provider): not gpuheal's


def drift(routes: tuple[Route, ...], gpus: Iterable[tuple[str, str, str | None]]) -> Drift:
    """``gpus``: (alias, endpoint, litellm_model_id) of each configured GPU."""
    gpus = tuple(gpus)
    by_id = {mid: alias for alias, _e, mid in gpus if mid}
    by_place: dict[tuple[str, int | None], str] = {}
    for alias, endpoint, _mid in gpus:
        url = split_url(endpoint)
        if url is not None:
            by_place.setdefault(url.host_port, alias)
    routed: set[str] = set()
    unwatched: list[Route] = []
    moved: list[tuple[str, Route]] = []
    hosted = 0
    for route in routes:
        url = split_url(route.api_base)
        if route.api_base is None:
            hosted += 1
            continue
        place = by_place.get(url.host_port) if url is not None else None
        owner = by_id.get(route.model_id or "") or place
        if owner is None:
            unwatched.append(route)
            continue
        routed.add(owner)
        if place != owner:
            moved.append((owner, route))
    unrouted = tuple(alias for alias, _e, _m in gpus if alias not in routed)
    return Drift(tuple(unwatched), unrouted, tuple(moved), hosted)


def model_ids_at(routes: Iterable[Route], endpoint: str) -> tuple[str, ...]:
    """The ids of the deployments whose ``api_base`` is on ``endpoint``'s host and port (Rule 6's
    "LiteLLM reports model healthy" for a GPU whose config names no ``litellm_model_id``), in LiteLLM's order."""
    want = split_url(endpoint)
    if want is None:
        return ()
    found: list[str] = []
    for route in routes:
        url = split_url(route.api_base)
        if url is not None and url.host_port == want.host_port and route.model_id and route.model_id not in found:
            found.append(route.model_id)
    return tuple(found)
