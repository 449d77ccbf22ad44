#!/usr/bin/env python3
"""``gpuheal check`` under 2,000 mutated gpu-monitor documents (issue 9, "Done when").

A loopback fleet of three healthy llama-servers, LiteLLM and a gpu-monitor whose answer is
replaced before every run by the next mutated document (``tests/fuzz_docs.py``: wrong JSON types,
NaN, 400- and 5,000-digit integers, lone surrogates, ``'1²234'``, deleted keys, swapped
containers, cut or corrupted bytes, 100,000-deep nesting). Each run is one ``check`` (alternately
``--json`` and human output) with the clock one minute later, on one state directory, so history
and issues accumulate as under cron. Counted: internal errors, tracebacks, exits other than
0/1/2, output that is not valid UTF-8, ``--json`` that is not one document, and a temperature
outside 0–200 °C reaching the output. The promise is 0 of each.

    .venv/bin/python benchmarks/fuzz_monitor.py               # 2,000 documents, in process
    .venv/bin/python benchmarks/fuzz_monitor.py -n 200 --subprocess   # as cron runs it (slower)
    .venv/bin/python benchmarks/fuzz_monitor.py --seed 7 --show 3     # another corpus; print failures
    .venv/bin/python benchmarks/fuzz_monitor.py --command heal -n 500 # heal's dry run on the same corpus

Exit status 0 when nothing went wrong, 1 otherwise. Loopback only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fuzz_docs import HOSTS, judge, mutated_documents, run_in_process  # noqa: E402
from servers import HEALTH_OK, LoopbackServer, Reply, fleet_config, run_gpuheal, write_config  # noqa: E402

START = datetime(2026, 7, 18, 8, 0, tzinfo=UTC)


def stamp(minute: int) -> str:
    return (START + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%SZ")


def fuzz(n: int, seed: int, subprocess_mode: bool, show: int, command: str = "check") -> dict:
    documents = mutated_documents(n, seed)
    failures: list[tuple[int, str]] = []
    codes: dict[int, int] = {}
    with (
        tempfile.TemporaryDirectory(prefix="gpuheal-fuzz-") as tmp,
        LoopbackServer({"/gpu-data": Reply(200, b"{}")}, record=False) as monitor,
        LoopbackServer({"/health/liveliness": Reply(200, '"I\'m alive!"')}, record=False) as litellm,
        LoopbackServer({"/health": HEALTH_OK}, ports=3, record=False) as gpus,
    ):
        cfg = fleet_config(
            monitor.url + "/gpu-data",
            [(alias, host, url) for (alias, host), url in zip(HOSTS.items(), gpus.urls, strict=True)],
            litellm_url=litellm.url,
            timeout_s=2,
        )
        if "heal" in command:  # let heal --apply act: a harmless local command per GPU
            for gpu in cfg["gpus"]:
                gpu["restart_command"] = ["true"]
        config = write_config(Path(tmp) / "gpuheal.yaml", cfg)
        base = ["--config", str(config), "--state-dir", str(Path(tmp) / "state")]
        started = time.perf_counter()
        for i, body in enumerate(documents):
            monitor.set("/gpu-data", Reply(200, body, headers={"Content-Type": "application/json"}))
            json_out = i % 2 == 0
            argv = [*base, *command.split(), *(["--json"] if json_out else [])]
            if subprocess_mode:
                proc = run_gpuheal(*argv, env={"GPUHEAL_NOW": stamp(i)})
                code, out, err = proc.returncode, proc.stdout, proc.stderr
            else:
                code, out, err = run_in_process(argv, stamp(i))
            codes[code] = codes.get(code, 0) + 1
            problem = judge(code, out, err, json_out)
            if problem:
                failures.append((i, problem))
                if len(failures) <= show:
                    print(f"--- document {i}: {problem}\n{body[:300]!r}\n{err[-2000:]}", file=sys.stderr)
        took = time.perf_counter() - started
    kinds: dict[str, int] = {}
    for _, problem in failures:
        kind = problem.split(":")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "documents": n,
        "seed": seed,
        "command": command,
        "mode": "subprocess" if subprocess_mode else "in-process",
        "seconds": round(took, 1),
        "exit_codes": dict(sorted(codes.items())),
        "internal_errors": kinds.get("internal error", 0),
        "tracebacks": kinds.get("traceback", 0),
        "failures": len(failures),
        "failure_kinds": kinds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="documents (default 2000)")
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--subprocess", action="store_true", help="a fresh gpuheal process per run, as cron")
    parser.add_argument("--show", type=int, default=5, help="print the first N failures in full")
    parser.add_argument("--command", default="check", help='the command run on each document, e.g. "heal" '
                        '(a dry run: it plans and prints, changes nothing); default "check"')
    args = parser.parse_args()
    result = fuzz(args.n, args.seed, args.subprocess, args.show, args.command)
    for key, value in result.items():
        print(f"{key:16} {value}")
    return 0 if result["failures"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
