"""The real LiteLLM 1.108.7 wakes ``gpuheal wake`` on the first failed request (issue 28 item 3):
``general_settings.alerting: ["slack"]`` and ``SLACK_WEBHOOK_URL=http://127.0.0.1:PORT/wake/TOKEN``,
no header, no nginx hop. A llama-server's port starts refusing; the proxy's alert reaches
``gpuheal wake`` (run per connection, as systemd's ``Accept=yes`` does), which answers 200 and runs
one ``heal --apply`` cycle, and the audit line names the deployment. The figures of
``benchmarks/wake_litellm.py`` come from the same rig (``tests/litellm_wake.py``)."""

from __future__ import annotations

import json

import pytest

from tests.litellm_wake import PROMPT, TOKEN, WakeRig

pytestmark = pytest.mark.reallitellm


@pytest.fixture(scope="module")
def rig(litellm_bin, tmp_path_factory):
    rig = WakeRig(litellm_bin, tmp_path_factory.mktemp("wake-litellm"))
    try:
        yield rig
    finally:
        rig.close()


def test_the_first_failed_request_wakes_one_cycle_that_names_the_deployment(rig, tmp_path):
    m = rig.fail_once("gpu-solo", tmp_path / "state")
    assert m.alert_s < 30 and m.cycle_started_s < 30, m  # it came at all, and not by cron (60 s)
    cycles = [r for r in m.runs if r.cycled]
    assert len(cycles) == 1, [r.stderr for r in m.runs]  # a burst of alerts: one cycle (min_interval_s)
    first = cycles[0]
    assert first.returncode == 0 and any("heal cycle done: fleet" in line for line in first.stderr), first.stderr
    assert any(" 200 cycle: heal cycle started (litellm " in line for line in first.stderr), first.stderr
    others = [r for r in m.runs if r is not first and r.ended_s is not None]
    assert all(any(f" {code} " in r.stderr[0] for code in ("200", "429")) for r in others), [r.stderr for r in others]
    audit = [json.loads(x) for x in (m.state_dir / "gpu-self-heal-log.jsonl").read_text().splitlines()]
    (woke,) = [r for r in audit if r["issue"] == "wake"]
    named = woke["detected"]["litellm"]
    assert (named["gpu"], named["api_base"]) == ("gpu-solo", rig.fleet.endpoints["gpu-solo"] + "/v1"), woke
    assert named["model_group"] in ("solo", None) and named["model"] in ("openai/gpu-solo", "gpu-solo")  # not forged
    assert named["alert_type"] in ("llm_exceptions", "outage_alerts") and named["api_base"].endswith("/v1")
    # the user's prompt (in llm_exceptions' Messages:) and the token: in no file, no log line
    written = "".join(p.read_text(errors="replace") for p in m.state_dir.rglob("*") if p.is_file())
    logs = "\n".join(line for r in m.runs for line in r.stderr)
    for secret in (PROMPT[:20], TOKEN):
        assert secret not in written and secret not in logs
    rig.settle("gpu-solo")
