"""Regenerate the replay traces in this directory from their series (promtool-like notation).

    .venv/bin/python tests/traces/make_traces.py        # writes NAME.jsonl for every trace below
    GPUHEAL_UPDATE_GOLDENS=1 .venv/bin/python -m pytest tests/test_replay.py   # then the goldens

Each trace is named after the spec incident, lesson or rule it pins; ``tests/test_replay.py``
replays it and compares the timeline with ``NAME.expected.json``. The config is the spec's fleet
(``tests/series.py`` ``FLEET_YAML``, also written here as ``fleet.json``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from series import FLEET_YAML, fleet_config, fleet_trace  # noqa: E402

TRACES = {
    # Lesson L1: gpu-light started with another --api-key; LiteLLM's requests fail with 401 and its
    # probe says 401 too. api-key-mismatch fires at once and inhibits model-stuck (a restart cannot
    # fix a wrong key); the key fixed at poll 6, everything clears.
    "l1_api_key_401": {
        "gpus": {"gpu-light": {"endpoint": "ok unauthorized*5 ok*2",
                               "failures_60s": "0 6x4 0x2"}},
    },
    # Rule 1's negative twin: one hot poll at a time (flapping around 85 °C) never fires.
    "rule1_one_hot_poll": {"gpus": {"gpu-dense": {"temp_c": "84 86 84 86 84 86 84 80"}}},
    # Rule 1 + Rule 8 (examples/scenarios/demo.yaml): 64 °C rising 3 °C/min to 92, then cooling.
    "rule1_rule8_demo_ramp": {"gpus": {"gpu-dense": {"temp_c": "64+3x9 92 88 84 80 79 76 74"}}},
    # Rule 2 (demo): gpu-light leaking 10 MB/min = 600 MB/h; fires once the 6 h window is covered.
    "rule2_vram_leak_gpu_light": {"gpus": {"gpu-light": {"vram_used_mb": "6000+10x360"}}},
    # Rule 2's negative twin: 250 MB/h on a 300 MB/h GPU.
    "rule2_250_mb_per_hour_on_300": {"gpus": {"gpu-dense": {"vram_used_mb": "12000+4.1667x380"}}},
    # Rule 3 (demo): strix-moe stuck, /health 200 while every request fails; restarted at poll 5.
    "rule3_strix_stuck": {"gpus": {"strix-moe": {"failures_60s": "0 12x3 _ 0x3",
                                                  "endpoint": "ok*4 loading ok*4"}}},
    # Rule 5 (demo): gpu-light's breaker opens at t=60 and stays open; fires at t=720.
    "rule5_breaker_open_9_then_11_min": {"gpus": {"gpu-light": {"breaker": "0 1x12 0"}}},
    # incidents.yaml: strix-moe's host dies at t=120 (refused), gpu-monitor down t=300..480.
    "rule6_rule7_dead_host_and_monitor_outage": {
        "gpus": {"strix-moe": {"endpoint": "ok ok refused*10"}},
        "monitor": "1 1 1 1 1 0 0 0 0 1 1 1",
    },
    # Lesson L5: one oversized monitor body is a fault for one cycle, never an issue.
    "l5_one_oversized_monitor_poll": {"gpus": {}, "monitor": "1 1 0 1 1", },
}


def main() -> None:
    cfg = fleet_config()
    (HERE / "fleet.json").write_text(json.dumps(FLEET_YAML, indent=2) + "\n")
    for name, spec in TRACES.items():
        observations = fleet_trace(cfg, spec["gpus"], monitor=spec.get("monitor"))
        with open(HERE / f"{name}.jsonl", "w", encoding="utf-8") as fh:
            for obs in observations:
                fh.write(json.dumps(obs.to_dict(), separators=(",", ":")) + "\n")
        print(f"{name}.jsonl: {len(observations)} polls")


if __name__ == "__main__":
    main()
