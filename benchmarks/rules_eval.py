#!/usr/bin/env python3
"""Rule evaluation alone over 1000 GPUs × 6.5 h of per-minute history (issue 3, "Benchmark").

Builds a :class:`~gpuheal.state.history.History` of 1000 GPUs × 390 polls (some leaking, some heating,
some with missing samples), an issue book warmed by the previous poll, and times one poll of
:func:`gpuheal.steps.evaluate.evaluate_poll` — every rule, the engine, the ``vram-trend`` objects —
with no IO. Prints the median of 5 (target ≤ 300 ms). A figure, not a timed test.

    .venv/bin/python benchmarks/rules_eval.py [--gpus 1000] [--runs 5] [--profile]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

from gpuheal import benchdata
from gpuheal.config import load_config_dict
from gpuheal.core.engine import new_book
from gpuheal.core.view import NO_RESTARTS, vram_trend
from gpuheal.model import Breaker, GpuSample, Observation
from gpuheal.state.history import History
from gpuheal.steps.evaluate import evaluate_poll

START = datetime(2026, 7, 18, 0, 0, tzinfo=UTC)
POLLS = 390  # 6.5 h at one poll a minute


def build(n_gpus: int):
    gpus = [
        {
            "alias": f"gpu-{i:04d}",
            "host": f"host{i:04d}",
            "endpoint": f"http://127.0.0.1:{20000 + i}",
            "vram_total_mb": 24576,
            "baseline_tok_s": 75.0,
            "vram_leak_mb_per_hour": 300 if i % 3 else 200,
            "weight": 1.0 / n_gpus,
            "transport": "local",
        }
        for i in range(n_gpus)
    ]
    cfg = load_config_dict({"gpus": gpus})
    history = History()
    samples_by_poll = []
    for p in range(POLLS):
        at = START + timedelta(minutes=p)
        samples = {}
        for i, g in enumerate(gpus):
            leak = 10 if i % 10 == 0 else 0  # every 10th GPU leaks 600 MB/h
            heat = 3 if i % 25 == 0 and p > POLLS - 10 else 0
            temp = 60 + (p % 7) * 0.5 + heat * (p - (POLLS - 10))
            vram = 10000 + leak * p + (i * 37 + p * 11) % 40
            missing = (i + p) % 97 == 0  # now and then the monitor missed one
            samples[g["alias"]] = GpuSample(
                temp_c=None if missing else temp,
                vram_used_mb=None if missing else float(vram),
                vram_total_mb=24576,
                util_pct=80.0,
                power_w=200.0,
                power_limit_w=350.0,
                endpoint="refused" if i % 50 == 7 else "ok",
                requests_60s=10,
                failures_60s=8 if i % 40 == 3 else 0,
                breaker=Breaker(open=i % 60 == 11),
            )
        obs = Observation(at=at, gpus=samples, monitor_ok=True)
        history.add(obs, cfg.aliases)
        samples_by_poll.append(obs)
    return cfg, history, samples_by_poll


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    t0 = time.perf_counter()
    cfg, history, observations = build(args.gpus)
    print(f"built {args.gpus} GPUs × {POLLS} polls of history in {time.perf_counter() - t0:.1f} s", file=sys.stderr)

    # the book as the previous poll left it (holds running, issues open)
    book = new_book()
    bench = benchdata.empty()
    prev = observations[-2]
    evaluate_poll(cfg, prev, history, book, bench, NO_RESTARTS, prev.at.timestamp())
    last = observations[-1]
    now_s = last.at.timestamp()

    def once() -> tuple[float, int]:
        work = copy.deepcopy(book)
        start = time.perf_counter()
        ev, view, _ = evaluate_poll(cfg, last, history, work, bench, NO_RESTARTS, now_s)
        trends = [vram_trend(view, a) for a in cfg.aliases]  # what check writes to vram-trend.json
        elapsed = time.perf_counter() - start
        assert len(trends) == args.gpus
        return elapsed, len(ev.issues)

    if args.profile:
        import cProfile
        import pstats

        cProfile.runctx("once()", globals(), {"once": once}, "/tmp/rules_eval.prof")
        pstats.Stats("/tmp/rules_eval.prof").sort_stats("cumulative").print_stats(25)

    times = []
    issues = 0
    for _ in range(args.runs):
        elapsed, issues = once()
        times.append(elapsed)
    median_ms = statistics.median(times) * 1000
    print(
        f"rules evaluation, {args.gpus} GPUs × 6.5 h history: median {median_ms:.0f} ms of {args.runs} "
        f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}); {issues} open issues; target ≤ 300 ms"
    )
    return 0 if median_ms <= 300 else 1


if __name__ == "__main__":
    sys.exit(main())
