"""The chaos benchmark's gpuheal run, from one tree, timed in CPU seconds: ``python benchmarks/chaos_cpu.py TREE
DAYS OUT.json``. ``TREE``'s own ``gpuheal`` and ``benchmarks`` go first on ``sys.path``, so that two trees (a
``git worktree`` of the commit before, and this one) run side by side from one virtual environment; start both
together and compare their CPU, as the figures in ``benchmarks/README.md`` are. 100 GPUs, seed 1, gpuheal only
(``chaos.run(..., only=("gpuheal",), jobs=1)``); the document is written with sorted keys, so two runs of the
same behaviour ``cmp`` equal. Also printed: the wall time, the peak RSS, and the CPU of gpuheal's cycles per simulated
day in ms a cycle (what grows with the week; threads included)."""

from __future__ import annotations

import json
import resource
import sys
import time


def main() -> None:
    tree, days, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    sys.path[:0] = [tree, tree + "/benchmarks"]
    import gpuheal

    if not gpuheal.__file__ or not gpuheal.__file__.startswith(tree):
        sys.exit(f"gpuheal was imported from {gpuheal.__file__}, not from {tree}")
    import chaos
    import chaos_gpuheal
    from chaos_inject import load_rates

    per_day_s = _count_cycles(chaos_gpuheal.GpuhealSystem)
    start_s, wall_start_s = time.process_time(), time.monotonic()
    doc, _, _ = chaos.run(100, days, 1, load_rates(None), only=("gpuheal",), jobs=1)
    cpu_s, wall_s = time.process_time() - start_s, time.monotonic() - wall_start_s
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, sort_keys=True)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    days_ms = ", ".join(f"day {d} {1000 * s / n:.1f}" for d, (s, n) in sorted(per_day_s.items()))
    print(f"{tree} {days} days: {cpu_s:.2f} s CPU, {wall_s:.1f} s wall, {rss_mb:.0f} MB; ms of CPU a cycle: {days_ms}")



def _count_cycles(system: type) -> dict[int, tuple[float, int]]:
    """Wrap ``system.cycle`` so that each cycle's CPU is added to its simulated day's (CPU seconds, cycles)
    (returned, filled as the week runs)."""
    per_day_s: dict[int, tuple[float, int]] = {}
    cycle = system.cycle

    def counted(self, t: float, clock_offset_s: float):
        start_s = time.process_time()
        try:
            return cycle(self, t, clock_offset_s)
        finally:
            day = int(t // 86400)
            spent_s, n = per_day_s.get(day, (0.0, 0))
            per_day_s[day] = (spent_s + time.process_time() - start_s, n + 1)

    system.cycle = counted
    return per_day_s


if __name__ == "__main__":
    main()
