"""From the first failed request to the woken heal cycle, through the real LiteLLM 1.108.7 (issue 28
item 3): its Slack-style alerting posts to ``gpuheal wake`` at ``/wake/TOKEN``.

The rig is the real-LiteLLM tier's (``tests/litellm_wake.py``): a simulated fleet on real time, the
real proxy with ``general_settings.alerting: ["slack"]``, and one ``gpuheal wake`` process per
connection as systemd's ``Accept=yes`` starts them. Each run closes one llama-server's port
(connection refused), sends chat completions through the proxy (one every 2 s, or back to back while
each takes longer), and times, from the moment the first one that failed was sent: its ``500``
(after LiteLLM's own retries), LiteLLM's first alert reaching gpuheal, the woken cycle's start and
its end. Each run has its own state directory, and starts only once the proxy has sent no alert for
8 s (a late alert of the previous fault would otherwise book a cycle there first, and the run's own
alerts would rightly be answered 429); the runs alternate between the two GPUs. Loopback only.
Prints each run on stderr, then JSON: median and worst.

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
    ap.add_argument("--flush-interval-s", type=int, default=None,
                    help="the proxy's DEFAULT_FLUSH_INTERVAL_SECONDS (LiteLLM's default: 5)")
    args = ap.parse_args()
    binary, why = litellm_binary()
    if binary is None:
        sys.exit(f"wake_litellm: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        rig = WakeRig(binary, Path(tmp), args.flush_interval_s)
        try:
            measured = []
            aliases = list(GROUPS)
            for i in range(args.runs):
                alias = aliases[i % len(aliases)]
                m = rig.fail_once(alias, Path(tmp) / f"state-{i}")
                measured.append(m)
                rig.settle(alias)
                print(json.dumps(summary(measured)["each"][-1]), file=sys.stderr)
                for r in m.runs:  # every wake process of the window: when it came, what it answered
                    said = r.stderr[0][:110] if r.stderr else "(no line yet)"
                    print(f"  +{r.accepted_s - rig.first_failed_s:6.2f} s  {said}", file=sys.stderr)
        finally:
            rig.close()
    print(json.dumps({**summary(measured), "flush_interval_s": args.flush_interval_s or 5}, indent=2))


if __name__ == "__main__":
    main()
