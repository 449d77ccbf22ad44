"""The doctor's built-in checks (issue 11, point 3). Every probe only reads: HTTP GETs, an SSH
connect, and the read-only commands ``command -v``, ``systemctl cat UNIT``, ``sudo -n true``, the GPU's
power-limit query and ``id -u`` (the power cap's proof: ``doctor/power.py``).
No restart, no LiteLLM update, no Zulip message; the state directory's lock is taken and released
(never waited for) and nothing is written there."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuheal.doctor import FAIL, OK, SKIP, WARN, Check, Context, Probe, register
from gpuheal.parse.values import printable

if TYPE_CHECKING:
    from gpuheal.config.model import Config, GpuConfig
    from gpuheal.sources.litellm_admin import Deployment
    from gpuheal.transport import Target, Transport, TransportPool

# one configured command to check where it runs: (alias, config key, argv template, placeholder values)
Command = tuple[str, str, tuple[str, ...], dict[str, str]]

CMD_TIMEOUT_S = 5.0
RESTART_VERBS = {"restart", "try-restart", "reload-or-restart"}
# issue 28: a frozen server's restart within the MTTR target (90 s, cron every 60 s): up to 62 s until
# a poll sees it, ~10 s of in-run confirmation, ~5 s to start and verify; the stop gets the rest
STOP_TIMEOUT_WARN_S = 10.0
SIGKILL = 9
SERVICE_VERBS = {"restart", "start", "stop", "reload", "try-restart", "reload-or-restart", "kill"}


# --------------------------------------------------------------------------- local stage


@register("local")
def local_probes(ctx: Context) -> Iterable[Probe]:
    cfg = ctx.cfg
    yield Probe(
        "state",
        "config",
        1.0,
        lambda: Check(
            "state",
            "config",
            OK,
            f"{cfg.path or 'config'} valid: {len(cfg.gpus)} GPU{'s' if len(cfg.gpus) != 1 else ''}",
        ),
    )
    yield Probe("state", "state directory", 2.0, lambda: state_dir_check(Path(ctx.state_dir)))
    yield Probe("zulip", "credentials", 2.0, lambda: zulip_credentials(ctx))
    if uses_builtin_shedding(cfg):
        yield Probe("litellm", "admin key present", 2.0, lambda: admin_key_present(ctx))
    if cfg.wake.configured or Path(WAKE_SOCKET_UNIT).exists():
        yield Probe("state", "wake token", 2.0, lambda: wake_token(ctx))
    for g in cfg.gpus:
        for issue, action in fallback_steps():
            yield Probe(g.alias, f"{issue} restart", 1.0, partial(fallback_check, g, issue, action))


def fallback_steps() -> list[tuple[str, str]]:
    """(issue, action) of each remedy step whose action falls back to another's command when its own is
    not configured (Rule 2.2's memory-capped restart falls back to a plain one)."""
    from gpuheal.core.catalog import ACTIONS
    from gpuheal.rules import REMEDIES

    return [(issue, a) for issue, r in REMEDIES.items() for a in r.steps if ACTIONS[a].fallback is not None]


def fallback_check(g: GpuConfig, issue: str, action: str) -> Check:
    """Rule 2.2: "restart with memory cap flag". Without ``memcap_restart_command`` the leak's
    restart is a plain one (the audit says "uncapped"), and the leak can come straight back."""
    from gpuheal.core.catalog import ACTIONS

    spec = ACTIONS[action]
    if spec.command_key and g.command(spec.command_key):
        return Check(g.alias, f"{issue} restart", OK, f"{spec.command_key} configured")
    return Check(g.alias, f"{issue} restart", WARN, spec.unconfigured)


WAKE_SOCKET_UNIT = "/etc/systemd/system/gpuheal-wake.socket"


def wake_token(ctx: Context) -> Check:
    """``gpuheal wake`` refuses every request (401) while its token variable is unset (issue 22 item 7)."""
    from gpuheal.credentials import lookup

    name = ctx.cfg.wake.token_env
    value, source = lookup(name, ctx.cfg.path, ctx.environ)
    if value:
        return Check("state", "wake token", OK, f"${name} is set (from {printable(source, 80)})")
    return Check(
        "state", "wake token", FAIL, f"${name} is not set: gpuheal wake answers every webhook 401",
        f"put {name}=<a long random string> in /etc/gpuheal/.env (mode 0600) and in the sender's config",
    )


def state_dir_check(path: Path) -> Check:
    """Writable and lockable, without waiting for the lock and without writing a state file."""
    import errno
    import fcntl

    from gpuheal.state.store import LOCK_FILE

    if not path.exists():
        parent = next((p for p in path.absolute().parents if p.exists()), Path("/"))
        if os.access(parent, os.W_OK | os.X_OK):
            return Check("state", "state directory", OK, f"{path} does not exist yet; the first run creates it")
        return Check(
            "state",
            "state directory",
            FAIL,
            f"{path} does not exist and {parent} is not writable",
            "create it (mode 0700) for the user cron runs gpuheal as, or pass --state-dir",
        )
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        return Check(
            "state",
            "state directory",
            FAIL,
            f"{path} is not a writable directory",
            f"chown/chmod {path} for the user cron runs gpuheal as, or pass --state-dir",
        )
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        return Check(
            "state",
            "state directory",
            FAIL,
            f"cannot open {path / LOCK_FILE}: {exc.strerror}",
            f"fix the permissions of {path}",
        )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return Check(
                "state",
                "state directory",
                WARN,
                f"{path} is locked by another gpuheal run right now",
                "fine while cron runs gpuheal; if it stays locked, look for a hung gpuheal process",
            )
        return Check("state", "state directory", FAIL, f"cannot lock {path}: {exc.strerror}", "use a local filesystem")
    finally:
        os.close(fd)
    return Check("state", "state directory", OK, f"{path} writable and lockable")


def zulip_credentials(ctx: Context) -> Check:
    from gpuheal.errors import GpuhealError
    from gpuheal.zulip import load_credentials

    if not ctx.cfg.zulip.site:
        return Check("zulip", "credentials", SKIP, "zulip.site is not set: alerts stay queued in the state directory")
    try:
        creds = load_credentials(ctx.cfg, ctx.environ)
    except GpuhealError as exc:
        return Check(
            "zulip", "credentials", FAIL, printable(exc, 200), "export the variable (or put it in .env, mode 0600)"
        )
    return Check("zulip", "credentials", OK, f"bot {printable(creds.email, 80)} (from {printable(creds.source, 80)})")


def admin_key(ctx: Context) -> str | None:
    from gpuheal.credentials import lookup

    value, _source = lookup(ctx.cfg.litellm.admin_key_env, ctx.cfg.path, ctx.environ)
    return value


def admin_key_present(ctx: Context) -> Check:
    name = ctx.cfg.litellm.admin_key_env
    if admin_key(ctx):
        return Check("litellm", "admin key present", OK, f"${name} is set")
    return Check(
        "litellm",
        "admin key present",
        FAIL,
        f"${name} is not set: built-in load shedding cannot call LiteLLM",
        f"export {name}=<the proxy's master_key> (or put it in .env, mode 0600)",
    )


def uses_builtin_shedding(cfg: Config) -> bool:
    return bool(cfg.litellm.url) and any(g.litellm_model_id and not g.command("shed_load_command") for g in cfg.gpus)


# --------------------------------------------------------------------------- network stage: HTTP


@register("network")
def source_probes(ctx: Context) -> Iterable[Probe]:
    """The configured GPU source's own probes (gpu-monitor's document, Prometheus's queries)."""
    from gpuheal.named import resolve
    from gpuheal.sources.gpu_source import gpu_source

    for p in gpu_source(ctx.cfg).doctor_probes():
        check = resolve(p.check)
        yield Probe(p.target, p.name, p.deadline_s, partial(check, ctx.cfg))


@register("local")
def coverage_probes(ctx: Context) -> Iterable[Probe]:
    """Which rules the configured source cannot feed (issue 19): the fleet-wide part of ``check``'s
    ``rules_off``, derived the same way (a GPU without /metrics has its own /metrics row)."""
    yield Probe("rules", "rules off", 1.0, lambda: coverage_checks(ctx.cfg))


def coverage_checks(cfg: Config) -> list[Check]:
    """One skip row per rule that cannot judge under this source, with why and the fix; one ✔ row
    when every rule can. Skips are neutral: a source that lacks a signal is a choice, not a fault."""
    from datetime import UTC, datetime

    from gpuheal.core.coverage import from_litellm, rules_off
    from gpuheal.model import Observation
    from gpuheal.rules import ALL
    from gpuheal.source_kinds import configured

    source, lite = configured(cfg).name, cfg.litellm
    off = rules_off(source, Observation(datetime.now(UTC), {}, True, source=source), ALL,
                    from_litellm(lite.url, lite.read_metrics, lite.read_spend_logs))
    if not off:
        return [Check("rules", "rules off", OK, f"every rule can judge with GPU source {source}")]
    return [Check("rules", f"rule {o['rule']}", SKIP, f"off: {o['why']}", o["fix"]) for o in off]


def _has_failure_ratio(cfg: Config) -> bool:
    """Whether the configured source gives Rule 3 its failure ratio (its declaration, not its config section)."""
    from gpuheal.signals import Signal
    from gpuheal.sources.gpu_source import gpu_source

    return Signal.FAILURE_RATIO in gpu_source(cfg).provides()


@register("network")
def http_probes(ctx: Context) -> Iterable[Probe]:
    cfg = ctx.cfg
    deadline = cfg.probe.timeout_s
    for g in cfg.gpus:
        yield Probe(g.alias, "llama-server /health", deadline, partial(health_check, g, deadline))
        yield Probe(g.alias, "llama-server /props", deadline, partial(props_check, cfg, g, deadline))
        yield Probe(g.alias, "llama-server /metrics", deadline, partial(metrics_check, cfg, g, deadline))
    if cfg.litellm.url:
        t = float(cfg.litellm.timeout_s)
        yield Probe("litellm", "liveliness", t * 3, lambda: litellm_checks(ctx, t))
    else:
        yield Probe(
            "litellm",
            "liveliness",
            1.0,
            lambda: Check(
                "litellm", "liveliness", SKIP, "litellm.url is not set: no LiteLLM checks, no built-in load shedding"
            ),
        )
    if cfg.zulip.site:
        t = cfg.zulip.timeout_s
        yield Probe("zulip", "bot", t * 2, lambda: zulip_checks(ctx, t))


def monitor_check(cfg: Config) -> Check:
    from gpuheal.sources.monitor import fetch_monitor

    mon = cfg.monitor
    if mon is None:  # the probe is gpu-monitor's own (source_kinds/monitor.py): never asked without it
        return Check("monitor", "gpu-monitor", SKIP, "no monitor: section")
    doc, faults, warnings = fetch_monitor(cfg)
    if doc is None:
        fault = faults[0] if faults else None
        kind = fault.fault if fault else "?"
        fix = {
            "oversized": f"raise monitor.max_response_bytes ({mon.max_response_bytes}) or slim the "
            "monitor's document (Lesson L5)",
            "refused": "is gpu-monitor running at monitor.url?",
            "timeout": "gpu-monitor is too slow: check it, or raise monitor.timeout_s",
        }.get(kind, "monitor.url must serve gpu-monitor's /gpu-data JSON")
        return Check(
            "monitor",
            "gpu-monitor",
            FAIL,
            f"{mon.url}: {kind}: {printable(fault.detail if fault else '')}"
            + (f" ({printable(warnings[0])})" if warnings else ""),
            fix,
        )
    hosts = set(doc.hosts)
    missing = sorted({g.host for g in cfg.gpus} - hosts)
    if faults or missing:
        detail = "; ".join(printable(f.detail, 100) for f in faults)
        if missing:  # Rule 7 for those GPUs, read through the fallback (issue 27 defect 1)
            lacks = f"no reading for host {', '.join(missing)}" if hosts else "it lists no GPUs"
            detail = (detail + "; " if detail else "") + lacks
        return Check("monitor", "gpu-monitor", WARN, detail, "gpus[].host must be the hostname gpu-monitor reports")
    return Check("monitor", "gpu-monitor", OK, f"valid document, {len(hosts)} host{'s' if len(hosts) != 1 else ''}")


def health_check(g: GpuConfig, deadline: float) -> Check:
    from gpuheal.sources.sense import probe_health

    state, _latency, detail = probe_health(g.endpoint, deadline)
    if state == "ok":
        return Check(g.alias, "llama-server /health", OK, f"{g.endpoint} ready")
    if state == "loading":
        return Check(
            g.alias,
            "llama-server /health",
            WARN,
            f"{g.endpoint} is loading its model",
            "run doctor again when it has loaded",
        )
    return Check(
        g.alias,
        "llama-server /health",
        FAIL,
        f"{g.endpoint}: {state}: {printable(detail)}",
        "is llama-server running there (gpus[].endpoint)?",
    )


def props_check(cfg: Config, g: GpuConfig, deadline: float) -> Check:
    from gpuheal.sources.llama_server import read_props

    props = read_props(g.endpoint, cfg.litellm.api_key, deadline)
    name = "llama-server /props"
    if props.ok:
        parts = [
            f"model {printable(props.model or '?', 60)}",
            f"ctx {props.n_ctx or '?'}",
            f"slots {props.total_slots or '?'}",
        ]
        if g.n_ctx and props.n_ctx and props.n_ctx != g.n_ctx:
            return Check(
                g.alias,
                name,
                WARN,
                ", ".join(parts) + f"; config says n_ctx {g.n_ctx}",
                "update gpus[].n_ctx to what the server runs (Lesson L3)",
            )
        return Check(g.alias, name, OK, ", ".join(parts) + "; api key accepted")
    if props.status in (401, 403):
        return Check(
            g.alias,
            name,
            FAIL,
            f"the api key is rejected (HTTP {props.status}, Lesson L1)",
            "start llama-server with --api-key equal to litellm.api_key",
        )
    return Check(g.alias, name, FAIL, f"{props.error or '?'}: {printable(props.detail)}", "check the llama-server")


def metrics_check(cfg: Config, g: GpuConfig, deadline: float) -> Check:
    from gpuheal.core.coverage import without_metrics
    from gpuheal.parse.llama_metrics import HOW_TO_ENABLE
    from gpuheal.sources.http import HttpFault, request
    from gpuheal.sources.llama_server import auth_headers

    name = "llama-server /metrics"
    res = request(
        "GET",
        g.endpoint.rstrip("/") + "/metrics",
        deadline_s=deadline,
        max_bytes=4 << 20,
        headers=auth_headers(cfg.litellm.api_key),
    )
    if isinstance(res, HttpFault):
        return Check(g.alias, name, FAIL, f"{res.kind}: {printable(res.detail)}", "check the llama-server")
    if res.status == 200 and b"llamacpp:" in res.body:
        return Check(g.alias, name, OK, "enabled")
    if res.status == 501:  # what is lost depends on gpu-monitor being there (issue 11: it was always named)
        why = without_metrics(_has_failure_ratio(cfg))
        return Check(g.alias, name, WARN, f"not enabled (HTTP 501){why}", HOW_TO_ENABLE["metrics"])
    if res.status in (401, 403):
        return Check(
            g.alias,
            name,
            FAIL,
            f"the api key is rejected (HTTP {res.status})",
            "start llama-server with --api-key equal to litellm.api_key",
        )
    return Check(g.alias, name, WARN, f"HTTP {res.status}, no llamacpp: series", HOW_TO_ENABLE["metrics"])


def litellm_checks(ctx: Context, t: float) -> list[Check]:
    """Liveliness; then, where built-in load shedding is configured, the admin key, each
    ``litellm_model_id`` and whether LiteLLM can change it — else which command to configure."""
    from gpuheal.sources import litellm_admin as la

    cfg = ctx.cfg
    url = str(cfg.litellm.url)
    problem = la.liveliness(url, t)
    rows = [
        Check(
            "litellm",
            "liveliness",
            FAIL if problem else OK,
            problem.detail if problem else f"{url} alive",
            problem.fix if problem else "",
        )
    ]
    if problem is None:
        rows += litellm_requests_checks(cfg, t)
        rows += spend_logs_checks(cfg, admin_key(ctx), t)
    builtin = [g for g in cfg.gpus if g.litellm_model_id and not g.command("shed_load_command")]
    rows += [shedding_by_command(g) for g in cfg.gpus if g.command("shed_load_command")]
    rows += [
        Check(
            g.alias,
            "load shedding",
            WARN,
            "no load shedding configured: Rules 1 and 8 can only escalate",
            "set gpus[].litellm_model_id (LiteLLM), shed_load_command, or heal.shed_power_ratio (the power cap)",
        )
        for g in cfg.gpus
        if not g.litellm_model_id and not g.command("shed_load_command") and cfg.heal.shed_power_ratio is None
    ]
    if not builtin:
        return rows
    if problem is not None:
        return rows + [Check(g.alias, "load shedding", FAIL, "LiteLLM is not reachable", problem.fix) for g in builtin]
    key = admin_key(ctx)
    deps = la.read_deployments(url, key, t)
    if isinstance(deps, la.AdminProblem):
        rows.append(Check("litellm", "admin key accepted", FAIL, deps.detail, deps.fix))
        return rows + [
            Check(g.alias, "load shedding", FAIL, "cannot read LiteLLM's deployments", deps.fix) for g in builtin
        ]
    rows.append(Check("litellm", "admin key accepted", OK, f"/v1/model/info lists {len(deps)} deployments"))
    db = la.database_state(url, t)
    ratio = cfg.heal.shed_rpm_ratio
    for g in builtin:
        rows.append(shedding_check(g, deps, db, ratio))
    return rows


def litellm_requests_checks(cfg: Config, t: float) -> list[Check]:
    """Issue 20: which GPUs have LiteLLM's per-deployment failure counts (Rule 3 with no gpu-monitor),
    and how to turn the ``prometheus`` callback on where they are missing."""
    from gpuheal.model import DataFault
    from gpuheal.parse.litellm_metrics import HOW_TO_ENABLE
    from gpuheal.sources.litellm_metrics import fetch_requests

    if not cfg.litellm.read_metrics:
        if _has_failure_ratio(cfg):  # the GPU source counts them (gpu-monitor)
            return []
        return [Check("litellm", "request counts", WARN, "litellm.read_metrics is off: without gpu-monitor Rule 3 "
                      "sees no request failures, only a hung llama-server", HOW_TO_ENABLE)]
    got = fetch_requests(str(cfg.litellm.url), cfg.litellm.api_key or None, t)
    if isinstance(got, DataFault):
        return [Check("litellm", "request counts", FAIL, printable(got.detail, 160), HOW_TO_ENABLE)]
    rows = []
    for g in cfg.gpus:
        found = got.for_gpu(g.alias, g.endpoint)
        rows.append(Check(g.alias, "request counts", OK, f"LiteLLM deployment {found.model_id!r}: "
                          f"{found.total:g} requests, {found.failures:g} failed") if found is not None else
                    Check(g.alias, "request counts", WARN, "no LiteLLM deployment counted for it yet (model_info.id = "
                          "the alias, or api_base = its endpoint)", "send it a request through LiteLLM"))
    return rows


def spend_logs_checks(cfg: Config, key: str | None, t: float) -> list[Check]:
    """Issue 22 item 6: whether Rule 10 can read LiteLLM's spend logs (they need its database), and what
    it reads instead; asked only when spend logs are on or a GPU's role names request kinds. ``t``: the
    probe's deadline (s)."""
    from gpuheal.core.routing import Criterion, criteria
    from gpuheal.model import DataFault
    from gpuheal.signals import Signal
    from gpuheal.source_kinds import configured
    from gpuheal.sources.litellm_spend import NO_DATABASE, NO_DATABASE_HINT, fetch_spend

    roles = [g for g in cfg.gpus if g.role_kinds is not None and g.role_kinds.judged]
    if not cfg.litellm.read_spend_logs and not roles:
        return []
    source = configured(cfg).spec  # the GPU source's own request counts (gpu-monitor's), if it has them
    instead = ("LiteLLM's counters" if cfg.litellm.read_metrics else source.label
               if Signal.REQUEST_SHARE in source.provides else "nothing: Rule 10 is not judged")
    now_s = time.time()  # the last minute's rows: enough to see that the route answers
    got = fetch_spend(str(cfg.litellm.url), key, now_s - 60.0, now_s, deadline_s=t,
                      max_rows=cfg.litellm.spend_logs_max_rows) if cfg.litellm.read_spend_logs else None
    if got is None:
        row = Check("litellm", "spend logs", WARN, f"litellm.read_spend_logs is off: Rule 10 reads {instead}",
                    "set litellm.read_spend_logs: true (needs LiteLLM's database)")
    elif isinstance(got, DataFault) and got.fault == NO_DATABASE:
        row = Check("litellm", "spend logs", WARN, f"{NO_DATABASE_HINT}; using {instead}",
                    "connect LiteLLM to a database (DATABASE_URL) to judge request tags and prompt sizes")
    elif isinstance(got, DataFault):
        row = Check("litellm", "spend logs", FAIL, printable(got.detail, 160), "check the admin key and LiteLLM's logs")
    else:
        row = Check("litellm", "spend logs", OK, f"GET /spend/logs/v2: {len(got.rows)} requests in the last minute")
    rows = [row]
    if row.status != OK:  # what the fallback cannot judge, said once per GPU
        counters = cfg.litellm.read_metrics
        for g in roles:
            lost = [c.value for c in criteria(g.role_kinds) if not (counters and c is Criterion.MODEL_GROUP)]
            if lost:
                kept = "model group and weight" if counters else "weight"
                rows.append(Check(g.alias, "role", WARN, f"its role's {' and '.join(lost)} are not known without "
                                  f"spend logs: judged on {kept} only", row.fix))
    return rows


def shedding_by_command(g: GpuConfig) -> Check:
    return Check(g.alias, "load shedding", OK, "shed_load_command configured (its program is checked below)")


def shedding_check(g: GpuConfig, deps: tuple[Deployment, ...], db: str | None, ratio: float) -> Check:
    from gpuheal.sources import litellm_admin as la

    found = la.find(deps, g.litellm_model_id or "")  # asked only for a GPU that names one
    if isinstance(found, la.AdminProblem):
        return Check(g.alias, "load shedding", FAIL, found.detail, found.fix)
    plan = la.target_value(found, "shed-load", ratio)
    if isinstance(plan, la.AdminProblem):
        return Check(g.alias, "load shedding", FAIL, plan.detail, plan.fix)
    field, value = plan
    if db is not None and db.lower() != "connected":
        return Check(
            g.alias,
            "load shedding",
            FAIL,
            f"LiteLLM's database is {db!r}: it cannot store a change",
            "load shedding needs a database with STORE_MODEL_IN_DB=True, " + la.SHED_HINT,
        )
    before = found.value(field)
    if not before:
        return Check(
            g.alias, "load shedding", WARN,
            f"LiteLLM {found.model_id} has {field} {la.num_text(before)} in group {found.group!r}: "
            "it gets no share now",
            "give the deployment its normal share, or load shedding has nothing to lower",
        )
    return Check(
        g.alias,
        "load shedding",
        OK,
        f"LiteLLM {found.model_id} (group {found.group!r}, db_model true) can be shed by {field} "
        f"{la.num_text(before)} -> {la.num_text(value)}; heal reads each change back",
    )


def zulip_checks(ctx: Context, t: float) -> list[Check]:
    """``GET /api/v1/users/me`` (the bot's credentials) and ``GET /api/v1/get_stream_id``."""
    from urllib.parse import quote

    from gpuheal.errors import GpuhealError
    from gpuheal.sources.http import HttpFault, request
    from gpuheal.zulip import load_credentials

    cfg = ctx.cfg
    try:
        creds = load_credentials(cfg, ctx.environ)
    except GpuhealError:
        return [Check("zulip", "bot", SKIP, "no credentials (see the credentials check)")]
    site = (cfg.zulip.site or "").rstrip("/")  # asked only when zulip.site is set (http_probes)
    headers = creds.auth_headers()

    def get(path: str) -> tuple[tuple[int, dict[str, Any]] | None, str]:
        res = request("GET", site + path, deadline_s=t, max_bytes=1 << 20, headers=headers)
        if isinstance(res, HttpFault):
            return None, f"{res.kind}: {printable(res.detail)}"
        try:
            doc = json.loads(res.body)
        except ValueError:
            return None, f"HTTP {res.status}, not JSON"
        return (res.status, doc if isinstance(doc, dict) else {}), ""

    me, err = get("/api/v1/users/me")
    if me is None:
        return [Check("zulip", "bot", FAIL, f"{site}: {err}", "zulip.site must be the Zulip server's URL")]
    if me[0] != 200 or me[1].get("result") != "success":
        return [
            Check(
                "zulip",
                "bot",
                FAIL,
                f"{site} rejects the bot's credentials (HTTP {me[0]}: {printable(me[1].get('msg', ''), 80)})",
                "check ZULIP_EMAIL / ZULIP_API_KEY (the bot's API key)",
            )
        ]
    rows = [Check("zulip", "bot", OK, f"credentials valid for {printable(me[1].get('email') or creds.email, 80)}")]
    stream = str(cfg.zulip.stream or "")
    got, err = get("/api/v1/get_stream_id?stream=" + quote(stream, safe=""))
    if got is None:
        rows.append(Check("zulip", "stream", FAIL, f"{err}", "check the Zulip server"))
    elif got[0] == 200 and got[1].get("result") == "success":
        rows.append(Check("zulip", "stream", OK, f"#{printable(stream, 60)} exists (id {got[1].get('stream_id')})"))
    else:
        rows.append(
            Check(
                "zulip",
                "stream",
                FAIL,
                f"#{printable(stream, 60)}: {printable(got[1].get('msg', got[0]), 100)}",
                "create the stream, subscribe the bot, or fix zulip.stream",
            )
        )
    return rows


# --------------------------------------------------------------------------- network stage: transports


@register("network")
def transport_probes(ctx: Context) -> Iterable[Probe]:
    """One probe per place commands run (each SSH host, this machine): connect with host-key
    verification, then check each configured command's program, unit and sudo there."""
    from gpuheal.transport import Target, TransportPool

    cfg = ctx.cfg
    pool = ctx.extras.get("pool")
    if pool is None:
        pool = ctx.extras["pool"] = TransportPool.from_config(cfg.heal)
    places: dict[Target, list[tuple[str, str, tuple[str, ...], dict[str, str]]]] = {}
    for g in cfg.gpus:
        where = Target.for_gpu(g, cfg.heal)
        values = {"alias": g.alias, "host": g.host, "endpoint": g.endpoint}
        for key, argv in sorted(g.commands.items()):
            places.setdefault(where, []).append((g.alias, key, argv, values))
        if not g.commands:
            places.setdefault(where, [])
    if cfg.litellm.restart_command:
        host = cfg.litellm.host if cfg.litellm.transport == "ssh" and cfg.litellm.host else None
        where = Target("ssh", host, 22, cfg.heal.ssh_user) if host else Target("local")
        places.setdefault(where, []).append(
            (
                "litellm",
                "litellm.restart_command",
                tuple(cfg.litellm.restart_command),
                {"alias": "litellm", "host": host or "", "endpoint": str(cfg.litellm.url)},
            )
        )
    mon = cfg.heal.gpu_monitor_restart_command
    from gpuheal.source_kinds import configured

    restartable = configured(cfg).spec.restartable  # Rule 7 restarts it (gpu-monitor)
    if mon and restartable and cfg.heal.gpu_monitor_transport == "local":
        import shlex

        argv = tuple(shlex.split(mon) if isinstance(mon, str) else mon)
        places.setdefault(Target("local"), []).append(
            ("monitor", "heal.gpu_monitor_restart_command", argv, {"alias": "monitor", "host": "", "endpoint": ""})
        )
    connect_s = cfg.heal.ssh_connect_timeout_s
    for where, commands in places.items():
        aliases = sorted({a for g in cfg.gpus if Target.for_gpu(g, cfg.heal) == where for a in [g.alias]})
        label = aliases[0] if aliases else (commands[0][0] if commands else "local")
        n_checks = sum(2 + ("sudo" in argv[:1]) for *_x, argv, _v in commands) + 4 * len(aliases)
        deadline = (connect_s if where.kind == "ssh" else 0) + CMD_TIMEOUT_S * max(1, n_checks)
        yield Probe(
            label,
            "transport",
            deadline,
            partial(place_checks, pool, cfg, where, commands, aliases),
        )


def _known_hosts(cfg: Config) -> str:
    return str(cfg.heal.known_hosts or "~/.ssh/known_hosts")


def place_checks(
    pool: TransportPool, cfg: Config, where: Target, commands: list[Command], aliases: list[str]
) -> list[Check]:
    from gpuheal.transport import HOST_KEY_CHANGED, HOST_KEY_UNKNOWN, SshTransport

    transport = pool.get(where)
    rows: list[Check] = []
    targets = aliases or sorted({a for a, *_x in commands})
    if where.kind == "ssh" and isinstance(transport, SshTransport):
        failure = transport.connect()
        if failure is not None:
            error, detail = failure
            fix = {
                HOST_KEY_UNKNOWN: f"ssh-keyscan -p {where.port} {where.host} >> {_known_hosts(cfg)} "
                "(compare the fingerprint with the host's own first)",
                HOST_KEY_CHANGED: "verify the host, then replace its entry in " + _known_hosts(cfg),
            }.get(error, "check the host, the SSH user/key (heal.ssh_user, heal.ssh_key) and the network")
            rows += [Check(a, "ssh", FAIL, f"{error}: {printable(detail, 200)}", fix) for a in targets]
            return rows + [Check(a, key, SKIP, "not checked: no SSH connection") for a, key, *_x in commands]
        rows += [
            Check(a, "ssh", OK, f"{where.user or ''}@{where.host}:{where.port} host key verified".lstrip("@"))
            for a in targets
        ]
    checked_sudo = False
    for alias, key, template, values in commands:
        rows += command_checks(transport, alias, key, template, values, checked_sudo)
        checked_sudo = checked_sudo or "sudo" in template[:1]
    from gpuheal.doctor.power import config_redirect_checks, kfd_checks, power_cap_checks

    if any(key == "litellm.restart_command" for _, key, *_x in commands):  # where LiteLLM runs
        rows += config_redirect_checks(transport, cfg, CMD_TIMEOUT_S)

    for alias in aliases:  # the power cap and AMD's per-GPU processes, proven read-only (issue 27 items 7, 12)
        rows += power_cap_checks(transport, cfg, alias, CMD_TIMEOUT_S) + kfd_checks(transport, cfg, alias,
                                                                                      CMD_TIMEOUT_S)
    return rows


def _program(argv: list[str]) -> tuple[bool, list[str]]:
    """(uses sudo, the argv sudo runs): ``sudo -n -u x prog ...`` -> (True, [prog, ...])."""
    if not argv or os.path.basename(argv[0]) != "sudo":
        return False, argv
    rest = argv[1:]
    while rest and rest[0].startswith("-"):
        flag = rest.pop(0)
        if flag in ("-u", "-g", "-C", "-h", "-p", "-U") and rest:
            rest.pop(0)
    return True, rest


def command_checks(
    transport: Transport, alias: str, key: str, template: Sequence[str], values: Mapping[str, str], sudo_checked: bool
) -> list[Check]:
    from gpuheal.errors import GpuhealError
    from gpuheal.transport import expand

    try:
        argv = expand(template, **values)
    except GpuhealError as exc:
        return [Check(alias, key, FAIL, printable(exc), f"fix {key}")]
    sudo, inner = _program(argv)
    rows: list[Check] = []
    if sudo and not sudo_checked:
        out = transport.run(["sudo", "-n", "true"], CMD_TIMEOUT_S)
        rows.append(
            Check(
                alias,
                "sudo -n",
                OK if out.ok else FAIL,
                "sudo works without a password"
                if out.ok
                else f"sudo -n true: {printable(out.stderr or out.describe())}",
                "" if out.ok else "allow the command in sudoers with NOPASSWD for the gpuheal user",
            )
        )
    if not inner:
        return rows + [Check(alias, key, FAIL, "no program after sudo", f"fix {key}")]
    prog = inner[0]
    found = transport.run(["sh", "-c", 'command -v -- "$1"', "sh", prog], CMD_TIMEOUT_S)
    if not found.ok:
        why = "not found" if found.rc == 1 or (found.rc and not found.error) else printable(found.describe())
        return rows + [Check(alias, key, FAIL, f"{prog}: {why}", f"install {prog} there, or fix {key}")]
    where = printable(found.stdout.strip() or prog, 80)
    if os.path.basename(prog) == "systemctl":
        args = [a for a in inner[1:] if not a.startswith("-")]
        if len(args) >= 2 and args[0] in SERVICE_VERBS:
            unit = args[1]
            cat = transport.run(["systemctl", "cat", "--", unit], CMD_TIMEOUT_S)
            if not cat.ok:
                return rows + [
                    Check(
                        alias,
                        key,
                        FAIL,
                        f"systemctl cat {unit}: {printable(cat.stderr or cat.describe())}",
                        f"install the unit {unit}, or fix {key}",
                    )
                ]
            rows.append(Check(alias, key, OK, f"{where}; unit {unit} exists"))
            if key == "restart_command" and args[0] in RESTART_VERBS:
                rows.append(stop_timeout_check(transport, alias, unit))
            return rows
    return rows + [Check(alias, key, OK, f"{where} found")]


def stop_timeout_check(transport: Transport, alias: str, unit: str) -> Check:
    """A frozen llama-server (SIGSTOP, or its task loop hung) ignores SIGTERM: ``systemctl restart``
    then waits the unit's ``TimeoutStopSec`` before SIGKILL (issues 20, 28). A restart that sends
    SIGKILL first (``RestartKillSignal=SIGKILL``, systemd >= 244) waits nothing; otherwise past
    ``STOP_TIMEOUT_WARN_S`` the restart alone breaks the 90 s MTTR target with a 60 s cron."""
    from gpuheal.parse.systemd import show_int, timeout_stop_s

    argv = ["systemctl", "show", "-p", "TimeoutStopUSec", "-p", "RestartKillSignal", "-p", "KillSignal", "--", unit]
    out = transport.run(argv, CMD_TIMEOUT_S)
    stop_s = timeout_stop_s(out.stdout) if out.ok else None
    restart_signal = show_int(out.stdout, "RestartKillSignal") if out.ok else None
    old_systemd = out.ok and "RestartKillSignal=" not in out.stdout  # < 244: a restart sends KillSignal
    first_signal = show_int(out.stdout, "KillSignal") if old_systemd else restart_signal
    if first_signal == SIGKILL:
        return Check(alias, "stop timeout", OK, f"{unit}: a restart sends SIGKILL first "
                     f"({'KillSignal' if old_systemd else 'RestartKillSignal'}=9): a frozen llama-server costs "
                     "no stop timeout")
    fix = stop_timeout_fix(unit, old_systemd=old_systemd)
    if stop_s is None:
        said = out.stdout or out.stderr or out.describe() if out.ok else out.stderr or out.describe()
        why = printable(said, 80 if out.ok else 160)
        return Check(alias, "stop timeout", WARN, f"systemctl show -p TimeoutStopUSec {unit}: not known ({why})", fix)
    shown = "infinity" if stop_s == float("inf") else f"{stop_s:g} s"
    if stop_s > STOP_TIMEOUT_WARN_S:
        return Check(alias, "stop timeout", WARN, f"{unit}: TimeoutStopSec {shown} (> {STOP_TIMEOUT_WARN_S:g} s): "
                     "a frozen llama-server ignores SIGTERM, so its restart waits this long before SIGKILL "
                     "(MTTR target 90 s)", fix)
    return Check(alias, "stop timeout", OK, f"{unit}: TimeoutStopSec {shown}")


def stop_timeout_fix(unit: str, *, old_systemd: bool) -> str:
    """The drop-in that makes a frozen server's restart cost no stop timeout (README: install).
    ``RestartKillSignal=`` is systemd >= 244; an older one (it does not show the property) gets the
    short stop timeout alone."""
    if old_systemd:
        return f"systemctl edit {unit}: [Service] TimeoutStopSec=5 (README: install)"
    return f"systemctl edit {unit}: [Service] RestartKillSignal=SIGKILL and TimeoutStopSec=10 (README: install)"


# --------------------------------------------------------------------------- Rule 4's baseline seed

BASELINE_DIFF_RATIO = 0.10  # issue 27 item 14: configured and gpu-monitor baselines more than 10 % apart warn


@register("network")
def baseline_probes(ctx: Context) -> Iterable[Probe]:
    """Rule 4's seed (issue 27 item 14): each GPU's configured ``baseline_tok_s`` against the one
    gpu-monitor gives in its ``benchmarks`` entry; only where gpu-monitor is the configured source."""
    mon = ctx.cfg.monitor
    if mon is not None and mon.url:
        yield Probe("monitor", "baselines", float(mon.timeout_s), lambda: baseline_checks(ctx.cfg))


def baseline_checks(cfg: Config) -> list[Check]:
    """Fetch gpu-monitor once and compare every GPU's baselines (:func:`baseline_rows`). A monitor
    that does not answer is the ``gpu-monitor`` row's failure; nothing is compared then."""
    from gpuheal.sources.monitor import fetch_monitor

    doc, _faults, _warnings = fetch_monitor(cfg)
    if doc is None:
        return [Check("monitor", "baselines", SKIP, "gpu-monitor gave no document: baselines not compared")]
    return baseline_rows(cfg, doc.bench_baselines)


def baseline_rows(cfg: Config, monitor: dict[str, float | None]) -> list[Check]:
    """One ``baseline`` row per GPU from ``monitor`` (gpu-monitor's baseline by host; ``None``: absent
    or bad, not known). A host that several configured GPUs share has one benchmark entry for no one
    GPU: not compared (as ``check`` reads it)."""
    from collections import Counter

    shared = {h for h, n in Counter(g.host for g in cfg.gpus).items() if n > 1}
    return [
        Check(g.alias, "baseline", *baseline_verdict(g.alias, g.baseline_tok_s, None if g.host in shared else
                                                     monitor.get(g.host)))
        for g in cfg.gpus
    ]


def baseline_verdict(alias: str, mine: float | None, theirs: float | None) -> tuple[str, str, str]:
    """(status, detail, fix) for one GPU's configured and gpu-monitor baselines. The configured one
    wins when both are there (``benchdata.seed``), so a difference over :data:`BASELINE_DIFF_RATIO`
    means Rule 4 judges against a figure gpu-monitor disagrees with."""
    within = f"{BASELINE_DIFF_RATIO * 100:g} %"
    if mine is None and theirs is None:
        return SKIP, ("no baseline_tok_s configured nor from gpu-monitor: Rule 4 judges once a week of "
                      "`gpuheal bench` results makes the rolling 30-day baseline"), ""
    if mine is None:
        return OK, f"gpu-monitor's {theirs:g} tok/s seeds Rule 4 (none configured)", ""
    if theirs is None:
        return OK, f"configured {mine:g} tok/s (gpu-monitor gives none)", ""
    if abs(theirs - mine) <= BASELINE_DIFF_RATIO * mine:
        return OK, f"configured {mine:g} tok/s, gpu-monitor {theirs:g} (within {within})", ""
    return (
        WARN,
        f"configured baseline_tok_s {mine:g} and gpu-monitor's {theirs:g} differ by "
        f"{(theirs - mine) / mine * 100:+.1f} % (over {within}); Rule 4 uses the configured one",
        f"set gpus[].baseline_tok_s of {alias} to its current figure, or remove it to seed from gpu-monitor; "
        "if gpu-monitor's is the stale one, fix its baseline",
    )
