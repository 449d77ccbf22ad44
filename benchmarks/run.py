#!/usr/bin/env python3
"""gpuheal benchmarks, for the record (issue 2, "Benchmark"): figures, not timed tests.

Starts its own servers on 127.0.0.1 (tests/servers.py), runs the installed ``gpuheal`` as cron
would (a fresh process each time) and prints a table. ``--update`` also writes every figure to the
tracked ``benchmarks/results/latest.json`` (``--out PATH`` anywhere else): a plain run leaves the
tree clean. Stdlib + the package + tests/servers.py only.

    .venv/bin/python benchmarks/run.py            # everything (about a minute)
    .venv/bin/python benchmarks/run.py --quick    # fewer repetitions, 1000-GPU case once
    .venv/bin/python benchmarks/run.py --profile  # also cProfile the 1000-GPU check (top 25)

Measured:
  help        start-up of ``gpuheal --help``, median of N subprocess runs
  check-3     ``check --json`` on a 3-GPU loopback fleet (monitor, 3 llama-servers, LiteLLM), median of N
  check-1000  ``check --json`` on 1000 GPUs (one monitor document of 1000 GPUs, 1000 llama-server
              endpoints answering /health, /metrics, /props and /slots with a real server's bodies)
              with 6.5 h of per-minute history already in the state directory: wall time (median)
              and peak RSS (max over runs, from getrusage of a wrapper's children)
  smi-1000    the same without gpu-monitor (issue 12): 250 hosts x 4 GPUs, each host's readings from
              one local ``nvidia-smi`` (a stand-in on PATH printing real captured rows)
  dead-200    ``check --json`` against 200 endpoints that accept and never answer (and a monitor
              and LiteLLM that do the same): wall time against the probe deadline
  imports     modules that ``check`` imports (``-X importtime``): fabric/paramiko/invoke must be absent
  doctor      ``doctor --json`` on a healthy simulated 3-GPU fleet (gpu-monitor, llama-servers,
              LiteLLM with a database, Zulip look-alike, local commands) and on a dead one (every
              HTTP peer accepts and never answers, every SSH host never sends its banner;
              deadlines 2 s): wall time, median of 5 each (issue 11)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from servers import (  # noqa: E402
    HEALTH_OK,
    Hang,
    LoopbackServer,
    Reply,
    fleet_config,
    gpu_entry,
    gpuheal_argv,
    json_reply,
    write_config,
)

TARGETS = {"help": 0.100, "check-3": 0.300, "check-1000": 2.0, "check-1000-rss-mb": 200.0,
           "doctor-3": 1.0, "doctor-dead": 2 * 2.0 + 2.0}
START = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)
NEVER_IMPORTED = ("fabric", "paramiko", "invoke", "requests")
LATEST = ROOT / "benchmarks" / "results" / "latest.json"  # tracked: rewritten only with --update


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")}
    env.update(TERM="dumb", **extra)
    return env


def timed_run(argv: list[str], env: dict[str, str], ok_codes=(0, 1, 2)) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    took = time.perf_counter() - started
    if proc.returncode not in ok_codes:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr}")
    return took, proc


RSS_WRAPPER = (
    "import resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
    "t = time.perf_counter() - t\n"
    "r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print(p.returncode, t, r.ru_maxrss, r.ru_utime + r.ru_stime)\n"
    "sys.stderr.buffer.write(p.stderr)\n"
)


def run_with_rss(argv: list[str], env: dict[str, str]) -> tuple[int, float, float, float, str]:
    """(rc, wall s, peak RSS MB, cpu s) of one run of ``argv``, via a wrapper whose only child it is."""
    proc = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *argv], capture_output=True, text=True, env=env,
                          timeout=300)
    rc, wall, maxrss_kb, cpu = proc.stdout.split()
    return int(rc), float(wall), int(maxrss_kb) / 1024, float(cpu), proc.stderr


def stamp(minutes: int) -> str:
    return (START + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- cases


def bench_help(n: int) -> dict:
    argv = [*gpuheal_argv(), "--help"]
    timed_run(argv, clean_env())  # warm the page cache
    times = [timed_run(argv, clean_env())[0] for _ in range(n)]
    return {"median_s": statistics.median(times), "min_s": min(times), "runs": n, "target_s": TARGETS["help"]}


def bench_check_3(n: int, work: Path) -> dict:
    hosts = {"gpu-dense": "ct8", "gpu-light": "ct110", "strix-moe": "ct15"}
    doc = {"generated_at": stamp(0), "gpus": [gpu_entry(h) for h in hosts.values()]}
    with (
        LoopbackServer({"/gpu-data": json_reply(doc)}, record=False) as monitor,
        LoopbackServer({"/health/liveliness": Reply(200, '"I\'m alive!"')}, record=False) as litellm,
        LoopbackServer({"/health": HEALTH_OK}, ports=3, record=False) as gpus,
    ):
        cfg = fleet_config(
            monitor.url + "/gpu-data",
            [(alias, host, url) for (alias, host), url in zip(hosts.items(), gpus.urls, strict=True)],
            litellm_url=litellm.url,
            timeout_s=5,
        )
        config = write_config(work / "check3.yaml", cfg)
        state = work / "state-3"
        base = [*gpuheal_argv(), "--config", str(config), "--state-dir", str(state), "check", "--json"]
        timed_run(base, clean_env(GPUHEAL_NOW=stamp(0)))
        times, codes = [], set()
        for i in range(n):
            took, proc = timed_run(base, clean_env(GPUHEAL_NOW=stamp(i + 1)))
            times.append(took)
            codes.add(proc.returncode)
    return {"median_s": statistics.median(times), "min_s": min(times), "runs": n, "exit_codes": sorted(codes),
            "target_s": TARGETS["check-3"]}


def make_history(aliases: list[str], end: datetime, hours: float = 6.5) -> dict:
    """Per-minute samples for ``hours`` up to ``end``, as ``History.from_dict`` takes them."""
    n = int(hours * 60)
    t0 = end.timestamp() - n * 60
    ts = [round(t0 + 60 * i, 3) for i in range(n)]
    raw = {}
    for k, alias in enumerate(aliases):
        raw[alias] = {
            "t": ts,
            "temp_c": [55.0 + k % 10 + (i % 3) * 0.5 for i in range(n)],  # steady, no trend
            "vram_used_mb": [10_000.0 + i * 0.5 for i in range(n)],
            "util_pct": [40.0 + (i * 7 + k) % 50 for i in range(n)],
            "power_w": [180.0 + (i + k) % 90 for i in range(n)],
            "endpoint": ["ok"] * n,
        }
    return {"raw": raw, "coarse": {}}


def write_state_file(state: Path, name: str, data: dict) -> None:
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    (state / name).write_text(json.dumps({"schema_version": 1, "data": data}, separators=(",", ":")))
    os.chmod(state / name, 0o600)


def bench_check_1000(n: int, work: Path, profile: bool, framings: tuple[str, ...] = ()) -> dict:
    count = 1000
    hosts = [f"node{i:04d}" for i in range(count)]
    aliases = [f"gpu-{i:04d}" for i in range(count)]
    doc = {
        "generated_at": stamp(0),
        "gpus": [gpu_entry(h, temp_c=55 + i % 10, vram_used_mb=10_000 + 195) for i, h in enumerate(hosts)],
        "summary": {
            "available_models": [
                {"name": a, "hostname": h, "requests_60s": 20, "failures_60s": 0, "consecutive_timeouts": 0}
                for a, h in zip(aliases, hosts, strict=True)
            ],
            "circuit_breakers": [],
        },
    }
    body = json.dumps(doc).encode()

    telemetry = llama_routes()

    def health(req):  # one port, one path per GPU: /gpu-0001/health -> ok, /gpu-0001/metrics -> ...
        path = "/" + req.path.rsplit("/", 1)[-1]
        return telemetry.get(path, Reply(404, ""))

    with (
        LoopbackServer({"/gpu-data": Reply(200, body, {"Content-Type": "application/json"})}, record=False) as monitor,
        LoopbackServer({"/health/liveliness": Reply(200, '"ok"')}, record=False) as litellm,
        LoopbackServer(default=health, record=False, backlog=4096, keep_alive=True) as gpus,
    ):
        cfg = fleet_config(
            monitor.url + "/gpu-data",
            [(a, h, f"{gpus.url}/{a}") for a, h in zip(aliases, hosts, strict=True)],
            litellm_url=litellm.url,
            timeout_s=5,
            monitor={"max_response_bytes": 8 * 1024 * 1024},
        )
        config = write_config(work / "check1000.yaml", cfg)
        state = work / "state-1000"
        from gpuheal.state.history import History

        # stored exactly as gpuheal stores it (History.to_dict), as if cron had run for 6.5 h
        write_state_file(state, "history.json", History.from_dict(make_history(aliases, START)).to_dict())
        history_mb = (state / "history.json").stat().st_size / 1e6
        tail = ["--config", str(config), "--state-dir", str(state), "check", "--json"]
        argvs = {f: [*framing_argv(f), *tail] for f in framings} or {"": [*gpuheal_argv(), *tail]}
        # the first run of a new config text validates it against the schema (and remembers it)
        for argv in argvs.values():
            cold_rc, cold_wall, cold_rss, _, err = run_with_rss(argv, clean_env(GPUHEAL_NOW=stamp(1)))
            if cold_rc not in (0, 1, 2):
                raise SystemExit(f"1000-GPU check failed ({cold_rc}):\n{err}")
        runs: dict[str, list[tuple[float, float, float]]] = {f: [] for f in argvs}
        codes = set()
        for i in range(n):  # with several framings, their runs alternate: each meets the same load
            for j, (f, argv) in enumerate(argvs.items()):
                rc, wall, peak, cpu, err = run_with_rss(argv, clean_env(GPUHEAL_NOW=stamp(2 + i * len(argvs) + j)))
                if rc not in (0, 1, 2):
                    raise SystemExit(f"1000-GPU check failed ({rc}):\n{err}")
                runs[f].append((wall, peak, cpu))
                codes.add(rc)
        by_framing = {f: run_figures(r) for f, r in runs.items()}
        out = {
            **next(iter(by_framing.values())),
            "runs": n,
            "first_run_s": cold_wall,
            "first_run_rss_mb": cold_rss,
            "gpus": count,
            "history_file_mb": round(history_mb, 1),
            "monitor_document_kb": round(len(body) / 1024, 1),
            "exit_codes": sorted(codes),
            "target_s": TARGETS["check-1000"],
            "target_rss_mb": TARGETS["check-1000-rss-mb"],
        }
        if framings:
            out["framings"] = by_framing
        if profile:
            out["profile_top"] = profile_check(config, state, stamp(2 + n * len(argvs)))
    return out


def run_figures(runs: list[tuple[float, float, float]]) -> dict:
    """Median and max wall, peak RSS and median CPU of (wall s, peak RSS MB, CPU s) runs."""
    walls, rss, cpus = zip(*runs, strict=True)
    return {"median_s": statistics.median(walls), "max_s": max(walls), "peak_rss_mb": max(rss),
            "cpu_s_median": statistics.median(cpus)}


def framing_argv(framing: str) -> list[str]:
    """gpuheal with the chosen HTTP/1.1 framing (``benchmarks/framing_run.py``; issue 19 item 5)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from framing_run import argv

    return argv(framing)


def llama_routes() -> dict:
    """A busy llama-server's real answers (b11312, tests/data/llama): /health, /metrics with two
    requests processing and one deferred, /props awake, /slots with both slots busy."""
    data = ROOT / "tests" / "data" / "llama"
    return {
        "/health": HEALTH_OK,
        "/metrics": Reply(200, (data / "metrics-busy-deferred.txt").read_bytes(),
                          {"Content-Type": "text/plain; version=0.0.4"}),
        "/props": json_reply({"total_slots": 2, "is_sleeping": False, "build_info": "b11312-0c1e57098"}),
        "/slots": Reply(200, (data / "slots-busy.json").read_bytes(), {"Content-Type": "application/json"}),
    }


FAKE_SMI = """#!/bin/sh
# nvidia-smi stand-in for the benchmark: the 4 rows of one host, real captured values
# (exec: one process a call, not a shell and its child: 250 "hosts" all run on this machine)
exec cat {rows}
"""


def bench_smi_1000(n: int, work: Path) -> dict:
    """No gpu-monitor (issue 12): 250 hosts x 4 GPUs, each host's 4 rows from one local
    ``nvidia-smi`` (a stand-in on PATH printing real captured rows), plus /health, /metrics, /props
    and /slots of 1000 llama-server endpoints, 6.5 h of history in the state directory."""
    from smi_captures import NVIDIA_CAPTURES, multi_gpu_csv

    hosts, per_host = 250, 4
    bin_dir = work / "smi-bin"
    bin_dir.mkdir(exist_ok=True)
    rows = work / "smi-rows.csv"
    rows.write_text(multi_gpu_csv(NVIDIA_CAPTURES[:per_host]))
    tool = bin_dir / "nvidia-smi"
    tool.write_text(FAKE_SMI.format(rows=rows))
    tool.chmod(0o755)
    gpus = [(f"gpu-{h:03d}-{i}", f"node{h:03d}", i) for h in range(hosts) for i in range(per_host)]
    aliases = [a for a, _, _ in gpus]
    telemetry = llama_routes()

    def server(req):
        return telemetry.get("/" + req.path.rsplit("/", 1)[-1], Reply(404, ""))

    with LoopbackServer(default=server, record=False, backlog=4096, keep_alive=True) as llama:
        cfg = {
            "litellm": {"api_key": "bench-key"},
            "probe": {"timeout_s": 5},
            "gpus": [{"alias": a, "host": h, "gpu_index": i, "endpoint": f"{llama.url}/{a}", "transport": "local",
                      "vendor": "nvidia"} for a, h, i in gpus],
        }
        config = write_config(work / "smi1000.yaml", cfg)
        state = work / "state-smi-1000"
        from gpuheal.state.history import History

        write_state_file(state, "history.json", History.from_dict(make_history(aliases, START)).to_dict())
        env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        base = [*gpuheal_argv(), "--config", str(config), "--state-dir", str(state), "check", "--json"]
        cold_rc, cold_wall, _, _, err = run_with_rss(base, clean_env(GPUHEAL_NOW=stamp(1), **env))
        if cold_rc not in (0, 1, 2):
            raise SystemExit(f"smi 1000-GPU check failed ({cold_rc}):\n{err}")
        walls, rss, cpus, codes = [], [], [], set()
        for i in range(n):
            rc, wall, peak, cpu, err = run_with_rss(base, clean_env(GPUHEAL_NOW=stamp(i + 2), **env))
            if rc not in (0, 1, 2):
                raise SystemExit(f"smi 1000-GPU check failed ({rc}):\n{err}")
            walls.append(wall)
            rss.append(peak)
            cpus.append(cpu)
            codes.add(rc)
        _, proc = timed_run(base, clean_env(GPUHEAL_NOW=stamp(n + 2), **env))
        doc = json.loads(proc.stdout)
        read = sum(1 for g in doc["gpus"].values() if g.get("temp_c") is not None and g.get("requests_processing") == 2)
    return {
        "median_s": statistics.median(walls), "max_s": max(walls), "peak_rss_mb": max(rss),
        "cpu_s_median": statistics.median(cpus), "runs": n, "first_run_s": cold_wall, "hosts": hosts,
        "gpus": hosts * per_host, "gpus_fully_read": read, "faults": len(doc["faults"]),
        "exit_codes": sorted(codes), "target_s": TARGETS["check-1000"], "target_rss_mb": TARGETS["check-1000-rss-mb"],
    }


def profile_check(config: Path, state: Path, now: str) -> list[str]:
    code = (
        "import cProfile, pstats, io, sys\n"
        "from gpuheal.cli import main\n"
        "pr = cProfile.Profile(); pr.enable()\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats('cumulative').print_stats(25)\n"
        "sys.stderr.write(s.getvalue())\n"
    )
    argv = [sys.executable, "-c", code, "--config", str(config), "--state-dir", str(state), "check", "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=clean_env(GPUHEAL_NOW=now), timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if "cumtime" in line), 0)
    return lines[start : start + 26]


def bench_dead_sweep(work: Path, deadline_s: float = 2.0) -> dict:
    count = 200
    with (
        LoopbackServer(default=Hang(), ports=count, record=False) as dead,
        LoopbackServer({"/gpu-data": Hang()}, record=False) as monitor,
        LoopbackServer({"/health/liveliness": Hang()}, record=False) as litellm,
    ):
        cfg = fleet_config(
            monitor.url + "/gpu-data",
            [(f"dead-{i:03d}", f"dead{i:03d}", url) for i, url in enumerate(dead.urls)],
            litellm_url=litellm.url,
            timeout_s=deadline_s,
        )
        config = write_config(work / "dead.yaml", cfg)
        argv = [*gpuheal_argv(), "--config", str(config), "--state-dir", str(work / "state-dead"), "check", "--json"]
        took, proc = timed_run(argv, clean_env(GPUHEAL_NOW=stamp(0)))
        doc = json.loads(proc.stdout)
    timeouts = sum(1 for row in doc["gpus"].values() if row["endpoint"] == "timeout")
    return {
        "wall_s": took,
        "probe_deadline_s": deadline_s,
        "endpoints": count,
        "timeouts_reported": timeouts,
        "status": doc["status"],
        "exit_code": proc.returncode,
        "target_s": deadline_s + 1.0,
    }


def bench_doctor(n: int, work: Path, deadline_s: float = 2.0) -> dict:
    """``doctor --json``: a healthy simulated 3-GPU fleet, then the same fleet dead."""
    from gpuheal.sim import Scenario, SimFleet
    from gpuheal.sim.zulip import ZulipLookalike

    email, key = "gpuheal-bot@zulip.example.org", "bench-zulip-key-0123"
    env = clean_env(LITELLM_MASTER_KEY="sk-sim-admin-0000", ZULIP_EMAIL=email, ZULIP_API_KEY=key)
    fleet = SimFleet(Scenario.load(ROOT / "examples" / "scenarios" / "demo.yaml"), ports="ephemeral").start()
    zulip = ZulipLookalike(email, key).start()
    try:
        raw = fleet.config_dict()
        raw["zulip"] = {"site": zulip.url, "stream": "agent-hub", "timeout_s": deadline_s}
        raw["heal"] = {"gpu_monitor_restart_command": [sys.executable, "-m", "gpuheal.sim.control", fleet.control_url,
                                                       "restart", "monitor"]}
        for g in raw["gpus"]:
            g["litellm_model_id"] = g["alias"]
        config = write_config(work / "doctor3.yaml", raw)
        argv = [*gpuheal_argv(), "--config", str(config), "--state-dir", str(work / "state-doctor"), "doctor", "--json"]
        first = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        if first.returncode != 0:
            bad = [c for c in json.loads(first.stdout or '{"checks": []}')["checks"] if c["status"] != "ok"]
            raise SystemExit(f"doctor on the healthy fleet exited {first.returncode}: {bad or first.stderr}")
        healthy = [timed_run(argv, env, ok_codes=(0,))[0] for _ in range(n)]
    finally:
        zulip.stop()
        fleet.stop()
    with LoopbackServer(default=Hang(), ports=6, record=False) as dead:
        urls = dead.urls
        gpus = [{"alias": a, "host": "127.0.0.1", "ssh_port": int(urls[i].rsplit(":", 1)[1]), "endpoint": urls[i],
                 "gpu_index": i, "vendor": "nvidia", "transport": "ssh", "litellm_model_id": a,
                 "restart_command": "systemctl restart llama-server"}
                for i, a in enumerate(("gpu-dense", "gpu-light", "strix-moe"))]
        raw = {"monitor": {"url": urls[3] + "/gpu-data", "timeout_s": deadline_s},
               "litellm": {"url": urls[4], "timeout_s": deadline_s / 3},
               "probe": {"timeout_s": deadline_s},
               "zulip": {"site": urls[5], "stream": "agent-hub", "timeout_s": deadline_s / 2},
               "heal": {"ssh_connect_timeout_s": deadline_s, "known_hosts": str(work / "known_hosts")},
               "gpus": gpus}
        (work / "known_hosts").write_text("")
        config = write_config(work / "doctor-dead.yaml", raw)
        state = work / "state-dead-doctor"
        argv = [*gpuheal_argv(), "--config", str(config), "--state-dir", str(state), "doctor", "--json"]
        dead_runs = [timed_run(argv, env, ok_codes=(1,)) for _ in range(n)]
        dead_times = [took for took, _proc in dead_runs]
        last = json.loads(dead_runs[-1][1].stdout)["checks"]
    return {
        "healthy_median_s": statistics.median(healthy), "healthy_runs": n,
        "dead_median_s": statistics.median(dead_times), "dead_runs": n, "deadline_s": deadline_s,
        "dead_rows": {st: sum(c["status"] == st for c in last) for st in ("ok", "warn", "fail", "skip")},
        "dead_details": sorted({f'{c["check"]}: {c["detail"]}'[:90] for c in last if c["status"] == "fail"})[:12],
        "target_healthy_s": TARGETS["doctor-3"], "target_dead_s": TARGETS["doctor-dead"],
    }


def bench_imports(work: Path) -> dict:
    """What ``check`` imports (a real check, against a closed port: every source refused)."""
    cfg = fleet_config("http://127.0.0.1:9/gpu-data", [("a", "h", "http://127.0.0.1:9")], timeout_s=1)
    config = write_config(work / "imports.yaml", cfg)
    argv = [sys.executable, "-X", "importtime", "-m", "gpuheal", "--config", str(config),
            "--state-dir", str(work / "state-imp"), "check", "--json"]
    for minute in (0, 1, 2):  # the third run is cron's steady state (the config text known valid)
        env = clean_env(GPUHEAL_NOW=stamp(minute))
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        self_us, cumulative_us, name = line[len("import time:") :].split("|", 2)
        rows.append((name[1:].rstrip(), int(self_us), int(cumulative_us)))  # leading spaces = nesting
    modules = {name for name, _, _ in rows}
    top_level = sorted(
        ((name, cum) for name, _, cum in rows if not name.startswith(" ")), key=lambda r: -r[1]
    )[:12]
    forbidden = sorted(m.strip() for m in modules if m.strip().split(".")[0] in NEVER_IMPORTED)
    return {
        "forbidden_imported": forbidden,
        "module_count": len(modules),
        "slowest_top_level_ms": [(name, round(us / 1000, 1)) for name, us in top_level],
    }


# --------------------------------------------------------------------------- main


def verdict(value: float, target: float) -> str:
    return "ok" if value <= target else "MISSED"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--profile", action="store_true", help="cProfile the 1000-GPU check")
    cases = ["help", "check-3", "check-1000", "smi-1000", "dead-200", "imports", "doctor"]
    parser.add_argument("--only", choices=cases, action="append")
    parser.add_argument("--update", action="store_true", help=f"write the figures to {LATEST.relative_to(ROOT)}")
    parser.add_argument("--out", type=Path, help="write the figures here (default: nowhere, unless --update)")
    parser.add_argument("--framing", default="", help="check-1000 with these HTTP/1.1 framings, runs alternating: "
                        "'hand,h11' (benchmarks/framing_run.py; issue 19 item 5)")
    args = parser.parse_args()
    n = 3 if args.quick else 10
    framings = tuple(f for f in args.framing.split(",") if f)
    wanted = set(args.only or cases)
    # Byte-code compiled first, as pip does when it installs the package: with
    # PYTHONDONTWRITEBYTECODE set (common in CI and dev shells) every edited module was compiled
    # again by every benchmarked run (50 modules, ~0.1 s a run, issue 12).
    import compileall

    compileall.compile_dir(str(ROOT / "gpuheal"), quiet=1)
    results: dict = {
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    with tempfile.TemporaryDirectory(prefix="gpuheal-bench-") as tmp:
        work = Path(tmp)
        if "help" in wanted:
            results["help"] = bench_help(n)
        if "check-3" in wanted:
            results["check-3"] = bench_check_3(n, work)
        if "check-1000" in wanted:
            results["check-1000"] = bench_check_1000(1 if args.quick else 5, work, args.profile, framings)
        if "smi-1000" in wanted:
            results["smi-1000"] = bench_smi_1000(1 if args.quick else 5, work)
        if "dead-200" in wanted:
            results["dead-200"] = bench_dead_sweep(work)
        if "imports" in wanted:
            results["imports"] = bench_imports(work)
        if "doctor" in wanted:
            results["doctor"] = bench_doctor(3 if args.quick else 5, work)

    rows = []
    if "help" in results:
        r = results["help"]
        rows.append((f"gpuheal --help (median of {r['runs']})", f"{r['median_s'] * 1000:.0f} ms", "≤ 100 ms",
                     verdict(r["median_s"], r["target_s"])))
    if "check-3" in results:
        r = results["check-3"]
        rows.append((f"check, 3-GPU loopback fleet (median of {r['runs']})", f"{r['median_s'] * 1000:.0f} ms",
                     "≤ 300 ms", verdict(r["median_s"], r["target_s"])))
    if "check-1000" in results:
        r = results["check-1000"]
        rows.append((f"check, 1000 GPUs + /metrics, /props, /slots + 6.5 h history (median of {r['runs']})",
                     f"{r['median_s']:.2f} s", "≤ 2 s", verdict(r["median_s"], r["target_s"])))
        rows.append(("  peak RSS of that check", f"{r['peak_rss_mb']:.0f} MB", "≤ 200 MB",
                     verdict(r["peak_rss_mb"], r["target_rss_mb"])))
        for f, fr in r.get("framings", {}).items():
            figures = (f"{fr['median_s']:.2f} / {fr['max_s']:.2f} s, {fr['cpu_s_median']:.2f} s, "
                       f"{fr['peak_rss_mb']:.0f} MB")
            rows.append((f"  framing {f}: median / max wall, CPU, peak RSS", figures, "", "-"))
    if "smi-1000" in results:
        r = results["smi-1000"]
        rows.append((f"check, no gpu-monitor: 250 hosts x 4 GPUs of nvidia-smi + 1000 servers (median of {r['runs']})",
                     f"{r['median_s']:.2f} s", "≤ 2 s", verdict(r["median_s"], r["target_s"])))
        rows.append(("  peak RSS of that check", f"{r['peak_rss_mb']:.0f} MB", "≤ 200 MB",
                     verdict(r["peak_rss_mb"], r["target_rss_mb"])))
    if "dead-200" in results:
        r = results["dead-200"]
        rows.append((f"check, 200 endpoints that never answer (deadline {r['probe_deadline_s']:g} s)",
                     f"{r['wall_s']:.2f} s", f"≤ {r['target_s']:g} s", verdict(r["wall_s"], r["target_s"])))
    if "imports" in results:
        r = results["imports"]
        forbidden = r["forbidden_imported"]
        rows.append(("check imports fabric/paramiko/invoke/requests", ", ".join(forbidden) or "none", "none",
                     "ok" if not forbidden else "MISSED"))
    if "doctor" in results:
        r = results["doctor"]
        rows.append((f"doctor, healthy simulated 3-GPU fleet (median of {r['healthy_runs']})",
                     f"{r['healthy_median_s'] * 1000:.0f} ms", f"≤ {r['target_healthy_s'] * 1000:.0f} ms",
                     verdict(r["healthy_median_s"], r["target_healthy_s"])))
        rows.append((f"doctor, dead 3-GPU fleet, deadlines {r['deadline_s']:g} s (median of {r['dead_runs']})",
                     f"{r['dead_median_s']:.2f} s", f"≤ {r['target_dead_s']:g} s",
                     verdict(r["dead_median_s"], r["target_dead_s"])))
    results["table"] = [list(row) for row in rows]

    width = max(len(row[0]) for row in rows)
    print(f"{'benchmark'.ljust(width)}  {'measured':>10}  {'target':>9}  verdict")
    for name, value, target, ok in rows:
        print(f"{name.ljust(width)}  {value:>10}  {target:>9}  {ok}")
    if "check-1000" in results and "profile_top" in results["check-1000"]:
        print("\ncProfile of one 1000-GPU check (cumulative):")
        print("\n".join(results["check-1000"]["profile_top"]))
    if "imports" in results:
        slowest = results["imports"]["slowest_top_level_ms"][:6]
        print("\nslowest top-level imports of check:", ", ".join(f"{n} {ms} ms" for n, ms in slowest))

    out = args.out or (LATEST if args.update else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_suffix(".json.tmp")
        tmp_out.write_text(json.dumps(results, indent=2) + "\n")
        os.replace(tmp_out, out)
        print(f"\nwritten: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0 if all(row[3] in ("ok", "-") for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
