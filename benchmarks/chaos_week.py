"""One system's week (issue 29): the injected incidents applied to a fresh simulated world, minute by
minute, the system run as cron runs it, and everything it did recorded against the ground truth.

Each minute ``m`` the driver moves the world's virtual clock to the incidents' due changes (each at
its own second), then to the cron start ``60 m + jitter`` (1–2 s late, from the seeded generator
``chaos-cron:SEED``, the same for every system), runs the system's cycle there, and afterwards:

- looks at every live fault: one that is no longer in the world before its natural end was ended by
  the system (its script says what "live" means: the process is back, the leak stopped, the GPU is
  no longer heating, the breaker closed, the limit restored);
- reads the cycle's report: what the system saw firing (time to detect), the messages it delivered
  (a page — ``⚠ … needs attention`` — about a GPU with a live fault brings a human within
  ``HUMAN_RESPONSE_S``, as a page is for), and a crash of the system itself (counted, never hidden);
- adds every GPU's lost serving capacity for the minute (:func:`chaos_world.serving`), except the
  planned downtime of a deploy or a maintenance window (the same for every system).

The actions come from the world's ``effects`` log (every restart, LiteLLM update, power-limit change
and kill, whoever made it) plus what the system itself reports attempting (a restart over SSH to a
host that is not there changes nothing in the world but is still an action taken).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from chaos_inject import Incident
from chaos_world import SCRIPTS, Live, serving

HUMAN_RESPONSE_S = 1800.0  # a page is answered, and the fault fixed, within half an hour
PLANNED = ("deploy", "maintenance", "nctx-change")  # downtime nobody could avoid: not "lost"
PAUSE_AHEAD_S = 300.0  # maintenance is announced (``gpuheal pause``) this long before it starts
RESUME_AFTER_S = 300.0  # and lifted this long after it ends


@dataclass(frozen=True)
class Action:
    """Something a system did to the fleet: ``what`` (restart, litellm-rpm, power-limit, kill,
    cooldown, …) on ``target`` (a GPU alias, ``monitor`` or ``litellm``) at ``t`` (virtual seconds)."""

    t: float
    what: str
    target: str
    took_effect: bool = True


@dataclass(frozen=True)
class Message:
    """One message a system delivered to the humans: ``page`` is a warning or critical one."""

    t: float
    title: str
    page: bool
    gpus: tuple[str, ...]  # the aliases it names ("fleet" for the fleet's own)
    reminder: bool = False


@dataclass
class Report:
    """What one cycle of a system says about itself."""

    firing: set[str] = field(default_factory=set)  # aliases (and "fleet") with a warning/critical issue firing
    reported: set[str] = field(default_factory=set)  # aliases with any issue firing (info included)
    messages: list[Message] = field(default_factory=list)
    attempts: list[Action] = field(default_factory=list)  # actions that could not reach the world
    crash: str | None = None  # the system itself failed this cycle: one line


class System(Protocol):
    name: str

    def cycle(self, t: float, clock_offset_s: float) -> Report: ...

    def pause(self, t: float, gpus: tuple[str, ...], resume: bool) -> None: ...

    def close(self) -> None: ...


@dataclass
class Week:
    """Everything one system's week recorded."""

    system: str
    incidents: list[Live]
    actions: list[Action] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    detected: dict[int, float] = field(default_factory=dict)  # incident id -> first seen (firing, or acted on)
    reported: dict[int, float] = field(default_factory=dict)  # incident id -> first any issue on its GPUs
    lost_gpu_min: dict[int | None, float] = field(default_factory=dict)  # incident id (None: none live) -> lost
    crashes: list[tuple[float, str]] = field(default_factory=list)
    cycles: int = 0
    wall_s: float = 0.0
    end_s: float = 0.0


def cron_starts(minutes: int, seed: int) -> list[float]:
    """When each minute's cycle starts: cron's minute plus 1–2 s (``chaos-cron:SEED``)."""
    rng = random.Random(f"chaos-cron:{seed}")
    return [m * 60.0 + rng.uniform(1.0, 2.0) for m in range(minutes)]


class Driver:
    """Runs one system through the week on ``world`` (a fresh :class:`~gpuheal.sim.world.World`)."""

    def __init__(self, world, system: System, incidents: list[Incident], days: float, seed: int,
                 progress: Callable[[int, int], None] | None = None) -> None:
        self.world, self.system, self.days, self.seed = world, system, days, seed
        self.lives = [Live(i) for i in incidents]
        self.week = Week(system.name, self.lives)
        self.progress = progress
        self.queue: list[tuple[float, int, Callable[[Any], None]]] = []
        self.seq = 0
        self.offset_s = 0.0  # the system host's wall clock against the fleet's (clock-step)
        self.paused: set[str] = set()
        self._effects_seen = 0
        for lv in self.lives:
            self._schedule_incident(lv)
        if hasattr(system, "driver"):
            system.driver = self  # type: ignore[attr-defined]

    def exited(self) -> set[str]:
        """The GPUs whose llama-server process exited by itself (a crash, an out-of-memory): what a
        process supervisor (systemd) knows, and no more — a stop for a deploy is not an exit."""
        out = set()
        for lv in self.lives:
            inc = lv.incident
            if lv.begun and lv.ended_at is None and (inc.kind in ("crash", "crash-hardware") or lv.state.get("oom")):
                out |= {a for a in inc.gpus if self.world.gpus[a].fault == "dead"}
        return out

    # ------------------------------------------------------------------ scheduling
    def at(self, t: float, fn: Callable[[Any], None]) -> None:
        self.seq += 1
        self.queue.append((t, self.seq, fn))

    def _schedule_incident(self, lv: Live) -> None:
        inc = lv.incident
        if inc.kind == "maintenance":
            self.at(inc.start_s - PAUSE_AHEAD_S, lambda w, inc=inc: self._pause(inc, resume=False))
            self.at(inc.natural_end_s + RESUME_AFTER_S, lambda w, inc=inc: self._pause(inc, resume=True))
        self.at(inc.start_s, lambda w, lv=lv: self._begin(lv))
        self.at(inc.natural_end_s, lambda w, lv=lv: self._end(lv, "natural"))

    def _pause(self, inc: Incident, resume: bool) -> None:
        self.system.pause(self.world.t, inc.gpus, resume)

    def _begin(self, lv: Live) -> None:
        inc = lv.incident
        lv.begun = True
        if inc.kind == "clock-step":
            self.offset_s += inc.params["step_s"]
        for t, fn in SCRIPTS[inc.kind].begin(self.world, lv, self.world.t):
            self.at(t, lambda w, fn=fn, lv=lv: None if lv.ended_at is not None else fn(w))

    def _end(self, lv: Live, by: str) -> None:
        if lv.ended_at is not None:
            return
        if lv.incident.kind == "clock-step":
            self.offset_s -= lv.incident.params["step_s"]
        SCRIPTS[lv.incident.kind].end(self.world, lv)
        lv.ended_at, lv.ended_by = self.world.t, by

    # ------------------------------------------------------------------ the week
    def run(self) -> Week:
        started = time.perf_counter()
        minutes = int(self.days * 24 * 60)
        starts = cron_starts(minutes, self.seed)
        for m, t in enumerate(starts):
            self._until(t)
            report = self.system.cycle(t, self.offset_s)
            self.week.cycles += 1
            self._after(max(t, self.world.t), report)  # when the cycle ended (a system may wait within it)
            self._capacity(t)
            if self.progress is not None and (m % 30 == 0 or m == minutes - 1):
                self.progress(m + 1, minutes)
        end = minutes * 60.0
        self._until(end)
        self.week.end_s = end
        self.week.wall_s = time.perf_counter() - started
        self.system.close()
        return self.week

    def wait(self, seconds: float) -> None:
        """A system's own wait within its cycle (gpuheal's in-run confirmation): the week moves on as
        real time would, every incident change due meanwhile applied at its own second."""
        self._until(self.world.t + max(0.0, seconds))

    def _until(self, t: float) -> None:
        """Apply every change due by ``t`` at its own second, then move the clock to ``t``."""
        world = self.world
        while True:
            due = [q for q in self.queue if q[0] <= t]
            if not due:
                break
            first = min(due)
            self.queue.remove(first)
            world.advance(max(0.0, first[0] - world.t))
            first[2](world)
        world.advance(max(0.0, t - world.t))
        for lv in self.lives:
            script = SCRIPTS[lv.incident.kind]
            if lv.begun and lv.ended_at is None and script.tick is not None:
                script.tick(world, lv, world.t)

    def _after(self, t: float, report: Report) -> None:
        week = self.week
        if report.crash:
            week.crashes.append((t, report.crash))
        actions = self._new_effects() + report.attempts
        week.actions += actions
        week.messages += report.messages
        for lv in self.lives:
            inc = lv.incident
            if not lv.begun or inc.start_s > t:
                continue
            live_now = lv.ended_at is None
            touched = set(inc.gpus) or {"fleet"}
            if live_now or t - (lv.ended_at or t) < 60:
                if inc.id not in week.detected and (report.firing & (touched | _fleet_of(inc))
                                                    or any(a.target in touched | _service_of(inc) for a in actions)):
                    week.detected[inc.id] = t
                if inc.id not in week.reported and report.reported & (touched | _fleet_of(inc)):
                    week.reported[inc.id] = t
            if not live_now or not inc.fault:
                continue
            self._judge(lv, t, report)

    def _judge(self, lv: Live, t: float, report: Report) -> None:
        inc = lv.incident
        script = SCRIPTS[inc.kind]
        is_live = script.live(self.world, lv)
        if not is_live and lv.healed_at is None:
            lv.healed_at = t
        elif is_live and lv.healed_at is not None and not lv.state.get("was_live", True):
            lv.relapses += 1  # held back, then back again (a mitigation undone while the cause lasts)
        lv.state["was_live"] = is_live
        if inc.spec.claim == "heal" and not is_live and lv.ended_at is None and _stays_healed(inc):
            lv.ended_at, lv.ended_by = t, "system"  # the fault left the world: the healer's doing
            script.end(self.world, lv)  # and its cause is gone with it (the natural end does nothing more)
        pages = [m for m in report.messages if m.page and (set(m.gpus) & (set(inc.gpus) | _fleet_of(inc)))]
        if pages and lv.first_page_at is None:
            lv.first_page_at = t
            fix_at = t + HUMAN_RESPONSE_S
            if fix_at < inc.natural_end_s:
                lv.human_fix_at = fix_at
                self.at(fix_at, lambda w, lv=lv: self._end(lv, "human"))

    def _new_effects(self) -> list[Action]:
        effects = self.world.effects[self._effects_seen:]
        self._effects_seen = len(self.world.effects)
        out = []
        for t, what, target, detail in effects:
            if what.startswith("litellm-"):
                g = self.world.gpus[target]
                normal = g.rpm_normal if what == "litellm-rpm" else g.weight_normal
                if normal is not None and float(detail) >= float(normal):
                    continue  # load given back (restore-load): the end of a mitigation, not an action
            out.append(Action(t, what, target))
        return out

    def _capacity(self, t: float) -> None:
        """One minute of every GPU's lost serving, charged to the live incident that holds it."""
        holder: dict[str, int] = {}
        planned: set[str] = set()
        for lv in self.lives:
            if lv.begun and (lv.ended_at is None or lv.ended_at > t - 60):
                for a in lv.incident.gpus:
                    holder.setdefault(a, lv.incident.id)
                    if lv.incident.kind in PLANNED and lv.ended_at is None:
                        planned.add(a)
        lost = self.week.lost_gpu_min
        for alias in self.world.gpus:
            if alias in planned:
                continue
            gone = 1.0 - serving(self.world, alias, self.world.t)
            if gone > 1e-9:
                key = holder.get(alias)
                lost[key] = lost.get(key, 0.0) + gone


def _stays_healed(inc: Incident) -> bool:
    """A healed fault whose cause goes with the fix (a restart ends a crash; shedding only holds an
    overheating GPU's heat back, its fan is still broken)."""
    return inc.kind not in ("overheat",)


def _fleet_of(inc: Incident) -> set[str]:
    return {"fleet"} if inc.kind.startswith("monitor-") else set()


def _service_of(inc: Incident) -> set[str]:
    if inc.kind.startswith("monitor-"):
        return {"monitor"}
    if inc.kind == "breaker-stuck":
        return {"litellm"}
    return set()


def progress_bar(label: str, log_every_min: int = 0) -> Callable[[int, int], None] | None:
    """A one-line bar on stderr when it is a terminal; otherwise None (no bar in logs or CI), or with
    ``log_every_min`` a line per that many simulated minutes (minutes done, wall and CPU seconds so far:
    how a long run in the background is followed and its end projected)."""
    if not sys.stderr.isatty():
        return _progress_lines(label, log_every_min) if log_every_min > 0 else None
    started = time.monotonic()

    def draw(done: int, total: int) -> None:
        width = 30
        filled = int(width * done / max(total, 1))
        elapsed = time.monotonic() - started
        eta = elapsed / done * (total - done) if done else 0.0
        sys.stderr.write(f"\r{label:<17} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} min"
                         f"  {elapsed:5.0f} s  eta {eta:4.0f} s ")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return draw


def _progress_lines(label: str, every_min: int) -> Callable[[int, int], None]:
    started, cpu0 = time.monotonic(), time.process_time()
    last = [0]

    def line(done: int, total: int) -> None:
        if done - last[0] < every_min and done < total:
            return
        last[0] = done
        sys.stderr.write(f"{label} {done}/{total} min: {time.monotonic() - started:.0f} s wall, "
                         f"{time.process_time() - cpu0:.0f} s CPU\n")
        sys.stderr.flush()

    return line
