#!/usr/bin/env python3
"""Mutated configuration files through the loader (issue 9, points 4 and 7).

The shipped examples (``examples/*.yaml``) with spans replaced by hostile YAML — anchors and
aliases, merge keys, tags, a 5,000-digit number, an impossible date, ``maybe``, NaN, tabs,
duplicate keys — must each load or fail with ONE config-error line (exit 3 at the CLI). Counted:
any other exception (an internal error), a multi-line message, and the slowest load. The
promise is 0 internal errors.

    .venv/bin/python benchmarks/fuzz_config.py            # 5,000 mutations, seed 9
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuheal.config import load_config  # noqa: E402
from gpuheal.errors import ConfigError  # noqa: E402

EVIL = ["&a ", "*a", "<<: *a", ": ", "\n  ", "\n- ", "{", "}", "[", "]", "!!python/name:os.system ", "!!binary ",
        "!!timestamp ", "!!int ", "!!float ", "!!set ", "!!omap ", "? ", ".nan", "-.inf", "9" * 5000, "0x" + "f" * 80,
        "2001-13-45", "2001-02-30 25:61:61", "1:2:3", "maybe", "~", '"\\ud800"', "\t", "#", "- - - -", "%YAML 1.1\n",
        "--- ", "...", "temp_c: 1\n    temp_c: 2", "rules: {thermal-critical: {temp_cc: 9}}", "-1", "2.5", "1e999",
        "\x00", "\ufeff", "'", '"', "|", ">"]


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 5)):
        at = rng.randrange(len(text) + 1)
        text = text[:at] + rng.choice(EVIL) + text[at + rng.randint(0, 6):]
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=9)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    examples = [p.read_text("utf-8") for p in sorted((ROOT / "examples").glob("*.yaml"))]
    internal, multiline, loaded, refused, slowest = 0, 0, 0, 0, 0.0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpuheal.yaml"
        for i in range(args.n):
            path.write_bytes(mutate(rng.choice(examples), rng).encode("utf-8", "surrogatepass"))
            t = time.perf_counter()
            try:
                load_config(path)
                loaded += 1
            except ConfigError as exc:
                refused += 1
                multiline += "\n" in str(exc)
            except Exception:  # noqa: BLE001 - anything else is the finding
                internal += 1
                if internal <= 3:
                    print(f"--- mutation {i}:\n{traceback.format_exc(limit=3)}", file=sys.stderr)
            slowest = max(slowest, time.perf_counter() - t)
    print(f"mutations        {args.n}")
    print(f"seconds          {time.perf_counter() - started:.1f}")
    print(f"loaded           {loaded}")
    print(f"config_errors    {refused}")
    print(f"internal_errors  {internal}")
    print(f"multi_line       {multiline}")
    print(f"slowest_s        {slowest:.3f}")
    return 0 if internal == 0 and multiline == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
