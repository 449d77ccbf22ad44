"""``core.coverage.rules_off`` works out what a GPU's llama-server gives once per kind of server, not
once per rule and GPU (issue 19 "Performance": ~0.3 s of a 10,000-GPU check): the same answer as
asking every GPU, for any mix of servers and every source."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.core.coverage import home, rules_off
from gpuheal.model import GpuSample, Observation
from gpuheal.rules import ALL
from gpuheal.signals import ALWAYS, per_gpu, serves_task_loop, unmet
from gpuheal.source_kinds import spec

STATES = st.sampled_from([None, "ok", "disabled", "timeout", "unauthorized"])
SERVER = st.tuples(STATES, STATES, st.sampled_from([None, "ok", "timeout"]))


def asked_per_gpu(source: str, obs: Observation) -> dict[str, list[str]]:
    """Each rule's GPUs that cannot judge, every GPU asked on its own (what rules_off said before)."""
    mode = spec(home(source))
    out = {}
    for rule in ALL:
        if unmet(rule.NEEDS, mode.provides | ALWAYS):
            continue
        gpus = sorted(a for a, s in obs.gpus.items()
                      if unmet(rule.NEEDS, per_gpu(mode.provides, serves_metrics=s.metrics != "disabled",
                                                   reachable=True,
                                                   serves_task_loop=serves_task_loop(s.metrics, s.slots, s.canary))))
        if gpus:
            out[rule.ID] = gpus
    return out


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["monitor", "smi", "prometheus", "smi-fallback"]), st.lists(SERVER, max_size=12))
def test_rules_off_is_what_asking_every_gpu_gives(source, servers):
    gpus = {f"g{i}": GpuSample(endpoint="ok", metrics=m, slots=s, canary=c) for i, (m, s, c) in enumerate(servers)}
    obs = Observation(at=datetime(2026, 7, 18, 8, tzinfo=UTC), gpus=gpus, monitor_ok=True, source=source)
    want = asked_per_gpu(source, obs)
    got = {o["rule"]: o["gpus"] for o in rules_off(source, obs, ALL) if o["gpus"] != ["fleet"]}
    for rule, gpus in want.items():
        assert got.get(rule) == gpus, (rule, got)
    rule_ids = {r.ID for r in ALL}
    assert {r for r in got if r in rule_ids} - set(want) <= {"model-stuck"}  # _partial_metrics's own row
