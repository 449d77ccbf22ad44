"""llama-server's own telemetry, read every poll: ``GET /metrics``, ``GET /slots``, ``GET /props``
``is_sleeping`` (issue 12; contract "Direct sensing").

``/health`` answers 200 while a decode is hung (formats.md §1.9); the server's own counters do not:
``llamacpp:n_decode_total`` stops while ``requests_processing`` stays > 0 (Rule 3 from llama-server).
All three need the api key when the server has one (llama-server.md §5: only ``/health`` is public).

Each call is one request under the probe's deadline and byte cap; nothing here raises for what the
network does. The state words are the contract's endpoint words plus ``disabled`` (HTTP 501: the
server was started without ``--metrics`` / with ``--no-slots``; "not known", not a fault):
``ok | disabled | unauthorized | loading | timeout | refused | invalid | http-NNN``, and for
``/slots`` also ``idle`` / ``sleeping`` (not asked: nothing in flight / the server sleeps).

``/slots`` wakes a sleeping server (llama-server.md §5: "GET /slots wakes it"), so it is asked only
after ``/props`` said the server is awake — a monitor must not keep ``--sleep-idle-seconds`` from
ever unloading the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gpuheal.parse.llama_metrics import (
    HOW_TO_ENABLE,
    InvalidMetrics,
    InvalidSlots,
    ServerMetrics,
    Slots,
    known_n_ctx,
    parse_metrics,
    parse_slots,
)
from gpuheal.sources.http import HttpFault, HttpResult, request
from gpuheal.sources.llama_server import auth_headers

PROBE_MAX_BYTES = 1 << 20  # one cap for /health, /metrics, /slots, /props (a /props carries the chat template)

OK = "ok"
DISABLED = "disabled"
UNAUTHORIZED = "unauthorized"
LOADING = "loading"
SLEEPING = "sleeping"  # /slots not asked: the server sleeps
IDLE = "idle"  # /slots not asked: /metrics shows nothing in flight (0 busy slots; it may sleep)
NOT_ASKED = "not-asked"
# states that are not a fault of this poll: the server said so itself, or /health reports it
QUIET_STATES = frozenset({OK, DISABLED, LOADING, SLEEPING, IDLE, NOT_ASKED})



@dataclass(frozen=True)
class Answer:
    """One telemetry request: ``state`` (above), what it said, and one line for people."""

    state: str
    detail: str = ""
    metrics: ServerMetrics | None = None
    slots: Slots | None = None
    is_sleeping: bool | None = None
    n_ctx: int | None = None  # /props default_generation_settings.n_ctx (per slot), Rule 9


def fetch_metrics(endpoint: str, api_key: str | None, deadline_s: float) -> Answer:
    """``GET {endpoint}/metrics`` → :class:`Answer` with ``metrics`` when the body parsed."""
    return metrics_answer(_get(endpoint, "/metrics", api_key, deadline_s))


def fetch_slots(endpoint: str, api_key: str | None, deadline_s: float) -> Answer:
    """``GET {endpoint}/slots`` → :class:`Answer` with ``slots`` when the body parsed."""
    return slots_answer(_get(endpoint, "/slots", api_key, deadline_s))


def fetch_sleeping(endpoint: str, api_key: str | None, deadline_s: float) -> Answer:
    """``GET {endpoint}/props`` → ``is_sleeping`` (``None`` when the build does not say)."""
    return sleeping_answer(_get(endpoint, "/props", api_key, deadline_s))


def metrics_answer(result: HttpResult | Answer) -> Answer:
    """What one ``/metrics`` reply says (:func:`answer` of it first)."""
    if not isinstance(result, HttpResult):
        return result
    try:
        text = result.body.decode("utf-8")
        metrics = parse_metrics(text)
    except (UnicodeDecodeError, InvalidMetrics) as exc:
        return Answer("invalid", f"GET /metrics: {_reason(exc)}")
    detail = f"GET /metrics: {'; '.join(metrics.problems)}" if metrics.problems else ""
    return Answer(OK, detail, metrics=metrics)


def slots_answer(result: HttpResult | Answer) -> Answer:
    if not isinstance(result, HttpResult):
        return result
    try:
        slots = parse_slots(json.loads(result.body))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, InvalidSlots
        reason = str(exc) if isinstance(exc, InvalidSlots) else "not JSON"
        return Answer("invalid", f"GET /slots: {reason}")
    detail = f"GET /slots: {'; '.join(slots.problems)}" if slots.problems else ""
    return Answer(OK, detail, slots=slots)


def sleeping_answer(result: HttpResult | Answer) -> Answer:
    if not isinstance(result, HttpResult):
        return result
    try:
        doc = json.loads(result.body)
    except (ValueError, RecursionError):
        return Answer("invalid", "GET /props: not JSON")
    if not isinstance(doc, dict):
        return Answer("invalid", "GET /props: not a JSON object")
    sleeping = doc.get("is_sleeping")
    settings = doc.get("default_generation_settings")
    n_ctx = known_n_ctx(settings.get("n_ctx") if isinstance(settings, dict) else doc.get("n_ctx"))
    return Answer(OK, is_sleeping=sleeping if isinstance(sleeping, bool) else None, n_ctx=n_ctx)


def metrics_enabled(endpoint: str, api_key: str | None, deadline_s: float) -> tuple[bool | None, str]:
    """For ``doctor`` and ``check``: is ``/metrics`` served to this key? ``(True, "")``,
    ``(False, how to enable it)`` on 501, ``(None, why not known)`` otherwise."""
    got = fetch_metrics(endpoint, api_key, deadline_s)
    if got.state == OK:
        return True, ""
    if got.state == DISABLED:
        return False, HOW_TO_ENABLE["metrics"]
    if got.state == UNAUTHORIZED:
        return None, "GET /metrics answered 401: the server does not accept litellm.api_key (Lesson L1)"
    return None, got.detail or got.state


def _get(endpoint: str, path: str, api_key: str | None, deadline_s: float) -> HttpResult | Answer:
    result = request("GET", endpoint.rstrip("/") + path, deadline_s=deadline_s, max_bytes=PROBE_MAX_BYTES,
                     headers=auth_headers(api_key))
    return answer(path, result)


def answer(path: str, result: HttpResult | HttpFault) -> HttpResult | Answer:
    """A 200 reply as it came (for the body's parser); anything else as the :class:`Answer` it
    means: 501 / 404 / 405 ``disabled``, 401 ``unauthorized``, 503 ``loading``, faults by kind."""
    if isinstance(result, HttpFault):
        kind = result.kind if result.kind in ("timeout", "refused") else "invalid"
        return Answer(kind, f"GET {path}: {result.detail}")
    if result.status == 200:
        return result
    if result.status == 501:
        return Answer(DISABLED, f"GET {path}: 501 not enabled")
    if result.status in (404, 405):  # not a llama-server route here (a proxy, another server)
        return Answer(DISABLED, f"GET {path}: {result.status} not served")
    if result.status == 401:
        return Answer(UNAUTHORIZED, f"GET {path}: 401 — the server does not accept the configured api key")
    if result.status == 503:
        return Answer(LOADING, f"GET {path}: 503 loading model")
    return Answer(f"http-{result.status:03d}", f"GET {path}: HTTP {result.status}")


def _reason(exc: Exception) -> str:
    return "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)[:160]
