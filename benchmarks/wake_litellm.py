"""From the first failed request to the woken heal cycle, through the real LiteLLM 1.108.7 (issue 28
item 3): its Slack-style alerting posts to ``gpuheal wake`` at ``/wake/TOKEN``.

The rig is the real-LiteLLM tier's (``tests/litellm_wake.py``): a simulated fleet on real time, the
real proxy with ``general_settings.alerting: ["slack"]``, and one ``gpuheal wake`` process per
connection as systemd's ``Accept=yes`` starts them. Each run closes one llama-server's port
(connection refused), sends a chat completion through the proxy every 2 s, and times, from the
first request that failed: LiteLLM's first alert reaching gpuheal, the woken cycle's start, and its
end. Each run has its own state directory (so ``wake.min_interval_s`` of the previous run does not
refuse it); the runs alternate between the two GPUs. Loopback only. Prints JSON: median and worst.

    .venv/bin/python benchmarks/wake_litellm.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.litellm_proxy import litellm_binary  # noqa: E402
from tests.litellm_wake import GROUPS, WakeRig, summary  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    binary, why = litellm_binary()
    if binary is None:
        sys.exit(f"wake_litellm: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        rig = WakeRig(binary, Path(tmp))
        try:
            measured = []
            aliases = list(GROUPS)
            for i in range(args.runs):
                alias = aliases[i % len(aliases)]
                measured.append(rig.fail_once(alias, Path(tmp) / f"state-{i}"))
                rig.settle(alias)
                print(json.dumps(summary(measured)["each"][-1]), file=sys.stderr)
        finally:
            rig.close()
    print(json.dumps(summary(measured), indent=2))


if __name__ == "__main__":
    main()
