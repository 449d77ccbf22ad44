"""SimFleet: the scenario's servers on loopback, a virtual clock, and ``run_sim`` for the CLI."""

from __future__ import annotations

import functools
import ipaddress
import os
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from .inprocess import InProcessNetwork, Site, StandIn
from .scenario import Scenario, iso
from .servers import ControlHandler, Listener, LitellmHandler, LlamaHandler, MonitorHandler, llama_answer
from .world import World

#: Served in process, every server but the control endpoint is reached at this loopback address,
#: on ports from IN_PROCESS_PORTS_FROM (unless the scenario names its own); nothing is bound there.
IN_PROCESS_HOST = "127.29.0.1"
IN_PROCESS_PORTS_FROM = 20000


class SimError(RuntimeError):
    """The fleet cannot start (e.g. a port is taken). One line, no traceback needed."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SimFleet:
    """A simulated GPU fleet on loopback, driven by a :class:`Scenario` and a virtual clock.

    ``ports``: ``None`` (or ``"scenario"``) binds the scenario's ports; ``"ephemeral"`` binds
    port 0 everywhere; a dict overrides some of ``monitor``, ``litellm``, ``control``,
    ``gpus_from``. ``realtime_speed``: when set, a thread advances the virtual clock by
    ``speed x`` the real seconds elapsed.
    """

    def __init__(
        self,
        scenario: Scenario | str | os.PathLike[str],
        host: str = "127.0.0.1",
        ports: str | dict[str, int] | None = None,
        *,
        realtime_speed: float | None = None,
        verbose: bool = False,
        serve: str = "sockets",
    ):
        if not isinstance(scenario, Scenario):
            scenario = Scenario.load(scenario)
        if not _is_loopback(host):
            raise SimError(f"the sim binds to loopback only (127.0.0.0/8, ::1), not {host!r}")
        if realtime_speed is not None and not (realtime_speed > 0):
            raise SimError("realtime_speed must be > 0")
        if serve not in ("sockets", "in-process"):
            raise SimError(f"serve must be 'sockets' or 'in-process', not {serve!r}")
        self.scenario = scenario
        self.host = host
        self.serve = serve
        self.verbose = verbose
        self.realtime_speed = realtime_speed
        self._ports = self._resolve_ports(ports)
        self.world = World(scenario, on_change=self._sync)
        self._listeners: dict[str, Listener] = {}
        self._sync_lock = threading.Lock()
        self._started = False
        self._stopping = False
        self._rt_thread: threading.Thread | None = None
        self._rt_stop = threading.Event()

    # ------------------------------------------------------------------ ports and URLs

    def _resolve_ports(self, ports: str | dict[str, int] | None) -> dict[str, int]:
        scn = self.scenario
        if ports is None or ports == "scenario" or ports == "fixed":
            base = dict(scn.ports)
            gpu_ports = [scn.gpu_port(i) for i in range(len(scn.gpus))]
        elif ports == "ephemeral":
            base = {k: 0 for k in scn.ports}
            gpu_ports = [0] * len(scn.gpus)
        elif isinstance(ports, dict):
            unknown = set(ports) - set(scn.ports)
            if unknown:
                raise SimError(f"unknown port names: {', '.join(sorted(unknown))}")
            base = {**scn.ports, **ports}
            gpu_ports = [
                g.port
                if g.port is not None
                else (base["gpus_from"] + i if base["gpus_from"] else 0)
                for i, g in enumerate(scn.gpus)
            ]
        else:
            raise SimError(f"ports must be None, 'ephemeral' or a dict, not {ports!r}")
        out = {k: v for k, v in base.items() if k != "gpus_from"}
        for g, p in zip(scn.gpus, gpu_ports, strict=True):
            out[f"gpu:{g.alias}"] = p
        return out

    def _url(self, key: str) -> str:
        lst = self._listeners.get(key)
        if lst is None:
            raise SimError("the fleet is not started")
        host = self._site_host(key)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{lst.port}"

    def _site_host(self, key: str) -> str:
        """Where a server is reached: its bound host, or (served in process) an address of its own
        in 127.0.0.0/8 that nothing listens on, so a client without the network gets refused."""
        return IN_PROCESS_HOST if self.serve == "in-process" and key != "control" else self.host

    @property
    def monitor_url(self) -> str:
        return self._url("monitor") + "/gpu-data"

    @property
    def litellm_url(self) -> str:
        return self._url("litellm") + "/litellm"

    @property
    def litellm_admin_key(self) -> str:
        """The Bearer key of ``POST {litellm_url}/model/update`` (``litellm_admin_key``)."""
        return self.scenario.litellm_admin_key

    @property
    def control_url(self) -> str:
        return self._url("control") + "/_sim"

    @property
    def endpoints(self) -> dict[str, str]:
        return {g.alias: self._url(f"gpu:{g.alias}") for g in self.scenario.gpus}

    @property
    def ports(self) -> dict[str, int]:
        """Bound ports: ``monitor``, ``litellm``, ``control`` and one per GPU alias."""
        return {
            (k[4:] if k.startswith("gpu:") else k): lst.port for k, lst in self._listeners.items()
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> SimFleet:
        if self._started:
            return self
        w = self.world
        specs = [
            ("control", ControlHandler, None),
            ("monitor", MonitorHandler, None),
            ("litellm", LitellmHandler, None),
            *((f"gpu:{g.alias}", LlamaHandler, g.alias) for g in self.scenario.gpus),
        ]
        try:
            for n, (key, handler, alias) in enumerate(specs):
                lst = Listener(
                    key, self.host, self._ports[key], handler, w, alias=alias, verbose=self.verbose
                )
                if self.serve == "in-process" and key != "control":
                    lst.port = lst.port or IN_PROCESS_PORTS_FROM + n  # never bound (see network())
                    self._listeners[key] = lst
                    continue
                try:
                    lst.open()  # every port is bound once, so ephemeral ports get their numbers
                except OSError as exc:
                    what = alias or key
                    raise SimError(
                        f"cannot listen on {self.host}:{self._ports[key]} for {what}: "
                        f"{exc.strerror or exc}"
                    ) from None
                self._listeners[key] = lst
        except BaseException:
            for lst in self._listeners.values():
                lst.close()
            self._listeners.clear()
            raise
        self._started = True
        with w.lock:  # LiteLLM's /v1/model/info shows each deployment's api_base
            w.api_bases = {a: f"{url}/v1" for a, url in self.endpoints.items()}
        self._sync()  # close the ports of GPUs that start dead / a monitor that starts down
        if self.realtime_speed:
            self._rt_thread = threading.Thread(
                target=self._realtime, name="gpuheal-sim-clock", daemon=True
            )
            self._rt_thread.start()
        return self

    def stop(self) -> None:
        """Stop every server; returns within about a second even with hanging clients."""
        if not self._started or self._stopping:
            return
        self._stopping = True
        self.world.stopped.set()
        self._rt_stop.set()
        with self._sync_lock:
            closers = [
                threading.Thread(target=lst.close, daemon=True) for lst in self._listeners.values()
            ]
            for t in closers:
                t.start()
            deadline = time.monotonic() + 2.0
            for t in closers:
                t.join(max(0.0, deadline - time.monotonic()))
        if self._rt_thread is not None:
            self._rt_thread.join(0.5)

    def __enter__(self) -> SimFleet:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def network(self) -> InProcessNetwork:
        """Every server of the fleet but the control endpoint, served in process
        (:mod:`gpuheal.sim.inprocess`) at the address its URL names: for ``serve="in-process"`` the
        only way to reach them; for a socket fleet the same answers without the sockets (the test
        that the two agree uses both)."""
        net = InProcessNetwork()
        for key, lst in self._listeners.items():
            if key != "control":
                template = StandIn(self.world, lst.alias, self.verbose)
                fast = (functools.partial(llama_answer, self.world, lst.alias)
                        if lst.handler is LlamaHandler and lst.alias is not None and not self.verbose else None)
                net.add(self._site_host(key), lst.port,
                        Site(lst.handler, template, functools.partial(self.world.is_listening, key), fast))
        return net

    def _sync(self) -> None:
        """Open or close ports to match the state (``dead`` GPU, ``down`` monitor/LiteLLM)."""
        if not self._started or self._stopping or self.serve == "in-process":
            return
        want = self.world.listening()
        with self._sync_lock:
            if self._stopping:
                return
            for key, lst in self._listeners.items():
                if key == "control":
                    continue
                if want.get(key, True):
                    if not lst.is_open:
                        try:
                            lst.open()
                        except OSError as exc:
                            sys.stderr.write(
                                f"gpuheal-sim: cannot reopen {key} on port {lst.port}: {exc}\n"
                            )
                elif lst.is_open:
                    lst.close()

    def _realtime(self) -> None:
        speed = float(self.realtime_speed or 0)
        last = time.monotonic()
        while not self._rt_stop.wait(0.1):
            now = time.monotonic()
            self.world.advance(speed * (now - last))
            last = now

    # ------------------------------------------------------------------ clock and control

    def now(self) -> datetime:
        """Virtual now (tz-aware UTC)."""
        return self.world.now()

    def advance(self, seconds: float) -> datetime:
        """Move the virtual clock forward, applying due events; returns the new now."""
        return self.world.advance(seconds)

    def restart(self, alias: str) -> int:
        """What ``POST /_sim/restart`` does; returns the alias's restart count."""
        return self.world.restart(alias)

    def restart_count(self, alias: str) -> int:
        w = self.world
        with w.lock:
            if alias in w.gpus:
                return w.gpus[alias].restart_count
            return w.service_restarts[alias]

    def use_litellm_config(self, path: str) -> None:
        """Serve LiteLLM's deployments from its ``config.yaml`` at ``path``, read now and at each restart of
        LiteLLM (``restart litellm``), as the real proxy without a database does (drain first, issue 28)."""
        with self.world.lock:
            self.world.litellm_config_file = path
            self.world.read_litellm_config()

    def set(self, alias: str, values: dict[str, Any]) -> None:
        """Set values on a GPU now (``POST /_sim/set``); e.g. ``set("gpu-dense", {"temp_c": 90})``."""
        self.world.apply_now({"gpu": alias, "set": dict(values)})

    def apply(self, event: dict[str, Any]) -> None:
        """Apply an event (scenario syntax, without ``at``) at the current virtual time."""
        self.world.apply_now(dict(event))

    def state(self) -> dict[str, Any]:
        return self.world.state()

    def gpu_data(self) -> dict[str, Any]:
        """The monitor document as the ``ok`` mode would serve it now."""
        return self.world.gpu_data()

    # ------------------------------------------------------------------ gpuheal config

    def config_dict(self, api_key: str | None = "not-needed") -> dict[str, Any]:
        """A gpuheal config pointing at this fleet; restarts go through the control endpoint."""
        control = self.control_url
        endpoints = self.endpoints
        gpus = []
        for g in self.scenario.gpus:
            gpus.append(
                {
                    "alias": g.alias,
                    "host": g.host,
                    "endpoint": endpoints[g.alias],
                    "vendor": g.vendor,
                    "vram_total_mb": int(g.values["vram_total_mb"]),
                    "baseline_tok_s": g.values["baseline_tok_s"],
                    "transport": "local",
                    **({"gpu_index": g.gpu_index} if g.gpu_index is not None else {}),
                    "restart_command": [
                        sys.executable,
                        "-m",
                        "gpuheal.sim.control",
                        control,
                        "restart",
                        "{alias}",
                    ],
                    # Rule 2: the per-process VRAM, printed as the GPU's nvidia-smi / rocm-smi does
                    "smi_command": [sys.executable, "-m", "gpuheal.sim.control", control, "smi", "{alias}"],
                }
            )
        return {
            "monitor": {"url": self.monitor_url, "timeout_s": 2, "max_response_bytes": 1048576},
            "litellm": {"url": self.litellm_url, "api_key": api_key},
            "gpus": gpus,
        }

    def write_config(
        self, path: str | os.PathLike[str], api_key: str | None = "not-needed"
    ) -> Path:
        import yaml

        p = Path(path)
        header = (
            f"# gpuheal config for the simulated fleet {self.scenario.name!r}\n"
            f"# written by gpuheal.sim at {iso(self.now())} (virtual); control: {self.control_url}\n"
        )
        text = yaml.safe_dump(self.config_dict(api_key=api_key), sort_keys=False)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(header + text, encoding="utf-8")
        os.replace(tmp, p)
        return p


def run_sim(
    scenario_path: str | os.PathLike[str],
    host: str = "127.0.0.1",
    ports_mode: str | None = None,
    write_config_path: str | os.PathLike[str] | None = None,
    realtime_speed: float | None = None,
    *,
    api_key: str | None = "not-needed",
    verbose: bool = False,
    out: TextIO | None = None,
    stop_event: threading.Event | None = None,
) -> int:
    """Start the fleet, print one line per served URL, block until SIGINT/SIGTERM; return 0.

    Raises :class:`ScenarioError` for a bad scenario and :class:`SimError` when it cannot start.
    ``stop_event`` lets a caller (a test) end it without a signal.
    """
    out = out or sys.stdout
    scenario = Scenario.load(scenario_path)
    fleet = SimFleet(
        scenario,
        host=host,
        ports=ports_mode,
        realtime_speed=realtime_speed,
        verbose=verbose,
    )
    fleet.start()
    stop = stop_event or threading.Event()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        lines = [
            ("monitor", fleet.monitor_url),
            ("litellm", fleet.litellm_url),
            ("control", fleet.control_url),
            *fleet.endpoints.items(),
        ]
        width = max(len(k) for k, _ in lines)
        for label, url in lines:
            print(f"{label:<{width}}  {url}", file=out)
        if write_config_path is not None:
            fleet.write_config(write_config_path, api_key=api_key)
            print(f"{'config':<{width}}  {write_config_path}", file=out)
        out.flush()
        while not stop.wait(0.2):
            pass
    finally:
        fleet.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
