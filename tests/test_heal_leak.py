"""Rule 2 end to end (issue 22, item 1): ``heal --apply`` on the simulator, one cron run per poll on a
jittered clock, with the GPU's per-process list read by a real local command. The process that
grew between the onset snapshot (kept in the state directory across runs) and the fire-time one is
acted on; the largest process that did not grow is never touched; an unattributable list restarts
and kills nothing and says why in the audit trail."""

from __future__ import annotations

import random
import sys

from tests.lab import Lab, scenario

LEAK = [{"at": 0, "gpu": "gpu-a", "ramp": {"vram_used_mb": 10.0}}]  # 600 MB/h
GPUS = [{"alias": "gpu-a", "host": "ct1", "vram_used_mb": 4000}, {"alias": "gpu-b", "host": "ct2"}]
CAT = "import sys; sys.stdout.write(open(sys.argv[1]).read())"
# the kill: record the pid, and the process is gone from the GPU's list (as a real SIGTERM does)
KILL = ("import sys, pathlib; killed, listing, pid = sys.argv[1:]; open(killed, 'a').write(pid + '\\n'); "
        "p = pathlib.Path(listing); "
        "p.write_text(''.join(ln for ln in p.read_text().splitlines(True) if not ln.startswith(pid + ',')))")


def leak_lab(tmp_path, kill_unknown: bool) -> tuple[Lab, object, object]:
    lab = Lab(tmp_path, scenario(GPUS, LEAK), heal={"kill_unknown_processes": kill_unknown})
    listing, killed = tmp_path / "compute-apps.csv", tmp_path / "killed"
    gpu = lab.gpu_raw("gpu-a")
    gpu["smi_command"] = [sys.executable, "-c", CAT, str(listing)]
    gpu["kill_command"] = [sys.executable, "-c", KILL, str(killed), str(listing), "{pid}"]
    lab.write_config()
    return lab, listing, killed


def run_until_acted(lab: Lab, listing, rows, polls: int = 140, seed: int = 22) -> list[dict]:
    """Poll every ~5 minutes, started a few seconds late or early; ``rows(minutes)`` is what the
    GPU's process list says at that virtual time. Stops once the leak's remedy ran."""
    rng, minutes = random.Random(seed), 0.0
    for _ in range(polls):
        step_s = 300 + rng.uniform(-2.0, 6.0)
        minutes += step_s / 60
        listing.write_text("".join(f"{line}\n" for line in rows(minutes)))
        lab.heal(advance_s=step_s)
        outcomes = [r for r in lab.audit() if r["phase"] == "outcome" and r["issue"] == "vram-leak"]
        if outcomes:
            return outcomes
    raise AssertionError("the leak's remedy never ran")


def test_the_small_process_that_grew_is_killed_and_the_largest_left_alone(tmp_path):
    lab, listing, killed = leak_lab(tmp_path, kill_unknown=True)
    try:
        # llama-server holds the most VRAM and stays flat; the small miner grows with the leak
        outcomes = run_until_acted(lab, listing, lambda m: ["1234, /app/llama-server, 20000",
                                                            f"4242, python3 miner.py, {300 + 10 * m:.0f}"])
        assert killed.read_text().split() == ["4242"]
        assert lab.restarts("gpu-a") == 0
        outcome = outcomes[0]
        attribution = outcome["detected"]["attribution"]
        assert (attribution["pid"], attribution["name"], attribution["is_llama_server"]) == (
            4242, "python3 miner.py", False)
        assert 80 <= attribution["grew_mb"] <= 200  # ~10 minutes of a 600 MB/h leak
        assert attribution["onset"]["taken_s"] < attribution["fire"]["taken_s"]
        assert outcome["result"] == "escalated" and outcome["verification"]["gone_from_gpu"] is True
        assert [s["action"] for s in outcome["steps"]] == ["snapshot-processes", "kill-process"]
        # the onset snapshot was kept across cron runs, in the state directory
        assert lab.read("vram-onset.json")["gpu-a"]["snapshot"]["taken_s"] == attribution["onset"]["taken_s"]
    finally:
        lab.close()


def test_a_list_that_cannot_be_attributed_restarts_and_kills_nothing(tmp_path):
    lab, listing, killed = leak_lab(tmp_path, kill_unknown=True)
    try:
        outcomes = run_until_acted(lab, listing, lambda m: [f"1234, /app/llama-server, {8000 + 10 * m:.0f}",
                                                            "4242, [Not Found], [N/A]"])
        assert not killed.exists() and lab.restarts("gpu-a") == 0
        outcome = outcomes[0]
        attribution = outcome["detected"]["attribution"]
        assert attribution["attributed"] is False and "[N/A]" in attribution["reason"]
        assert "pid" not in attribution and "name" not in attribution
        assert outcome["result"] == "escalated" and [s["action"] for s in outcome["steps"]] == ["snapshot-processes"]
        escalated = [r for r in lab.audit() if r["issue"] == "vram-leak" and r["result"] == "escalated"]
        assert any("not attributed" in str(r) for r in escalated)
    finally:
        lab.close()
