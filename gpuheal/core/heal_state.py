"""``heal-state.json`` as typed, frozen records (issue 10, item 2). Pure: values in, values out.

The file keeps the format earlier releases wrote (``schema_version`` unchanged)::

    {"restarts": {ALIAS: [epoch_s, ...]},
     "attempts": {KEY: ATTEMPT},
     "escalated": {"ALIAS/ISSUE": {"at": epoch_s, "reason": str, "since": ISO}},
     "paused": {"fleet": {"reason", "at"} | None, "gpus": {ALIAS: {"reason", "at"}}},
     "active": {ALIAS: {"actions": [...], "issue": ID, "restore_failures": n,
                        "cool_since": epoch_s}},  # load-side mitigations to undo once cool
     "litellm_restarts": [epoch_s, ...],   # circuit-breaker-status.json "last_reset"
     "service_restarts": {"litellm" | "gpu-monitor": [epoch_s, ...]},  # their restart budget
     "run_seq": {"day": "YYYYMMDD", "n": int}}  # the run id counter before run-ids.json: kept as read
    ATTEMPT = {"key", "gpu", "issue", "since", "n", "actions": [...], "status" (core/verify.py),
               "started_at", "verify_by", "run_id", "verification": {...}, "finished_at",
               "outcome": {"detected", "steps", "evidence"}}  # only while the attempt awaits its verdict

:meth:`HealState.from_json` is the one reader of the file: every command reads it there and gets the
typed record (``tests/test_heal_state_reader.py`` scans that no module reads the file's dict by key).
Reading is field by field (contract: a corrupt state file is survived): a damaged value — a wrong
type, NaN, a 400-digit integer — loses that value only, never the run and never the rest of the
file. Changes are new records (:func:`dataclasses.replace`); nothing here is mutated in place.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuheal.core import timing

HOUR_S = 3600.0
# LiteLLM restart times kept: circuit-breaker-status.json reads only the last ("last_reset")
LITELLM_RESTARTS_KEPT = 50
DAY_S = 86400.0
ATTEMPT_KEEP_S = 8 * DAY_S  # settled attempts are kept this long (the weekly report reads them) ...
MAX_ATTEMPTS_KEPT = 500  # ... and at most this many; open attempts are never dropped
MAX_POWER_W = 10_000.0  # a board power limit beyond this is damage (parse/gpu_data's bound)
MAX_COUNT = 1_000_000  # an attempt number or failure count beyond this is damage, read as 0


def num(value: Any) -> float | None:
    """A finite number, else ``None`` (``True``, ``"5"``, NaN, and ints too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if math.isfinite(out) else None


def count(value: Any) -> int:
    n = num(value)
    return int(n) if n is not None and 0 <= n <= MAX_COUNT else 0


def _times(value: Any) -> tuple[float, ...]:
    return tuple(t for t in (num(v) for v in value) if t is not None) if isinstance(value, list) else ()


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return str(value) if isinstance(value, int | float) else None


def _names(value: Any) -> tuple[str, ...]:
    return tuple(a for a in value if isinstance(a, str)) if isinstance(value, list) else ()


@dataclass(frozen=True)
class Attempt:
    """One remediation attempt of one occurrence (``since``) of one (gpu, issue)."""

    key: str  # "gpu/issue/since/n": deterministic, so a reserved attempt is never repeated
    gpu: str
    issue: str
    since: str | None
    n: int
    actions: tuple[str, ...]
    status: str
    started_at: float | None = None
    verify_by: float | None = None  # missing: judged at once (failed), never waited on forever
    run_id: str | None = None
    verification: dict[str, Any] | None = None
    finished_at: float | None = None
    # what its one outcome line will carry (detected, steps, evidence), kept while it awaits its verdict
    outcome: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, key: str, value: Any) -> Attempt | None:
        if not isinstance(value, dict) or not isinstance(value.get("gpu"), str):
            return None
        if not isinstance(value.get("issue"), str):
            return None
        status = value.get("status")
        verification = value.get("verification")
        return cls(
            key=value["key"] if isinstance(value.get("key"), str) else str(key),
            gpu=value["gpu"],
            issue=value["issue"],
            since=_text(value.get("since")),
            n=count(value.get("n")),
            actions=_names(value.get("actions")),
            status=status if isinstance(status, str) else "superseded",
            started_at=num(value.get("started_at")),
            verify_by=num(value.get("verify_by")),
            run_id=_text(value.get("run_id")),
            verification=verification if isinstance(verification, dict) else None,
            finished_at=num(value.get("finished_at")),
            outcome=value["outcome"] if isinstance(value.get("outcome"), dict) else None,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": self.key,
            "gpu": self.gpu,
            "issue": self.issue,
            "since": self.since,
            "n": self.n,
            "actions": list(self.actions),
            "status": self.status,
        }
        for name in ("started_at", "verify_by", "run_id", "verification", "finished_at", "outcome"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass(frozen=True)
class Escalation:
    """The humans have (gpu, issue): nothing more is tried until it resolves or is cleared."""

    at: float | None
    reason: str
    since: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> Escalation | None:
        if not isinstance(value, dict):
            return None
        return cls(num(value.get("at")), str(_text(value.get("reason")) or ""), _text(value.get("since")))

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at, "reason": self.reason, "since": self.since}


@dataclass(frozen=True)
class Pause:
    reason: str = "maintenance"
    at: str | None = None  # ISO 8601, as `gpuheal pause` writes it

    @classmethod
    def from_json(cls, value: Any) -> Pause | None:
        if not isinstance(value, dict):
            return None
        return cls(str(_text(value.get("reason")) or "maintenance"), _text(value.get("at")))

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "at": self.at}


@dataclass(frozen=True)
class Mitigation:
    """Load-side mitigations of one GPU, to undo once it stayed cool (``restore-load``)."""

    actions: tuple[str, ...]
    issue: str = ""  # the issue whose fix shed the load; "" when not recorded (the heal step names the likeliest)
    restore_failures: int = 0
    cool_since: float | None = None
    # the built-in LiteLLM change to undo: the deployment's field and the value found before the
    # first change (issue 11: restore puts back exactly what was there). None: LiteLLM unchanged.
    restore: tuple[str, str, float] | None = None  # (model_id, field, value)
    # the board power limit before the first thermal power cap (issue 27 item 7), put back by
    # restore-power-limit; None: the power limit was not changed
    power_w: float | None = None
    # LiteLLM's config file a redirect rewrote (its original kept beside it), put back by restore-load
    litellm_config: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> Mitigation | None:
        if not isinstance(value, dict):
            return None
        issue = _text(value.get("issue"))
        power_w = num(value.get("power_w"))
        return cls(
            _names(value.get("actions")),
            issue or "",
            count(value.get("restore_failures")),
            num(value.get("cool_since")),
            _restore(value.get("restore")),
            power_w if power_w is not None and 0 < power_w <= MAX_POWER_W else None,  # never a damaged watt
            _path(value.get("litellm_config")),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "actions": list(self.actions),
            "issue": self.issue,
            "restore_failures": self.restore_failures,
        }
        if self.cool_since is not None:
            out["cool_since"] = self.cool_since
        if self.restore is not None:
            model_id, field_name, value = self.restore
            out["restore"] = {"model_id": model_id, "field": field_name, "value": value}
        if self.power_w is not None:
            out["power_w"] = self.power_w
        if self.litellm_config is not None:
            out["litellm_config"] = self.litellm_config
        return out


def _path(value: Any) -> str | None:
    """An absolute file path as stored (a damaged one is dropped: never a guess at which file to restore)."""
    if isinstance(value, str) and value.startswith("/") and len(value) <= 4096 and "\x00" not in value:
        return value
    return None


def _restore(value: Any) -> tuple[str, str, float] | None:
    """A damaged ``restore`` entry is dropped field by field: never a guess at a LiteLLM value."""
    if not isinstance(value, dict):
        return None
    model_id, field_name, number = _text(value.get("model_id")), value.get("field"), num(value.get("value"))
    if not model_id or field_name not in ("weight", "rpm") or number is None or number < 0:
        return None
    return model_id, field_name, number


@dataclass(frozen=True)
class HealState:
    restarts: dict[str, tuple[float, ...]] = field(default_factory=dict)
    attempts: dict[str, Attempt] = field(default_factory=dict)
    escalated: dict[str, Escalation] = field(default_factory=dict)
    paused_fleet: Pause | None = None
    paused_gpus: dict[str, Pause] = field(default_factory=dict)
    active: dict[str, Mitigation] = field(default_factory=dict)
    litellm_restarts: tuple[float, ...] = ()
    service_restarts: dict[str, tuple[float, ...]] = field(default_factory=dict)
    run_day: str | None = None  # run_seq, as read (the state directory numbers runs now, state/store.py)
    run_n: int = 0
    # run_seq exactly as the old counter wrote it ("YYYYMMDD", an int under MAX_COUNT): only then does
    # the state directory carry on from it (a damaged counter starts the day over); not written back
    run_seq_exact: bool = field(default=False, compare=False)

    @classmethod
    def from_json(cls, data: Any) -> HealState:
        """A damaged heal state loses the damaged part only, never the run."""
        if not isinstance(data, dict):
            return cls()

        def section(name: str) -> dict[str, Any]:
            value = data.get(name)
            return value if isinstance(value, dict) else {}

        def typed(name: str, reader: Callable[[Any], Any]) -> dict[str, Any]:
            return {k: v for k, v in ((k, reader(v)) for k, v in section(name).items()) if v is not None}

        paused = section("paused")
        stored = paused.get("gpus")
        gpus = stored if isinstance(stored, dict) else {}
        seq = section("run_seq")
        return cls(
            restarts={a: _times(ts) for a, ts in section("restarts").items() if isinstance(ts, list)},
            attempts={k: a for k, a in ((k, Attempt.from_json(k, v)) for k, v in section("attempts").items()) if a},
            escalated={k: e for k, e in typed("escalated", Escalation.from_json).items() if "/" in k},
            paused_fleet=Pause.from_json(paused.get("fleet")),
            paused_gpus={a: p for a, p in ((a, Pause.from_json(v)) for a, v in gpus.items()) if p},
            active=typed("active", Mitigation.from_json),
            litellm_restarts=_times(data.get("litellm_restarts")),
            service_restarts={s: _times(ts) for s, ts in section("service_restarts").items() if isinstance(ts, list)},
            run_day=seq["day"] if isinstance(seq.get("day"), str) else None,
            run_n=count(seq.get("n")) if isinstance(seq.get("day"), str) else 0,
            run_seq_exact=_run_seq_exact(seq),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "restarts": {a: list(ts) for a, ts in self.restarts.items()},
            "attempts": {k: a.to_json() for k, a in self.attempts.items()},
            "escalated": {k: e.to_json() for k, e in self.escalated.items()},
            "paused": self.paused_to_json(),
            "active": {a: m.to_json() for a, m in self.active.items()},
            "run_seq": {"day": self.run_day, "n": self.run_n} if self.run_day is not None else {},
            "litellm_restarts": list(self.litellm_restarts),
            "service_restarts": {s: list(ts) for s, ts in self.service_restarts.items()},
        }

    # ------------------------------------------------------------------ queries
    def paused_to_json(self) -> dict[str, Any]:
        """``paused`` as stored (and as ``gpuheal pause --json`` shows it)."""
        return {
            "fleet": self.paused_fleet.to_json() if self.paused_fleet else None,
            "gpus": {a: p.to_json() for a, p in self.paused_gpus.items()},
        }

    @property
    def run_counter(self) -> tuple[str, int] | None:
        """The old run counter (day, n) when it was stored exactly; ``None`` starts the day over."""
        return (self.run_day, self.run_n) if self.run_day is not None and self.run_seq_exact else None

    def restarts_in_window(
        self, alias: str, now_s: float, window_s: float = HOUR_S, tol: float = timing.TOLERANCE_S
    ) -> int:
        """Restarts of ``alias`` in the trailing window (the restarts-per-hour budget), counted in
        polls (core/timing): one made an hour of polls ago frees its slot at the same poll at any clock."""
        return sum(1 for t in self.restarts.get(alias, ()) if timing.within_last(now_s, t, window_s, tol))

    def last_restart(self, alias: str) -> float | None:
        times = self.restarts.get(alias) or ()
        return max(times) if times else None

    def attempts_for(self, gpu: str, issue: str, since: str | None = None) -> list[Attempt]:
        out = [a for a in self.attempts.values() if a.gpu == gpu and a.issue == issue]
        if since is not None:
            out = [a for a in out if a.since == since]
        return sorted(out, key=lambda a: a.n)

    def tried(self, gpu: str, issue: str, since: str | None) -> list[str]:
        """What was tried for one occurrence, as an alert lists it."""
        return [f"attempt {a.n}: {'+'.join(a.actions)} → {a.status}" for a in self.attempts_for(gpu, issue, since)]

    def paused_reason(self, gpu: str) -> str | None:
        if self.paused_fleet:
            return f"fleet paused ({self.paused_fleet.reason})"
        own = self.paused_gpus.get(gpu)
        return f"{gpu} paused ({own.reason})" if own else None

    # ------------------------------------------------------------------ changes (new records)
    def with_attempt(self, attempt: Attempt) -> HealState:
        return replace(self, attempts={**self.attempts, attempt.key: attempt})

    def with_escalation(self, key: str, escalation: Escalation | None) -> HealState:
        escalated = {k: v for k, v in self.escalated.items() if k != key}
        if escalation is not None:
            escalated[key] = escalation
        return replace(self, escalated=escalated)

    def with_pause(self, gpu: str | None, pause: Pause | None) -> HealState:
        """``gpuheal pause``: ``gpu`` ``None`` is the whole fleet; ``pause`` ``None`` resumes."""
        if gpu is None:
            return replace(self, paused_fleet=pause)
        gpus = dict(self.paused_gpus)
        if pause is None:
            gpus.pop(gpu, None)
        else:
            gpus[gpu] = pause
        return replace(self, paused_gpus=gpus)

    def with_litellm_restart(self, at_s: float) -> HealState:
        """One more LiteLLM restart; only the last :data:`LITELLM_RESTARTS_KEPT` are kept."""
        return replace(self, litellm_restarts=(*self.litellm_restarts[-(LITELLM_RESTARTS_KEPT - 1) :], at_s))

    def with_mitigation(self, alias: str, mitigation: Mitigation | None) -> HealState:
        active = {k: v for k, v in self.active.items() if k != alias}
        if mitigation is not None:
            active[alias] = mitigation
        return replace(self, active=active)

    def pruned(self, now_s: float, open_statuses: frozenset[str]) -> HealState:
        """Settled attempts older than ``ATTEMPT_KEEP_S`` (or beyond ``MAX_ATTEMPTS_KEPT``) and
        restart times older than a day are forgotten; open attempts never are."""
        kept = {
            k: a
            for k, a in self.attempts.items()
            if a.status in open_statuses or now_s - (a.started_at or 0.0) <= ATTEMPT_KEEP_S
        }
        if len(kept) > MAX_ATTEMPTS_KEPT:
            oldest = sorted(kept, key=lambda k: kept[k].started_at or 0.0)[: len(kept) - MAX_ATTEMPTS_KEPT]
            kept = {k: a for k, a in kept.items() if k not in oldest or a.status in open_statuses}

        def recent(book: dict[str, tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
            out = {alias: tuple(t for t in ts if now_s - t < DAY_S) for alias, ts in book.items()}
            return {alias: ts for alias, ts in out.items() if ts}

        return replace(
            self, attempts=kept, restarts=recent(self.restarts), service_restarts=recent(self.service_restarts)
        )


def _run_seq_exact(seq: dict[str, Any]) -> bool:
    day, n = seq.get("day"), seq.get("n")
    return isinstance(day, str) and re.fullmatch(r"\d{8}", day) is not None and type(n) is int and 0 <= n < MAX_COUNT


def empty_state() -> dict[str, Any]:
    """A new heal state in its stored format (what a first run writes)."""
    return HealState().to_json()
