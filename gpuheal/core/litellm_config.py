"""Rule 1.2's redirect to a cooler GPU through LiteLLM's ``config.yaml`` (issue 27 item 7). Pure: the
document in, the changed document (or why not) out, and what LiteLLM's read-back must show.

**Why.** On the spec's own fleet every stable alias (``gpu-dense``, ``gpu-light``, ``strix-moe``) is a
LiteLLM model group of one deployment, kept in ``config.yaml`` with no database: ``/model/update`` cannot
change it (500 "No DB Connected"), and a lower weight in a group of one moves nothing. A redirect there
means LiteLLM sending the hot GPU's model group to a cooler GPU — the spec's "redirect new requests to
cooler GPUs via LiteLLM fallback chains (gemma → qwen, qwen → gemma)" — which LiteLLM 1.108.7 takes only
from its config file, read at start (it has no ``/config/reload``: the route is not mounted, BerriAI/litellm
#30772; no file watcher), so the change is: rewrite the file, restart LiteLLM (``litellm.restart_command``),
read ``/v1/model/info`` back.

**What changes.** Every ``model_list`` entry whose ``litellm_params.api_base`` is the hot GPU's endpoint
gets the cooler GPU's ``api_base`` (the one its own entries use, else its endpoint + ``/v1``): the hot
GPU's model groups are served by the cooler GPU until the original file is put back. Nothing else in the
file changes meaning (it is re-serialised: comments are not kept; the original is kept beside it as
``<file>.gpuheal-orig`` and copied back on restore, so the operator's file returns byte for byte).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gpuheal.core.heal_state import HealState
from gpuheal.core.urls import split_url

BACKUP_SUFFIX = ".gpuheal-orig"
NEW_SUFFIX = ".gpuheal-new"
MAX_ENTRIES = 10_000


def base_of(url: object) -> tuple[str, int | None] | None:
    """(host, port) of an ``api_base`` or endpoint URL (the scheme's default port if none); ``None`` for
    anything that is not one (:func:`gpuheal.core.urls.split_url`: strict)."""
    parsed = split_url(url.strip() if isinstance(url, str) else url)
    return None if parsed is None else parsed.host_port


def _entries(doc: Any) -> list[dict[str, Any]] | str:
    listed = doc.get("model_list") if isinstance(doc, dict) else None
    if not isinstance(listed, list):
        return "it has no model_list"
    if len(listed) > MAX_ENTRIES:
        return f"its model_list has more than {MAX_ENTRIES} entries"
    return [e for e in listed if isinstance(e, dict)]


def _base(entry: dict[str, Any]) -> object:
    params = entry.get("litellm_params")
    return params.get("api_base") if isinstance(params, dict) else None


@dataclass(frozen=True)
class Redirect:
    """The changed document, the model groups now served by the cooler GPU, and its ``api_base``."""

    doc: dict[str, Any]
    groups: tuple[str, ...]
    to_base: str


def redirect(doc: Any, hot_endpoint: str, cool_endpoint: str) -> Redirect | str:
    """``doc`` with the hot GPU's deployments pointed at the cooler GPU, or why it cannot be."""
    entries = _entries(doc)
    if isinstance(entries, str):
        return entries
    hot, cool = base_of(hot_endpoint), base_of(cool_endpoint)
    if hot is None or cool is None or hot == cool:
        return "the two GPUs' endpoints are not two URLs"
    to_base = next((str(_base(e)) for e in entries if base_of(_base(e)) == cool), cool_endpoint.rstrip("/") + "/v1")
    groups: list[str] = []
    out_list: list[Any] = []
    for entry in doc["model_list"]:
        if isinstance(entry, dict) and base_of(_base(entry)) == hot and isinstance(entry.get("model_name"), str):
            entry = {**entry, "litellm_params": {**entry["litellm_params"], "api_base": to_base}}
            groups.append(entry["model_name"])
        out_list.append(entry)
    if not groups:
        return f"no model_list entry has the api_base of {hot_endpoint}"
    return Redirect({**doc, "model_list": out_list}, tuple(dict.fromkeys(groups)), to_base)


def routes(payload: Any, groups: tuple[str, ...], endpoint: str) -> bool | None:
    """Whether LiteLLM's ``/v1/model/info`` answer sends any of ``groups`` to ``endpoint`` (``None``:
    the answer lists none of the groups, or is not one)."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return None
    want = base_of(endpoint)
    seen = [e for e in data if isinstance(e, dict) and e.get("model_name") in groups]
    if not seen:
        return None
    return any(base_of(_base(e)) == want for e in seen)


CONFIG_EFFECT = "litellm-config"  # the ``kind`` of the effect a config redirect leaves for its restore


def note_restore(state: HealState, alias: str, effects: list[dict[str, Any]]) -> HealState:
    """Remember the config file a redirect rewrote, so ``restore-load`` copies its original back."""
    m = state.active.get(alias)
    if m is None or m.litellm_config is not None:
        return state
    for effect in effects:
        if effect.get("kind") == CONFIG_EFFECT and isinstance(effect.get("path"), str):
            return state.with_mitigation(alias, replace(m, litellm_config=str(effect["path"])))
    return state


def serves(payload: Any, endpoint: str) -> bool:
    """Whether any deployment in a ``/v1/model/info`` answer has ``endpoint``'s ``api_base``."""
    data = payload.get("data") if isinstance(payload, dict) else None
    want = base_of(endpoint)
    return isinstance(data, list) and any(isinstance(e, dict) and base_of(_base(e)) == want for e in data)


# --------------------------------------------------------------------------- drain first (issue 28 item 2)
DRAIN_SUFFIX = ".gpuheal-drain-"  # + the GPU's alias: the file as it was before that GPU was drained


@dataclass(frozen=True)
class Drain:
    """The file without the drained GPU's deployments, and the model groups they were in (each still has
    a deployment elsewhere in the file)."""

    doc: dict[str, Any]
    groups: tuple[str, ...]


def drain(doc: Any, endpoint: str) -> Drain | str:
    """``doc`` without the ``model_list`` entries on ``endpoint``, or why not: a group of them left with no
    deployment in the file is refused (never the last deployment of a group; LiteLLM's read-back, and the
    caller's health of the twins, decide the rest)."""
    entries = _entries(doc)
    if isinstance(entries, str):
        return entries
    at = base_of(endpoint)
    if at is None:
        return f"{endpoint!r} is not a URL"
    mine = [e for e in entries if base_of(_base(e)) == at]
    groups = tuple(dict.fromkeys(str(e.get("model_name")) for e in mine))
    if not mine:
        return f"no model_list entry has the api_base of {endpoint}"
    kept = [e for e in doc["model_list"] if not (isinstance(e, dict) and base_of(_base(e)) == at)]
    alone = [g for g in groups if not any(isinstance(e, dict) and str(e.get("model_name")) == g for e in kept)]
    if alone:
        return f"it is the only deployment of {', '.join(alone)} in the file"
    return Drain({**doc, "model_list": kept}, groups)


def undrain(doc: Any, original: Any, endpoint: str) -> dict[str, Any] | str:
    """``doc`` with the entries on ``endpoint`` that ``original`` (the file before the drain) had, back in
    their places among the entries kept since; entries changed or added meanwhile are kept as they are."""
    now, before = _entries(doc), _entries(original)
    if isinstance(now, str) or isinstance(before, str):
        return f"cannot put the deployments back: {now if isinstance(now, str) else before}"
    at = base_of(endpoint)
    back = [e for e in before if base_of(_base(e)) == at]
    if not back:
        return f"the file before the drain has no entry with the api_base of {endpoint}"
    present = [e for e in doc["model_list"] if not (isinstance(e, dict) and e in back)]
    out: list[Any] = []
    for entry in original["model_list"]:  # the original order, the entries of today's file kept
        if isinstance(entry, dict) and entry in back:
            out.append(entry)
        elif present and entry == present[0]:
            out.append(present.pop(0))
    return {**doc, "model_list": out + present}
