"""Issue 28 item 1, "must not regress": ``heal --apply`` on 1000 GPUs (the ``check-1000`` fleet of
``run.py``: one monitor document, 1000 busy llama-servers on one port, 6.5 h of history) with 10 of
them refusing (a loopback port nothing listens on). Each run is a fresh process as cron starts it,
on a fresh copy of the state directory:

- ``healthy``: nothing refusing — the run must not wait or re-probe;
- ``cron-only``: 10 refusing, ``heal.confirm_budget_s: 0`` — they stay pending (the 3rd poll acts);
- ``in-run``: 10 refusing, the defaults (budget 30 s, a probe every 5 s) — the same run re-probes
  those 10 and restarts them (``restart_command: true``; ``reload_wait_s`` 1 s so the acting is short).

Prints JSON: wall seconds of each run (median of ``--runs``), the restarts each run audited, the
longest evidence an in-run action was taken on (its probes' first to last), and the in-run wall less
the cron-only run's: the confirmation plus acting on 10 GPUs (restart, its reload wait and proof).
``nice -n 5 .venv/bin/python benchmarks/confirm_1000.py --runs 3``"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import (  # noqa: E402
    START,
    LoopbackServer,
    Reply,
    clean_env,
    fleet_config,
    gpu_entry,
    gpuheal_argv,
    llama_routes,
    make_history,
    stamp,
    timed_run,
    write_config,
    write_state_file,
)

REFUSING = 10


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def evidence_s(line: dict) -> float:
    """The seconds from the poll's probe to the last re-probe of an in-run confirmed action."""
    from gpuheal.clock import parse_iso

    probes = (line.get("detected") or {}).get("probes") or []
    if len(probes) < 2:
        return 0.0
    return round(parse_iso(probes[-1]["at"]).timestamp() - parse_iso(probes[0]["at"]).timestamp(), 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    count = 1000
    hosts = [f"node{i:04d}" for i in range(count)]
    aliases = [f"gpu-{i:04d}" for i in range(count)]
    doc = {"generated_at": stamp(0),
           "gpus": [gpu_entry(h, temp_c=55 + i % 10, vram_used_mb=10_000 + 195) for i, h in enumerate(hosts)],
           "summary": {"available_models": [{"name": a, "hostname": h, "requests_60s": 20, "failures_60s": 0,
                                             "consecutive_timeouts": 0} for a, h in zip(aliases, hosts, strict=True)],
                       "circuit_breakers": []}}
    body = json.dumps(doc).encode()
    telemetry = llama_routes()
    dead = f"http://127.0.0.1:{closed_port()}"

    def health(req):
        return telemetry.get("/" + req.path.rsplit("/", 1)[-1], Reply(404, ""))

    out: dict = {"gpus": count, "refusing": REFUSING, "runs": args.runs}
    with (
        LoopbackServer({"/gpu-data": Reply(200, body, {"Content-Type": "application/json"})}, record=False) as monitor,
        LoopbackServer({"/health/liveliness": Reply(200, '"ok"')}, record=False) as litellm,
        LoopbackServer(default=health, record=False, backlog=4096, keep_alive=True) as gpus,
        tempfile.TemporaryDirectory(prefix="gpuheal-confirm-") as tmp,
    ):
        work = Path(tmp)
        seed = work / "seed"
        from gpuheal.state.history import History

        write_state_file(seed, "history.json", History.from_dict(make_history(aliases, START)).to_dict())
        for case, refusing, budget in (("healthy", 0, 30), ("cron-only", REFUSING, 0), ("in-run", REFUSING, 30)):
            endpoints = [dead if i < refusing else f"{gpus.url}/{a}" for i, a in enumerate(aliases)]
            cfg = fleet_config(monitor.url + "/gpu-data", list(zip(aliases, hosts, endpoints, strict=True)),
                               litellm_url=litellm.url, timeout_s=5, monitor={"max_response_bytes": 8 * 1024 * 1024},
                               heal={"confirm_budget_s": budget, "reload_wait_s": 1, "verify_timeout_s": 1})
            for g in cfg["gpus"]:
                g["restart_command"] = g["start_command"] = ["true"]
            config = write_config(work / f"{case}.yaml", cfg)
            walls, restarts, spans = [], [], []
            for i in range(args.runs + 1):  # the first run of a config text validates it: not counted
                state = work / f"state-{case}-{i}"
                shutil.copytree(seed, state)
                argv = [*gpuheal_argv(), "--config", str(config), "--state-dir", str(state), "heal", "--apply",
                        "--json"]
                took, proc = timed_run(argv, clean_env(GPUHEAL_NOW=stamp(1)))
                log = state / "gpu-self-heal-log.jsonl"
                lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
                if i:
                    walls.append(took)
                    intents = [r for r in lines if r.get("phase") == "intent"]
                    restarts.append(len(intents))
                    spans.extend(evidence_s(r) for r in intents)
            out[case] = {"median_s": round(statistics.median(walls), 2), "max_s": round(max(walls), 2),
                         "intents": restarts, "evidence_s_max": max(spans, default=None)}
    out["confirmation_cost_s"] = round(out["in-run"]["median_s"] - out["cron-only"]["median_s"], 2)
    out["budget_s"] = 30
    out["when"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
