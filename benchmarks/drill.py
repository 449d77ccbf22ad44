"""The drill (issues 20 and 28): gpuheal healing real llama-servers in real time, and what users saw.

    .venv/bin/python benchmarks/drill.py                       # 3 runs of 10 cycles, 60 s apart (~33 min)
    .venv/bin/python benchmarks/drill.py --no-heal --runs 1    # the baseline: `heal` without --apply
    .venv/bin/python benchmarks/drill.py --litellm             # a real LiteLLM in front, a twin per fault
    .venv/bin/python benchmarks/drill.py --runs 1 --cycles 3 --cadence-s 20 --fault-cycle 1   # smoke (~1.5 min)

Seven real llama-servers (the suite's binary from scripts/build-llama-server.sh, the suite's
generated tiny model) on 127.0.0.1, owned by a systemd-like supervisor (benchmarks/drill_supervisor.py:
``--restart-kill-signal`` (TERM) + SIGCONT, ``--stop-timeout-s`` (15 s), SIGKILL, start). Each gets one
fault or none:

========== ==========================================================================
hang       SIGSTOP (every thread stops: /health times out)
frozen     the main thread (the task loop) stopped by ptrace: /health ok, /metrics, /slots and
           completions hang (llama.cpp#27388)
kill       SIGKILL
slow-load  SIGKILL, ``--slow-load-after`` cycles after the others, and every restart of it sleeps
           ``--slow-load-s`` (40 s) before exec (a model slow to load back)
busy       no fault: a larger model with every slot generating long answers and more queued
control-1  no fault
control-2  no fault
========== ==========================================================================

The first three are injected half a cadence before cycle ``--fault-cycle``. Like cron, cycle k
starts at k × cadence plus 0.3–1.7 s of jitter and runs ``gpuheal heal --apply`` then
``gpuheal escalate`` (a Zulip look-alike on loopback), with a generated config: no gpu-monitor
(direct sensing), transport local, ``restart_command`` = the supervisor's client. gpuheal is run as
``python -m gpuheal`` with this interpreter: whatever gpuheal is installed there is measured.

A prober sends a 4-token completion to every server every ``--probe-every-s`` (5 s, timeout 10 s).
Per fault: the cycle whose poll first saw an issue (pending) and fired it, the supervisor's restarts
(when, how the old process ended), the MTTR (fault injected -> first successful client completion
sent after it) and the failed client requests; for the busy twin and the controls the actions
gpuheal's audit trail (gpu-self-heal-log.jsonl) records on them. Nothing but cron wakes gpuheal.

``--runs`` (3) whole drills run in a row, each on a fresh fleet with its own cron jitter; each run's
table is printed as it ends, then each fault's median and worst (benchmarks/drill_report.py). With
``--litellm`` (benchmarks/drill_litellm.py) the real LiteLLM 1.108.7 is in front: each faulted server
shares a model group with a healthy twin, gpuheal's config points at the proxy (``litellm_model_id``
per GPU), and the prober also sends each group's users' requests through the proxy. The result is one
JSON file in benchmarks/results/ (every run's figures, probes, cycles and audit trail, the machine and
its load average) and the tables on stdout. Everything stays on loopback; it stops by itself; on exit
and on Ctrl-C every server is stopped and reaped and every ptrace ended.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "realserver"))

from drill_faults import Freeze, freeze_task_loop, send  # noqa: E402
from drill_report import (  # noqa: E402,F401  (re-exported for tests/test_drill_report.py)
    FAULTED,
    FAULTS,
    QUIET,
    Run,
    aggregate,
    first_cycle,
    group_of,
    load_figures,
    servers,
    summarize,
    summary_table,
    table,
)
from drill_supervisor import Service, Supervisor, wait_ok  # noqa: E402

API_KEY = "drill-key"
BUSY_CLIENTS = 4  # -np 2: two generating, two deferred
BUSY_N_PREDICT = 3000
LOAD_SAMPLE_S = 5.0


# ---------------------------------------------------------------------------------- HTTP on loopback
def post_completion(port: int, n_predict: int, timeout_s: float) -> tuple[bool, str]:
    """One POST /completion to 127.0.0.1:port; (ok, error). http.client: never an HTTP proxy."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    body = json.dumps({"prompt": "The drill says", "n_predict": n_predict, "cache_prompt": False})
    try:
        conn.request("POST", "/completion", body=body, headers={"Authorization": f"Bearer {API_KEY}",
                                                                "Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            return False, f"HTTP {resp.status}"
        return ("content" in json.loads(data)), ""
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return False, type(exc).__name__
    finally:
        conn.close()


def wait_health(port: int, timeout_s: float) -> bool:
    return wait_ok(port, "/health", timeout_s, 0.2)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------- the fleet
def server_argv(binary: Path, model: Path, port: int, *, busy: bool) -> list[str]:
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--api-key", API_KEY,
            "--metrics", "--slots", "-np", "2", "-t", "1"]
    return argv + (["-c", "8192"] if busy else ["-c", "2048"])


def start_fleet(sup: Supervisor, binary: Path, models: dict[str, Path], run_dir: Path,
                slow_load_s: float, names: list[str]) -> dict[str, int]:
    ports: dict[str, int] = {}
    for name in names:
        port = free_port()
        prefix = ([sys.executable, str(ROOT / "benchmarks" / "drill_faults.py"), "delayed-exec", str(slow_load_s),
                   "--"] if name == "slow-load" else [])
        sup.add(Service(name, server_argv(binary, models["busy" if name == "busy" else "tiny"], port,
                                          busy=name == "busy"), run_dir / f"{name}.log", restart_prefix=prefix))
        ports[name] = port
    for name, port in ports.items():
        if not wait_health(port, 120):
            raise RuntimeError(f"{name} (port {port}) did not become healthy; see {run_dir / (name + '.log')}")
    return ports


def write_config(path: Path, ports: dict[str, int], sock: Path, zulip_port: int,
                 litellm: dict | None = None) -> None:
    """gpuheal's config: direct sensing, local transport, the supervisor's client as restart_command;
    with LiteLLM in front, its ``litellm:`` block (benchmarks/drill_litellm.py: url, config_file,
    restart_command — drain first)."""
    import yaml

    client = [sys.executable, str(ROOT / "benchmarks" / "drill_supervisor.py"), str(sock), "restart"]
    gpus = [{"alias": name, "host": f"drill-{name}", "endpoint": f"http://127.0.0.1:{port}", "transport": "local",
             "restart_command": client + [name]} for name, port in ports.items()]
    cfg = {"litellm": {"api_key": API_KEY, **(litellm or {})},
           "zulip": {"site": f"http://127.0.0.1:{zulip_port}", "timeout_s": 5}, "gpus": gpus}
    if litellm and litellm.get("config_file"):
        cfg["heal"] = {"drain_first": True}  # opt-in (heal.drain_first): the drill measures what it costs
    path.write_text("# generated by benchmarks/drill.py: no monitor (direct sensing)\n"
                    + yaml.safe_dump(cfg, sort_keys=False))


# ---------------------------------------------------------------------------------- load and probes
def busy_load(port: int, stop: threading.Event, run: Run) -> None:
    """One client of the busy twin: long generations back to back."""
    while not stop.is_set():
        ok, _ = post_completion(port, BUSY_N_PREDICT, 600)
        if ok:
            with run.lock:
                run.busy_done += 1
        elif not stop.is_set():
            stop.wait(1)


def probe_once(run: Run, name: str, port: int, timeout_s: float) -> None:
    sent = time.time()
    ok, err = post_completion(port, 4, timeout_s)
    with run.lock:
        run.probes.append({"server": name, "via": "direct", "sent": run.rel(sent), "done": run.rel(), "ok": ok,
                           "error": err})


def probe_via_proxy(run: Run, name: str, proxy, timeout_s: float) -> None:
    """A user of ``name``'s model group, through LiteLLM (the twin may serve it)."""
    from drill_litellm import post_via_proxy

    sent = time.time()
    ok, err = post_via_proxy(proxy.url, proxy.master_key, group_of(name), timeout_s)
    with run.lock:
        run.probes.append({"server": name, "via": "proxy", "sent": run.rel(sent), "done": run.rel(), "ok": ok,
                           "error": err})


def prober(run: Run, ports: dict[str, int], args: argparse.Namespace, stop: threading.Event, proxy=None) -> None:
    """Every ``--probe-every-s``: a 4-token completion to each server, and with LiteLLM one to each
    model group through the proxy; the load average on its own slower tick."""
    tick = 0
    groups = [n for n in ports if n in FAULTS]  # a twin's users are its group's: counted once
    while not stop.is_set():
        for name, port in ports.items():
            threading.Thread(target=probe_once, args=(run, name, port, args.probe_timeout_s), daemon=True).start()
        if proxy is not None:
            for name in groups:
                threading.Thread(target=probe_via_proxy, args=(run, name, proxy, args.proxy_timeout_s),
                                 daemon=True).start()
        if tick % max(1, round(LOAD_SAMPLE_S / args.probe_every_s)) == 0:
            with run.lock:
                run.load.append((run.rel(), round(os.getloadavg()[0], 2)))
        tick += 1
        stop.wait(max(0.0, run.t0 + tick * args.probe_every_s - time.time()))


# ---------------------------------------------------------------------------------- cron cycles
@dataclass
class Gpuheal:
    config: Path
    state_dir: Path
    apply: bool
    env: dict[str, str]
    running: list[subprocess.Popen] = field(default_factory=list)

    def step(self, *args: str) -> dict:
        argv = [sys.executable, "-m", "gpuheal", "--config", str(self.config), "--state-dir", str(self.state_dir),
                *args, "--json"]
        started = time.time()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
                                cwd=self.state_dir.parent, start_new_session=True)  # no ./gpuheal to shadow it
        self.running.append(proc)
        try:
            out, err = proc.communicate(timeout=600)
        finally:
            self.running.remove(proc)
        return {"argv": args, "rc": proc.returncode, "took_s": round(time.time() - started, 2),
                "stdout": out[-20000:], "stderr": err[-4000:]}

    def kill_running(self) -> None:
        for proc in list(self.running):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def heal_issues(stdout: str) -> list[dict] | None:
    """The issues one `heal --json` saw at its poll: gpu, issue id, state (pending/firing)."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return None
    issues = doc.get("issues") if isinstance(doc, dict) else None
    if not isinstance(issues, list):
        return None
    return [{"gpu": i.get("gpu"), "issue": i.get("issue"), "state": i.get("state")} for i in issues
            if isinstance(i, dict)]


SEEN = ("endpoint", "metrics", "slots", "requests_processing", "requests_deferred", "n_decode_total",
        "polls_without_decode")


def heal_view(stdout: str) -> dict[str, dict] | None:
    """What one `heal --json` poll read of each server: /health, /metrics, /slots and the decode counters."""
    try:
        gpus = json.loads(stdout).get("gpus")
    except (ValueError, AttributeError):
        return None
    if not isinstance(gpus, dict):
        return None
    return {alias: {k: row.get(k) for k in SEEN} for alias, row in gpus.items() if isinstance(row, dict)}


def cycle(run: Run, k: int, gh: Gpuheal) -> None:
    rec: dict = {"cycle": k, "start": run.rel()}
    heal = gh.step("heal", *(["--apply"] if gh.apply else []))
    rec["issues"] = heal_issues(heal["stdout"])
    rec["seen"] = heal_view(heal["stdout"])
    if rec["issues"] is not None:
        heal["stdout"] = heal["stdout"][-1500:]
    rec["heal"] = heal
    rec["escalate"] = gh.step("escalate")
    rec["escalate"]["stdout"] = rec["escalate"]["stdout"][-1500:]
    rec["end"] = run.rel()
    with run.lock:
        run.cycles.append(rec)


def inject(run: Run, name: str, sup: Supervisor, freezes: dict[str, Freeze]) -> None:
    pid = sup.pid(name)
    if name == "hang":
        send(pid, signal.SIGSTOP)
    elif name == "frozen":
        freezes[name] = freeze_task_loop(pid)
    else:
        send(pid, signal.SIGKILL)
    run.faults[name] = run.rel()
    print(f"[{run.rel():7.1f}] fault: {name} ({FAULTS[name]}) pid {pid}", flush=True)


def schedule(args: argparse.Namespace, seed: int | None = None) -> list[tuple[float, str, object]]:
    """(seconds after t0, kind, what): cron starts with jitter, then faults; sorted by time."""
    rng = random.Random(args.seed if seed is None else seed)
    events: list[tuple[float, str, object]] = [(k * args.cadence_s + rng.uniform(0.3, 1.7), "cycle", k)
                                               for k in range(args.cycles)]
    at = (args.fault_cycle - 0.5) * args.cadence_s + args.fault_offset_s
    events += [(at, "fault", n) for n in ("hang", "frozen", "kill")]
    events.append((at + args.slow_load_after * args.cadence_s, "fault", "slow-load"))
    return sorted(events, key=lambda e: e[0])


def drive(run: Run, args: argparse.Namespace, gh: Gpuheal, sup: Supervisor, freezes: dict[str, Freeze],
          seed: int) -> None:
    threads: list[threading.Thread] = []
    for at, kind, what in schedule(args, seed):
        if at >= args.cycles * args.cadence_s:
            continue
        time.sleep(max(0.0, run.t0 + at - time.time()))
        if kind == "fault":
            inject(run, str(what), sup, freezes)
        else:
            print(f"[{run.rel():7.1f}] cycle {what}", flush=True)
            t = threading.Thread(target=cycle, args=(run, what, gh), daemon=True)
            t.start()
            threads.append(t)
    time.sleep(max(0.0, run.t0 + args.cycles * args.cadence_s - time.time()))
    for t in threads:
        t.join(600)


# ---------------------------------------------------------------------------------- the report
def read_audit(state_dir: Path) -> list[dict]:
    path = state_dir / "gpu-self-heal-log.jsonl"
    out = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"torn": line[:200]})
    return out


# ---------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="whole drills in a row, each on a fresh fleet")
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--cadence-s", type=float, default=60.0)
    ap.add_argument("--fault-cycle", type=int, default=2, help="hang/frozen/kill injected half a cadence before")
    ap.add_argument("--fault-offset-s", type=float, default=2.5,
                    help="after the half cadence: between two probes, so no client request is in flight")
    ap.add_argument("--slow-load-after", type=float, default=3.0, help="cycles after the others (fleet guard)")
    ap.add_argument("--slow-load-s", type=float, default=40.0)
    ap.add_argument("--stop-timeout-s", type=float, default=15.0, help="the supervisor's TimeoutStopSec")
    ap.add_argument("--restart-kill-signal", choices=("TERM", "KILL"), default="TERM",
                    help="the supervisor's RestartKillSignal (KILL: a restart costs no stop timeout)")
    ap.add_argument("--probe-every-s", type=float, default=5.0)
    ap.add_argument("--probe-timeout-s", type=float, default=10.0)
    ap.add_argument("--litellm", action="store_true",
                    help="a real LiteLLM in front: each faulted server in a model group with a healthy twin")
    ap.add_argument("--proxy-timeout-s", type=float, default=30.0, help="a user's timeout through LiteLLM")
    ap.add_argument("--no-drain", action="store_true",
                    help="with --litellm: gpuheal is not told LiteLLM's config file (no drain first): LiteLLM alone "
                    "routes around the fault")
    ap.add_argument("--litellm-router", type=json.loads, default=None,
                    help="LiteLLM router_settings as JSON (default: benchmarks/drill_litellm.py's)")
    ap.add_argument("--no-heal", action="store_true", help="baseline: `heal` without --apply")
    ap.add_argument("--seed", type=int, default=20, help="run i uses seed + i")
    ap.add_argument("--out", type=Path, help="JSON result (default benchmarks/results/drill-MODE-latest.json)")
    ap.add_argument("--llama-server", type=Path, help="binary (default: scripts/build-llama-server.sh's)")
    ap.add_argument("--keep", action="store_true", help="keep the run directories (logs, state)")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.cycles < 1:
        ap.error("--runs and --cycles: at least 1")
    return args


def binary_path(explicit: Path | None) -> Path:
    if explicit:
        return explicit
    env = os.environ.get("LLAMA_SERVER_BIN")
    if env:
        return Path(env)
    check = subprocess.run(["bash", str(ROOT / "scripts" / "build-llama-server.sh"), "--check"],
                           stdout=subprocess.PIPE, text=True)
    if check.returncode != 0 or not check.stdout.strip():
        raise SystemExit("drill: the real llama-server is not built here; run scripts/build-llama-server.sh "
                         "(once per machine), then the drill")
    return Path(check.stdout.strip().splitlines()[-1])


def machine() -> dict:
    """Where and under what load it ran: CPUs, model, kernel, the load averages now."""
    model = "?"
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "?")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": os.uname().release,
            "loadavg": [round(x, 2) for x in os.getloadavg()], "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def sigterm_to_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def execute(args: argparse.Namespace, run_dir: Path, seed: int) -> dict:
    """One drill: start everything, drive the cycles, stop everything (whatever happens), return the result."""
    from make_model import make_tiny_model

    from gpuheal.sim.zulip import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike

    binary = binary_path(args.llama_server)
    models = {"tiny": make_tiny_model(run_dir / "tiny.gguf"),
              "busy": make_tiny_model(run_dir / "busy.gguf", n_embd=512, n_layer=6, n_ff=2048)}
    freezes: dict[str, Freeze] = {}

    def before_reap(name: str, pid: int) -> None:
        if name in freezes:
            freezes.pop(name).end()

    sup = Supervisor(run_dir / "supervisor.sock", args.stop_timeout_s, before_reap,
                     signal.SIGKILL if args.restart_kill_signal == "KILL" else signal.SIGTERM)
    zulip = ZulipLookalike().start()
    stop = threading.Event()
    run = Run(t0=time.time())
    gh = proxy = None
    started = machine()
    try:
        sup.serve()
        ports = start_fleet(sup, binary, models, run_dir, args.slow_load_s, servers(args.litellm))
        env = {**os.environ, "ZULIP_EMAIL": DEFAULT_EMAIL, "ZULIP_API_KEY": DEFAULT_KEY, "NO_PROXY": "127.0.0.1"}
        if args.litellm:
            proxy = start_litellm(args, run_dir, ports)
            env["LITELLM_MASTER_KEY"] = proxy.master_key
        write_config(run_dir / "gpuheal.yaml", ports, sup.socket_path, zulip.port,
                     gpuheal_litellm(proxy, drain=not args.no_drain) if proxy else None)
        gh = Gpuheal(run_dir / "gpuheal.yaml", run_dir / "state", not args.no_heal, env)
        for _ in range(BUSY_CLIENTS):
            threading.Thread(target=busy_load, args=(ports["busy"], stop, run), daemon=True).start()
        time.sleep(3)  # the busy twin's slots fill before the first poll
        run.t0 = time.time()
        threading.Thread(target=prober, args=(run, ports, args, stop, proxy), daemon=True).start()
        drive(run, args, gh, sup, freezes, seed)
        run.end = run.rel()
        stop.set()
        time.sleep(max(args.probe_timeout_s, args.proxy_timeout_s if proxy else 0) + 0.5)  # the last probes end
        with run.lock:
            run.probes = [p for p in run.probes if p["sent"] < run.end]
    finally:
        stop.set()
        if gh is not None:
            gh.kill_running()
        for f in list(freezes.values()):
            f.end()
        sup.stop_all()
        sup.close()
        zulip.stop()
        if proxy is not None:
            proxy.stop()
    audit = read_audit(run_dir / "state")
    restarts = {name: svc.restarts for name, svc in sup.services.items()}
    return {"seed": seed, "machine": started, "load": load_figures(run.load), "loadavg_end": machine()["loadavg"],
            "gpuheal": gpuheal_version(run_dir), "duration_s": run.end,
            "servers": summarize(run, restarts, audit, servers(args.litellm)),
            "busy_generations_done": run.busy_done, "zulip_messages": len(zulip.messages),
            "cycle_log": sorted(run.cycles, key=lambda c: c["cycle"]),
            "probes": sorted(run.probes, key=lambda p: (p["server"], p.get("via", ""), p["sent"])),
            "audit": audit}


def router_settings(args: argparse.Namespace) -> dict:
    from drill_litellm import ROUTER_SETTINGS

    return ROUTER_SETTINGS if args.litellm_router is None else args.litellm_router


def gpuheal_litellm(proxy, drain: bool) -> dict:
    import drill_litellm

    return drill_litellm.gpuheal_litellm(proxy, drain)


def start_litellm(args: argparse.Namespace, run_dir: Path, ports: dict[str, int]):
    import drill_litellm

    return drill_litellm.start(run_dir / "litellm", ports, API_KEY, router_settings(args))


def settings(args: argparse.Namespace) -> dict:
    """What every run of one invocation shares (the JSON's head and each table's title line)."""
    return {"mode": "no-heal" if args.no_heal else "heal --apply", "wake": False, "litellm": args.litellm,
            "drain_first": args.litellm and not args.no_drain,
            "litellm_router": router_settings(args) if args.litellm else None,
            "cycles": args.cycles, "cadence_s": args.cadence_s, "fault_cycle": args.fault_cycle,
            "stop_timeout_s": args.stop_timeout_s, "restart_kill_signal": args.restart_kill_signal,
            "slow_load_s": args.slow_load_s, "probe_every_s": args.probe_every_s,
            "probe_timeout_s": args.probe_timeout_s, "proxy_timeout_s": args.proxy_timeout_s}


def gpuheal_version(cwd: Path) -> str:
    """Which gpuheal ran (imported from ``cwd``, as the cycles run it): version, tree, commit."""
    probe = "import gpuheal, os; print(gpuheal.__version__, os.path.dirname(os.path.dirname(gpuheal.__file__)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=cwd).stdout.split()
    if len(out) != 2:
        return "gpuheal not importable"
    version, tree = out
    rev = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "gpuheal"], capture_output=True, text=True)
    return f"{version} from {tree} at {rev.stdout.strip() or '?'}{' (gpuheal/ modified)' if dirty.stdout else ''}"


def default_out(args: argparse.Namespace) -> Path:
    name = f"drill-{'noheal' if args.no_heal else 'heal'}{'-litellm' if args.litellm else ''}-latest.json"
    return ROOT / "benchmarks" / "results" / name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, sigterm_to_interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C even where SIGINT came in ignored (`cmd &`)
    head = settings(args)
    runs: list[dict] = []
    for i in range(args.runs):
        run_dir = Path(tempfile.mkdtemp(prefix="gpuheal-drill-"))
        try:
            runs.append(execute(args, run_dir, args.seed + i))
        except KeyboardInterrupt:
            print("drill interrupted: every server stopped and reaped", file=sys.stderr)
            return 130
        finally:
            if not args.keep:
                shutil.rmtree(run_dir, ignore_errors=True)
            else:
                print(f"run directory kept: {run_dir}", file=sys.stderr)
        print(f"run {i + 1} of {args.runs}:\n{table({**head, **runs[-1]})}", flush=True)
    result = {**head, "runs_done": len(runs), "machine": machine(), "summary": aggregate(runs), "runs": runs}
    out = args.out or default_out(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(summary_table(result["summary"], len(runs)))
    print(f"result: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
