"""Built-in load-side cooling through LiteLLM's admin API (Rules 1 and 8; Design Decision 1: load,
never fans; contract: "LiteLLM load-side cooling").

What the real proxy (``litellm[proxy]`` 1.108.7, pinned by ``scripts/install-litellm.sh`` and
exercised by ``tests/reallitellm``) does, and therefore what this module does:

* ``GET {url}/v1/model/info`` (admin key) lists every deployment: ``model_name`` (the group),
  ``litellm_params`` (``weight``, ``rpm``, ...) and ``model_info`` (``id``, ``db_model``). A
  deployment from ``config.yaml`` carries ``db_model: false`` and cannot be edited.
* The default router (``simple-shuffle``) picks within a group by ``weight`` when any deployment
  has one, else by ``rpm``, else ``tpm``, else at random. So a weighted group is shed by lowering
  ``weight``; changing ``rpm`` there changes nothing. A group of one deployment has nowhere to
  send the load; a group without weights or rpm cannot be shed by editing one deployment.
* ``POST {url}/model/update`` ``{"model_info": {"id": ID}, "litellm_params": {FIELD: VALUE}}``
  answers 500 ``No DB Connected`` without a database, 400 ``Model in config`` for a config-file
  deployment, **200 with the body ``null``** when the proxy has a database but
  ``STORE_MODEL_IN_DB`` is off (nothing stored), and 400 ``No connected db.`` for a key that is
  not the master key on a proxy without a database.

An update therefore counts only when a read-back shows it (:func:`apply_update`). Every failure is
a :class:`AdminProblem`: a stable ``reason`` code, one line saying what happened and one saying
how to fix it; nothing here raises for what the network or the proxy does. The admin key is sent
in the ``Authorization`` header only and never appears in a detail.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gpuheal.parse.values import Bad, check_number, clean_text, printable, shown, sub_object
from gpuheal.sources.http import HttpFault, HttpResult, request

#: ``/v1/model/info`` is ~8 KB per deployment on 1.108.7 (every pricing key, mostly null): 8 MiB
#: holds a thousand deployments and still refuses a runaway body.
MAX_BYTES = 8 * 1024 * 1024
FIELDS = ("weight", "rpm")
SHED_HINT = "or configure a shed_load_command / redirect_command for the GPU"


@dataclass(frozen=True)
class AdminProblem:
    """Why the built-in path cannot work. ``reason``: no-admin-key | auth | no-db | config-model |
    not-stored | not-applied | missing-id | single-deployment | unrouted | timeout | refused |
    oversized | not-json | bad-answer | http-NNN."""

    reason: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.detail}: {self.fix}" if self.fix else self.detail


@dataclass(frozen=True)
class Deployment:
    """One deployment as ``/v1/model/info`` shows it, with what its group routes by."""

    model_id: str
    group: str
    db_model: bool | None
    weight: float | None
    rpm: float | None
    group_size: int
    group_routes_by: str | None  # "weight" | "rpm" | "tpm" | None (random)

    @property
    def field(self) -> str | None:
        """The ``litellm_params`` key that moves this deployment's share of the group's load."""
        return self.group_routes_by if self.group_routes_by in FIELDS else None

    def value(self, field: str) -> float | None:
        return self.weight if field == "weight" else self.rpm


@dataclass(frozen=True)
class UpdateResult:
    """An update and its read-back. ``ok`` only when the read-back shows ``value``."""

    model_id: str
    field: str
    value: float
    before: float | None = None
    after: float | None = None
    problem: AdminProblem | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        if self.problem is not None:
            return self.problem.line()
        return f"LiteLLM {self.model_id}: {self.field} {num_text(self.before)} -> {num_text(self.after)} (read back)"


def num_text(v: float | None) -> str:
    """A LiteLLM routing value as a person reads it (``unset``, ``300``, ``0.5``): one spelling for
    the read-back, the dry-run preview and doctor."""
    if v is None:
        return "unset"
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


# --------------------------------------------------------------------------- answers


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def _message(payload: object) -> str:
    """The human message of a LiteLLM/FastAPI error body: ``{"error": {"message": ...}}``,
    ``{"detail": {"error": ...}}``, ``{"detail": "..."}``."""
    if not isinstance(payload, dict):
        return ""
    err = payload.get("error")
    if isinstance(err, dict):
        return _text(err.get("message") or err.get("type") or "")
    detail = payload.get("detail")
    if isinstance(detail, dict):
        return _text(detail.get("error") or detail)
    if detail is not None:
        return _text(detail)
    return _text(err or "")


def _text(value: object) -> str:
    """A string as sent, else a short description — never ``str()`` of a nested value (deep
    nesting raises RecursionError) or of a huge number."""
    return clean_text(value[:2000]) if isinstance(value, str) else shown(value)


def _fault(fault: HttpFault, what: str, deadline_s: float) -> AdminProblem:
    if fault.kind == "timeout":
        return AdminProblem(
            "timeout",
            f"LiteLLM did not answer {what} within {deadline_s:g} s",
            "check the proxy (litellm.url) or raise litellm.timeout_s",
        )
    if fault.kind == "refused":
        return AdminProblem(
            "refused",
            f"LiteLLM refused {what} ({printable(fault.detail, 80)})",
            "is the proxy running at litellm.url?",
        )
    if fault.kind == "oversized":
        return AdminProblem(
            "oversized",
            f"LiteLLM's answer to {what} is larger than {MAX_BYTES >> 20} MiB",
            "litellm.url must point at the LiteLLM proxy",
        )
    return AdminProblem("bad-answer", f"LiteLLM {what}: {printable(fault.detail, 120)}", "check litellm.url")


def _decode(result: HttpResult, what: str) -> tuple[object, AdminProblem | None]:
    text = result.body.decode("utf-8", "replace").strip()
    try:
        return json.loads(text), None
    except (ValueError, RecursionError):
        kind = (
            "HTML"
            if text[:200].lower().lstrip().startswith(("<!doctype", "<html")) or "<html" in text[:500].lower()
            else "not JSON"
        )
        return None, AdminProblem(
            "not-json",
            f"LiteLLM answered {what} with HTTP {result.status} {kind} ({printable(text, 60)!r})",
            "litellm.url must be the proxy's base URL (its API, not a web page or another service)",
        )


def _error(result: HttpResult, payload: object, what: str) -> AdminProblem:
    """A non-2xx answer, classified by what the real proxy sends for each case."""
    msg = _message(payload)
    low = msg.lower()
    status = result.status
    if status in (401, 403) or (isinstance(payload, dict) and _err_type(payload) == "no_db_connection"):
        # 1.108.7 without a database answers a key that is not the master key with 400
        # {"error": {"message": "No connected db.", "type": "no_db_connection"}}
        return AdminProblem(
            "auth",
            f"LiteLLM rejected the admin key for {what} (HTTP {status}: {printable(msg, 60)})",
            "set the variable litellm.admin_key_env names (default LITELLM_MASTER_KEY) to the proxy's master_key",
        )
    if "no db connected" in low:
        return AdminProblem(
            "no-db",
            "LiteLLM has no database (500 No DB Connected), so it cannot change a deployment",
            "load shedding needs a database with STORE_MODEL_IN_DB=True, " + SHED_HINT,
        )
    if "model in config" in low:
        return AdminProblem(
            "config-model",
            "LiteLLM keeps this deployment in config.yaml and refuses to edit it (400 Model in config)",
            "load shedding needs STORE_MODEL_IN_DB with a database (add the model via /model/new), " + SHED_HINT,
        )
    if "not found" in low:
        return AdminProblem(
            "missing-id",
            f"LiteLLM has no deployment for {what} ({printable(msg, 80)})",
            "set gpus[].litellm_model_id to the deployment's model_info.id (GET /v1/model/info)",
        )
    return AdminProblem(
        f"http-{status:03d}",
        f"LiteLLM answered {what} with HTTP {status}: {printable(msg, 100)}",
        "check the proxy's log",
    )


def _err_type(payload: dict[str, Any]) -> str:
    err = payload.get("error")
    return str(err.get("type")) if isinstance(err, dict) else ""


# --------------------------------------------------------------------------- reading


def liveliness(base_url: str, deadline_s: float) -> AdminProblem | None:
    """``GET {url}/health/liveliness`` answers 200 ``"I'm alive!"`` on a live proxy (no key)."""
    result = request("GET", base_url.rstrip("/") + "/health/liveliness", deadline_s=deadline_s, max_bytes=64 * 1024)
    if isinstance(result, HttpFault):
        return _fault(result, "/health/liveliness", deadline_s)
    payload, bad = _decode(result, "/health/liveliness")
    if bad is not None:
        return bad
    if result.status != 200 or not (isinstance(payload, str) and "alive" in payload.lower()):
        return AdminProblem(
            f"http-{result.status:03d}",
            f"LiteLLM /health/liveliness answered HTTP {result.status} {printable(_text(payload), 60)}",
            "check the proxy (litellm.url)",
        )
    return None


def database_state(base_url: str, deadline_s: float) -> str | None:
    """``GET {url}/health/readiness`` ``db``: "connected", "Not connected", ... (None: unknown)."""
    result = request("GET", base_url.rstrip("/") + "/health/readiness", deadline_s=deadline_s, max_bytes=256 * 1024)
    if isinstance(result, HttpFault) or result.status != 200:
        return None
    try:
        payload = json.loads(result.body)
    except (ValueError, RecursionError):
        return None
    db = payload.get("db") if isinstance(payload, dict) else None
    return printable(db, 40) if isinstance(db, str) else None


def _number(v: object) -> float | None:
    """A finite, non-negative JSON number (the strict reader: a string, a bool or a 400-digit int
    — ``math.isfinite`` would raise OverflowError on it — is not known)."""
    read = check_number(v, lo=0, hi=1e15)
    return None if read is None or isinstance(read, Bad) else float(read)


def parse_deployments(payload: object) -> tuple[Deployment, ...] | AdminProblem:
    """Pure: ``/v1/model/info``'s ``data`` list -> deployments with their group's routing field.

    Entries that are not objects or lack an id are skipped (a damaged entry must not hide ours).
    """
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        return AdminProblem(
            "bad-answer", "LiteLLM /v1/model/info has no 'data' list", "litellm.url must point at the LiteLLM proxy"
        )
    rows: list[tuple[str, str, bool | None, float | None, float | None, float | None]] = []
    for entry in data:
        if not isinstance(entry, dict):
            continue
        info = sub_object(entry, "model_info")
        params = sub_object(entry, "litellm_params")
        model_id, group = info.get("id"), entry.get("model_name")
        if not isinstance(model_id, str) or not model_id or not isinstance(group, str):
            continue
        db = info.get("db_model")
        rows.append(
            (
                model_id,
                group,
                db if isinstance(db, bool) else None,
                _number(params.get("weight")),
                _number(params.get("rpm")),
                _number(params.get("tpm")),
            )
        )
    routes: dict[str, str | None] = {}
    sizes: dict[str, int] = {}
    for _mid, group, _db, weight, rpm, tpm in rows:
        sizes[group] = sizes.get(group, 0) + 1
        for name, v in (("weight", weight), ("rpm", rpm), ("tpm", tpm)):
            current = routes.get(group)
            if v and (current is None or FIELDS_ORDER[name] < FIELDS_ORDER[current]):
                routes[group] = name
        routes.setdefault(group, None)
    return tuple(
        Deployment(mid, group, db, weight, rpm, sizes[group], routes[group])
        for mid, group, db, weight, rpm, _tpm in rows
    )


FIELDS_ORDER = {"weight": 0, "rpm": 1, "tpm": 2}


def read_deployments(
    base_url: str, admin_key: str | None, deadline_s: float, only_id: str | None = None
) -> tuple[Deployment, ...] | AdminProblem:
    """Every deployment the proxy routes to (``GET /v1/model/info``); with ``only_id`` just that
    one (``?litellm_model_id=``: a read-back, no group information)."""
    if not admin_key:
        return NO_KEY
    url = base_url.rstrip("/") + "/v1/model/info"
    if only_id is not None:
        url += "?litellm_model_id=" + quote(only_id, safe="")
    result = request("GET", url, deadline_s=deadline_s, max_bytes=MAX_BYTES, headers=_auth(admin_key))
    if isinstance(result, HttpFault):
        return _fault(result, "/v1/model/info", deadline_s)
    payload, bad = _decode(result, "/v1/model/info")
    if bad is not None:
        return bad
    if result.status != 200:
        return _error(result, payload, "/v1/model/info")
    return parse_deployments(payload)


def read_model_info(base_url: str, admin_key: str | None, deadline_s: float) -> object | AdminProblem:
    """``GET {url}/v1/model/info`` (admin key): the decoded answer as sent, for readers that need
    more than :class:`Deployment` (``api_base``: :mod:`gpuheal.core.topology`). Never raises."""
    if not admin_key:
        return NO_KEY
    result = request("GET", base_url.rstrip("/") + "/v1/model/info", deadline_s=deadline_s, max_bytes=MAX_BYTES,
                     headers=_auth(admin_key))  # fmt: skip
    if isinstance(result, HttpFault):
        return _fault(result, "/v1/model/info", deadline_s)
    payload, bad = _decode(result, "/v1/model/info")
    if bad is not None:
        return bad
    if result.status != 200:
        return _error(result, payload, "/v1/model/info")
    return payload


NO_KEY = AdminProblem(
    "no-admin-key",
    "no LiteLLM admin key",
    "set the variable litellm.admin_key_env names (default LITELLM_MASTER_KEY; .env works too)",
)


def find(deployments: tuple[Deployment, ...], model_id: str) -> Deployment | AdminProblem:
    for dep in deployments:
        if dep.model_id == model_id:
            return dep
    return AdminProblem(
        "missing-id",
        f"LiteLLM has no deployment with model_info.id {model_id!r} ({len(deployments)} deployments listed)",
        "set gpus[].litellm_model_id to the deployment's model_info.id (GET /v1/model/info)",
    )


def read_deployment(
    base_url: str, admin_key: str | None, model_id: str, deadline_s: float
) -> Deployment | AdminProblem:
    found = read_deployments(base_url, admin_key, deadline_s)
    return found if isinstance(found, AdminProblem) else find(found, model_id)


# --------------------------------------------------------------------------- deciding (pure)


def editable(dep: Deployment) -> AdminProblem | None:
    """Whether changing this one deployment can move load, before anything is sent."""
    if dep.db_model is False:
        return AdminProblem(
            "config-model",
            f"LiteLLM keeps {dep.model_id} in config.yaml (db_model false)",
            "load shedding needs STORE_MODEL_IN_DB with a database, " + SHED_HINT,
        )
    if dep.group_size < 2:
        return AdminProblem(
            "single-deployment",
            f"{dep.model_id} is the only deployment of model group "
            f"{dep.group!r}: LiteLLM has nowhere else to send its requests",
            "add another deployment to the group, " + SHED_HINT,
        )
    if dep.field is None:
        return AdminProblem(
            "unrouted",
            f"model group {dep.group!r} sets no weight or rpm on any deployment "
            "(LiteLLM picks at random), so changing one deployment cannot move load",
            "give the group's deployments a weight, " + SHED_HINT,
        )
    return None


def target_value(
    dep: Deployment, action: str, shed_ratio: float, redirect_rpm: int = 1
) -> tuple[str, float] | AdminProblem:
    """(field, value) for ``shed-load`` (× ``shed_ratio``) or ``redirect-traffic`` (weight 0,
    rpm ``redirect_rpm``) on ``dep``; the problem when the built-in path cannot work."""
    problem = editable(dep)
    if problem is not None:
        return problem
    field = dep.field
    assert field is not None
    current = dep.value(field) or 0.0
    if current <= 0:  # it already gets no share (e.g. an earlier redirect): nothing to lower
        return field, 0.0
    if action == "redirect-traffic":
        return field, (0.0 if field == "weight" else float(max(0, int(redirect_rpm))))
    if field == "rpm":
        return field, float(max(1, round(current * shed_ratio)))
    return field, round(current * shed_ratio, 6)


def _same(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


# --------------------------------------------------------------------------- changing


def post_update(
    base_url: str, admin_key: str | None, model_id: str, field: str, value: float, deadline_s: float
) -> AdminProblem | None:
    """``POST /model/update``; None when LiteLLM says it stored the change (a JSON object)."""
    if not admin_key:
        return NO_KEY
    if field not in FIELDS:
        raise ValueError(f"field must be one of {FIELDS}")
    wire: float | int = int(value) if field == "rpm" else float(value)
    body = json.dumps({"model_info": {"id": model_id}, "litellm_params": {field: wire}}).encode()
    result = request(
        "POST",
        base_url.rstrip("/") + "/model/update",
        deadline_s=deadline_s,
        max_bytes=MAX_BYTES,
        headers=_auth(admin_key),
        body=body,
    )
    if isinstance(result, HttpFault):
        return _fault(result, "/model/update", deadline_s)
    payload, bad = _decode(result, "/model/update")
    if bad is not None:
        return bad
    if result.status != 200:
        return _error(result, payload, f"/model/update of {model_id}")
    if payload is None:
        return AdminProblem(
            "not-stored",
            "LiteLLM answered /model/update with 200 null: it stored nothing (STORE_MODEL_IN_DB is off)",
            "set STORE_MODEL_IN_DB=True on the proxy, " + SHED_HINT,
        )
    return None


def apply_update(
    base_url: str,
    admin_key: str | None,
    model_id: str,
    field: str,
    value: float,
    deadline_s: float,
    before: float | None = None,
) -> UpdateResult:
    """Update, then read the deployment back; done only when the read-back shows ``value``."""
    problem = post_update(base_url, admin_key, model_id, field, value, deadline_s)
    if problem is not None:
        return UpdateResult(model_id, field, value, before, problem=problem)
    listed = read_deployments(base_url, admin_key, deadline_s, only_id=model_id)
    back = listed if isinstance(listed, AdminProblem) else find(listed, model_id)
    if isinstance(back, AdminProblem):
        return UpdateResult(
            model_id,
            field,
            value,
            before,
            problem=AdminProblem(back.reason, "read-back after /model/update failed: " + back.detail, back.fix),
        )
    after = back.value(field)
    if not _same(after, value):
        return UpdateResult(
            model_id,
            field,
            value,
            before,
            after,
            AdminProblem(
                "not-applied",
                f"LiteLLM accepted /model/update but {model_id}'s {field} reads {num_text(after)}, "
                f"not {num_text(value)}",
                "the proxy did not apply the change (STORE_MODEL_IN_DB, database), " + SHED_HINT,
            ),
        )
    return UpdateResult(model_id, field, value, before, after)


def describe_update(base_url: str | None, model_id: str, field: str, value: float | None) -> str:
    """How a dry-run plan shows the call (no key). ``auto``: weight or rpm, read from LiteLLM."""
    shown = "weight|rpm (read from /v1/model/info)" if field == "auto" else f"{field}={num_text(value)}"
    return f"POST {str(base_url).rstrip('/')}/model/update id={model_id} {shown}"


# --------------------------------------------------------------------------- the executor's call

#: failures of the network, not of the setup: the next run may try again
TRANSIENT = frozenset({"timeout", "refused"})


@dataclass(frozen=True)
class AdminOutcome:
    """What one built-in load action came to, in the shape the executor reads from commands
    (``rc``, ``stdout``, ``stderr``, ``error``, ``timed_out``). ``effect``: the change the read-back
    proved (``model_id``, ``field``, ``before``, ``after``) — ``before`` is what restore puts back.
    ``impossible``: LiteLLM's setup (not the network) rules the built-in path out."""

    rc: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    timed_out: bool = False
    effect: dict[str, Any] | None = None
    impossible: bool = False


def _failed(problem: AdminProblem) -> AdminOutcome:
    transient = problem.reason in TRANSIENT
    return AdminOutcome(
        rc=None if transient else 1,
        stderr=problem.line(),
        error=problem.reason,
        timed_out=problem.reason == "timeout",
        impossible=not transient,
    )


def run_update(
    base_url: str,
    admin_key: str | None,
    action: str,
    model_id: str,
    field: str,
    value: float | None,
    *,
    shed_ratio: float,
    redirect_rpm: int,
    deadline_s: float,
) -> AdminOutcome:
    """One built-in load action. ``field == "auto"`` (shed-load, redirect-traffic): read the
    deployment, pick weight or rpm by what its group routes by, compute the value; otherwise
    (restore-load) set ``field`` to ``value``. Done only when the read-back shows it."""
    before: float | None = None
    if field == "auto":
        dep = read_deployment(base_url, admin_key, model_id, deadline_s)
        if isinstance(dep, AdminProblem):
            return _failed(dep)
        plan = target_value(dep, action, shed_ratio, redirect_rpm)
        if isinstance(plan, AdminProblem):
            return _failed(plan)
        field, value = plan
        before = dep.value(field)
        if before is not None and before <= value:
            shown = f"LiteLLM {model_id}: {field} already {num_text(before)}, nothing to lower"
            return AdminOutcome(rc=0, stdout=shown)
    if field not in FIELDS or value is None:
        return _failed(AdminProblem("bad-answer", f"nothing to set for {model_id} ({field}={value})", SHED_HINT))
    res = apply_update(base_url, admin_key, model_id, field, float(value), deadline_s, before=before)
    if not res.ok:
        assert res.problem is not None
        return _failed(res.problem)
    effect = {"model_id": model_id, "field": field, "before": res.before, "after": res.after}
    return AdminOutcome(rc=0, stdout=res.describe(), effect=effect)


# --------------------------------------------------------------------------- a deployment's health


@dataclass(frozen=True)
class ModelHealth:
    """LiteLLM's view of one deployment (Rule 6's verify: "LiteLLM reports model healthy").
    ``verdict``: healthy | unhealthy | not known; ``detail``: what LiteLLM said, or why not known."""

    verdict: str
    detail: str = ""


def _same_base(api_base: object, endpoint: str) -> bool:
    """Whether a ``/health`` entry's ``api_base`` (``http://h:p/v1``) is the GPU's endpoint."""
    from urllib.parse import urlsplit

    if not isinstance(api_base, str):
        return False
    try:
        a, b = urlsplit(api_base), urlsplit(endpoint)
        return (a.hostname, a.port or 80) == (b.hostname, b.port or 80)
    except ValueError:  # a port that is not a number
        return False


def _health_entries(payload: object, key: str) -> list[dict[str, Any]]:
    rows = payload.get(key) if isinstance(payload, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def read_model_health(payload: object, model_id: str, endpoint: str) -> ModelHealth:
    """Pure: the deployment's verdict in a ``GET /health`` answer. 1.108.7 answers
    ``{"healthy_endpoints": [...], "unhealthy_endpoints": [...], ...}``; an entry carries
    ``model_id`` (when asked by id) and ``api_base``, an unhealthy one an ``error``."""
    for key, verdict in (("unhealthy_endpoints", "unhealthy"), ("healthy_endpoints", "healthy")):
        for row in _health_entries(payload, key):
            if row.get("model_id") == model_id or _same_base(row.get("api_base"), endpoint):
                said = printable(_text(row.get("error") or ""), 160) if verdict == "unhealthy" else ""
                return ModelHealth(verdict, said)
    if not isinstance(payload, dict):
        return ModelHealth("not known", f"LiteLLM /health answered {type(payload).__name__}, not an object")
    return ModelHealth("not known", f"LiteLLM /health does not list deployment {printable(model_id, 60)!r}")


def model_health(base_url: str, admin_key: str | None, model_id: str, endpoint: str, deadline_s: float) -> ModelHealth:
    """``GET {url}/health?model_id=ID`` (admin key): LiteLLM makes one call through that deployment
    and files it as healthy or unhealthy. 1.108.7 answers a request for one model with no healthy
    endpoint 503, the body unchanged; only an admin key is shown ``api_base`` (an entry is matched by
    ``model_id`` first). Never raises; a fault of the proxy is "not known"."""
    if not admin_key:
        return ModelHealth("not known", NO_KEY.line())
    url = base_url.rstrip("/") + "/health?model_id=" + quote(model_id, safe="")
    result = request("GET", url, deadline_s=deadline_s, max_bytes=MAX_BYTES, headers=_auth(admin_key))
    if isinstance(result, HttpFault):
        return ModelHealth("not known", _fault(result, "/health", deadline_s).line())
    payload, bad = _decode(result, "/health")
    if bad is not None:
        return ModelHealth("not known", bad.line())
    listed = isinstance(payload, dict) and "unhealthy_endpoints" in payload
    if result.status == 200 or (result.status == 503 and listed):
        return read_model_health(payload, model_id, endpoint)
    return ModelHealth("not known", _error(result, payload, "/health").line())
