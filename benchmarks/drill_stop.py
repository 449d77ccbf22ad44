"""What the stop costs when a frozen llama-server is restarted (issue 28, item 4).

    .venv/bin/python benchmarks/drill_stop.py                                  # 2 faults x 4 variants x 3 (~12 min)
    .venv/bin/python benchmarks/drill_stop.py --variants 15,5,kill --reps 2    # shorter

A frozen server — SIGSTOPped (``hang``), or its task loop stopped by ptrace (``frozen``: ``/health``
ok, completions hang, llama.cpp#27388) — may ignore SIGTERM, so ``systemctl restart`` waits the unit's
``TimeoutStopSec`` before SIGKILL. This measures it against a real llama-server (scripts/build-llama-server.sh's binary,
the suite's generated tiny model) owned by the drill's systemd stand-in (benchmarks/drill_supervisor.py),
restarted through gpuheal's own path (``restart_command``: the supervisor's client over its Unix
socket). Variants: a stop timeout of N seconds (``TimeoutStopSec=N``; SIGTERM + SIGCONT first, as
systemd sends them) and ``kill`` (``RestartKillSignal=SIGKILL``: SIGKILL + SIGCONT first, with a 15 s
stop timeout that never comes into play). ``--faults none`` restarts a healthy server: what a normal
SIGTERM exit costs, the floor under any stop timeout.

Per sample: the fault is injected into the running server and a user's 4-token completion is sent to
it at once, left in flight with ``--client-timeout-s`` (120 s: a user behind LiteLLM waits longer,
its default request timeout is 6000 s); ``--settle-s`` (2 s) later the restart command runs. (A
SIGSTOPped llama-server given SIGTERM + SIGCONT exits at once when no request is in flight, but not
before the last one in flight ends — its client gives up — or the stop timeout's SIGKILL: so under
traffic it is as deaf as the frozen task loop.) recorded are ``stop_s`` (restart asked ->
old process reaped), ``restart_s`` (the command's wall time: what gpuheal waits for), ``health_s``
(restart asked -> ``/health`` 200) and ``served_s`` (restart asked -> the first 4-token completion
answered). The restarted server is the next sample's victim. Median and worst per variant go to
stdout and to a JSON file (default benchmarks/results/drill-stop-latest.json) with every sample and
the load average. Loopback only; on exit or Ctrl-C every server is stopped and reaped, every ptrace
ended.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "realserver"))

from drill import (  # noqa: E402
    binary_path,
    free_port,
    machine,
    post_completion,
    server_argv,
    sigterm_to_interrupt,
    wait_health,
)
from drill_faults import Freeze, freeze_task_loop, send  # noqa: E402
from drill_supervisor import Service, Supervisor  # noqa: E402

KILL_VARIANT_STOP_TIMEOUT_S = 15.0  # RestartKillSignal=SIGKILL beside the README's TimeoutStopSec


def parse_variant(text: str) -> tuple[str, float, signal.Signals]:
    """``"90"`` -> TimeoutStopSec=90 with SIGTERM first; ``"kill"`` -> SIGKILL first."""
    if text == "kill":
        return "RestartKillSignal=SIGKILL", KILL_VARIANT_STOP_TIMEOUT_S, signal.SIGKILL
    return f"TimeoutStopSec={float(text):g}", float(text), signal.SIGTERM


def inject(fault: str, pid: int) -> Freeze | None:
    """``hang``: SIGSTOP; ``frozen``: the task loop stopped by ptrace; ``none``: a healthy server
    (what a normal SIGTERM exit costs, the floor of any stop timeout)."""
    if fault == "hang":
        send(pid, signal.SIGSTOP)
    elif fault == "frozen":
        return freeze_task_loop(pid)
    return None


def sample(sup: Supervisor, freezes: dict[str, Freeze], fault: str, port: int, args: argparse.Namespace) -> dict:
    """One fault with a user's request in flight, one restart through the client (as gpuheal runs
    restart_command), and what it cost."""
    pid = sup.pid("victim")
    freeze = inject(fault, pid)
    if freeze is not None:
        freezes["victim"] = freeze
    threading.Thread(target=post_completion, args=(port, 4, args.client_timeout_s), daemon=True).start()
    time.sleep(args.settle_s)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "drill_supervisor.py"), str(sup.socket_path),
                           "restart", "victim"], capture_output=True, text=True, timeout=300)
    restart_s = time.monotonic() - t0
    rec = sup.services["victim"].restarts[-1]
    healthy = wait_health(port, 120)
    health_s = time.monotonic() - t0
    served_s = None
    deadline = time.monotonic() + 60
    while healthy and time.monotonic() < deadline:
        if post_completion(port, 4, 10.0)[0]:
            served_s = round(time.monotonic() - t0, 2)
            break
        time.sleep(0.1)
    return {"fault": fault, "rc": done.returncode, "how": rec["stop"], "stop_s": rec["stop_s"],
            "restart_s": round(restart_s, 2), "health_s": round(health_s, 2) if healthy else None,
            "served_s": served_s, "loadavg": [round(x, 2) for x in os.getloadavg()]}


def summary(samples: list[dict], key: str) -> dict:
    vals = [s[key] for s in samples if s[key] is not None]
    return {"median": round(statistics.median(vals), 2) if vals else None, "worst": max(vals) if vals else None,
            "n": len(vals), "missing": len(samples) - len(vals)}


def measure(args: argparse.Namespace, run_dir: Path) -> list[dict]:
    from make_model import make_tiny_model

    binary = binary_path(args.llama_server)
    model = make_tiny_model(run_dir / "tiny.gguf")
    out: list[dict] = []
    for fault in args.faults:
        for text in args.variants:
            row = variant(args, run_dir, binary, model, fault, text)
            print(line(row), flush=True)
            out.append(row)
    return out


def variant(args: argparse.Namespace, run_dir: Path, binary: Path, model: Path, fault: str, text: str) -> dict:
    """``--reps`` samples of one fault under one stop variant, on one supervised server."""
    label, stop_timeout_s, first = parse_variant(text)
    freezes: dict[str, Freeze] = {}

    def before_reap(name: str, pid: int) -> None:
        if name in freezes:
            freezes.pop(name).end()

    sup = Supervisor(run_dir / "s.sock", stop_timeout_s, before_reap, first)
    try:
        sup.serve()
        port = free_port()
        sup.add(Service("victim", server_argv(binary, model, port, busy=False), run_dir / "victim.log"))
        if not wait_health(port, 120):
            raise RuntimeError(f"the server did not start; see {run_dir / 'victim.log'}")
        samples = [sample(sup, freezes, fault, port, args) for _ in range(args.reps)]
    finally:
        for f in list(freezes.values()):
            f.end()
        sup.stop_all()
        sup.close()
    return {"fault": fault, "variant": label, "stop_timeout_s": stop_timeout_s, "first_signal": first.name,
            "samples": samples, **{k: summary(samples, k) for k in ("stop_s", "restart_s", "health_s", "served_s")}}


def line(row: dict) -> str:
    hows = ",".join(sorted({s["how"] for s in row["samples"]}))
    cells = [f"{row[k]['median']}/{row[k]['worst']}" for k in ("stop_s", "restart_s", "served_s")]
    return f"{row['fault']:7} {row['variant']:27} {hows:8} " + " ".join(f"{c:>13}" for c in cells)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", type=lambda s: s.split(","), default=["hang", "frozen"], help="hang,frozen,none")
    ap.add_argument("--variants", type=lambda s: s.split(","), default=["90", "15", "5", "kill"],
                    help="stop timeouts in s, and 'kill' (RestartKillSignal=SIGKILL)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=2.0, help="fault -> restart")
    ap.add_argument("--client-timeout-s", type=float, default=120.0, help="the in-flight user request's timeout")
    ap.add_argument("--llama-server", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "drill-stop-latest.json")
    args = ap.parse_args(argv)
    for v in args.variants:
        parse_variant(v)  # a bad variant fails before any server starts
    if not args.faults or set(args.faults) - {"hang", "frozen", "none"}:
        ap.error("--faults: hang, frozen and/or none")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, sigterm_to_interrupt)
    run_dir = Path(tempfile.mkdtemp(prefix="drill-stop-"))  # short: a Unix socket path has ~100 bytes
    started = machine()
    print(f"{'fault':7} {'variant':27} {'stop':8} {'stop s':>13} {'restart s':>13} {'served s':>13}  "
          "(median/worst)", flush=True)
    try:
        rows = measure(args, run_dir)
    except KeyboardInterrupt:
        print("interrupted: every server stopped and reaped", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    result = {"reps": args.reps, "settle_s": args.settle_s, "client_timeout_s": args.client_timeout_s,
              "machine_start": started, "machine_end": machine(),
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"result: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
