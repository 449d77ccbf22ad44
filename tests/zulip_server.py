"""A loopback Zulip look-alike: ``POST /api/v1/messages`` as formats.md §5 describes it.

Speaks the real contract — HTTP basic auth (bot email + API key), a form-encoded body with
``type``/``to``/``topic``/``content``, ``{"result": "success", "msg": "", "id": N}`` — and can be
told to misbehave, per request, in the ways that matter to ``gpuheal escalate``:

* ``"ok"`` — accept (content over 10,000 characters and topics over 60 are truncated the way
  Zulip does it, so a test can tell whether gpuheal respected the limits itself);
* ``("429", seconds)`` — ``RATE_LIMIT_HIT`` with ``retry-after`` in the body and the header;
* ``"401"`` — ``INVALID_API_KEY`` (a wrong key gets this in ``"ok"`` mode too);
* ``"500"`` — an HTML 500 from a proxy in front;
* ``"hang"`` — accept the connection and never answer (until the server stops);
* ``"400-stream"`` — ``STREAM_DOES_NOT_EXIST``.

``server.script`` is a list of modes used one per request; when it is empty ``server.mode``
applies. ``server.messages`` holds every accepted message, ``server.requests`` every request.

Run it by hand (or from the demo) with ``python tests/zulip_server.py --port 9925``: it prints
each accepted message and, with ``--out FILE``, appends it as a JSON line.
"""

from __future__ import annotations

import json
from typing import Any

from gpuheal.sim.zulip import (  # noqa: E402,F401  (the look-alike lives with the simulator)
    DEFAULT_EMAIL,
    DEFAULT_KEY,
    MAX_MESSAGE_LENGTH,
    MAX_TOPIC_LENGTH,
    ZulipLookalike,
    free_port,
    main,
)

FLEET = [
    {"alias": "gpu-dense", "host": "ct8", "endpoint": "http://127.0.0.1:9", "baseline_tok_s": 74.8, "vram_total_mb": 24576},
    {"alias": "gpu-light", "host": "ct110", "endpoint": "http://127.0.0.1:9", "baseline_tok_s": 165.2, "vram_total_mb": 12288},
    {"alias": "strix-moe", "host": "ct15", "endpoint": "http://127.0.0.1:9", "baseline_tok_s": 70.5, "vram_total_mb": 65536, "vendor": "amd"},
]


def config_dict(site: str | None = None, **sections: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"gpus": [dict(g) for g in FLEET], "zulip": {"site": site, "timeout_s": 2}}
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key].update(value)
        else:
            cfg[key] = value
    return cfg


def runtime(cfg: dict[str, Any], state_dir, now, path: str | None = None):
    from gpuheal.config import load_config_dict
    from gpuheal.runtime import Runtime

    return Runtime(cfg=load_config_dict(cfg, path=path), state_dir=state_dir, now=now)


def alert(gpu: str, issue: str | None, kind: str = "escalated", since: str = "2026-07-18T06:00:00Z", created_at: float = 0.0, **extra: Any) -> dict[str, Any]:
    """An alert shaped like ``heal`` queues it (gpuheal/steps/heal.py ``_queue``)."""
    from gpuheal import alerts as alertq

    base = {
        "fingerprint": alertq.fingerprint(gpu, issue),
        "gpu": gpu,
        "issue": issue,
        "kind": kind,
        "state_key": f"{kind}:{since}",
        "created_at": created_at,
        "run_id": "gpu-self-heal-20260718-004",
        "detected": {"failures_60s": 12, "requests_60s": 14},
        "tried": ["attempt 1: restart-llama-server → failed", "attempt 2: restart-llama-server → failed", "attempt 3: restart-llama-server → failed"],
        "attempts": 3,
        "since": since,
        "summary": "3 failed verifications; escalating",
    }
    base.update(extra)
    return base


def seed(state_dir, name: str, data: Any, raw: bool = False) -> None:
    """Write a state file the way gpuheal does (``{"schema_version": 1, "data": ...}``)."""
    from pathlib import Path

    path = Path(state_dir)
    path.mkdir(parents=True, exist_ok=True)
    doc = data if raw else {"schema_version": 1, "data": data}
    (path / name).write_text(json.dumps(doc))


def read_state(state_dir, name: str) -> Any:
    from pathlib import Path

    doc = json.loads((Path(state_dir) / name).read_text())
    return doc.get("data", doc)


def health_doc(issues: list[tuple[str, str]] | None = None, status: str | None = None, at: str = "2026-07-18T08:00:00Z") -> dict[str, Any]:
    issues = issues or []
    return {
        "schema_version": 1,
        "status": status or ("down" if issues else "healthy"),
        "issues": [
            {"gpu": g, "issue": i, "severity": "critical", "state": "firing", "since": "2026-07-18T06:00:00Z", "detected": {}}
            for g, i in issues
        ],
        "actions": [],
        "generated_at": at,
        "gpus": {
            "gpu-dense": {"temp_c": 64, "vram_used_mb": 21600, "vram_total_mb": 24576, "util_pct": 87, "power_w": 281.4, "endpoint": "ok"},
            "gpu-light": {"temp_c": None, "vram_used_mb": None, "vram_total_mb": 12288, "util_pct": None, "power_w": None, "endpoint": "refused"},
        },
        "faults": [],
        "warnings": [],
    }



def simulated_week(state_dir, now) -> None:
    """A deterministic fortnight for the weekly report: bench results every 6 h (gpu-light slows
    down this week: a >10 % regression; strix-moe has no previous week and a day without data),
    and an audit trail with a resolved model-stuck, an escalated host-unreachable that later
    resolved, a resolved thermal-critical, an open vram-leak, and junk lines."""
    from pathlib import Path

    from gpuheal.clock import format_iso

    t_now = now.timestamp()
    day = 86400.0
    results: dict[str, list[dict[str, Any]]] = {"gpu-dense": [], "gpu-light": [], "strix-moe": []}
    for i in range(56):  # 14 days x 4
        at = t_now - 14 * day + (i + 0.5) * day / 4
        this_week = at >= t_now - 7 * day
        wobble = (i % 4) * 0.3 + ((i // 4) % 3) * 0.5
        results["gpu-dense"].append({"at": at, "gen_tok_s": round(74.2 + wobble, 2), "ok": True, "source": "bench"})
        light = 140.0 + (i % 3) if this_week else 165.0 + (i % 3)
        results["gpu-light"].append({"at": at, "gen_tok_s": float(light), "ok": True, "source": "bench"})
        if this_week and not (t_now - 4 * day <= at < t_now - 3 * day):
            results["strix-moe"].append({"at": at, "gen_tok_s": round(62.9 + (i % 5) * 0.4, 2), "ok": True, "source": "bench"})
    results["gpu-dense"].append({"at": t_now - 2 * day + 60, "gen_tok_s": None, "ok": False, "error": "timeout", "source": "bench"})
    results["gpu-dense"].sort(key=lambda r: r["at"])
    bench = {"results": results, "baselines": {"gpu-dense": {"baseline_tok_s": 74.6, "source": "rolling-30d", "computed_at": t_now - 3 * day, "n": 40}}}
    seed(state_dir, "bench-results.json", bench)

    def ts(offset_s: float) -> str:
        return format_iso(datetime_from(t_now + offset_s))

    def rec(offset_s, run, gpu, issue, action, result, phase, escalated=False, **extra):
        r = {"run_id": run, "timestamp": ts(offset_s), "gpu": gpu, "issue": issue, "detected": extra.pop("detected", {}),
             "action": action, "result": result, "verification": extra.pop("verification", None), "escalated": escalated, "phase": phase}
        r.update(extra)
        return json.dumps(r)

    d = day
    lines = [
        # last week, before the period: noise the report must leave out
        rec(-9 * d, "gpu-self-heal-20260709-001", "gpu-dense", "thermal-critical", "shed-load", "pending", "intent", attempt=1),
        rec(-9 * d + 300, "gpu-self-heal-20260709-001", "gpu-dense", "thermal-critical", "shed-load", "resolved", "verification", attempt=1),
        # model-stuck on gpu-dense: restart, verified after 4 min
        rec(-6 * d, "gpu-self-heal-20260712-003", "gpu-dense", "model-stuck", "restart-llama-server", "pending", "intent", attempt=1,
            detected={"failures_60s": 12, "requests_60s": 14, "since": ts(-6 * d - 120)}),
        rec(-6 * d + 20, "gpu-self-heal-20260712-003", "gpu-dense", "model-stuck", "restart-llama-server", "pending", "outcome", attempt=1),
        rec(-6 * d + 120, "gpu-self-heal-20260712-003", "gpu-dense", "model-stuck", "restart-llama-server", "resolved", "verification", attempt=1,
            verification={"resolved_after_s": 120}),
        "this is not json",
        # host-unreachable on gpu-light: three failed restarts, escalated, back 3 h later
        *[
            rec(-4 * d + k * 600, f"gpu-self-heal-20260714-00{k + 1}", "gpu-light", "host-unreachable", "restart-llama-server", "failed", "outcome", attempt=k + 1)
            for k in range(3)
        ],
        rec(-4 * d + 1800, "gpu-self-heal-20260714-004", "gpu-light", "host-unreachable", "alert", "escalated", "outcome", escalated=True),
        rec(-4 * d + 3 * 3600, "gpu-self-heal-20260714-009", "gpu-light", "host-unreachable", "alert", "resolved", "verification"),
        '{"truncated": ',
        "[1, 2, 3]",
        # thermal-critical on strix-moe: load shed, cooled in 6 min
        rec(-2 * d, "gpu-self-heal-20260716-002", "strix-moe", "thermal-critical", "shed-load+redirect-traffic", "pending", "intent", attempt=1),
        rec(-2 * d + 360, "gpu-self-heal-20260716-002", "strix-moe", "thermal-critical", "shed-load+redirect-traffic", "resolved", "verification", attempt=1),
        # vram-leak on gpu-dense: still open
        rec(-3600, "gpu-self-heal-20260718-001", "gpu-dense", "vram-leak", "restart-llama-server-memcap", "pending", "outcome", attempt=1),
    ]
    path = Path(state_dir) / "gpu-self-heal-log.jsonl"
    path.write_text("\n".join(lines) + "\n")


def datetime_from(epoch: float):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC)
