"""The doctor's drift check (issue 27 item 16): LiteLLM's deployment list against ``gpus[]``.

The fleet is hand-copied YAML; the deployments that really serve traffic are LiteLLM's. A
deployment no configured GPU is goes unwatched (no rule sees it fail), and a configured GPU LiteLLM
routes nothing to is watched for nothing (or was moved). Both are warnings with a fix line, never a
failure: the config may be right and LiteLLM about to change. Read-only: one ``GET /v1/model/info``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpuheal.doctor import OK, SKIP, WARN, Check, Context, Probe, register

if TYPE_CHECKING:
    from gpuheal.core.topology import Drift

CHECK = "deployments"
MAX_ROWS = 20  # a fleet that drifted a lot gets 20 rows and a count, not a thousand


@register("network")
def drift_probes(ctx: Context) -> Iterable[Probe]:
    if ctx.cfg.litellm.url:
        t = float(ctx.cfg.litellm.timeout_s)
        yield Probe("litellm", CHECK, t + 1.0, lambda: drift_checks(ctx, t))


def drift_checks(ctx: Context, deadline_s: float) -> list[Check]:
    from gpuheal.core import topology
    from gpuheal.credentials import lookup
    from gpuheal.sources import litellm_admin as la

    cfg = ctx.cfg
    name = cfg.litellm.admin_key_env
    key, _where = lookup(name, cfg.path, ctx.environ)
    if not key:
        return [Check("litellm", CHECK, SKIP, f"${name} is not set: LiteLLM's deployments not compared with gpus[]",
                      f"set ${name} to the proxy's master key to compare them")]  # fmt: skip
    payload = la.read_model_info(str(cfg.litellm.url), key, deadline_s)
    if isinstance(payload, la.AdminProblem):
        return [Check("litellm", CHECK, WARN, f"cannot compare with gpus[]: {payload.detail}", payload.fix)]
    routes = topology.read_routes(payload)
    if isinstance(routes, str):
        return [Check("litellm", CHECK, WARN, f"cannot compare with gpus[]: {routes}", "check litellm.url")]
    found = topology.drift(routes, ((g.alias, g.endpoint, g.litellm_model_id) for g in cfg.gpus))
    return drift_rows(found, len(routes), str(cfg.litellm.url))


def drift_rows(found: Drift, listed: int, url: str) -> list[Check]:
    """One warning per drifted deployment or GPU (at most :data:`MAX_ROWS`), else one ``ok`` row."""
    from gpuheal.parse.values import printable

    rows = []
    for route in found.unwatched:
        where = f"{printable(route.api_base or '', 100)} (model id {printable(route.model_id or '?', 64)!r})"
        rows.append(Check("litellm", CHECK, WARN,
                          f"LiteLLM routes model group {printable(route.group, 60)!r} to {where}, "
                          "which no gpus[] entry watches",
                          f"add it to gpus[] (`gpuheal init --from-litellm {url}` writes one to copy)"))  # fmt: skip
    for alias, route in found.moved:
        rows.append(Check(alias, CHECK, WARN,
                          f"LiteLLM's deployment {printable(route.model_id or '?', 64)!r} points at "
                          f"{printable(route.api_base or '', 100)}, not at this GPU's endpoint",
                          "set gpus[].endpoint to where LiteLLM routes, or fix the deployment's api_base"))  # fmt: skip
    for alias in found.unrouted:
        rows.append(Check(alias, CHECK, WARN,
                          "LiteLLM routes no deployment to this GPU (by litellm_model_id or endpoint): it is "
                          "watched but serves no traffic",
                          "remove it from gpus[] (or pause it), or add it to LiteLLM's model_list"))  # fmt: skip
    if len(rows) > MAX_ROWS:
        rows = rows[:MAX_ROWS] + [Check("litellm", CHECK, WARN, f"and {len(rows) - MAX_ROWS} more drifted",
                                        "compare `gpuheal init --from-litellm` output with gpus[]")]  # fmt: skip
    if rows:
        return rows
    hosted = f"; {found.hosted} hosted deployments without api_base not gpuheal's" if found.hosted else ""
    return [Check("litellm", CHECK, OK, f"LiteLLM's {listed} deployments match gpus[]{hosted}")]
