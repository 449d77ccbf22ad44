"""A promtool-like notation for rule tests: write a poll series compactly, get Observations.

Series (one token per poll, or a token that expands to several; promtool's expanding notation):

    "84 86 87"      three polls
    "64+3x4"        64 67 70 73 76        (a+bxn: n+1 values)
    "90-2x3"        90 88 86 84
    "86x2"          86 86 86              (axn = a+0xn)
    "_"             a missing value ("not known") for this poll
    "_x3"           three missing values
    "ok refused*3"  words (endpoint states); word*n repeats a word (or a number) n times

``fleet_trace`` builds one Observation per poll (60 s apart by default) for a config: every GPU
starts healthy (``HEALTHY`` plus the config's VRAM total) and each named field follows its series.
Special fields: ``present`` ("1 1 _ 1": the GPU missing from a poll), ``breaker`` (0/1: LiteLLM's
breaker, ``breaker_opened_at`` a datetime), ``bench_tok_s`` (a monitor benchmark measured at that
poll). ``monitor`` ("1 1 0 0") makes gpu-monitor unusable at the polls with 0: every monitor-fed
field is then ``None`` and a monitor fault is recorded.
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuheal.config import Config, load_config_dict
from gpuheal.model import UNREACHABLE_STATES, Breaker, DataFault, GpuSample, Observation

START = datetime(2026, 7, 18, 8, 0, 0, tzinfo=UTC)
HEALTHY: dict[str, Any] = {
    "temp_c": 60.0,
    "vram_used_mb": 10000.0,
    "util_pct": 50.0,
    "power_w": 150.0,
    "power_limit_w": 350.0,
    "endpoint": "ok",
    "requests_60s": 10,
    "failures_60s": 0,
    "consecutive_timeouts": 0,
}
MONITOR_FIELDS = (
    "temp_c",
    "vram_used_mb",
    "vram_total_mb",
    "util_pct",
    "power_w",
    "power_limit_w",
    "requests_60s",
    "failures_60s",
    "consecutive_timeouts",
    "breaker",
    "bench_tok_s",
    "bench_measured_at",
    "name",
    "running",
)
INT_FIELDS = ("requests_60s", "failures_60s", "consecutive_timeouts")

_EXPAND = re.compile(r"^(-?\d+(?:\.\d+)?)(?:([+-])(\d+(?:\.\d+)?))?x(\d+)$")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")


def _num(text: str) -> float:
    value = float(text)
    return int(value) if value.is_integer() and "." not in text else value


def parse(text: str) -> list[Any]:
    """Expand a series; numbers become int/float, ``_`` None, anything else stays a word."""
    out: list[Any] = []
    for token in text.split():
        if token == "_":
            out.append(None)
        elif token.startswith("_x"):
            out.extend([None] * int(token[2:]))
        elif "*" in token:
            word, count = token.rsplit("*", 1)
            value = None if word == "_" else (_num(word) if _NUMBER.match(word) else word)
            out.extend([value] * int(count))
        elif m := _EXPAND.match(token):
            start, sign, step, n = m.groups()
            a = float(start)
            b = float(step or 0) * (-1 if sign == "-" else 1)
            out.extend(a + i * b for i in range(int(n) + 1))
        elif _NUMBER.match(token):
            out.append(_num(token))
        else:
            out.append(token)
    return out


FLEET_YAML: dict[str, Any] = {
    "monitor": {"url": "http://127.0.0.1:9/gpu-data"},
    "gpus": [
        {"alias": "gpu-dense", "host": "ct8", "endpoint": "http://127.0.0.1:18081", "vendor": "nvidia",
         "vram_total_mb": 24576, "baseline_tok_s": 74.8, "vram_leak_mb_per_hour": 300,
         "role": "heavy reasoning", "weight": 0.55, "n_ctx": 131072, "transport": "local"},
        {"alias": "gpu-light", "host": "ct110", "endpoint": "http://127.0.0.1:18082", "vendor": "nvidia",
         "vram_total_mb": 12288, "baseline_tok_s": 165.2, "vram_leak_mb_per_hour": 300,
         "role": "vision, light tasks", "weight": 0.15, "n_ctx": 131072, "transport": "local"},
        {"alias": "strix-moe", "host": "ct15", "endpoint": "http://127.0.0.1:18083", "vendor": "amd",
         "vram_total_mb": 65536, "baseline_tok_s": 70.5, "vram_leak_mb_per_hour": 200,
         "role": "long docs", "weight": 0.30, "n_ctx": 131072, "transport": "local",
         "rules": {"context-window": {"settling": True}}},
    ],
}


def fleet_config(rules: dict[str, Any] | None = None, gpus: list[dict[str, Any]] | None = None, **extra: Any) -> Config:
    """The spec's three-GPU fleet on loopback addresses (optionally with fleet ``rules``)."""
    import copy

    data = copy.deepcopy(FLEET_YAML)
    if gpus is not None:
        data["gpus"] = gpus
    if rules:
        data["rules"] = rules
    data.update(extra)
    return load_config_dict(data)


def fleet_trace(
    cfg: Config,
    gpus: dict[str, dict[str, Any]] | None = None,
    monitor: str | None = None,
    n: int | None = None,
    start: datetime = START,
    step_s: float = 60.0,
) -> list[Observation]:
    gpus = gpus or {}
    series: dict[str, dict[str, list[Any]]] = {}
    lengths = []
    for alias, fields in gpus.items():
        series[alias] = {}
        for key, text in fields.items():
            if isinstance(text, str):
                series[alias][key] = parse(text)
                lengths.append(len(series[alias][key]))
    mon = parse(monitor) if monitor else None
    if mon is not None:
        lengths.append(len(mon))
    if n is None:
        if not lengths:
            raise ValueError("give n or at least one series")
        n = max(lengths)

    def at(values: list[Any] | None, i: int, default: Any) -> Any:
        if values is None:
            return default
        return values[i] if i < len(values) else values[-1]

    out = []
    for i in range(n):
        t = start + timedelta(seconds=step_s * i)
        monitor_ok = bool(at(mon, i, 1)) if mon is not None else True
        faults: list[DataFault] = []
        if not monitor_ok:
            faults.append(DataFault("monitor", "refused", "connection refused"))
        samples: dict[str, GpuSample] = {}
        for gpu in cfg.gpus:
            s = series.get(gpu.alias, {})
            extra = gpus.get(gpu.alias, {})
            if "present" in s and at(s["present"], i, 1) is None:
                continue
            values = dict(HEALTHY, vram_total_mb=gpu.vram_total_mb)
            if gpu.weight is not None:  # traffic in proportion to the weights: Rule 10 stays quiet
                values["requests_60s"] = round(40 * gpu.weight)
            for key, vals in s.items():
                if key in ("present", "breaker", "bench_tok_s"):
                    continue
                values[key] = at(vals, i, None)
            for key in INT_FIELDS:
                if values.get(key) is not None:
                    values[key] = int(values[key])
            if "breaker" in s:
                b = at(s["breaker"], i, None)
                values["breaker"] = None if b is None else Breaker(open=bool(b), opened_at=extra.get("breaker_opened_at") if b else None)
            if "bench_tok_s" in s:
                b = at(s["bench_tok_s"], i, None) if i < len(s["bench_tok_s"]) else None
                if b is not None:
                    values["bench_tok_s"] = float(b)
                    values["bench_measured_at"] = t
            if not monitor_ok:
                for key in MONITOR_FIELDS:
                    values.pop(key, None)
            state = values.get("endpoint")
            if state in UNREACHABLE_STATES:
                faults.append(DataFault(gpu.alias, state, "connection refused"))
            samples[gpu.alias] = GpuSample(**values)
        out.append(Observation(at=t, gpus=samples, monitor_ok=monitor_ok, faults=tuple(faults)))
    return out


# Real time is not whole seconds (issue 9): cron starts gpuheal 0.2-1.5 s after the minute, and now
# and then a poll is 2 s late. Every series run is also replayed under such clocks, and must give
# the same transitions at the same polls. Fixed seeds (reproducible); GPUHEAL_JITTER_SEEDS adds more.
JITTER_SEEDS = (1, 2, *(int(s) for s in os.environ.get("GPUHEAL_JITTER_SEEDS", "").split(",") if s.strip()))


def cron_clock(observations: list[Observation], seed: int, late_s: float = 2.0) -> list[Observation]:
    """``observations`` polled by a cron-like clock: each poll starts 0-1.5 s after its whole-second
    time (drawn, to the microsecond), one in eight a further ``late_s`` late. Seed 0 is the worst
    case for rounding: every offset is just past a half millisecond, so a stored time rounded to the
    millisecond lands after ``now`` (the bug of issue 9 point 1)."""
    rng = random.Random(seed)
    out = []
    for obs in observations:
        if seed == 0:
            offset = rng.randrange(0, 1500) / 1000 + 0.0006
        else:
            offset = rng.randrange(0, 1_500_001) / 1e6
        if rng.random() < 0.125:
            offset += late_s
        out.append(replace(obs, at=obs.at + timedelta(seconds=offset)))
    return out


def timing(result) -> list[tuple[int, str, str, str]]:
    """What a clock must not change: which transition happened at which poll."""
    return events(result)


def run(cfg: Config, observations: list[Observation], jitter: bool = True):
    """Replay in memory (the code ``check`` runs); returns the ReplayResult (of the given clock).

    With ``jitter`` (the default) the same polls are also replayed under cron-like clocks
    (:func:`cron_clock`, seeds 0 and :data:`JITTER_SEEDS`), and each must give the same transitions
    at the same polls: a poll a second early or late never changes when a rule fires (issue 9)."""
    from gpuheal.steps.replay import replay

    result = replay(cfg, observations)
    if jitter:
        want = timing(result)
        for seed in (0, *JITTER_SEEDS):
            got = timing(replay(cfg, cron_clock(observations, seed)))
            assert got == want, f"cron-like clock (seed {seed}) changed the timeline:\n{got}\nwhole seconds:\n{want}"
    return result


def polls(result, gpu: str, issue: str, event: str = "firing") -> list[int]:
    """Poll indexes at which (gpu, issue) had ``event`` (pending|firing|resolved|dropped)."""
    return [t["poll"] for t in result.timeline if t["gpu"] == gpu and t["issue"] == issue and t["event"] == event]


def events(result) -> list[tuple[int, str, str, str]]:
    """The whole timeline as (poll, gpu, issue, event) tuples."""
    return [(t["poll"], t["gpu"], t["issue"], t["event"]) for t in result.timeline]


def fired(result) -> set[tuple[str, str]]:
    return {(t["gpu"], t["issue"]) for t in result.timeline if t["event"] == "firing"}
