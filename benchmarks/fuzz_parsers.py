#!/usr/bin/env python3
"""10,000 mutations of real smi / ps output through gpuheal's pure parsers (issue 9, point 5).

The issue's adversarial pass fed 10,000 mutations of real output to the smi and ps parsers and
got 21 exceptions (``'1²234'`` passes ``str.isdigit()`` then breaks ``int()``; an integer of more
than 4,300 digits). This repeats it: the corpus is the real captures in
``../shared/fixtures/smi/`` when present (nvidia-smi CSV sections, rocm-smi JSON) plus inline
samples of every format, mutated by splicing hostile characters. Counted: exceptions of any kind,
and values that are not finite numbers or not valid UTF-8 strings. The promise is 0.

    .venv/bin/python benchmarks/fuzz_parsers.py            # 10,000 mutations, seed 9
    .venv/bin/python benchmarks/fuzz_parsers.py -n 50000 --seed 1
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuheal.parse.smi import (  # noqa: E402
    parse_compute_apps,
    parse_ps,
    parse_query_gpu,
    parse_rocm_smi,
)

INLINE = {
    "query_gpu": ("0, NVIDIA GeForce RTX 3090, 29, 23358, 24576, 0, 118.42, 350.00\n"
                  "1, NVIDIA H200, 35, [N/A], 143771, 0, 11.17, [N/A]\n"),
    "compute_apps": "1106871, /app/llama-server, 23342\n312710, [Not Found], [N/A]\n4242, /opt/my, weird, name, 512\n",
    "ps": ("  PID USER       RSS COMMAND\n 1234 llama  9000000 /usr/bin/llama-server -m m.gguf\n"
           "   77 root 1200 /usr/sbin/sshd -D\n"),
}
EVIL = ["²", "³", "٣", "１", "\ud800", "\x00", "\n", ", ", "[N/A]", "nan", "inf", "-", "9" * 5000, "1" + "0" * 400,
        "{", "}", '"', "e999", "_", "0x", "\u202e", " ", "\t"]
PARSERS = {"query_gpu": parse_query_gpu, "compute_apps": parse_compute_apps, "ps": parse_ps,
           "rocm": parse_rocm_smi}


def corpus() -> dict[str, list[str]]:
    out = {k: [v] for k, v in INLINE.items()}
    out["rocm"] = ['{"card0": {"Temperature (Sensor junction) (C)": "52.0", "GPU use (%)": "5", '
                   '"VRAM Total Memory (B)": "21458059264", "VRAM Total Used Memory (B)": "27856896"}}']
    found = [p / "shared" / "fixtures" / "smi" for p in (ROOT.parent, ROOT.parent.parent)]
    for fixtures in [f for f in found if f.is_dir()][:1]:
        for path in sorted(fixtures.glob("rocm-smi__*.json")):
            out["rocm"].append(path.read_text("utf-8", "replace"))
        for path in sorted(fixtures.glob("*nvidia*.txt")):
            text = path.read_text("utf-8", "replace")
            csv = [line for line in text.splitlines() if line[:1].isdigit() and ", " in line]
            if csv:
                out["query_gpu"].append("\n".join(csv[:40]))
    return out


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 6)):
        at = rng.randrange(len(text) + 1)
        text = text[:at] + rng.choice(EVIL) + text[at + rng.randint(0, 4):]
    return text


def check(value) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"non-finite {value}"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "string not valid UTF-8"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=9)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    samples = corpus()
    kinds = sorted(samples)
    exceptions, bad_values, first = 0, 0, []
    started = time.perf_counter()
    for i in range(args.n):
        kind = kinds[i % len(kinds)]
        text = mutate(rng.choice(samples[kind]), rng)
        try:
            result = PARSERS[kind](text)
        except Exception:  # noqa: BLE001 - any exception is the finding
            exceptions += 1
            if len(first) < 3:
                first.append(f"{kind}: {traceback.format_exc(limit=2)}")
            continue
        rows = result if isinstance(result, list) else [result]
        for row in rows:
            fields = getattr(row, "__dataclass_fields__", {})
            values = row.values() if isinstance(row, dict) else (vars(row).values() if hasattr(row, "__dict__") else
                                                                  [getattr(row, f) for f in fields] or [row])
            if any(check(v) for v in values):
                bad_values += 1
    took = time.perf_counter() - started
    print(f"mutations        {args.n}")
    print(f"corpus           {', '.join(f'{k}: {len(v)}' for k, v in samples.items())}")
    print(f"seconds          {took:.1f}")
    print(f"exceptions       {exceptions}")
    print(f"bad_values       {bad_values}")
    for text in first:
        print(text, file=sys.stderr)
    return 0 if exceptions == 0 and bad_values == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
