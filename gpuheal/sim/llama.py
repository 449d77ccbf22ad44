"""Bodies a llama.cpp ``llama-server`` returns, shaped like the captured real ones.

Shapes (key names, nesting, key order, number formats) are copied from the verbatim responses in
``docs/llama-server.md`` section 7 (build b11312-0c1e57098). Values come from the sim's state.
Pure functions: no sockets, no clock.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from typing import Any

BUILD_INFO = "b11312-0c1e57098"


# The real server emits compact JSON (nlohmann dump()).
def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def error_body(code: int, message: str, type_: str) -> bytes:
    """The error envelope, in the newest builds' key order (message, type, code)."""
    return dumps({"error": {"message": message, "type": type_, "code": code}})


LOADING_BODY = error_body(503, "Loading model", "unavailable_error")
UNAUTHORIZED_BODY = error_body(401, "Invalid API Key", "authentication_error")
NOT_FOUND_BODY = error_body(404, "File Not Found", "not_found_error")
METRICS_DISABLED_BODY = dumps(
    {
        "error": {
            "code": 501,
            "message": "This server does not support metrics endpoint. Start it with `--metrics`",
            "type": "not_supported_error",
        }
    }
)
NO_SLOT_BODY = dumps(
    {"error": {"code": 503, "message": "no slot available", "type": "unavailable_error"}}
)
HEALTH_OK_BODY = b'{"status":"ok"}'


def server_error_body(message: str) -> bytes:
    # The captured 500 (malformed JSON) puts "code" first.
    return dumps({"error": {"code": 500, "message": message, "type": "server_error"}})


_SAMPLING_PARAMS: dict[str, Any] = {
    "seed": 4294967295,
    "temperature": 0.800000011920929,
    "dynatemp_range": 0.0,
    "dynatemp_exponent": 1.0,
    "top_k": 40,
    "top_p": 0.949999988079071,
    "min_p": 0.05000000074505806,
    "top_n_sigma": -1.0,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.10000000149011612,
    "typical_p": 1.0,
    "repeat_last_n": 64,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": 64,
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.10000000149011612,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.8999999761581421,
    "max_tokens": -1,
    "n_predict": -1,
    "n_keep": 0,
    "n_discard": 0,
    "ignore_eos": False,
    "stream": False,
    "n_probs": 0,
    "min_keep": 0,
    "chat_format": "Content-only",
    "reasoning_format": "none",
    "reasoning_in_content": False,
    "generation_prompt": "",
    "samplers": [
        "penalties",
        "dry",
        "top_n_sigma",
        "top_k",
        "typ_p",
        "top_p",
        "min_p",
        "xtc",
        "temperature",
    ],
    "speculative.types": "none",
    "timings_per_token": False,
    "post_sampling_probs": False,
    "backend_sampling": False,
    "lora": [],
}

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS = (
    "the GPU fleet is healthy and every llama server answers its probes in time while the "
    "monitor records temperature memory and throughput for each host"
).split()


def model_ftype(model: str) -> str:
    m = model.upper()
    for tag, ftype in (
        ("Q4_K_M", "Q4_K - Medium"),
        ("Q4_K_S", "Q4_K - Small"),
        ("Q5_K_M", "Q5_K - Medium"),
        ("Q6_K", "Q6_K"),
        ("Q8_0", "Q8_0"),
        ("F16", "F16"),
    ):
        if tag in m:
            return ftype
    return "Q4_K - Medium"


def props(*, model_path: str, n_ctx: int, parallel: int, metrics: bool) -> dict[str, Any]:
    """``GET /props``; ``default_generation_settings.n_ctx`` is per slot, as in the real one."""
    return {
        "default_generation_settings": {
            "params": dict(_SAMPLING_PARAMS),
            "n_ctx": max(1, n_ctx // max(1, parallel)),
        },
        "total_slots": parallel,
        "model_alias": model_path,
        "model_ftype": model_ftype(model_path),
        "model_path": model_path,
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": "<__media_" + hashlib.sha1(model_path.encode()).hexdigest()[:32] + "__>",
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": metrics,
        "ui": True,
        "ui_settings": {},
        "chat_template": CHAT_TEMPLATE,
        "chat_template_caps": {
            "supports_object_arguments": False,
            "supports_parallel_tool_calls": False,
            "supports_preserve_reasoning": False,
            "supports_reasoning_effort": False,
            "supports_string_content": True,
            "supports_system_role": True,
            "supports_tool_calls": False,
            "supports_tools": False,
            "supports_typed_content": False,
        },
        "bos_token": "<s>",
        "eos_token": "</s>",
        "build_info": BUILD_INFO,
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    }


@functools.lru_cache(maxsize=1024)
def props_body(model_path: str, n_ctx: int, parallel: int, metrics: bool) -> bytes:
    """:func:`props`' JSON, remembered per server shape (each poll asks every server for it)."""
    return dumps(props(model_path=model_path, n_ctx=n_ctx, parallel=parallel, metrics=metrics))


def slots(*, n_ctx: int, parallel: int, busy: int) -> list[dict[str, Any]]:
    """``GET /slots``: one entry per slot, the 4-field shape of slots that never ran."""
    per_slot = max(1, n_ctx // max(1, parallel))
    return [
        {"id": i, "n_ctx": per_slot, "speculative": False, "is_processing": i < busy}
        for i in range(parallel)
    ]


@functools.lru_cache(maxsize=1024)
def slots_body(n_ctx: int, parallel: int, busy: int) -> bytes:
    """:func:`slots`'s JSON, remembered: a fleet's servers answer a few shapes, poll after poll."""
    return dumps(slots(n_ctx=n_ctx, parallel=parallel, busy=busy))


def models(*, model_path: str, n_ctx: int, parallel: int, created: int) -> dict[str, Any]:
    """``GET /v1/models`` (and ``/models``): Ollama-style ``models`` plus OpenAI ``data``."""
    return {
        "models": [
            {
                "name": model_path,
                "model": model_path,
                "modified_at": "",
                "size": "",
                "digest": "",
                "type": "model",
                "description": "",
                "tags": [""],
                "capabilities": ["completion"],
                "parameters": "",
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "",
                    "families": [""],
                    "parameter_size": "",
                    "quantization_level": "",
                },
            }
        ],
        "object": "list",
        "data": [
            {
                "id": model_path,
                "aliases": [model_path],
                "tags": [],
                "object": "model",
                "created": created,
                "owned_by": "llamacpp",
                "meta": {
                    "vocab_type": 2,
                    "n_vocab": 151936,
                    "n_ctx": max(1, n_ctx // max(1, parallel)),
                    "n_ctx_train": max(n_ctx, 262144),
                    "n_embd": 5120,
                    "n_params": 27_000_000_000,
                    "size": 16_500_000_000,
                    "ftype": model_ftype(model_path),
                },
            }
        ],
    }


_METRICS = (
    (
        "prompt_tokens_total",
        "counter",
        "Number of prompt tokens processed, excluding cached tokens",
    ),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "counter", "Total time spent processing prompts"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"),
    (
        "n_decode_total",
        "counter",
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
    ),
    ("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated"),
    (
        "spec_decode_num_accepted_tokens_total",
        "counter",
        "Speculative: Total draft tokens accepted by the target model",
    ),
    (
        "spec_decode_num_drafts_total",
        "counter",
        "Speculative: Total speculative decoding verification steps",
    ),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s"),
    ("requests_processing", "gauge", "Number of requests processing"),
    ("requests_deferred", "gauge", "Number of requests deferred"),
    (
        "n_busy_slots_per_decode",
        "gauge",
        "Average number of busy slots per llama_decode() call",
    ),
)


# Each series' HELP and TYPE lines and its sample's name, written once (issue 29: a 100-GPU week
# formats 1.4 million bodies), with a ``%.6g`` for its value: one ``%`` formats a whole body. A value is
# written as C++ ``operator<<`` writes a double: 6 significant digits (``1.23457e+06``, ``0.978764``);
# ``"%.6g" % v`` is ``format(float(v), ".6g")``, the same C routine (tests/test_sim_metrics_text.py).
_METRICS_NAMES = tuple(name for name, _, _ in _METRICS)
_METRICS_TEMPLATE = "".join(
    f"# HELP llamacpp:{name} {help_}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} ".replace("%", "%%") + "%.6g\n"
    for name, kind, help_ in _METRICS
)


_METRICS_BODIES: dict[bytes, bytes] = {}
_MAX_METRICS_BODIES = 1024  # ~2.5 KB each
_PACK_METRICS = struct.Struct(f"<{len(_METRICS_NAMES)}d").pack


def metrics_text(values: dict[str, float]) -> bytes:
    """``GET /metrics``: the 15 series of the captured build, HELP/TYPE/value triplets. A body is remembered
    by its values' bits (``-0.0`` and ``0.0`` are written apart: ``-0`` and ``0``): a scrape of an idle server
    says what the last one said, and a chaos week scrapes 1.4 million times (issue 29; 99 % of them repeat)."""
    get = values.get
    floats = tuple([float(get(name, 0)) for name in _METRICS_NAMES])
    key = _PACK_METRICS(*floats)
    body = _METRICS_BODIES.get(key)
    if body is None:
        if len(_METRICS_BODIES) >= _MAX_METRICS_BODIES:
            _METRICS_BODIES.clear()
        body = _METRICS_BODIES[key] = (_METRICS_TEMPLATE % floats).encode("ascii")
    return body


def jitter(seq: int) -> float:
    """Deterministic throughput jitter in [-1 %, +1 %] for the seq-th request."""
    return ((seq * 37) % 21 - 10) / 1000.0


def count_tokens(text: str) -> int:
    return max(1, int(len(text.split()) * 1.3) + 1)


def timings(
    *, tok_s: float, prompt_tok_s: float, prompt_n: int, predicted_n: int, seq: int
) -> dict[str, Any]:
    """A ``timings`` object whose ``*_ms``, ``*_per_token_ms`` and ``*_per_second`` agree."""
    j = jitter(seq)
    gen_rate = max(tok_s, 0.01) * (1 + j)
    pp_rate = max(prompt_tok_s, 0.01) * (1 - j / 2)
    prompt_ms = round(prompt_n / pp_rate * 1000.0, 3)
    predicted_ms = round(predicted_n / gen_rate * 1000.0, 3)
    out: dict[str, Any] = {
        "cache_n": 0,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else None,
        "prompt_per_second": prompt_n / prompt_ms * 1000.0 if prompt_ms else None,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else None,
        "predicted_per_second": predicted_n / predicted_ms * 1000.0 if predicted_ms else None,
    }
    return out


def filler(n_tokens: int) -> str:
    n = max(0, min(n_tokens, 256))
    return "".join(" " + _WORDS[i % len(_WORDS)] for i in range(n))


def completion_id(alias: str, seq: int) -> str:
    h = hashlib.sha256(f"{alias}:{seq}".encode()).digest()
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    return "chatcmpl-" + "".join(letters[b % len(letters)] for b in h[:32])


def completion(
    *,
    model_path: str,
    prompt: str,
    n_predict: int,
    prompt_n: int,
    timing: dict[str, Any],
    request: dict[str, Any],
) -> dict[str, Any]:
    """``POST /completion`` (non-streaming), shaped like the captured greedy run."""
    settings = dict(_SAMPLING_PARAMS)
    settings.update(
        {
            "seed": request.get("seed", 4294967295),
            "temperature": float(request.get("temperature", 0.800000011920929)),
            "max_tokens": n_predict,
            "n_predict": n_predict,
            "reasoning_format": "deepseek",
            "stop": [],
            "logit_bias": [],
            "grammar": "",
        }
    )
    return {
        "index": 0,
        "content": filler(n_predict),
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": model_path,
        "tokens_predicted": n_predict,
        "tokens_evaluated": prompt_n,
        "generation_settings": settings,
        "prompt": "<s> " + prompt,
        "has_new_line": False,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": prompt_n + max(n_predict - 1, 0),
        "timings": timing,
    }


def chat_completion(
    *,
    model_path: str,
    n_predict: int,
    prompt_n: int,
    timing: dict[str, Any],
    created: int,
    cid: str,
) -> dict[str, Any]:
    """``POST /v1/chat/completions`` (non-streaming): ``choices``, ``usage``, ``timings``."""
    return {
        "choices": [
            {
                "finish_reason": "length",
                "index": 0,
                "message": {"role": "assistant", "content": filler(n_predict)},
            }
        ],
        "created": created,
        "model": model_path,
        "system_fingerprint": BUILD_INFO,
        "object": "chat.completion",
        "usage": {
            "completion_tokens": n_predict,
            "prompt_tokens": prompt_n,
            "total_tokens": prompt_n + n_predict,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
        "id": cid,
        "timings": timing,
    }


def chat_stream_chunks(
    *,
    model_path: str,
    n_predict: int,
    prompt_n: int,
    timing: dict[str, Any],
    created: int,
    cid: str,
    include_usage: bool,
) -> list[bytes]:
    """SSE events of a streamed chat completion, ending in ``data: [DONE]``."""
    base = {
        "created": created,
        "id": cid,
        "model": model_path,
        "system_fingerprint": BUILD_INFO,
        "object": "chat.completion.chunk",
    }

    def ev(obj: dict[str, Any]) -> bytes:
        return b"data: " + dumps(obj) + b"\n\n"

    out = [
        ev(
            {
                "choices": [
                    {
                        "finish_reason": None,
                        "index": 0,
                        "delta": {"role": "assistant", "content": None},
                    }
                ],
                **base,
            }
        )
    ]
    for word in filler(min(n_predict, 64)).split(" ")[1:]:
        out.append(
            ev(
                {
                    "choices": [
                        {"finish_reason": None, "index": 0, "delta": {"content": " " + word}}
                    ],
                    **base,
                }
            )
        )
    usage = {
        "completion_tokens": n_predict,
        "prompt_tokens": prompt_n,
        "total_tokens": prompt_n + n_predict,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    final = {"choices": [{"finish_reason": "length", "index": 0, "delta": {}}], **base}
    if include_usage:
        out.append(ev(final))
        out.append(ev({"choices": [], **base, "usage": usage, "timings": timing}))
    else:
        out.append(ev({**final, "timings": timing}))
    out.append(b"data: [DONE]\n\n")
    return out


def completion_stream_chunks(
    *,
    model_path: str,
    prompt: str,
    n_predict: int,
    prompt_n: int,
    timing: dict[str, Any],
    request: dict[str, Any],
) -> list[bytes]:
    """SSE events of a streamed ``/completion``; the ``stop: true`` one carries ``timings``."""
    out = []
    words = filler(min(n_predict, 64)).split(" ")[1:]
    for i, word in enumerate(words):
        out.append(
            b"data: "
            + dumps(
                {
                    "index": 0,
                    "content": " " + word,
                    "tokens": [],
                    "stop": False,
                    "id_slot": -1,
                    "tokens_predicted": i + 1,
                    "tokens_evaluated": prompt_n,
                }
            )
            + b"\n\n"
        )
    final = completion(
        model_path=model_path,
        prompt=prompt,
        n_predict=n_predict,
        prompt_n=prompt_n,
        timing=timing,
        request=request,
    )
    final["content"] = ""
    out.append(b"data: " + dumps(final) + b"\n\n")
    return out
