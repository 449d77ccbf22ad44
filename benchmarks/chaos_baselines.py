"""What operators run today, as policies on the same simulated week (issue 29).

Each acts on the fleet only as the real tool can, and sees only what the real tool sees:

- ``no-heal``: nothing; faults last until a human notices (their natural end).
- ``crash-only`` (systemd ``Restart=on-failure``, llama-swap): restarts a llama-server whose process
  exited by itself — a crash, an out-of-memory at the end of a leak. systemd knows a crash from a
  ``systemctl stop`` (a deploy, maintenance), and a process that hangs, or a host off the network,
  never exits. A restart that does not bring it back is retried at once until systemd's start limit
  (``StartLimitBurst=5`` in ``StartLimitIntervalSec=10s``), then the unit stays failed.
- ``probe-300s`` (GPUStack's model-instance health check): ``GET /health`` of every server every 300 s;
  after 3 failures in a row (refused, no answer, not 200 — a model still loading too) it restarts the
  server. It cannot see a task loop hung behind a healthy ``/health``, a leak, heat or a breaker; its
  restart of a server on a host that cannot be reached goes nowhere.
- ``litellm-cooldown`` (LiteLLM 1.108.7's router): a deployment whose requests fail in a minute is
  cooled down (``DEFAULT_COOLDOWN_TIME_SECONDS`` = 5 s, again while it keeps failing): traffic goes
  around it, nothing is restarted. One action per failing episode; the capacity is not given back.
"""

from __future__ import annotations

from chaos_week import Action, Report

RESTART_BURST = 5  # systemd StartLimitBurst
PROBE_EVERY_S = 300.0
PROBE_FAILURES = 3
# What a client sees of a server in each state: the request fails (LiteLLM counts it) or not.
FAILING = {"refused", "hang", "unreachable", "taskloop-hang", "stuck", "failing", "loading", "wrong-key",
           "decode-hang"}
HEALTH_FAILS = {"refused", "hang", "unreachable", "loading", "failing"}  # /health not 200 (or no answer)


class Baseline:
    name = "baseline"

    def __init__(self, world) -> None:
        self.world = world
        self.driver = None  # set by the driver: what a process supervisor knows (why a process is down)

    def pause(self, t: float, gpus: tuple[str, ...], resume: bool) -> None:
        return None  # none of them has a maintenance switch that gpuheal's pause would be

    def close(self) -> None:
        return None

    def _restart(self, t: float, alias: str, report: Report) -> None:
        """Restart a server; one that reaches the fleet is in the world's effects log, one that cannot
        (its host is off the network) is reported as an attempt."""
        from gpuheal.sim.hosts import unreachable

        g = self.world.gpus[alias]
        if unreachable(self.world, g.spec.host):
            report.attempts.append(Action(t, "restart", alias, took_effect=False))
            return
        self.world.restart(alias)


class NoHeal(Baseline):
    name = "no-heal"

    def cycle(self, t: float, clock_offset_s: float) -> Report:
        return Report()


class CrashOnly(Baseline):
    name = "crash-only"

    def __init__(self, world) -> None:
        super().__init__(world)
        self.failed_units: set[str] = set()

    def cycle(self, t: float, clock_offset_s: float) -> Report:
        report = Report()
        exited = self.driver.exited() if self.driver is not None else set()
        for alias in sorted(exited):
            if alias in self.failed_units:
                continue
            for _ in range(RESTART_BURST):
                self._restart(t, alias, report)
                if self.world.gpus[alias].fault != "dead":
                    break
            else:
                self.failed_units.add(alias)  # start-limit-hit: the unit stays failed
        self.failed_units &= exited  # a unit a human brought back is supervised again
        report.firing = set(exited)
        return report


class Probe300(Baseline):
    name = "probe-300s"

    def __init__(self, world) -> None:
        super().__init__(world)
        self.failures: dict[str, int] = {}
        self.last_probe = -PROBE_EVERY_S

    def cycle(self, t: float, clock_offset_s: float) -> Report:
        report = Report()
        if t - self.last_probe < PROBE_EVERY_S:
            return report
        self.last_probe = t
        for alias, g in self.world.gpus.items():
            if g.endpoint_state() in HEALTH_FAILS:
                self.failures[alias] = self.failures.get(alias, 0) + 1
                report.firing.add(alias)
            else:
                self.failures[alias] = 0
            if self.failures[alias] >= PROBE_FAILURES:
                self._restart(t, alias, report)
                self.failures[alias] = 0
        return report


class LitellmCooldown(Baseline):
    name = "litellm-cooldown"

    def __init__(self, world) -> None:
        super().__init__(world)
        self.cooling: set[str] = set()

    def cycle(self, t: float, clock_offset_s: float) -> Report:
        report = Report()
        failing = {a for a, g in self.world.gpus.items() if g.endpoint_state() in FAILING}
        for alias in sorted(failing - self.cooling):
            report.attempts.append(Action(t, "cooldown", alias))
        self.cooling = failing
        report.firing = failing
        return report


BASELINES = (NoHeal, CrashOnly, Probe300, LitellmCooldown)
