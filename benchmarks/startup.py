"""Start-up against a shell sweep (issue 19, "Performance"): figures, not a timed test.

Starts the simulator (``gpuheal sim --scenario examples/scenarios/healthy.yaml --ephemeral-ports``,
three GPUs on 127.0.0.1) and times, interleaved in pairs so that both sides meet the same load:

  check   ``gpuheal --config SIM --state-dir TMP check --json`` (a fresh process, as cron runs it)
  sweep   bash: ``curl`` the monitor document and every GPU's ``/health`` in parallel, then ``jq``
          (what a hand-written cron job would do; needs ``curl`` and ``jq``: ``apt-get install jq``)

and ``gpuheal --help`` alone. One warm-up of each first (the warm-up check also stores the config's
schema verdict, as the first cron run does). Prints the medians, the ratio check/sweep and the
load average before and after; the target is check <= 2.5 x sweep and --help <= 100 ms. The
package is byte-compiled first, as an installed one is.

    .venv/bin/python benchmarks/startup.py [--pairs 15] [--scenario PATH] [--gpuheal CMD]

``--gpuheal CMD`` times another build's gpuheal (an executable; e.g. a script that puts an older
tree first on ``sys.path`` and calls its ``gpuheal.cli.main``) against the same simulator, which
always runs from this tree.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPUHEAL = str(Path(sys.executable).with_name("gpuheal"))

SWEEP = r"""
set -u
d=$(mktemp -d)
curl -s -m 2 "$1" > "$d/monitor" &
i=0
for url in "${@:2}"; do
  i=$((i + 1))
  curl -s -m 2 -o "$d/health-$i" -w '%{http_code}' "$url/health" > "$d/code-$i" &
done
wait
jq -n --slurpfile m "$d/monitor" '{gpus: ($m[0].gpus | length)}' > /dev/null
for f in "$d"/health-*; do jq -e '.status == "ok"' "$f" > /dev/null || echo "unhealthy: $f"; done
rm -rf "$d"
"""


def start_sim(scenario: Path, where: Path) -> tuple[subprocess.Popen, Path, str, list[str]]:
    config = where / "sim.yaml"
    proc = subprocess.Popen([GPUHEAL, "sim", "--scenario", str(scenario), "--ephemeral-ports",
                             "--write-config", str(config)], stdout=subprocess.PIPE, text=True)
    monitor, endpoints = "", []
    for line in proc.stdout:
        label, _, url = line.strip().partition(" ")
        url = url.strip()
        if label == "monitor":
            monitor = url
        elif url.startswith("http://127.0.0.1") and label not in ("litellm", "control"):
            endpoints.append(url)
        if label == "config":
            break
    if not monitor or not endpoints:
        proc.kill()
        raise SystemExit("the simulator did not print its URLs")
    return proc, config, monitor, endpoints


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, env=env)
    took = time.perf_counter() - started
    if done.returncode not in (0, 1, 2):
        raise SystemExit(f"failed ({done.returncode}): {' '.join(argv)}\n{done.stderr.decode()[-500:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--scenario", type=Path, default=ROOT / "examples/scenarios/healthy.yaml")
    ap.add_argument("--gpuheal", default=GPUHEAL, help="the gpuheal to time (default: this venv's)")
    args = ap.parse_args()
    for tool in ("curl", "jq", "bash"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt-get install -y {tool})")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")} | {"TERM": "dumb"}
    # Byte-code compiled first, as pip does when it installs the package (and as benchmarks/run.py
    # does): with PYTHONDONTWRITEBYTECODE set (CI, dev shells) an editable install's modules were
    # otherwise compiled again by every timed run, ~60 ms of a 3-GPU check.
    import compileall

    compileall.compile_dir(str(ROOT / "gpuheal"), quiet=1)
    with tempfile.TemporaryDirectory(prefix="gpuheal-startup-") as tmp:
        proc, config, monitor, endpoints = start_sim(args.scenario, Path(tmp))
        try:
            check = [args.gpuheal, "--config", str(config), "--state-dir", str(Path(tmp) / "state"), "check", "--json"]
            sweep = ["bash", "-c", SWEEP, "sweep", monitor, *endpoints]
            load_before = os.getloadavg()
            timed(check, env), timed(sweep, env)  # warm-up
            checks, sweeps, helps = [], [], []
            for _ in range(args.pairs):
                checks.append(timed(check, env))
                sweeps.append(timed(sweep, env))
                helps.append(timed([args.gpuheal, "--help"], env))
            load_after = os.getloadavg()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    check_ms, sweep_ms = statistics.median(checks) * 1000, statistics.median(sweeps) * 1000
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f}, after {load_after[0]:.2f} "
          f"{load_after[1]:.2f} ({os.cpu_count()} CPUs)")
    print(f"gpuheal --help                     median of {args.pairs}: {statistics.median(helps) * 1000:.0f} ms")
    print(f"gpuheal check --json ({len(endpoints)} GPUs)     median of {args.pairs}: {check_ms:.0f} ms")
    print(f"bash + curl + jq sweep             median of {args.pairs}: {sweep_ms:.0f} ms")
    print(f"ratio check / sweep: {check_ms / sweep_ms:.2f} (target <= 2.5)")


if __name__ == "__main__":
    main()
