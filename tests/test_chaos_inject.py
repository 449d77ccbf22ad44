"""The chaos week's injector and its command line (benchmarks/chaos_inject.py, issue 29): a seeded,
documented week; a bad ``--rates`` file is one line on stderr and exit 3."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from chaos_inject import BY_NAME, KINDS, Layout, counts, inject, load_rates  # noqa: E402


def test_the_same_seed_gives_the_same_week_and_another_seed_another():
    layout = Layout.of(100)
    rates = load_rates(None)
    one = [i.to_json() for i in inject(layout, 7, 1, rates)]
    assert one == [i.to_json() for i in inject(layout, 7, 1, rates)]
    assert one != [i.to_json() for i in inject(layout, 7, 2, rates)]


def test_a_default_week_holds_faults_of_most_kinds_labelled_with_start_and_end():
    incidents = inject(Layout.of(100), 7, 1, load_rates(None))
    faults, benign = counts(incidents, True), counts(incidents, False)
    assert sum(faults.values()) >= 30 and sum(benign.values()) >= 60
    assert sum(1 for n in faults.values() if n) >= 10 and all(benign.values())
    week_s = 7 * 86400
    for inc in incidents:
        assert 0 <= inc.start_s < inc.natural_end_s
        assert inc.start_s + inc.spec.budget_s <= week_s  # a healer has the time the kind needs


def test_no_target_is_in_two_incidents_at_once():
    incidents = inject(Layout.of(40), 7, 5, load_rates(None))
    busy: dict[str, list[tuple[float, float]]] = {}
    for inc in incidents:
        slots = inc.gpus if inc.spec.slot == "gpu" else (inc.spec.slot,)
        for slot in slots:
            for start, end in busy.get(slot, []):
                assert inc.start_s >= end or inc.natural_end_s <= start, (inc, slot)
            busy.setdefault(slot, []).append((inc.start_s, inc.natural_end_s))


def test_every_kind_the_issue_names_is_drawn_and_classified():
    for name in ("crash", "freeze", "taskloop-hang", "vram-leak", "vram-leak-foreign", "overheat", "rack-cooling",
                 "power-cap", "breaker-stuck", "monitor-down", "monitor-empty", "host-unreachable", "partition",
                 "context-perf-loss", "role-drift"):
        assert BY_NAME[name].fault and BY_NAME[name].claim in ("heal", "escalate", "report")
    for name in ("deploy", "maintenance", "saturated", "traffic-spike", "blip", "slow", "nctx-change", "clock-step"):
        assert not BY_NAME[name].fault and BY_NAME[name].claim == "-"
    assert all(k.rate_per_hour > 0 for k in KINDS)


def test_a_partition_takes_most_of_a_racks_hosts_not_all_of_them_when_it_has_several():
    layout = Layout.of(64)
    rates = {k.name: 0.0 for k in KINDS} | {"partition": 0.05}
    parts = inject(layout, 2, 3, rates)
    assert parts
    for inc in parts:
        hosts = {layout.host_of[g] for g in inc.gpus}
        rack_hosts = {layout.host_of[g] for g in layout.gpus_of_rack(inc.unit)}
        assert hosts < rack_hosts and len(hosts) >= len(rack_hosts) / 2


def _chaos(tmp_path: Path, rates_text: str | None, *extra: str) -> subprocess.CompletedProcess:
    args = [sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--gpus", "2", "--days", "0.01", *extra]
    if rates_text is not None:
        path = tmp_path / "rates.yaml"
        path.write_text(rates_text)
        args += ["--rates", str(path)]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("crash: 1e-3\nmeteor-strike: 1e-3\n", "unknown kind 'meteor-strike'"),
        ("crash: -0.1\n", "cannot be negative"),
        ("crash: 40\nfreeze: 30\n", "sum to"),
        ("crash: lots\n", "must be a number"),
        ("- crash\n", "expected a mapping"),
        ("crash: [1\n", "cannot read the rates"),
    ],
)
def test_a_bad_rates_file_is_one_line_and_exit_3(tmp_path, text, says):
    proc = _chaos(tmp_path, text)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and says in proc.stderr and "Traceback" not in proc.stderr


def test_a_missing_rates_file_is_one_line_and_exit_3(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--rates", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1 and "cannot read the rates" in proc.stderr


def test_rates_override_only_what_they_name():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        fh.write("crash: 0.002\n")
    rates = load_rates(fh.name)
    Path(fh.name).unlink()
    assert rates["crash"] == 0.002 and rates["freeze"] == BY_NAME["freeze"].rate_per_hour


def test_a_crash_of_gpuheal_during_the_week_is_counted_and_reported(monkeypatch):
    """An exception out of ``heal --apply`` is a crash of gpuheal: the week goes on, and every one is
    counted in the figures with its line (never hidden, never a traceback on the table)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import chaos
    from chaos_inject import load_rates

    from gpuheal.steps import heal

    def boom(rt, store, **options):
        raise RuntimeError("injected: heal fell over")

    monkeypatch.setattr(heal, "command", boom)
    doc, _, _ = chaos.run(2, 0.01, 3, load_rates(None), only=("gpuheal",))
    m = doc["systems"]["gpuheal"]
    assert m["crashes"] == 14  # one per cycle: 0.01 day = 14 minutes
    assert all("RuntimeError: injected: heal fell over" in str(c) for c in m["crash_list"])
    assert "| gpuheal |" in chaos.table(doc) and "| 14 |" in chaos.table(doc)
