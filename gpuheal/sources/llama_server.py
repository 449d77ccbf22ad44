"""The benchmark inference test against one llama.cpp ``llama-server``.

One function, :func:`benchmark_inference`, serves both ``gpuheal bench`` (issue 5) and the
verification step ``heal`` runs after a restart (Rule 3: "Model returns 200 with <30s response").
It makes a real completion through the API every client uses and reads the speed the way llama.cpp
itself reports it (formats.md §1.7):

* ``POST /completion`` → ``timings.predicted_per_second`` / ``predicted_n`` / ``prompt_per_second``;
* ``POST /v1/chat/completions`` when ``/completion`` is not served (404/405/501: a proxy or an
  OpenAI-only server) or its answer carries no usable timings — the chat answer's ``timings`` when
  present, else ``usage.completion_tokens`` over the request's wall time.

What the network does is never raised: every outcome is a :class:`BenchOutcome` whose ``error`` is
``None`` or one of ``unauthorized | loading | timeout | refused | http-NNN | invalid | empty``.

Lessons L1/L2: a 401 is ``unauthorized`` and ends the test for that server at once — no second
request of any kind (not the warm-up's main request, not the chat fallback). Likewise ``loading``
(503), ``timeout`` and ``refused`` stop it: a server that cannot answer one request will not answer
the next, and each further request would cost another full deadline.
L3 (verify running state, not docs): :func:`read_props` reads the model and the running per-slot
context from ``GET /props`` first; it is also the cheapest way to meet a 401 or a 503.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from gpuheal.model import (
    ERR_EMPTY,
    ERR_INVALID,
    ERR_LOADING,
    ERR_REFUSED,
    ERR_TIMEOUT,
    ERR_UNAUTHORIZED,
    BenchOutcome,
)
from gpuheal.parse.values import Bad, check_number, check_text, clean_text, sub_object
from gpuheal.redact import describe_key, redact_text
from gpuheal.sources.http import HttpFault, HttpResult, request

DEFAULT_PROMPT = (
    "You are benchmarking a GPU. Write a short technical paragraph about how graphics processors "
    "run the matrix multiplications of a transformer language model, one layer after another."
)
WARMUP_N_PREDICT = 8
PROPS_DEADLINE_S = 10.0
PROPS_MAX_BYTES = 1 << 20       # /props carries the chat template: tens of KB on real models
COMPLETION_MAX_BYTES = 4 << 20  # n_predict ≤ 4096 tokens of text plus generation_settings
FALLBACK_STATUSES = frozenset({404, 405, 501})

API_COMPLETION = "completion"
API_CHAT = "chat"

FATAL_ERRORS = frozenset({ERR_UNAUTHORIZED, ERR_LOADING, ERR_TIMEOUT, ERR_REFUSED})


@dataclass(frozen=True)
class Props:
    """What ``GET /props`` says about the running server; ``None`` = not known."""

    ok: bool
    model: str | None = None
    n_ctx: int | None = None          # per slot: default_generation_settings.n_ctx
    total_slots: int | None = None
    build_info: str | None = None
    is_sleeping: bool | None = None
    status: int | None = None
    error: str | None = None
    detail: str = ""


# --------------------------------------------------------------------------- public API


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The llama-server API key as a Bearer token (none when the server has no key); the one copy
    (``llama_telemetry`` and the doctor use it too)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def read_props(endpoint: str, api_key: str | None, deadline_s: float) -> Props:
    """``GET {endpoint}/props`` with the key; never raises. The key is taken out of its ``detail`` here,
    where the answer is finished (:func:`_props` builds it from what the server said)."""
    props = _props(endpoint, api_key, deadline_s)
    return replace(props, detail=redact_text(props.detail, _secrets(api_key)))


def _props(endpoint: str, api_key: str | None, deadline_s: float) -> Props:
    """:func:`read_props` before redaction: the server's own words, bounded (:func:`_clean`)."""
    result = request(
        "GET",
        endpoint.rstrip("/") + "/props",
        deadline_s=deadline_s,
        max_bytes=PROPS_MAX_BYTES,
        headers=auth_headers(api_key),
    )
    if isinstance(result, HttpFault):
        return Props(ok=False, error=_fault_error(result), detail=_clean(result.detail))
    error = _status_error(result.status)
    if error is not None:
        return Props(ok=False, status=result.status, error=error, detail=_error_message(result.body))
    doc = _json_object(result.body)
    if doc is None:
        return Props(ok=False, status=result.status, error=ERR_INVALID, detail="/props is not a JSON object")
    return parse_props(doc, status=result.status)


def parse_props(doc: dict[str, Any], status: int | None = 200) -> Props:
    """Pure: the fields gpuheal uses from a ``/props`` document (every one optional)."""
    settings = doc.get("default_generation_settings")
    n_ctx = _int(settings.get("n_ctx")) if isinstance(settings, dict) else None
    if n_ctx is None:
        n_ctx = _int(doc.get("n_ctx"))  # some forks put it at the top level
    model = _str(doc.get("model_alias")) or _str(doc.get("model_path"))
    sleeping = doc.get("is_sleeping")
    return Props(
        ok=True,
        model=model,
        n_ctx=n_ctx,
        total_slots=_int(doc.get("total_slots")),
        build_info=_str(doc.get("build_info")),
        is_sleeping=sleeping if isinstance(sleeping, bool) else None,
        status=status,
    )


def benchmark_inference(
    endpoint: str,
    api_key: str | None,
    n_predict: int,
    deadline_s: float,
    warmup: bool = True,
    *,
    prompt: str | None = None,
    props: bool = True,
) -> BenchOutcome:
    """Run the benchmark inference test on one llama-server; never raises for network trouble.

    ``deadline_s`` bounds each request (connect + answer + body) on its own; ``/props`` gets
    ``min(deadline_s, 10)``. Requests, in order, stopping at the first fatal answer
    (401 / 503 / timeout / refused): ``GET /props`` (when ``props``), a warm-up completion of
    ``min(n_predict, 8)`` tokens (when ``warmup``), the measured completion of ``n_predict`` tokens.
    Prompt caching is off so that prompt tok/s measures prefill and not a cache hit. The outcome is
    built from what the server said and the key taken out of it once, at the end (:func:`_finished`).
    """
    outcome = _benchmark(endpoint.rstrip("/"), api_key, n_predict, deadline_s, warmup, prompt, props)
    return _finished(outcome, api_key)


def _benchmark(
    base: str, api_key: str | None, n_predict: int, deadline_s: float, warmup: bool, prompt: str | None,
    props: bool,
) -> BenchOutcome:
    """:func:`benchmark_inference`'s requests, in order, before redaction."""
    prompt = prompt or DEFAULT_PROMPT
    n_predict = max(1, int(n_predict))
    requests_made = 0
    info = Props(ok=False)

    if props:
        info = _props(base, api_key, min(deadline_s, PROPS_DEADLINE_S))
        requests_made += 1
        if info.error in FATAL_ERRORS:
            return _failed(info.error, info.status, f"/props: {info.detail}", requests_made)

    api = API_COMPLETION
    if warmup:
        warm, api, sent = _measure(base, api_key, prompt, min(n_predict, WARMUP_N_PREDICT), deadline_s, api)
        requests_made += sent
        if warm.error is not None:
            return replace(warm, requests=requests_made, detail=f"warm-up: {warm.detail}", **_known(info, warm))

    main, api, sent = _measure(base, api_key, prompt, n_predict, deadline_s, api)
    requests_made += sent
    return replace(main, requests=requests_made, **_known(info, main))


def completion_state(endpoint: str, api_key: str | None, n_predict: int, deadline_s: float) -> str:
    """One completion's word (``probe.canary``, issue 20: the task loop answering): ``ok``, or the
    :class:`BenchOutcome` error it met (``invalid`` when it has none). Only the word leaves this module,
    never what the server said, so there is nothing of the key to take out."""
    out = _benchmark(endpoint.rstrip("/"), api_key, n_predict, deadline_s, False, None, False)
    return "ok" if out.ok else (out.error or "invalid")


# --------------------------------------------------------------------------- one measurement


def _measure(
    base: str, api_key: str | None, prompt: str, n_predict: int, deadline_s: float, api: str
) -> tuple[BenchOutcome, str, int]:
    """One measured completion (plus, where needed, the chat fallback). → (outcome, api, requests)."""
    sent = 0
    first: BenchOutcome | None = None
    if api == API_COMPLETION:
        first = _completion(base, api_key, prompt, n_predict, deadline_s)
        sent += 1
        if first.error is None and first.rate_source == "timings":
            return first, API_COMPLETION, sent
        understood = first.error != ERR_INVALID or first.status != 200
        if first.error is not None and first.status not in FALLBACK_STATUSES and understood:
            return first, API_COMPLETION, sent
        # /completion is not served here, or its 200 carried no usable timings: ask the chat API.
    chat = _chat(base, api_key, prompt, n_predict, deadline_s)
    sent += 1
    if chat.error is None:
        if first is not None and first.error is None and chat.rate_source != "timings":
            # both without timings: keep /completion's own tokens over its wall time
            return first, API_COMPLETION, sent
        return chat, API_CHAT, sent
    if first is not None and first.error is None:
        return first, API_COMPLETION, sent  # the chat fallback failed; /completion did answer
    if chat.status in FALLBACK_STATUSES and first is not None:
        return first, API_COMPLETION, sent  # neither endpoint exists: report /completion's 404
    return chat, API_CHAT, sent


_SAMPLING = {"temperature": 0, "seed": 42, "cache_prompt": False, "ignore_eos": True, "stream": False}


def _completion(base: str, api_key: str | None, prompt: str, n_predict: int, deadline_s: float) -> BenchOutcome:
    payload = {"prompt": prompt, "n_predict": n_predict, **_SAMPLING}
    return _measured_request(base, "/completion", API_COMPLETION, api_key, payload, deadline_s)


def _chat(base: str, api_key: str | None, prompt: str, n_predict: int, deadline_s: float) -> BenchOutcome:
    payload = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n_predict, **_SAMPLING}
    return _measured_request(base, "/v1/chat/completions", API_CHAT, api_key, payload, deadline_s)


def _measured_request(
    base: str, path: str, api: str, api_key: str | None, payload: dict[str, Any], deadline_s: float
) -> BenchOutcome:
    """POST one measured request and read its ``timings`` (formats.md §1.7). The token count
    falls back to ``tokens_predicted`` (/completion) or ``usage.completion_tokens`` (chat); a chat
    answer's ``model`` only echoes what the client sent, so it is not evidence."""
    result = _post(base + path, api_key, payload, deadline_s)
    if isinstance(result, BenchOutcome):
        return replace(result, api=api)
    doc = _json_object(result.body)
    if doc is None:
        return _failed(ERR_INVALID, result.status, f"{path}: answer is not a JSON object", 0,
                       elapsed=result.elapsed_s, api=api)
    timings, usage = sub_object(doc, "timings"), sub_object(doc, "usage")  # both read at once, then judged
    tokens = _int(timings.get("predicted_n"))
    if tokens is None and api == API_COMPLETION:
        tokens = _int(doc.get("tokens_predicted"))
    if tokens is None and api == API_CHAT:
        tokens = _int(usage.get("completion_tokens"))
    return _judge(
        tokens=tokens,
        gen=_rate(timings, "predicted"),
        prompt_rate=_rate(timings, "prompt"),
        elapsed=result.elapsed_s,
        status=result.status,
        api=api,
        model=_str(doc.get("model")) if api == API_COMPLETION else None,
    )


def _judge(
    *, tokens: int | None, gen: float | None, prompt_rate: float | None, elapsed: float,
    status: int, api: str, model: str | None,
) -> BenchOutcome:
    """A 200 is a pass when at least one token was predicted — whatever the content says (a
    thinking model's ``content`` is empty while its tokens went to ``reasoning_content``)."""
    if tokens is None:
        return BenchOutcome(ok=False, error=ERR_INVALID, status=status, elapsed_s=round(elapsed, 3),
                            api=api, detail="200 without a token count (no timings, no usage)", model=model)
    if tokens <= 0:
        return BenchOutcome(ok=False, error=ERR_EMPTY, status=status, elapsed_s=round(elapsed, 3), api=api,
                            tokens=tokens, detail="200 but no token was predicted", model=model)
    source = "timings"
    if gen is None:
        source = "wall"
        gen = tokens / elapsed if elapsed > 0 else None
    return BenchOutcome(
        ok=True,
        gen_tok_s=_round(gen),
        prompt_tok_s=_round(prompt_rate),
        tokens=tokens,
        elapsed_s=round(elapsed, 3),
        status=status,
        api=api,
        rate_source=source,
        model=model,
    )


def _post(url: str, api_key: str | None, payload: dict[str, Any], deadline_s: float) -> HttpResult | BenchOutcome:
    """POST JSON; a non-200 or a transport failure comes back as a failed :class:`BenchOutcome`."""
    headers = {"Content-Type": "application/json", **auth_headers(api_key)}
    result = request(
        "POST", url, deadline_s=deadline_s, max_bytes=COMPLETION_MAX_BYTES, headers=headers,
        body=json.dumps(payload).encode(),
    )
    path = url[url.find("/", url.find("//") + 2):]
    if isinstance(result, HttpFault):
        # status None: no complete HTTP answer was read (an oversized one is not an answer)
        return _failed(_fault_error(result), None, f"{path}: {_clean(result.detail)}", 0,
                       elapsed=result.elapsed_s)
    error = _status_error(result.status)
    if error is not None:
        return _failed(error, result.status, f"{path}: {_error_message(result.body)}", 0,
                       elapsed=result.elapsed_s)
    return result


# --------------------------------------------------------------------------- helpers


def _status_error(status: int) -> str | None:
    if 200 <= status < 300:
        return None
    if status == 401:
        return ERR_UNAUTHORIZED
    if status == 503:
        return ERR_LOADING  # formats.md §1.9.2: 503 from any endpoint during load is normal
    return f"http-{status:03d}"


def _fault_error(fault: HttpFault) -> str:
    if fault.kind in (ERR_TIMEOUT, ERR_REFUSED):
        return fault.kind
    return ERR_INVALID  # oversized, not HTTP, a bad URL: nothing usable came back


def _failed(
    error: str | None, status: int | None, detail: str, requests_made: int,
    *, elapsed: float = 0.0, api: str | None = None,
) -> BenchOutcome:
    return BenchOutcome(ok=False, error=error, status=status, detail=detail, requests=requests_made,
                        elapsed_s=round(elapsed, 3), api=api)


def _finished(outcome: BenchOutcome, api_key: str | None) -> BenchOutcome:
    """The outcome as it leaves this module: the key out of its ``detail`` (the contract: no secret in what
    gpuheal writes) and, on a 401, the key named by its shape only (L1) — once, where the answer is built."""
    key_sent = describe_key(api_key or "") if outcome.error == ERR_UNAUTHORIZED else None
    return replace(outcome, detail=redact_text(outcome.detail, _secrets(api_key)), key_sent=key_sent)


def _secrets(api_key: str | None) -> tuple[str, ...]:
    return (api_key,) if api_key else ()


def _known(info: Props, outcome: BenchOutcome) -> dict[str, Any]:
    """Model and context: /props first (L3), the completion's own ``model`` as a fallback."""
    return {
        "model": info.model or outcome.model,
        "n_ctx": info.n_ctx,
        "slots": info.total_slots,
    }


def _rate(timings: dict[str, Any], prefix: str) -> float | None:
    """``{prefix}_per_second``, else ``{prefix}_n`` over ``{prefix}_ms``; null / NaN / ≤0 → None."""
    rate = _num(timings.get(f"{prefix}_per_second"))
    if rate is not None and rate > 0:
        return rate
    n = _num(timings.get(f"{prefix}_n"))
    ms = _num(timings.get(f"{prefix}_ms"))
    if n is not None and ms is not None and n > 0 and ms > 0:
        rate = n / (ms / 1000.0)
        return rate if rate < 1e12 else None  # 1e300 tokens in 1e-300 ms is not a speed
    return None


def _num(value: Any) -> float | None:
    """A finite JSON number (strict: a string, a bool or a 400-digit int is not known)."""
    read = check_number(value, lo=None, hi=1e300)
    return None if read is None or isinstance(read, Bad) else float(read)


def _int(value: Any) -> int | None:
    """A whole, non-negative JSON number (``12.0`` counts; ``"12"`` and ``12.5`` do not)."""
    read = check_number(value, lo=0, hi=2**53, integer=True)
    return None if read is None or isinstance(read, Bad) else int(read)


def _str(value: Any, limit: int = 200) -> str | None:
    read = check_text(value, limit)
    return read if isinstance(read, str) else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _error_message(body: bytes) -> str:
    """The llama.cpp error envelope's message (formats.md §1.8), or a bounded snippet of text."""
    doc = _json_object(body)
    message = None
    if doc is not None:
        err = doc.get("error")
        if isinstance(err, dict):
            message = _str(err.get("message"))
        elif isinstance(err, str):
            message = _str(err)
        message = message or _str(doc.get("status"))  # old builds: {"status": "loading model"}
    if message is None:
        message = body[:200].decode("utf-8", "replace").strip() or "(empty body)"
    return _clean(message)


def _clean(text: str) -> str:
    """One bounded, printable line of what the server said (the key is taken out by the caller that
    finishes the answer: :func:`read_props`, :func:`_finished`)."""
    return clean_text(" ".join(text.split())[:200])
