"""The poll trace: ``check --record FILE`` appends one JSON line per poll (:meth:`Observation.to_dict`),
``replay`` reads them back. The format's writer and its reader live here together.

Bad input (decided here, and tested in ``tests/test_replay.py``):

- a line that is not JSON, not an observation, or carries a reading of the wrong type → one error
  naming the file and line number (a backtest over a damaged trace would mislead). Only a final line
  without its newline (a ``check`` killed mid-write) is skipped, with a warning;
- blank lines are skipped; an observation not later than the previous one is skipped with a
  warning (the same as the history does).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gpuheal.clock import format_iso
from gpuheal.errors import GpuhealError
from gpuheal.model import Observation

NUMBER_FIELDS = (
    "temp_c",
    "vram_used_mb",
    "vram_total_mb",
    "util_pct",
    "power_w",
    "power_limit_w",
    "endpoint_latency_s",
    "requests_60s",
    "failures_60s",
    "consecutive_timeouts",
    "bench_tok_s",
    "bench_baseline_tok_s",
    # llama-server's own telemetry (issue 12)
    "n_decode_total",
    "tokens_predicted_total",
    "requests_processing",
    "requests_deferred",
    "slots_total",
    "slots_busy",
    "n_ctx",  # Rule 9: the running context from /props (rules/context_window/change)
)
TEXT_FIELDS = ("endpoint", "name", "bench_measured_at", "metrics", "slots")



def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number gpuheal accepts")


def _check_sample(alias: str, sample: Any) -> None:
    if not isinstance(sample, dict):
        raise ValueError(f"gpus.{alias}: not an object")
    for key in NUMBER_FIELDS:
        value = sample.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"gpus.{alias}.{key}: {str(value)[:40]!r} is not a valid reading")
    for key in TEXT_FIELDS:
        value = sample.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"gpus.{alias}.{key}: must be a string")
    breaker = sample.get("breaker")
    if breaker is not None and (not isinstance(breaker, dict) or not isinstance(breaker.get("open"), bool)):
        raise ValueError(f"gpus.{alias}.breaker: must be {{\"open\": true|false, ...}}")
    for key in ("running", "is_sleeping"):
        flag = sample.get(key)
        if flag is not None and not isinstance(flag, bool):
            raise ValueError(f"gpus.{alias}.{key}: must be true or false")


def parse_observation(text: str) -> Observation:
    """One trace line → an Observation; ``ValueError`` naming the problem."""
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ValueError(f"not JSON ({str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if not isinstance(data.get("at"), str):
        raise ValueError("no 'at' time")
    if not isinstance(data.get("monitor_ok"), bool):
        raise ValueError("'monitor_ok' must be true or false")
    gpus = data.get("gpus")
    if not isinstance(gpus, dict):
        raise ValueError("'gpus' must be an object of ALIAS: reading")
    for alias, sample in gpus.items():
        _check_sample(str(alias), sample)
    try:
        return Observation.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not an observation ({type(exc).__name__}: {str(exc)[:80]})") from None


def read_trace(path: Path) -> tuple[list[Observation], list[str]]:
    """The trace's observations, oldest first, and a warning for each line skipped (see the module's
    docstring); :class:`~gpuheal.errors.GpuhealError` for a trace that cannot be read or is damaged."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise GpuhealError(f"trace not found: {path}") from None
    except OSError as exc:
        raise GpuhealError(f"cannot read trace {path}: {exc.strerror}") from None
    lines = raw.split(b"\n")
    complete = raw.endswith(b"\n")
    observations: list[Observation] = []
    warnings: list[str] = []
    last_at = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        is_last = number == len(lines)
        try:
            obs = parse_observation(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            if is_last and not complete:
                warnings.append(f"{path} line {number}: incomplete last line skipped ({exc})")
                continue
            raise GpuhealError(f"{path} line {number}: {exc}") from None
        if last_at is not None and obs.at <= last_at:
            warnings.append(
                f"{path} line {number}: {format_iso(obs.at)} is not after {format_iso(last_at)}; skipped"
            )
            continue
        last_at = obs.at
        observations.append(obs)
    if not observations:
        raise GpuhealError(f"trace {path} holds no observations (record one with `gpuheal check --record FILE`)")
    return observations, warnings


def append(path: Path, obs: Observation) -> None:
    """Append ``obs`` as one line: the line is whole before it is written, so a run killed mid-write leaves at
    most an incomplete last line, which :func:`read_trace` skips."""
    line = json.dumps(obs.to_dict(), separators=(",", ":")) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
