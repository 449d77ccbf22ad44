"""The drill (issue 20, item 3): gpuheal healing real llama-servers in real time, and what users saw.

    .venv/bin/python benchmarks/drill.py                       # 10 cycles, 60 s apart (~11 min)
    .venv/bin/python benchmarks/drill.py --no-heal             # the baseline: `heal` without --apply
    .venv/bin/python benchmarks/drill.py --cycles 3 --cadence-s 20 --fault-cycle 1   # smoke (~1.5 min)

Seven real llama-servers (the suite's binary from scripts/build-llama-server.sh, the suite's
generated tiny model) on 127.0.0.1, owned by a systemd-like supervisor (benchmarks/drill_supervisor.py:
SIGTERM + SIGCONT, ``--stop-timeout-s`` (15 s), SIGKILL, start). Each gets one fault or none:

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
gpuheal's audit trail (gpu-self-heal-log.jsonl) records on them. The result is one JSON file in
benchmarks/results/ and a table on stdout. Everything stays on loopback; it stops by itself; on exit
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
from drill_supervisor import Service, Supervisor  # noqa: E402

API_KEY = "drill-key"
FAULTS = {"hang": "SIGSTOP", "frozen": "ptrace task loop", "kill": "SIGKILL", "slow-load": "SIGKILL, 40 s load",
          "busy": "none (saturated)", "control-1": "none", "control-2": "none"}
FAULTED = ("hang", "frozen", "kill", "slow-load")
QUIET = ("busy", "control-1", "control-2")
BUSY_CLIENTS = 4  # -np 2: two generating, two deferred
BUSY_N_PREDICT = 3000


@dataclass
class Run:
    """Everything the drill records while it runs (times are seconds since the drill's t0)."""

    t0: float
    probes: list[dict] = field(default_factory=list)
    cycles: list[dict] = field(default_factory=list)
    faults: dict[str, float] = field(default_factory=dict)
    busy_done: int = 0
    end: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rel(self, t: float | None = None) -> float:
        return round((time.time() if t is None else t) - self.t0, 2)


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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return True
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(0.2)
    return False


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
                slow_load_s: float) -> dict[str, int]:
    ports: dict[str, int] = {}
    for name in FAULTS:
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


def write_config(path: Path, ports: dict[str, int], sock: Path, zulip_port: int) -> None:
    import yaml

    client = [sys.executable, str(ROOT / "benchmarks" / "drill_supervisor.py"), str(sock), "restart"]
    cfg = {
        "litellm": {"api_key": API_KEY},
        "zulip": {"site": f"http://127.0.0.1:{zulip_port}", "timeout_s": 5},
        "gpus": [{"alias": name, "host": f"drill-{name}", "endpoint": f"http://127.0.0.1:{port}",
                  "transport": "local", "restart_command": client + [name]} for name, port in ports.items()],
    }
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
        run.probes.append({"server": name, "sent": run.rel(sent), "done": run.rel(), "ok": ok, "error": err})


def prober(run: Run, ports: dict[str, int], every_s: float, timeout_s: float, stop: threading.Event) -> None:
    tick = 0
    while not stop.is_set():
        for name, port in ports.items():
            threading.Thread(target=probe_once, args=(run, name, port, timeout_s), daemon=True).start()
        tick += 1
        stop.wait(max(0.0, run.t0 + tick * every_s - time.time()))


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


def schedule(args: argparse.Namespace) -> list[tuple[float, str, object]]:
    """(seconds after t0, kind, what): cron starts with jitter, then faults; sorted by time."""
    rng = random.Random(args.seed)
    events: list[tuple[float, str, object]] = [(k * args.cadence_s + rng.uniform(0.3, 1.7), "cycle", k)
                                               for k in range(args.cycles)]
    at = (args.fault_cycle - 0.5) * args.cadence_s + args.fault_offset_s
    events += [(at, "fault", n) for n in ("hang", "frozen", "kill")]
    events.append((at + args.slow_load_after * args.cadence_s, "fault", "slow-load"))
    return sorted(events, key=lambda e: e[0])


def drive(run: Run, args: argparse.Namespace, gh: Gpuheal, sup: Supervisor, freezes: dict[str, Freeze]) -> None:
    threads: list[threading.Thread] = []
    for at, kind, what in schedule(args):
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


def first_cycle(cycles: list[dict], gpu: str, *, fired: bool) -> int | None:
    """The first cycle whose poll saw an issue on ``gpu``: any, or one past pending (firing, verifying...)."""
    for rec in sorted(cycles, key=lambda r: r["cycle"]):
        if any(i["gpu"] == gpu and (not fired or i["state"] != "pending") for i in rec["issues"] or ()):
            return rec["cycle"]
    return None


def summarize(run: Run, sup: Supervisor, audit: list[dict]) -> dict:
    per: dict[str, dict] = {}
    for name in FAULTS:
        fault_t = run.faults.get(name)
        probes = [p for p in run.probes if p["server"] == name]
        after = [p for p in probes if fault_t is not None and p["sent"] >= fault_t]
        first_ok = next((p for p in sorted(after, key=lambda p: p["sent"]) if p["ok"]), None)
        restarts = [{**r, "t": run.rel(r["t"])} for r in sup.services[name].restarts]
        actions = [a for a in audit if a.get("gpu") == name and a.get("phase") == "intent"]
        per[name] = {
            "fault": FAULTS[name], "injected_s": fault_t,
            "pending_cycle": first_cycle(run.cycles, name, fired=False),
            "fired_cycle": first_cycle(run.cycles, name, fired=True),
            "restarts": restarts,
            "mttr_s": round(first_ok["done"] - fault_t, 1) if first_ok and fault_t is not None else None,
            "failed_after_fault": sum(not p["ok"] for p in after if first_ok is None or p["sent"] < first_ok["sent"]),
            "probes_ok": sum(p["ok"] for p in probes), "probes": len(probes),
            "actions": [{"action": a.get("action"), "issue": a.get("issue"), "ts": a.get("ts")} for a in actions],
        }
    return per


def table(result: dict) -> str:
    rows = [f"drill: {result['mode']}, {result['cycles']} cycles every {result['cadence_s']} s, faults before cycle "
            f"{result['fault_cycle']}, stop timeout {result['stop_timeout_s']} s",
            f"{'server':10} {'fault':18} {'inject s':>8} {'pend':>4} {'fire':>4} {'restarts (t s, stop)':24} "
            f"{'MTTR s':>7} {'failed':>6} {'ok/probes':>9} {'actions':>7}"]
    for name, s in result["servers"].items():
        rs = ", ".join(f"{r['t']:.0f} {r['stop']}" for r in s["restarts"]) or "-"
        rows.append(f"{name:10} {s['fault']:18} {_f(s['injected_s']):>8} {_f(s['pending_cycle']):>4} "
                    f"{_f(s['fired_cycle']):>4} {rs:24} {_f(s['mttr_s']):>7} {s['failed_after_fault']:>6} "
                    f"{s['probes_ok']:>4}/{s['probes']:<4} {len(s['actions']):>7}")
    return "\n".join(rows)


def _f(v: object) -> str:
    return "-" if v is None else str(v)


# ---------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--cadence-s", type=float, default=60.0)
    ap.add_argument("--fault-cycle", type=int, default=2, help="hang/frozen/kill injected half a cadence before")
    ap.add_argument("--fault-offset-s", type=float, default=2.5,
                    help="after the half cadence: between two probes, so no client request is in flight")
    ap.add_argument("--slow-load-after", type=float, default=3.0, help="cycles after the others (fleet guard)")
    ap.add_argument("--slow-load-s", type=float, default=40.0)
    ap.add_argument("--stop-timeout-s", type=float, default=15.0, help="the supervisor's TimeoutStopSec")
    ap.add_argument("--probe-every-s", type=float, default=5.0)
    ap.add_argument("--probe-timeout-s", type=float, default=10.0)
    ap.add_argument("--no-heal", action="store_true", help="baseline: `heal` without --apply")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--out", type=Path, help="JSON result (default benchmarks/results/drill-MODE-latest.json)")
    ap.add_argument("--llama-server", type=Path, help="binary (default: scripts/build-llama-server.sh's)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory (logs, state)")
    return ap.parse_args(argv)


def binary_path(explicit: Path | None) -> Path:
    if explicit:
        return explicit
    env = os.environ.get("LLAMA_SERVER_BIN")
    if env:
        return Path(env)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "build-llama-server.sh")], stdout=subprocess.PIPE,
                         text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def execute(args: argparse.Namespace, run_dir: Path) -> dict:
    """Start everything, drive the cycles, stop everything (whatever happens), return the result."""
    from make_model import make_tiny_model

    from gpuheal.sim.zulip import DEFAULT_EMAIL, DEFAULT_KEY, ZulipLookalike

    binary = binary_path(args.llama_server)
    models = {"tiny": make_tiny_model(run_dir / "tiny.gguf"),
              "busy": make_tiny_model(run_dir / "busy.gguf", n_embd=512, n_layer=6, n_ff=2048)}
    freezes: dict[str, Freeze] = {}

    def before_reap(name: str, pid: int) -> None:
        if name in freezes:
            freezes.pop(name).end()

    sup = Supervisor(run_dir / "supervisor.sock", args.stop_timeout_s, before_reap)
    zulip = ZulipLookalike().start()
    stop = threading.Event()
    run = Run(t0=time.time())
    gh = None
    try:
        sup.serve()
        ports = start_fleet(sup, binary, models, run_dir, args.slow_load_s)
        write_config(run_dir / "gpuheal.yaml", ports, sup.socket_path, zulip.port)
        env = {**os.environ, "ZULIP_EMAIL": DEFAULT_EMAIL, "ZULIP_API_KEY": DEFAULT_KEY, "NO_PROXY": "127.0.0.1"}
        gh = Gpuheal(run_dir / "gpuheal.yaml", run_dir / "state", not args.no_heal, env)
        for _ in range(BUSY_CLIENTS):
            threading.Thread(target=busy_load, args=(ports["busy"], stop, run), daemon=True).start()
        time.sleep(3)  # the busy twin's slots fill before the first poll
        run.t0 = time.time()
        threading.Thread(target=prober, args=(run, ports, args.probe_every_s, args.probe_timeout_s, stop),
                         daemon=True).start()
        drive(run, args, gh, sup, freezes)
        run.end = run.rel()
        stop.set()
        time.sleep(args.probe_timeout_s + 0.5)  # the last probes answer or time out while the faults hold
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
    audit = read_audit(run_dir / "state")
    return {"mode": "no-heal" if args.no_heal else "heal --apply", "cycles": args.cycles,
            "cadence_s": args.cadence_s, "fault_cycle": args.fault_cycle, "stop_timeout_s": args.stop_timeout_s,
            "slow_load_s": args.slow_load_s, "probe_every_s": args.probe_every_s,
            "probe_timeout_s": args.probe_timeout_s, "seed": args.seed,
            "gpuheal": gpuheal_version(run_dir), "duration_s": run.end, "servers": summarize(run, sup, audit),
            "busy_generations_done": run.busy_done, "zulip_messages": len(zulip.messages),
            "cycle_log": sorted(run.cycles, key=lambda c: c["cycle"]),
            "probes": sorted(run.probes, key=lambda p: (p["server"], p["sent"])),
            "audit": audit}


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C even where SIGINT came in ignored (`cmd &`)
    run_dir = Path(tempfile.mkdtemp(prefix="gpuheal-drill-"))
    try:
        result = execute(args, run_dir)
    except KeyboardInterrupt:
        print("drill interrupted: every server stopped and reaped", file=sys.stderr)
        return 130
    finally:
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            print(f"run directory kept: {run_dir}", file=sys.stderr)
    out = args.out or ROOT / "benchmarks" / "results" / f"drill-{'noheal' if args.no_heal else 'heal'}-latest.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"result: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
