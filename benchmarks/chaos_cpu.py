"""The chaos benchmark's gpuheal run, from one tree, timed in CPU seconds: ``python benchmarks/chaos_cpu.py TREE
DAYS OUT.json``. ``TREE``'s own ``gpuheal`` and ``benchmarks`` go first on ``sys.path``, so that two trees (a
``git worktree`` of the commit before, and this one) run side by side from one virtual environment; start both
together and compare their CPU, as the figures in ``benchmarks/README.md`` are. 100 GPUs, seed 1, gpuheal only
(``chaos.run(..., only=("gpuheal",), jobs=1)``); the document is written with sorted keys, so two runs of the
same behaviour ``cmp`` equal."""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    tree, days, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    sys.path[:0] = [tree, tree + "/benchmarks"]
    import gpuheal

    if not gpuheal.__file__ or not gpuheal.__file__.startswith(tree):
        sys.exit(f"gpuheal was imported from {gpuheal.__file__}, not from {tree}")
    import chaos
    from chaos_inject import load_rates

    start_s = time.process_time()
    doc, _, _ = chaos.run(100, days, 1, load_rates(None), only=("gpuheal",), jobs=1)
    cpu_s = time.process_time() - start_s
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, sort_keys=True)
    print(f"{tree} {days} days: {cpu_s:.2f} s CPU")


if __name__ == "__main__":
    main()
