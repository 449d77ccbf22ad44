#!/usr/bin/env python3
"""One cron run's history load + save at a week's end (issue 29): the earlier layout (one file, both tiers)
against the coarse tier in its own file, which a run that folds no bucket leaves alone.

    .venv/bin/python benchmarks/history_save.py --gpus 100 --runs 9

Per GPU: 6.5 h of per-minute samples (390) and 7 days of 10-minute buckets (1008). Prints the median CPU
seconds of a run (load, append one poll, compact, save) for each layout.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuheal.model import GpuSample, Observation  # noqa: E402
from gpuheal.state.files import HISTORY  # noqa: E402
from gpuheal.state.history import History  # noqa: E402
from gpuheal.state.history_store import load_history, save_history  # noqa: E402
from gpuheal.state.store import StateDir  # noqa: E402

T0 = datetime(2026, 7, 18, tzinfo=UTC)
RAW_H, BUCKET_S, COARSE_DAYS = 6.5, 600, 8.0


def week_end(gpus: int) -> History:
    now = T0 + timedelta(days=7)
    raw_t = [(now - timedelta(minutes=389 - i)).timestamp() for i in range(390)]
    coarse_t = [(T0 + timedelta(minutes=10 * i)).timestamp() for i in range(1008)]

    def cols(ts: list[float]) -> dict[str, list]:
        n = len(ts)
        return {"t": ts, "temp_c": [50.0 + i % 7 for i in range(n)], "vram_used_mb": [1e4 + i for i in range(n)],
                "util_pct": [40.0] * n, "power_w": [200.5] * n, "endpoint": ["ok"] * n}

    names = [f"gpu-{i:04d}" for i in range(gpus)]
    return History.from_dict({"raw": {a: cols(raw_t) for a in names}, "coarse": {a: cols(coarse_t) for a in names}})


def one_run(state: Path, minute: int, new_layout: bool) -> float:
    started = time.process_time()
    with StateDir(state) as store:
        history = load_history(store) if new_layout else History.from_dict(store.read(HISTORY, {}))
        at = T0 + timedelta(days=7, minutes=minute, seconds=1)
        history.add(Observation(at=at, gpus={a: GpuSample(temp_c=50.0, vram_used_mb=1e4, util_pct=40.0, power_w=200.5,
                                                           endpoint="ok") for a in history.raw}, monitor_ok=True))
        history.compact(at.timestamp(), RAW_H, BUCKET_S, COARSE_DAYS)
        if new_layout:
            save_history(store, history)
        else:
            store.write(HISTORY, history.to_dict(), stream=True)
    return time.process_time() - started


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=100)
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    history = week_end(args.gpus)
    with tempfile.TemporaryDirectory() as tmp:
        for new_layout in (False, True):
            state = Path(tmp) / ("new" if new_layout else "old")
            with StateDir(state) as store:
                store.write(HISTORY, history.to_dict(), stream=True)
            one_run(state, 0, new_layout)  # the first save moves the earlier layout (the new side)
            cpu = [one_run(state, m, new_layout) for m in range(1, args.runs + 1)]
            size = sum(p.stat().st_size for p in state.glob("history*.json")) / 1e6
            name = "coarse in its own file" if new_layout else "one file (earlier layout)"
            print(f"{name}: {statistics.median(cpu) * 1000:.0f} ms CPU a run (median of {args.runs}), {size:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
