"""Built-in load-side cooling through LiteLLM's admin API (Rules 1 and 8; Design Decision 1: load,
never fans).

``POST {litellm.url}/model/update`` with ``{"model_info": {"id": ID}, "litellm_params": {"rpm":
N}}`` and the proxy's admin key lowers a deployment's requests per minute: the router then sends
new requests to the other deployments of the alias (the spec's fallback chains) and the hot GPU
sheds load. The same call with the normal rpm undoes it. The answer is returned in the shape the
command runners use (``rc``, ``stdout``, ``stderr``, ``error``, ``timed_out``) so the executor
treats it like any other remediation command.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuheal.actions.catalog import LITELLM_UPDATE_VERB as VERB  # noqa: F401  (re-exported)
from gpuheal.sources.http import HttpFault, request


@dataclass(frozen=True)
class AdminOutcome:
    rc: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    timed_out: bool = False


def update_rpm(base_url: str, admin_key: str | None, model_id: str, rpm: int, deadline_s: float) -> AdminOutcome:
    """Set deployment ``model_id``'s rpm. Never raises for what the network does."""
    if not admin_key:
        return AdminOutcome(rc=None, error="no LiteLLM admin key (set the variable litellm.admin_key_env names)")
    body = json.dumps({"model_info": {"id": model_id}, "litellm_params": {"rpm": int(rpm)}}).encode()
    result = request(
        "POST",
        base_url.rstrip("/") + "/model/update",
        deadline_s=deadline_s,
        max_bytes=64 * 1024,
        headers={"Authorization": f"Bearer {admin_key}", "Content-Type": "application/json"},
        body=body,
    )
    if isinstance(result, HttpFault):
        return AdminOutcome(rc=None, error=result.kind, timed_out=result.kind == "timeout", stderr=result.detail)
    text = result.body[:2000].decode("utf-8", "replace")
    if result.status == 200:
        return AdminOutcome(rc=0, stdout=f"{model_id}: rpm {rpm}")
    if result.status in (401, 403):
        return AdminOutcome(rc=1, error="auth failed", stderr="LiteLLM rejected the admin key")
    return AdminOutcome(rc=1, error=f"http-{result.status:03d}", stderr=text)


def describe(base_url: str | None, argv: list[str] | tuple[str, ...]) -> str:
    """How a dry-run plan shows the call (no key, no body secrets)."""
    _, model_id, rpm = argv
    return f"POST {str(base_url).rstrip('/')}/model/update id={model_id} rpm={rpm}"
