#!/usr/bin/env python3
"""``make demo``: the whole gpuheal cycle on the embedded simulated fleet, on loopback only.

1. Starts the simulated fleet of ``examples/scenarios/demo.yaml`` (gpu-monitor, three
   llama-servers, LiteLLM) on the ports ``examples/lab.yaml`` names, and a Zulip look-alike.
2. Runs what cron runs, once per simulated minute, as separate processes with the state carried
   in ``demo-state/``: ``gpuheal heal --apply`` then ``gpuheal escalate``. The virtual clock is
   passed to gpuheal through ``GPUHEAL_NOW`` (and ``GPUHEAL_CONFIRM_WAIT=simulated`` for the seconds
   between heal's in-run re-probes); nothing waits for real minutes.
3. Benchmarks the fleet four times a day over a simulated week and prints the weekly report.

Every address is 127.0.0.1. Run it again any time: it starts from an empty state directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("GPUHEAL_DEMO_STATE", ROOT / "demo-state"))  # tests/test_demo.py: a tmp dir
CONFIG = ROOT / "examples" / "lab.yaml"
SCENARIO = ROOT / "examples" / "scenarios" / "demo.yaml"
BIN = Path(sys.executable).parent
ZULIP_PORT = 19500
TICKS = 24
# benchmark runs over the rest of the simulated week (4 a day); tests/test_demo.py runs one a day
WEEK_BENCHES = max(1, int(os.environ.get("GPUHEAL_DEMO_WEEK_BENCHES", "26")))
BOLD, DIM, RED, YELLOW, GREEN, CYAN, RESET = ("\033[1m", "\033[2m", "\033[31m", "\033[33m", "\033[32m", "\033[36m", "\033[0m")
if os.environ.get("NO_COLOR") or not sys.stdout.isatty():
    BOLD = DIM = RED = YELLOW = GREEN = CYAN = RESET = ""
STATUS_COLOUR = {"healthy": GREEN, "degraded": YELLOW, "down": RED}


def gpuheal(*args: str, now: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "GPUHEAL_NOW": now,
        "GPUHEAL_CONFIRM_WAIT": "simulated",  # the in-run confirmation's re-probes 5 s apart, on the simulated clock
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # gpuheal-simctl for the lab's commands
        "ZULIP_EMAIL": "gpuheal-bot@zulip.example.org",
        "ZULIP_API_KEY": "demo-zulip-key-0123456789",
        "LITELLM_MASTER_KEY": "sk-sim-admin-0000",  # the simulated LiteLLM's admin key (load shedding)
    }
    return subprocess.run(
        [str(BIN / "gpuheal"), "--config", str(CONFIG), "--state-dir", str(STATE), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def heading(text: str) -> None:
    print(f"\n{BOLD}━━ {text} {'━' * max(0, 74 - len(text))}{RESET}")


SEEN_INFO: set[tuple[str, str]] = set()


def summarise(tick: int, doc: dict) -> None:
    status = doc["status"]
    print(f"{BOLD}t+{tick:02d}m{RESET} {doc['generated_at']}  {STATUS_COLOUR[status]}{status:8}{RESET}")
    for issue in doc["issues"]:
        if issue["severity"] == "info":  # recommendations: shown once, they never change the status
            if (issue["gpu"], issue["issue"]) in SEEN_INFO:
                continue
            SEEN_INFO.add((issue["gpu"], issue["issue"]))
        colour = RED if issue["severity"] == "critical" else YELLOW if issue["severity"] == "warning" else DIM
        state = issue["state"]
        source = issue.get("detected", {}).get("source") if issue["issue"] == "model-stuck" else None
        seen_by = f" {DIM}(seen by {source}){RESET}" if source else ""
        print(f"   {colour}{issue['severity']:8}{RESET} {issue['gpu']:10} {issue['issue']:24} {DIM}{state}{RESET}{seen_by}")
    for fault in doc.get("faults", []):
        print(f"   {DIM}fault    {fault['source']:10} {fault['fault']}{RESET}")
    for action in doc["actions"]:
        if action.get("blocked"):
            continue
        colour = GREEN if action["result"] == "resolved" else RED if action["result"] in ("failed", "escalated") else CYAN
        print(f"   {colour}→ {action['gpu']:10} {action['action']:28} [{action['result']}]{RESET} {DIM}{action.get('why', '')[:70]}{RESET}")


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from gpuheal.sim import Scenario, SimError, SimFleet
    from gpuheal.sim.zulip import ZulipLookalike

    shutil.rmtree(STATE, ignore_errors=True)
    try:
        fleet = SimFleet(Scenario.load(SCENARIO), host="127.0.0.1").start()
        zulip = ZulipLookalike("gpuheal-bot@zulip.example.org", "demo-zulip-key-0123456789", port=ZULIP_PORT).start()
    except (SimError, OSError) as exc:
        print(f"demo: cannot start the simulated fleet ({exc}); is `gpuheal sim` already running?", file=sys.stderr)
        return 3
    try:
        heading("before anything: `gpuheal doctor` proves every path the config would use")
        doctor = gpuheal("doctor", now=fleet.now().strftime("%Y-%m-%dT%H:%M:%SZ"))
        print(doctor.stdout or doctor.stderr)
        if doctor.returncode != 0:
            print("demo: doctor found a path that would not work (see above)", file=sys.stderr)
            return 1

        heading("the simulated fleet (examples/scenarios/demo.yaml) — first look: gpuheal check")
        now = fleet.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        print(gpuheal("check", now=now).stdout)

        heading(f"{TICKS} simulated minutes of cron: heal --apply, then escalate")
        for tick in range(1, TICKS + 1):
            fleet.advance(60)
            now = fleet.now().strftime("%Y-%m-%dT%H:%M:%SZ")
            if tick == 10:
                bench = gpuheal("bench", "--json", now=now)
                results = json.loads(bench.stdout)["results"] if bench.stdout else []
                print(f"   {CYAN}bench:{RESET} " + ", ".join(f"{r['gpu']} {r['gen_tok_s'] or 0:.1f} tok/s" if r["ok"] else f"{r['gpu']} {r['error']}" for r in results))
            if tick == 5:
                heading("a person looks first: `gpuheal heal` (dry-run) plans, changes nothing")
                print(gpuheal("heal", now=now).stdout)
                heading("and cron carries on with --apply")
            proc = gpuheal("heal", "--apply", "--json", now=now)
            if proc.returncode == 3 or not proc.stdout:
                print(proc.stderr, file=sys.stderr)
                return 1
            summarise(tick, json.loads(proc.stdout))
            esc = gpuheal("escalate", "--json", now=now)
            sent = json.loads(esc.stdout).get("sent", []) if esc.stdout else []
            for message in sent:
                print(f"   {BOLD}✉ zulip:{RESET} {message['title']}")

        heading("what the operators read in Zulip (#agent-hub > alerts-gpu)")
        for message in zulip.messages:
            print(f"{DIM}── message {message['id']} ──{RESET}")
            print(message["content"])
        state = fleet.state()
        print(f"{DIM}restarts done by gpuheal in the simulator: {json.dumps(state['restarts'])}{RESET}")

        heading("the audit trail (demo-state/gpu-self-heal-log.jsonl), last lines")
        lines = (STATE / "gpu-self-heal-log.jsonl").read_text().splitlines()
        for line in lines[-6:]:
            record = json.loads(line)
            print(f"{record['timestamp']} {record['run_id']} {record['gpu']:10} {record['issue']:24} {record['action']:22} {record['result']:9} {record['phase']}")
        print(f"{DIM}({len(lines)} lines in all){RESET}")

        heading(f"the rest of the week: {WEEK_BENCHES} benchmark runs over 6.5 days, then the weekly report")
        for _ in range(WEEK_BENCHES):  # 6.5 days, so the report's 7-day window still holds the incidents above
            fleet.advance(round(6.5 * 24 * 3600 / WEEK_BENCHES))
            gpuheal("bench", now=fleet.now().strftime("%Y-%m-%dT%H:%M:%SZ"))
        report = gpuheal("report", "--weekly", now=fleet.now().strftime("%Y-%m-%dT%H:%M:%SZ"))
        print(report.stdout or report.stderr)
        print(f"{DIM}state kept in {STATE}/ — try: .venv/bin/gpuheal --config examples/lab.yaml --state-dir {STATE} report{RESET}")
        return 0
    finally:
        zulip.stop()
        fleet.stop()


if __name__ == "__main__":
    started = time.monotonic()
    code = main()
    print(f"{DIM}demo finished in {time.monotonic() - started:.0f} s{RESET}")
    sys.exit(code)
