"""The issue lifecycle (core/engine): holds, missing data, hysteresis, inhibition, muting, the
registry, and the purity of the core (no IO, no clock)."""

from __future__ import annotations

import ast
import dataclasses
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

try:
    from tests.series import START, fleet_config, fleet_trace
except ImportError:
    from series import START, fleet_config, fleet_trace

from gpuheal import benchdata
from gpuheal.core import engine
from gpuheal.core.engine import Finding, load_book, new_book
from gpuheal.core.memory import Memory
from gpuheal.core.view import FleetView, Restarts
from gpuheal.rules import ALL, BY_ID, KNOWN_IDS, RuleRegistryError, build_registry
from gpuheal.signals import Signal
from gpuheal.signals import needs as needs_of
from gpuheal.state.history import History

ROOT = Path(__file__).resolve().parent.parent
CFG = fleet_config()


def scripted_rule(detects: str, recovers: str | None = None, *, polls: int = 1, hold_s: float = 0,
                  started_at=None, rule_id: str = "thermal-critical", needs=(), inhibits=None,
                  scope: str = "gpu", clear_polls: int = 1):
    """A fake rule for gpu-dense (or the fleet): detect follows ``detects`` poll by poll
    (F finding, . quiet, _ not known); ``recovers`` likewise (R yes, n no, _ not known)."""
    state = {"i": -1}

    def detect(view, subject, p):
        if subject not in ("gpu-dense", "fleet"):
            return None
        state["i"] += 1
        c = detects[state["i"]]
        if c == "F":
            return Finding({"value": state["i"]}, f"poll {state['i']}", started_at=started_at)
        return False if c == "." else None

    rule = SimpleNamespace(ID=rule_id, SCOPE=scope, SEVERITY="critical", NEEDS=needs, INHIBITS=inhibits,
                           Params=BY_ID[rule_id].Params, detect=detect, recovered=None,
                           hold=lambda p: (polls, hold_s))
    if recovers is not None:
        def recovered(view, subject, p, record):
            c = recovers[state["i"]]
            return True if c == "R" else (False if c == "n" else None)

        rule.recovered = recovered
    return rule


def drive(rules, n, cfg=CFG, restarts=None, obs_list=None, book=None):
    """Run ``n`` polls 60 s apart; returns (timeline of (poll, gpu, issue, event), book, last Evaluation)."""
    book = book or new_book()
    timeline = []
    ev = None
    for i in range(n):
        now_s = (START + timedelta(seconds=60 * i)).timestamp()
        obs = obs_list[i] if obs_list else None
        view = FleetView(cfg, now_s, obs, History(), benchdata.empty(), book.memory,
                         restarts or Restarts(last={}, grace_s=0))
        ev = engine.evaluate(rules, view, book)
        timeline += [(i, t["gpu"], t["issue"], t["event"]) for t in ev.transitions]
    return timeline, book, ev


def test_fires_after_hold_polls_consecutive_findings():
    tl, _, ev = drive([scripted_rule("FFF", polls=2)], 3)
    assert tl == [(0, "gpu-dense", "thermal-critical", "pending"), (1, "gpu-dense", "thermal-critical", "firing")]
    assert ev.issues[0].state == "firing" and ev.issues[0].since == "2026-07-18T08:00:00Z"
    assert ev.issues[0].fired_at == "2026-07-18T08:01:00Z"


def test_one_finding_then_quiet_is_dropped_never_fired():
    tl, book, ev = drive([scripted_rule("F..", polls=2)], 3)
    assert [e[3] for e in tl] == ["pending", "dropped"]
    assert ev.issues == [] and ev.resolved == [] and book.issues == {}


def test_missing_data_neither_advances_nor_resets_the_hold():
    tl, _, _ = drive([scripted_rule("F__F", polls=2)], 4)
    assert tl == [(0, "gpu-dense", "thermal-critical", "pending"), (3, "gpu-dense", "thermal-critical", "firing")]


def test_missing_data_never_clears_a_firing_issue():
    tl, _, ev = drive([scripted_rule("F____")], 5)
    assert [e[3] for e in tl] == ["firing"]
    assert ev.issues[0].state == "firing"


def test_hysteresis_recovered_decides_not_detect():
    # quiet at polls 1-2 but not recovered (e.g. 82 °C), recovered at 3
    tl, _, ev = drive([scripted_rule("F...", "_nnR")], 4)
    assert [(e[0], e[3]) for e in tl] == [(0, "firing"), (3, "resolved")]
    assert ev.resolved[0].resolved_at == "2026-07-18T08:03:00Z"
    assert ev.resolved[0].since == "2026-07-18T08:00:00Z"


def test_clear_polls_needs_consecutive_recoveries():
    rule = scripted_rule("F....", "_RnRR")
    cfg = fleet_config(rules={"thermal-critical": {"clear_polls": 2}})
    tl, _, _ = drive([rule], 5, cfg=cfg)
    assert [(e[0], e[3]) for e in tl] == [(0, "firing"), (4, "resolved")]


def test_finding_again_resets_recovery_count():
    cfg = fleet_config(rules={"thermal-critical": {"clear_polls": 2}})
    tl, _, _ = drive([scripted_rule("F.F..", "_R_RR")], 5, cfg=cfg)
    assert [(e[0], e[3]) for e in tl] == [(0, "firing"), (4, "resolved")]


def test_hold_seconds_is_strictly_more_than():
    tl, _, _ = drive([scripted_rule("FFFFF", hold_s=180)], 5)
    assert [(e[0], e[3]) for e in tl] == [(0, "pending"), (4, "firing")]  # 240 s > 180 s; 180 is not


def test_started_at_moves_since_back():
    started = START.timestamp() - 590
    tl, _, ev = drive([scripted_rule("FF", hold_s=600, started_at=started)], 2)
    assert [(e[0], e[3]) for e in tl] == [(0, "pending"), (1, "firing")]
    assert ev.issues[0].since == "2026-07-18T07:50:10Z"


def test_muted_gpu_is_not_evaluated_at_all():
    restarts = Restarts(last={"gpu-dense": START.timestamp() + 60}, grace_s=120)
    # polls 1 and 2 are inside the grace: the script does not even advance there
    tl, _, ev = drive([scripted_rule("FF", polls=2)], 4, restarts=restarts)
    assert [(e[0], e[3]) for e in tl] == [(0, "pending"), (3, "firing")]


def test_muted_gpu_keeps_its_open_issues():
    restarts = Restarts(last={"gpu-dense": START.timestamp() + 60}, grace_s=120)
    _, _, ev = drive([scripted_rule("F")], 2, restarts=restarts)
    assert [i.state for i in ev.issues] == ["firing"] and ev.muted == ["gpu-dense"]


def test_host_inhibitor_freezes_and_hides_the_gpus_other_issues():
    host = scripted_rule(".F.", rule_id="host-unreachable", inhibits="host")
    other = scripted_rule("F.", rule_id="model-stuck")  # frozen at poll 1: its script does not advance
    tl, book, ev = drive([host, other], 2)
    assert [i.issue for i in ev.issues] == ["host-unreachable"]
    assert [(i.issue, i.inhibited_by) for i in ev.inhibited] == [("model-stuck", "host-unreachable")]
    assert book.issues["gpu-dense|model-stuck"].state == "firing"
    # the host comes back: the other rule is evaluated again (its script advances to ".")
    tl, _, ev = drive([host, other], 1, book=book)
    assert {(e[2], e[3]) for e in tl} == {("host-unreachable", "resolved"), ("model-stuck", "resolved")}


def test_monitor_inhibitor_hides_monitor_fed_issues_only():
    ds = scripted_rule("F", rule_id="data-source-unreachable", inhibits="monitor", scope="fleet")
    fed = scripted_rule("F", rule_id="thermal-critical", needs=needs_of(Signal.TEMP))
    book = new_book()
    book.issues["gpu-dense|thermal-critical"] = engine.IssueRecord(
        gpu="gpu-dense", issue="thermal-critical", severity="critical", state=engine.FIRING, since_s=0.0,
        fired_at="x", hits=2, last_s=0.0)
    other = scripted_rule("F", rule_id="benchmark-regression")
    _, _, ev = drive([ds, fed, other], 1, book=book)
    assert {i.issue for i in ev.issues} == {"data-source-unreachable", "benchmark-regression"}
    assert [i.issue for i in ev.inhibited] == ["thermal-critical"]


def test_issues_of_removed_gpus_or_rules_are_forgotten():
    book = load_book({"issues": {"gone|thermal-critical": {
        "gpu": "gone", "issue": "thermal-critical", "severity": "critical", "state": "firing",
        "since": "x", "since_s": 0, "hits": 1}}})
    assert "gone|thermal-critical" in book.issues
    _, book, ev = drive([scripted_rule("_")], 1, book=book)
    assert book.issues == {} and ev.resolved == []


@pytest.mark.parametrize("junk", [None, 3, "x", [], {"issues": []}, {"issues": {"a|b": {"gpu": "a"}}},
                                  {"issues": {"k": {"gpu": "a", "issue": "b", "severity": "info", "state": "firing",
                                                     "since": "x", "since_s": 1, "hits": 1}}},
                                  {"memory": 5, "log": {}}])
def test_load_book_tolerates_garbage(junk):
    book = load_book(junk)
    assert book.issues == {} and isinstance(book.memory, Memory) and book.memory.to_json() == {} and isinstance(book.log, engine.TransitionLog)


def test_log_is_bounded():
    old = engine.Transition("2026-07-18T07:00:00Z", "gpu-dense", "x", "info", engine.Event.PENDING, "", "", {})
    book = new_book()
    book.log = engine.TransitionLog([old] * (engine.LOG_MAX + 50))
    drive([scripted_rule("F")], 1, book=book)
    assert len(book.log) == engine.LOG_MAX and book.log[-1].issue == "thermal-critical"


def test_open_issues_sorted_worst_first_then_fleet_order():
    trace = fleet_trace(CFG, {"strix-moe": {"temp_c": "90 90"}, "gpu-dense": {"endpoint": "refused*3"}})
    try:
        from tests.series import run
    except ImportError:
        from series import run

    result = run(CFG, trace)
    assert [(i.gpu, i.issue, i.state) for i in result.open_at_end] == [
        ("gpu-dense", "host-unreachable", "firing"),
        ("strix-moe", "thermal-critical", "firing"),
    ]


# --------------------------------------------------------------------------- registry


def test_registry_has_every_contract_id_once_and_matches_defaults():
    import yaml

    assert sorted(BY_ID) == sorted(KNOWN_IDS) and len(ALL) == len(KNOWN_IDS)
    defaults = yaml.safe_load((ROOT / "gpuheal/config/defaults.yaml").read_text())
    assert set(defaults["rules"]) == set(KNOWN_IDS)


def _module(name, **attrs):
    mod = SimpleNamespace(__name__=f"gpuheal.rules.{name}", SCOPE="gpu", SEVERITY="warning", NEEDS=(),
                          INHIBITS=None, Params=BY_ID["vram-leak"].Params, detect=lambda v, s, p: None,
                          recovered=None, hold=None, remember=None, JUDGED_FROM_BENCH=False,
                          REMEDY=BY_ID["vram-leak"].REMEDY)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


def test_registry_refuses_duplicates_unknown_ids_and_misnamed_modules():
    good = _module("vram_leak", ID="vram-leak")
    with pytest.raises(RuleRegistryError, match="duplicate"):
        build_registry((good, _module("vram_leak", ID="vram-leak")))
    with pytest.raises(RuleRegistryError, match="unknown rule id"):
        build_registry((_module("gpu_on_fire", ID="gpu-on-fire"),))
    with pytest.raises(RuleRegistryError, match="named after"):
        build_registry((_module("leak", ID="vram-leak"),))
    with pytest.raises(RuleRegistryError, match="SEVERITY"):
        build_registry((_module("vram_leak", ID="vram-leak", SEVERITY="fatal"),))
    with pytest.raises(RuleRegistryError, match="detect"):
        build_registry((_module("vram_leak", ID="vram-leak", detect=None),))
    with pytest.raises(RuleRegistryError, match="REMEDY"):
        build_registry((_module("vram_leak", ID="vram-leak", REMEDY=None),))
    assert build_registry((good,)) == (good,)


def test_registry_refuses_a_bad_memory_declaration_and_two_memories_under_one_key():
    """``remember`` is None or a tuple of Remember records whose keys no other rule uses (each key
    is a memory in the issue book); ``JUDGED_FROM_BENCH`` a bool, never missing or truthy text."""
    from gpuheal.core.remember import Remember

    memory = Remember("rows", lambda data: None, lambda row, view, subject: None)
    for bad in ("rows", (), (memory, "rows"), [memory], "missing"):
        attrs = {} if bad == "missing" else {"remember": bad}
        mod = _module("vram_leak", ID="vram-leak", **attrs)
        if bad == "missing":
            del mod.remember
        with pytest.raises(RuleRegistryError, match="remember must be None or a tuple"):
            build_registry((mod,))
    for bad in ("yes", 1, None):
        with pytest.raises(RuleRegistryError, match="JUDGED_FROM_BENCH"):
            build_registry((_module("vram_leak", ID="vram-leak", JUDGED_FROM_BENCH=bad),))
    one, two = _module("vram_leak", ID="vram-leak", remember=(memory,)), _module("model_stuck", ID="model-stuck",
                                                                                 remember=(memory,))
    with pytest.raises(RuleRegistryError, match="memory key 'rows' is also vram-leak's"):
        build_registry((one, two))
    assert build_registry((one,)) == (one,)
    assert len({m.key for r in ALL for m in r.remember or ()}) == sum(len(r.remember or ()) for r in ALL) == 9


def test_the_rules_judged_from_benchmark_results_are_declared_on_them():
    """``bench`` re-evaluates exactly the rules whose evidence is the recorded results: Rule 4, Rule 9
    and the rejected key (L1), read from each rule's own declaration."""
    assert {r.ID for r in ALL if r.JUDGED_FROM_BENCH} == {"benchmark-regression", "context-window", "api-key-mismatch"}


def test_the_fleet_incidents_that_keep_results_out_of_the_baseline_are_derived_from_the_rules():
    """A bench result taken while the fleet's cooling is failing is not the GPU's speed; one taken while
    the data source is down is (gpuheal just cannot see): a new fleet rule must land on one side."""
    from gpuheal.steps.bench import slowing_every_gpu

    assert slowing_every_gpu(ALL) == {"cooling-infrastructure"}


def test_every_rule_declares_a_contract_severity():
    critical = {"thermal-critical", "model-stuck", "host-unreachable", "api-key-mismatch",
                "thermal-rising", "cooling-infrastructure"}
    info = {"context-window", "workload-misrouted"}
    for rule in ALL:
        expected = "critical" if rule.ID in critical else "info" if rule.ID in info else "warning"
        assert rule.SEVERITY == expected, rule.ID
    assert BY_ID["data-source-unreachable"].SCOPE == "fleet"
    assert BY_ID["cooling-infrastructure"].SCOPE == "fleet"


# --------------------------------------------------------------------------- purity

BANNED = ("requests", "socket", "subprocess", "fabric", "http", "time", "urllib",
          "gpuheal.sources", "gpuheal.state.store")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", ["gpuheal/core", "gpuheal/rules"])
def test_core_and_rules_do_no_io(package):
    """Design: "parse/, rules/ and core/ take values and return values" — read the imports."""
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in _imports(path):
            if any(name == b or name.startswith(b + ".") for b in BANNED):
                offenders.append(f"{path.name}: {name}")
    assert offenders == []


@pytest.mark.parametrize("package", ["gpuheal/core", "gpuheal/rules"])
def test_no_clock_reads_in_core_or_rules(package):
    """Design: "time is a parameter" — no rule or engine code reads the wall clock."""
    hits = []
    for path in (ROOT / package).rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"now\(\)|utcnow|time\.time|monotonic\(|clock\.now", line):
                hits.append(f"{path.name}:{number}: {line.strip()}")
    assert hits == []


# --------------------------------------------------------------------------- the typed book (issue 19 item 4)

OLD_STATE = ROOT / "tests" / "data" / "state-6d00935"  # issues.json written by main at 6d00935's engine


def test_a_book_written_by_the_previous_version_loads_typed_and_carries_on(tmp_path):
    """The issue book of the dict-era engine (its fixture written by that code) loads into typed
    records, round-trips to the same on-disk shape, and the lifecycle carries on from it."""
    import json

    from gpuheal.state import files
    from gpuheal.state.store import StateDir

    old = json.loads((OLD_STATE / "issues.json").read_text())
    book = load_book(old)
    firing = book.issues["gpu-dense|thermal-critical"]
    assert isinstance(firing, engine.IssueRecord) and firing.state is engine.IssueState.FIRING
    assert firing.since == "2026-07-18T08:04:00Z" and firing.since_s == 1784361840.0 and firing.hits == 2
    assert book.issues["gpu-dense|model-stuck"].state is engine.IssueState.PENDING
    assert [t.event for t in book.log] == ["firing", "pending", "dropped", "resolved", "firing", "pending"]
    assert all(isinstance(t.event, engine.Event) for t in book.log)
    assert book.to_json() == old  # the on-disk shape is kept, byte for byte once dumped sorted
    with StateDir(tmp_path / "state") as store:  # through the real state directory
        store.write(files.ISSUES, old)
        book = load_book(store.read(files.ISSUES, None))
    # thermal-critical recovers at once; model-stuck (pending, 1 hit of 3) goes quiet: dropped
    rules = [scripted_rule(".", "R", polls=1), scripted_rule(".", polls=3, rule_id="model-stuck")]
    tl, book, _ = drive(rules, 1, book=book)
    assert {(e[2], e[3]) for e in tl} == {("thermal-critical", "resolved"), ("model-stuck", "dropped")}
    assert book.issues == {} and len(book.log) == 8


def test_every_state_change_is_a_line_of_the_transition_table():
    book = new_book()
    tl, book, _ = drive([scripted_rule("FF..", "__RR", polls=2, clear_polls=1)], 4, book=book)
    assert [e[3] for e in tl] == ["pending", "firing", "resolved"]
    moves = {(before, event) for before, event in engine.TRANSITIONS}
    assert moves == {(None, "pending"), ("pending", "firing"), ("pending", "dropped"), ("firing", "resolved")}
    rec = engine.IssueRecord(gpu="gpu-dense", issue="thermal-critical", severity="critical",
                             state=engine.PENDING, since_s=0.0)
    view = FleetView(CFG, 0.0, None, History(), benchdata.empty(), {}, Restarts(last={}, grace_s=0))
    run = engine._Pass([], view, new_book(), None)
    with pytest.raises(engine.BadTransition):
        run.move(rec, engine.Event.RESOLVED)  # a pending issue never resolves: it is dropped


def test_since_is_stored_once_and_derived():
    _, book, _ = drive([scripted_rule("F")], 1)
    rec = book.issues["gpu-dense|thermal-critical"]
    assert "since" not in {f.name for f in dataclasses.fields(rec)}
    assert book.to_json()["issues"][rec.key]["since"] == rec.since == "2026-07-18T08:00:00Z"
