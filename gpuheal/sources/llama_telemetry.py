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
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from gpuheal import provenance as prov
from gpuheal.model import (
    ENDPOINT_LOADING,
    ENDPOINT_OK,
    ENDPOINT_REFUSED,
    ENDPOINT_TIMEOUT,
    ENDPOINT_UNAUTHORIZED,
    DataFault,
)
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
from gpuheal.sources.http import Ask, Exchange, HttpFault, HttpResult, printable, request
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


#: The ``/props`` answers one poll has read, by body (:func:`read_props`); made afresh for each poll.
PropsRead = dict[bytes, Answer]
PROPS_READ_MAX = 16  # distinct bodies remembered in one poll (a fleet runs a few models on a few builds)
PROPS_READ_MAX_BYTES = 64 * 1024  # a bigger body is read, not remembered (a real one is ~2-10 KB)


def read_props(result: HttpResult | Answer, read: PropsRead | None) -> Answer:
    """:func:`sleeping_answer` of one ``/props`` reply, each distinct body read once a poll (``read``: what
    this poll read so far; ``None``: nothing remembered). Replicas of one model file on one build with the same
    settings answer ``/props`` byte for byte alike, and a fleet is mostly such replicas; the answer is a function
    of the body alone, so a body already read this poll answers what it answered then (issue 29: ``json.loads``
    of a ~2 KB document for two fields was ~5 % of a 100-GPU cycle). Lives one poll: no run reuses another's."""
    if read is None or not isinstance(result, HttpResult):
        return sleeping_answer(result)
    body = result.body
    if type(body) is not bytes or len(body) > PROPS_READ_MAX_BYTES:
        return sleeping_answer(result)
    got = read.get(body)
    if got is None:
        got = sleeping_answer(result)
        if len(read) < PROPS_READ_MAX:
            read[body] = got
    return got


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


# --------------------------------------------------------------------------- one server's poll


def health_state(result: HttpResult | HttpFault) -> tuple[str, float | None, str, str | None]:
    """One ``/health`` reply → (state, latency_s, detail, fault kind or ``None``).

    state is ok | loading | refused | timeout | unauthorized | http-NNN (contract). 503 is a
    model still loading (formats.md §1.1), not a failure; an answer that is not HTTP at all is
    reported as refused (nothing there can serve). A reply larger than :data:`PROBE_MAX_BYTES` is an
    ``oversized`` fault (issue 9, point 8: it was labelled by its status, ``http-200``, as if the status
    were the problem); its endpoint state stays the HTTP status it answered with."""
    if isinstance(result, HttpFault):
        if result.kind == "timeout":
            return ENDPOINT_TIMEOUT, None, result.detail, ENDPOINT_TIMEOUT
        if result.kind == "refused":
            return ENDPOINT_REFUSED, None, result.detail, ENDPOINT_REFUSED
        if result.kind == "oversized":
            return f"http-{result.status or 0:03d}", None, result.detail, "oversized"
        return ENDPOINT_REFUSED, None, f"not an HTTP answer: {result.detail}", ENDPOINT_REFUSED
    if result.status == 200:
        return ENDPOINT_OK, result.elapsed_s, "", None
    if result.status == 503:
        return ENDPOINT_LOADING, result.elapsed_s, "503 loading model", None
    if result.status == 401:
        return ENDPOINT_UNAUTHORIZED, result.elapsed_s, "401 on a public path", "http-401"
    state = f"http-{result.status:03d}"
    return state, result.elapsed_s, snippet(result.body), state


def snippet(body: bytes, limit: int = 120) -> str:
    """The start of an unexpected answer's body, printable, for one line of detail."""
    return printable(body[:limit].decode("utf-8", "replace"), limit)


@dataclass(frozen=True)
class ServerTelemetry:
    """One llama-server's ``/metrics``, ``/slots`` and ``/props`` answers of this poll."""

    metrics: Answer
    slots: Answer
    props: Answer


UNASKED = Answer(NOT_ASKED)
NO_TELEMETRY = ServerTelemetry(UNASKED, UNASKED, UNASKED)  # /health did not answer 200: nothing else asked


@dataclass(frozen=True)
class ServerProbe:
    """One llama-server's poll (issue 12): its ``/health`` answer — the contract's endpoint state, latency,
    detail and data-fault kind (``None``: no fault) — its telemetry, and the canary's completion when one
    ran (issue 20). The same fields as :class:`~gpuheal.model.Liveness`, a server the source reports."""

    state: str
    latency_s: float | None
    detail: str
    fault: str | None
    telemetry: ServerTelemetry
    canary: str | None = None
    request: ClassVar[str] = prov.HEALTH  # provenance of the endpoint state

    def values(self) -> dict[str, Any]:
        """The :class:`~gpuheal.model.GpuSample` fields; nothing is known from a server whose /health failed."""
        t = self.telemetry
        if t.metrics is UNASKED:
            return {}
        m, sl = t.metrics.metrics, t.slots.slots
        out: dict[str, Any] = {"metrics": t.metrics.state, "slots": t.slots.state,
                               "is_sleeping": t.props.is_sleeping, "canary": self.canary, "n_ctx": t.props.n_ctx}
        if m is not None:
            out.update(n_decode_total=m.n_decode_total, tokens_predicted_total=m.tokens_predicted_total,
                       requests_processing=m.requests_processing, requests_deferred=m.requests_deferred)
        if sl is not None:
            out.update(slots_total=sl.total, slots_busy=sl.busy)
        elif t.slots.state == IDLE:
            out["slots_busy"] = 0
        return out

    def faults(self, alias: str) -> list[DataFault]:
        """A wrong key, garbage or a hang on /metrics or /slots is this poll's data fault; a 501
        (not enabled) is not — ``check`` lists it once among the rules that are off. When /health
        itself failed its fault says it all."""
        t = self.telemetry
        if self.state != ENDPOINT_OK or t.metrics is UNASKED:
            return []
        out = []
        for answer in (t.metrics, t.slots):
            if answer.state not in QUIET_STATES:
                kind = "http-401" if answer.state == UNAUTHORIZED else answer.state
                out.append(DataFault(alias, kind, answer.detail))
            elif answer.state == OK and answer.detail:  # parsed, but some series were garbage
                out.append(DataFault(alias, "invalid", answer.detail))
        return out


def server_exchange(api_key: str | None, deadline_s: float, props_read: PropsRead | None = None) -> Exchange:
    """One llama-server's poll as an exchange (:mod:`~gpuheal.sources.http_loop`: one kept-alive
    connection, one deadline): ``/health``; then, when it answered 200, its telemetry
    (:func:`telemetry_exchange`; ``props_read``: the poll's ``/props`` bodies read so far, :func:`read_props`).
    A dead or stopped server costs one request and one deadline. Returns its :class:`ServerProbe`."""
    started = time.monotonic()
    state, latency_s, detail, fault = health_state((yield Ask("/health", max_bytes=PROBE_MAX_BYTES)))
    telemetry = NO_TELEMETRY
    if state == ENDPOINT_OK:
        telemetry = yield from telemetry_exchange(api_key, deadline_s, started, props_read)
    return ServerProbe(state, latency_s, detail, fault, telemetry)


def telemetry_exchange(
    api_key: str | None, deadline_s: float, started: float, props_read: PropsRead | None = None
) -> Exchange:
    """``/metrics``; then ``/props`` — every poll: its ``n_ctx`` is the running context Rule 9 watches
    for a change (``rules/context_window/change``), and it says whether the server sleeps without waking it;
    then ``/slots`` — only of a server that is awake, since ``/slots`` wakes a sleeping one
    (llama-server.md §5). A server with requests processing is awake; an idle one
    (``requests_processing`` 0) is not asked further: its busy slots are 0 and it may sleep.
    All within what is left of the deadline that started at ``started`` (the /health probe); a busy
    server costs four requests."""
    auth = tuple(auth_headers(api_key).items())
    got = yield from _ask("/metrics", auth, deadline_s, started)
    metrics = metrics_answer(got)
    busy = metrics.metrics.requests_processing if metrics.metrics is not None else None
    if metrics.state == UNAUTHORIZED:  # the same key on /props and /slots: no more 401s
        return ServerTelemetry(metrics, Answer(UNAUTHORIZED, metrics.detail), UNASKED)
    got = yield from _ask("/props", auth, deadline_s, started)
    props = read_props(got, props_read)
    slots = _slots_unasked(busy, props)
    if slots is None:  # each answer is asked, then read: the reading never asks again
        got = yield from _ask("/slots", auth, deadline_s, started)
        slots = slots_answer(got)
    return ServerTelemetry(metrics=metrics, slots=slots, props=props)


def _slots_unasked(busy: int | None, props: Answer) -> Answer | None:
    """Why ``/slots`` is not asked this poll (its :class:`Answer`), or ``None``: ask it. Not of an idle server
    (nothing in flight), nor of a sleeping one (``/slots`` would wake it), nor after ``/props`` failed in a
    way that ``/slots`` would repeat."""
    if busy == 0:
        return Answer(IDLE, "GET /slots not asked: nothing in flight")
    if busy is None and props.is_sleeping:
        return Answer(SLEEPING, "GET /slots not asked: the server sleeps (it would wake it)")
    if busy is None and props.state in (UNAUTHORIZED, LOADING, "refused", "timeout"):
        return Answer(props.state, props.detail.replace("/props", "/slots (after /props)"))
    return None


def _ask(path: str, auth: tuple[tuple[str, str], ...], deadline_s: float, started: float) -> Exchange:
    """One keyed request of the telemetry → the 200 reply, or the :class:`Answer` it means."""
    if deadline_s - (time.monotonic() - started) < 0.05:
        return Answer("timeout", f"GET {path}: no time left in the probe deadline")
    return answer(path, (yield Ask(path, auth, PROBE_MAX_BYTES)))
