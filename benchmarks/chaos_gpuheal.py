"""gpuheal in the chaos week (issue 29), through the code paths cron runs.

Each minute: ``steps.heal.command(rt, store, apply=True)`` then ``steps.escalate.command(rt, store)``,
each under the state directory's lock (``gpuheal.state.store.StateDir``), as ``gpuheal heal --apply;
gpuheal escalate`` do through ``gpuheal.command.run_step``; the escalate run's clock is one second
later. Every six hours at :17 (``cron/gpuheal-bench.timer``) ``steps.bench.command``. Maintenance is
announced with ``steps.pause.command`` (``gpuheal pause --gpu ALIAS --reason …``) and lifted with its
``resume``. The state directory persists for the whole week; the clock is the runtime's ``now``
(what ``GPUHEAL_NOW`` sets), the fleet's virtual time plus the host's clock step when one is on.

What differs from a cron process, and why it does not change what gpuheal judges:

- the config is loaded once (``gpuheal.config.load_config``, with its schema), not every minute:
  the file does not change during the week and the loaded config is frozen;
- HTTP goes through ``gpuheal.sources.http.use_network`` to the sim's own handlers in process
  (``SimFleet(serve="in-process").network()``): the same request bytes, the same framing of the
  answer, the sim's answers byte for byte (``tests/test_chaos_network.py``), timeouts in virtual seconds;
- the calls a cron run makes at once on threads (the poll's GPU source and LiteLLM beside its probes, the
  history read meanwhile) run one after another in the calling thread (``gpuheal.sources.http.workers``): with
  the network in process nothing waits on a socket, and the threads only contended for the GIL (issue 29);
- commands go through ``gpuheal.transport.use_transports`` to the simulated hosts
  (:mod:`gpuheal.sim.hosts`) instead of SSH: the argv gpuheal builds, answered as the host's tools
  answer (a host that is off the network answers as SSH does: no connection within the timeout);
- nothing is printed: the step's document is read instead (the ``--json`` document);
- the garbage collector runs as in gpuheal's own process: ``gpuheal.entry.main`` sets
  ``entry.GC_THRESHOLDS`` before any command, so each cycle's commands run under them here too (and the
  week's process keeps Python's defaults between cycles). Under the defaults the collector walked the whole
  week's heap, the world's and the harness's records included, which no cron process holds: ~13 % of a
  day's CPU (issue 29);
- heal's in-run confirmation (issue 28 item 1, ``gpuheal.steps.confirm``) waits on the week's clock:
  ``heal.command(..., clock=)`` gets a ``Clock`` whose ``now`` is the world's virtual seconds and whose
  ``sleep`` moves the week on (:meth:`chaos_week.Driver.wait`: every incident change due meanwhile at
  its own second), so a fault or a blip that starts or ends within the minute is seen by the re-probes
  as it would be in real time; a restart's readiness wait (Rule 3's verify) waits on it too, so the
  restarted server loads meanwhile as a real one would (before, it waited 15 real seconds and the model never
  loaded, issue 29). The cycle's later steps start when heal is done (escalate
  ``ESCALATE_AFTER_S`` after it), and the driver judges the cycle at its end. The probes themselves
  take no virtual time (a real ``/health`` timeout takes ``probe.timeout_s``): the evidence is at most
  that much longer than on a real fleet.

Alerts go to the Zulip look-alike (:mod:`gpuheal.sim.zulip`), served in process too; what it received
are the week's messages. An exception out of a step is a crash of gpuheal: counted, and the week goes on.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from chaos_inject import Layout
from chaos_week import Action, Message, Report
from chaos_world import ssh_silence

from gpuheal.sim.hosts import run_on_host
from gpuheal.sim.inprocess import Site
from gpuheal.sim.zulip import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike

BENCH_HOURS = (0, 6, 12, 18)  # cron/gpuheal-bench.timer: OnCalendar=*-*-* 00/6:17:00
BENCH_MINUTE = 17
ESCALATE_AFTER_S = 1.0  # `heal --apply; exec escalate`: escalate starts when heal is done
MUTATING = {"systemctl": "restart", "docker": "restart", "kill": "kill"}
ALIAS_RE = re.compile(r"\bgpu-\d{4}\b")
PAGE_PREFIX = "⚠"  # contract "Alerts": "⚠ GPU Self-Heal — <alias> needs attention"
SEVERITY_RE = re.compile(r"\*\*[a-z0-9-]+\*\* · (info|warning|critical)\b")
REMINDER = "🔁"


def is_page(title: str, content: str) -> bool:
    """A warning or critical message: ``⚠ … needs attention`` about an issue that is not an ``info``
    recommendation (Rule 10's alert, Rule 9's perf loss are told, not paged). A ``⚠`` message whose
    issue lines say no severity counts as a page."""
    if not title.startswith(PAGE_PREFIX):
        return False
    severities = set(SEVERITY_RE.findall(content))
    return not severities or bool(severities - {"info"})


def config(fleet, layout: Layout, zulip_url: str, confirm_budget_s: float | None = None) -> dict[str, Any]:
    """The operators' config for this fleet: four GPUs a host over SSH, racks and sites as labels
    (alerts grouped by rack, Rule 1.3 judged per rack), LiteLLM with its admin key for load shedding
    and its restart command, everything else gpuheal's defaults — the in-run confirmation's budget too
    (``heal.confirm_budget_s``, 30 s) unless ``confirm_budget_s`` is given (0: cron's poll holds only)."""
    endpoints = fleet.endpoints
    traffic = {a: float(fleet.scenario.gpu(a).values["requests_60s"]) for a in layout.gpus}
    gpus = []
    for alias in layout.gpus:
        host = layout.host_of[alias]
        rack = layout.rack_of[host]
        gpus.append({
            "alias": alias, "host": host, "endpoint": endpoints[alias], "vendor": "nvidia",
            "gpu_index": layout.gpus_of_host(host).index(alias), "vram_total_mb": 24576,
            "baseline_tok_s": fleet.scenario.gpu(alias).values["baseline_tok_s"], "transport": "ssh",
            "restart_command": ["systemctl", "restart", "llama-server@{alias}"],
            "labels": {"rack": rack, "site": f"site-{int(rack[5:]) % 2 + 1}"},
            "litellm_model_id": alias, "litellm_rpm": 60,
            "weight": round(traffic[alias] / sum(traffic.values()), 6),  # Rule 10: LiteLLM routes by it
        })
    return {
        "monitor": {"url": fleet.monitor_url},
        "litellm": {"url": fleet.litellm_url, "api_key": "not-needed",
                    "restart_command": ["docker", "restart", "litellm"]},
        "zulip": {"site": zulip_url, "stream": "gpu-fleet", "topic": "alerts"},
        "alerts": {"group_by": "rack"},
        "heal": {"known_hosts": "/dev/null",
                 **({} if confirm_budget_s is None else {"confirm_budget_s": confirm_budget_s})},
        "rules": {"cooling-infrastructure": {"group_by": "rack", "cooling_fraction": 0.5}},
        "gpus": gpus,
    }


class SimHostTransport:
    """A :class:`gpuheal.transport.Transport` onto a simulated host (``gpuheal.transport.use_transports``)."""

    def __init__(self, owner: GpuhealSystem, target) -> None:
        self.owner = owner
        self.kind = target.kind
        self.host = target.host if target.kind == "ssh" else None

    def run(self, argv, timeout_s: float, input: str | None = None):  # noqa: A002 - Transport's signature
        from gpuheal.transport import CommandOutcome

        argv = list(argv)
        blip = ssh_silence(self.owner.world, self.host)  # a network blip: SSH refused or silent too
        if blip is not None:
            self.owner.note_command(self.host, argv, False)
            wait_s = 0.01 if blip == "refused" else self.owner.cfg.heal.ssh_connect_timeout_s
            return CommandOutcome(argv, None, elapsed_s=wait_s, error=blip, host=self.host,
                                  detail=f"{self.host}:22: {blip} (a network blip)")
        answer = run_on_host(self.owner.world, self.host, argv)
        self.owner.note_command(self.host, argv, answer is not None)
        if answer is None:
            wait_s = self.owner.cfg.heal.ssh_connect_timeout_s
            return CommandOutcome(argv, None, elapsed_s=wait_s, error="timeout", host=self.host,
                                  detail=f"no SSH connection to {self.host}:22 within {wait_s:g}s")
        error = detail = None
        if answer.rc == 127:
            error, detail = f"not found: {argv[0]}", f"{argv[0]}: not found on {self.host or 'this machine'}"
        return CommandOutcome(argv, answer.rc, answer.stdout, answer.stderr, 0.01, error=error, detail=detail,
                              host=self.host)

    def close(self) -> None:
        return None


class GpuhealSystem:
    name = "gpuheal"

    def __init__(self, fleet, layout: Layout, workdir: Path, confirm_budget_s: float | None = None) -> None:
        from gpuheal.config import load_config

        self.fleet, self.world, self.layout = fleet, fleet.world, layout
        self.zulip = ZulipLookalike()  # bound (its URL) but never started: served in process
        self.network = fleet.network()
        self.network.add("127.0.0.1", self.zulip.port, Site(self.zulip.handler_class, self.zulip))
        workdir.mkdir(parents=True, exist_ok=True)
        path = workdir / "gpuheal.yaml"
        path.write_text(yaml.safe_dump(config(fleet, layout, self.zulip.url, confirm_budget_s), sort_keys=False))
        self.cfg = load_config(path)
        self.state_dir = workdir / "state"
        self.env = {"ZULIP_EMAIL": DEFAULT_EMAIL, "ZULIP_API_KEY": DEFAULT_KEY,
                    "LITELLM_MASTER_KEY": fleet.litellm_admin_key}
        self.seen_messages = 0
        self.attempts: list[Action] = []
        self.now_t = 0.0
        self.last_bench: int | None = None
        self.stderr = io.StringIO()
        self.log = logging.getLogger("gpuheal")
        self.driver = None  # set by the driver (chaos_week.Driver): what moves the week on while heal waits

    # ------------------------------------------------------------------ the seams
    def transport(self, target) -> SimHostTransport:
        return SimHostTransport(self, target)

    def note_command(self, host: str | None, argv: list[str], reached: bool) -> None:
        """A command that would change the fleet, sent to a host that is not there, is still an
        action taken (one that reached it is in the world's effects log already)."""
        program = argv[0].rsplit("/", 1)[-1] if argv else ""
        if reached or MUTATING.get(program) not in argv[1:2] + (["kill"] if program == "kill" else []):
            return
        unit = argv[-1] if argv else ""
        target = unit.partition("@")[2] or (self.layout.gpus_of_host(host)[0] if host else unit)
        self.attempts.append(Action(self.world.t, "restart" if program != "kill" else "kill", target, False))

    @contextlib.contextmanager
    def _running(self):
        from gpuheal.entry import GC_THRESHOLDS
        from gpuheal.sources.http import use_network
        from gpuheal.transport import use_transports

        thresholds = gc.get_threshold()
        gc.set_threshold(*GC_THRESHOLDS)
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        handlers, propagate = self.log.handlers[:], self.log.propagate
        self.log.handlers, self.log.propagate = [logging.StreamHandler(self.stderr)], False
        try:
            with use_network(self.network), use_transports(self.transport), \
                    contextlib.redirect_stderr(self.stderr), contextlib.redirect_stdout(io.StringIO()):
                yield
        finally:
            gc.set_threshold(*thresholds)
            self.log.handlers, self.log.propagate = handlers, propagate
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def clock(self):
        """heal's in-run confirmation on the week's clock (``gpuheal.steps.confirm.Clock``)."""
        from gpuheal.steps.confirm import Clock

        return Clock(now=lambda: self.world.t, sleep=self._wait)

    def _wait(self, seconds: float) -> None:
        if self.driver is not None:
            self.driver.wait(seconds)
        else:
            self.world.advance(max(0.0, seconds))

    def _step(self, t: float, offset_s: float, step, **options):
        """One command under the state lock, as ``command.run_step`` runs it (without printing)."""
        from gpuheal.runtime import Runtime
        from gpuheal.sources.http import forget_remembered
        from gpuheal.state.store import StateDir

        forget_remembered()  # cron starts each command in a new process: nothing remembered from the minute before
        now = self.world.at(t) + timedelta(seconds=offset_s)
        rt = Runtime(cfg=self.cfg, state_dir=self.state_dir, now=now, json_out=True)
        with StateDir(rt.state_dir, self.cfg.state.lock_wait_s) as store:
            return step(rt, store, **options)

    # ------------------------------------------------------------------ System
    def cycle(self, t: float, clock_offset_s: float) -> Report:
        from gpuheal.steps import bench, escalate, heal

        report = Report()
        self.now_t, self.attempts = t, []
        with self._running():
            try:
                self._maybe_bench(t, clock_offset_s, bench)
                health = self._step(t, clock_offset_s, heal.command, apply=True, clock=self.clock()).document
                self._step(max(t, self.world.t) + ESCALATE_AFTER_S, clock_offset_s, escalate.command)
            except Exception as exc:  # noqa: BLE001 - a crash of gpuheal: counted, reported, never hidden
                report.crash = f"{type(exc).__name__}: {str(exc)[:200]}"
                health = {}
        for issue in health.get("issues") or []:
            if issue.get("state") == "firing":
                report.reported.add(str(issue.get("gpu")))
                if issue.get("severity") in ("warning", "critical"):
                    report.firing.add(str(issue.get("gpu")))
        report.messages = self._messages(t)
        report.attempts = self.attempts
        return report

    def _maybe_bench(self, t: float, offset_s: float, bench) -> None:
        now = self.world.at(t)
        slot = int(t // 3600)
        if now.hour in BENCH_HOURS and now.minute == BENCH_MINUTE and self.last_bench != slot:
            self.last_bench = slot
            self._step(t, offset_s, bench.command)

    def _messages(self, t: float) -> list[Message]:
        new = self.zulip.messages[self.seen_messages:]
        self.seen_messages = len(self.zulip.messages)
        out = []
        for m in new:
            content = str(m.get("content") or "")
            title = content.splitlines()[0] if content else ""
            named = set(ALIAS_RE.findall(content))
            if " fleet " in f" {title} " or "fleet" in title.split():
                named.add("fleet")
            out.append(Message(t, title, is_page(title, content), tuple(sorted(named)),
                               reminder=REMINDER in content[:400]))
        return out

    def pause(self, t: float, gpus: tuple[str, ...], resume: bool) -> None:
        from gpuheal.steps import pause

        with self._running():
            for alias in gpus:
                self._step(t, 0.0, pause.command, gpu=alias, reason="planned maintenance", resume=resume)

    def close(self) -> None:
        self.zulip.close_socket()
