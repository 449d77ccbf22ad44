"""Two per-poll costs of gpuheal before and after wave 8's speed work (issue 29), in one process:

    git archive 75d9baf | tar -x -C /tmp/before
    .venv/bin/python benchmarks/chaos_speed_micro.py --before /tmp/before

- ``parse_metrics`` of one ``/metrics`` body (the real capture, the sim's), median of 7 x 2,000 (CPU µs);
- Rule 10's ``routing.judge`` for every GPU of one poll (weighted GPUs, gpu-monitor readings) at 100, 1,000
  and 10,000 GPUs (CPU seconds; the previous module summed the fleet again for each GPU).

The modules of ``--before`` are loaded from their files under private names; this tree's are imported.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def metrics(old, new) -> None:
    from gpuheal.sim import llama

    bodies = {"real capture": (HERE.parent / "tests/data/llama/metrics-busy-deferred.txt").read_text(),
              "sim body": llama.metrics_text({"n_decode_total": 123456, "requests_processing": 1}).decode()}
    for name, text in bodies.items():
        res = {}
        for label, mod in (("before", old), ("after", new)):
            runs = []
            for _ in range(7):
                t = time.process_time()
                for _ in range(2000):
                    mod.parse_metrics(text)
                runs.append((time.process_time() - t) / 2000 * 1e6)
            res[label] = statistics.median(runs)
        print(f"parse_metrics, {name}: before {res['before']:.1f} us, after {res['after']:.1f} us")


def rule10(old, new, sizes: list[int]) -> None:
    kw = {"tolerance_ratio": 0.5, "role_tolerance_ratio": 0.1, "min_requests": 10.0, "window_s": 3600.0, "roles": {}}
    for n in sizes:
        aliases = [f"gpu-{i:05d}" for i in range(n)]
        weights = {a: 1.0 + (i % 7) for i, a in enumerate(aliases)}
        verdicts = {}
        for label, mod in (("before", old), ("after", new)):
            readings = {a: mod.Reading(float(20 + i % 13), mod.MONITOR) for i, a in enumerate(aliases)}
            t = time.process_time()
            if label == "after":
                fleet = mod.totals(readings, weights)
                out = [mod.judge(a, readings, weights, None, fleet=fleet, **kw) for a in aliases]
            else:
                out = [mod.judge(a, readings, weights, None, **kw) for a in aliases]
            spent = time.process_time() - t
            verdicts[label] = [v if v in (None, False) else (v.detected, v.summary) for v in out]
            print(f"{n} GPUs, Rule 10's judgements of one poll, {label}: {spent:.3f} s CPU")
        assert verdicts["before"] == verdicts["after"], "the verdicts differ"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a checkout (or git archive) of the code before")
    ap.add_argument("--sizes", default="100,1000,10000")
    args = ap.parse_args()
    before = Path(args.before)
    from gpuheal.core import routing
    from gpuheal.parse import llama_metrics

    metrics(_load(before / "gpuheal/parse/llama_metrics.py", "before_llama_metrics"), llama_metrics)
    sizes = [int(s) for s in args.sizes.split(",")]
    rule10(_load(before / "gpuheal/core/routing.py", "before_routing"), routing, sizes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
