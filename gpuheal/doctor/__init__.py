"""``gpuheal doctor``: prove every path the configuration would use before 3 a.m. (issue 11;
contract: "Preflight: gpuheal doctor").

A check is a :class:`Probe`: a target (``monitor``, ``litellm``, ``zulip``, ``state``,
``prometheus`` or a GPU alias), a name, a deadline and a function returning one or more
:class:`Check` rows. Probes are grouped in *stages*; every probe of a stage runs at once in its own
daemon thread, and a stage ends when each probe has answered or passed its own deadline (a probe
past it becomes one ``fail`` row "no answer within N s"). So a dead fleet costs about one deadline
per stage, never one per check.

Adding a check (e.g. Prometheus): write ``def my_probes(ctx) -> Iterable[Probe]`` and decorate it
with ``@register("network")``; it runs in that stage with every other probe. Nothing here changes
anything on a target: a probe reads, asks, or runs a read-only command (``command -v``,
``systemctl cat``, ``sudo -n true``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuheal.config.model import Config

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STAGES = ("local", "network")
#: a probe's thread gets this long past its deadline before its row says it never answered
GRACE_S = 1.0


@dataclass(frozen=True)
class Check:
    """One row of the doctor's answer (contract: ``{target, check, status, detail, fix}``)."""

    target: str
    check: str
    status: str
    detail: str = ""
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Probe:
    target: str
    check: str
    deadline_s: float
    run: Callable[[], Check | Iterable[Check]]


@dataclass
class Context:
    """What the probes share: the config, the environment lookups, the transports of this run."""

    cfg: Config
    state_dir: Path | str
    environ: dict[str, str] | None = None
    extras: dict[str, Any] = field(default_factory=dict)


Provider = Callable[[Context], Iterable[Probe]]
_REGISTRY: dict[str, list[Provider]] = {stage: [] for stage in STAGES}


def register(stage: str) -> Callable[[Provider], Provider]:
    """Add a provider of probes to ``stage`` (``local`` runs first, then ``network``)."""
    if stage not in _REGISTRY:
        raise ValueError(f"unknown doctor stage {stage!r} (one of {', '.join(STAGES)})")

    def add(fn: Provider) -> Provider:
        if fn not in _REGISTRY[stage]:
            _REGISTRY[stage].append(fn)
        return fn

    return add


def providers(stage: str) -> list[Provider]:
    return list(_REGISTRY[stage])


def _rows(probe: Probe, value: Check | Iterable[Check]) -> list[Check]:
    return [value] if isinstance(value, Check) else list(value)


def run_stage(probes: list[Probe], clock: Callable[[], float] = time.monotonic) -> list[Check]:
    """Run every probe at once; each gets its own deadline (+ :data:`GRACE_S`)."""
    results: list[list[Check] | None] = [None] * len(probes)
    done = [threading.Event() for _ in probes]

    def work(i: int, probe: Probe) -> None:
        try:
            results[i] = _rows(probe, probe.run())
        except Exception as exc:  # noqa: BLE001 - a bug in one probe is one row, not a traceback
            results[i] = [
                Check(
                    probe.target,
                    probe.check,
                    FAIL,
                    f"the check itself failed: {type(exc).__name__}: {str(exc)[:160]}",
                    "please report this (gpuheal -vv doctor logs more)",
                )
            ]
        finally:
            done[i].set()

    started = clock()
    for i, probe in enumerate(probes):
        threading.Thread(target=work, args=(i, probe), name=f"doctor-{probe.check}", daemon=True).start()
    rows: list[Check] = []
    for i, probe in enumerate(probes):
        left = started + probe.deadline_s + GRACE_S - clock()
        if done[i].wait(max(0.0, left)) and results[i] is not None:
            rows.extend(results[i])  # type: ignore[arg-type]
        else:
            rows.append(
                Check(
                    probe.target,
                    probe.check,
                    FAIL,
                    f"no answer within {probe.deadline_s:g} s",
                    "check that the target is up and reachable from here",
                )
            )
    return rows


def run_all(ctx: Context) -> list[Check]:
    rows: list[Check] = []
    for stage in STAGES:
        probes = [p for provider in providers(stage) for p in provider(ctx)]
        rows.extend(run_stage(probes))
    return rows


# --------------------------------------------------------------------------- verdict (pure)


def overall(rows: list[Check]) -> str:
    """``fail`` if any row failed, else ``warn`` if any warned, else ``ok`` (skips are neutral)."""
    statuses = {r.status for r in rows}
    return FAIL if FAIL in statuses else WARN if WARN in statuses else OK


def exit_code(rows: list[Check]) -> int:
    """0 when every path works, 1 when any would not (a failed or warned check)."""
    return 0 if overall(rows) == OK else 1


def document(rows: list[Check]) -> dict[str, Any]:
    return {"status": overall(rows), "checks": [r.to_dict() for r in rows]}


def grouped(rows: list[Check]) -> list[tuple[str, list[Check]]]:
    """Rows by target, in first-seen order (state, monitor, litellm, zulip, then GPUs)."""
    order: dict[str, list[Check]] = {}
    for r in rows:
        order.setdefault(r.target, []).append(r)
    return list(order.items())
