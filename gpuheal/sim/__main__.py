"""``python -m gpuheal.sim SCENARIO``: run a simulated fleet until Ctrl-C (no gpuheal CLI needed)."""

from __future__ import annotations

import argparse
import sys

from .fleet import SimError, run_sim
from .scenario import ScenarioError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuheal.sim", description=__doc__)
    ap.add_argument("scenario", help="scenario YAML file (see examples/scenarios/)")
    ap.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    ap.add_argument(
        "--ephemeral", action="store_true", help="bind free ports instead of the scenario's"
    )
    ap.add_argument("--write-config", metavar="PATH", help="write a gpuheal config for this fleet")
    ap.add_argument(
        "--speed",
        type=float,
        default=None,
        help="advance the virtual clock by SPEED x real time (default: only via control)",
    )
    ap.add_argument("--verbose", action="store_true", help="log every request to stderr")
    a = ap.parse_args(argv)
    try:
        return run_sim(
            a.scenario,
            host=a.host,
            ports_mode="ephemeral" if a.ephemeral else None,
            write_config_path=a.write_config,
            realtime_speed=a.speed,
            verbose=a.verbose,
        )
    except (ScenarioError, SimError) as exc:
        print(f"gpuheal-sim: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
