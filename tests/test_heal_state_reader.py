"""Issue 26 item 3: one reader of ``heal-state.json`` (:meth:`gpuheal.core.heal_state.HealState.from_json`).

Every module that used to read the heal state its own way (report, trend, evaluate, pause, check's
trend windows, the run-id counter in the state directory, the heal ledger, bench) runs here over a
set of hostile files — wrong types, missing keys, huge, old shapes, not JSON — and what each one
produces is compared with ``tests/golden/heal_state_hostile.json``, recorded on the code before the
readers were merged (``GPUHEAL_UPDATE_GOLDEN=1`` rewrites it). Nothing raises; a file that is not a
heal state is set aside with one warning line, as before.

A scan proves the merge stays done: outside ``core/heal_state.py`` no module reads the heal state's
dict by key (``.get("attempts")``, ``["paused"]``, ...), so a new reader cannot grow back unseen.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuheal.actions.record import old_run_counter
from gpuheal.state import files
from gpuheal.state.history import History
from gpuheal.state.store import StateDir

try:
    from tests.series import START, fleet_config, fleet_trace
except ImportError:
    from series import START, fleet_config, fleet_trace

GOLDEN = Path(__file__).parent / "golden" / "heal_state_hostile.json"
ROOT = Path(__file__).resolve().parent.parent / "gpuheal"
CFG = fleet_config()
NOW = START + timedelta(minutes=30)
T = NOW.timestamp()
A, B = "gpu-dense", "gpu-light"


def attempt(gpu: str, issue: str, **extra: Any) -> dict[str, Any]:
    return {"key": f"{gpu}/{issue}/s/1", "gpu": gpu, "issue": issue, "since": "2026-07-18T07:00:00Z", "n": 1,
            "actions": ["restart-llama-server"], "status": "pending", "started_at": T - 120, "verify_by": T + 60,
            **extra}


GOOD = {
    "restarts": {A: [T - 100, T - 7200]},
    "attempts": {"k1": attempt(A, "model-stuck"), "k2": attempt(B, "thermal-critical", status="resolved")},
    "escalated": {f"{B}/vram-leak": {"at": T - 50, "reason": "tried twice", "since": "2026-07-18T06:00:00Z"}},
    "paused": {"fleet": None, "gpus": {B: {"reason": "maintenance window", "at": "2026-07-18T07:55:00Z"}}},
    "active": {A: {"actions": ["shed-load"], "issue": "thermal-critical", "restore_failures": 1}},
    "litellm_restarts": [T - 300, T - 30],
    "service_restarts": {"litellm": [T - 30]},
    "run_seq": {"day": "20260718", "n": 7},
}

# name -> the raw text of heal-state.json (None: no file at all)
HOSTILE: dict[str, str | None] = {
    "absent": None,
    "not-json": "{corrupt",
    "no-schema": json.dumps(GOOD),
    "wrong-schema": json.dumps({"schema_version": 99, "data": GOOD}),
    "data-a-list": json.dumps({"schema_version": 1, "data": [1, 2, 3]}),
    "data-null": json.dumps({"schema_version": 1, "data": None}),
    "good": json.dumps({"schema_version": 1, "data": GOOD}),
    "sections-wrong-types": json.dumps({"schema_version": 1, "data": {
        "restarts": "x", "attempts": [1], "escalated": 5, "paused": "yes", "active": [], "litellm_restarts": {"a": 1},
        "service_restarts": 3, "run_seq": "x"}}),
    "values-wrong-types": json.dumps({"schema_version": 1, "data": {
        "restarts": {A: [True, "5", None, T - 10, 10**400], B: "x", "gpu-x": [[1]]},
        "attempts": {"a": attempt(A, "model-stuck", since=5, actions=["x", 3, None], started_at="y"),
                     "b": attempt(5, "model-stuck"), "c": attempt(A, None), "d": "junk",
                     "e": attempt(B, "model-stuck", n=True, status=7, verify_by=10**400, started_at=T - 5)},
        "escalated": {"noslash": {"at": 1}, f"{A}/model-stuck": "x", f"{B}/x": {"at": "y", "reason": 5}},
        "paused": {"fleet": {"reason": 5}, "gpus": {A: "x", B: {"at": 3}}},
        "active": {A: {"actions": "shed", "restore_failures": -4, "power_w": 10**9,
                       "restore": {"model_id": "m", "field": "bogus", "value": 1}}, B: 7},
        "litellm_restarts": [True, "x", T - 20, 10**400],
        "service_restarts": {"litellm": "x", "gpu-monitor": [T - 1, "z"]},
        "run_seq": {"day": "20260718", "n": 5.0}}}),
    "old-shape": json.dumps({"schema_version": 1, "data": {
        "restarts": {A: [T - 60]},
        "attempts": {"old": {"gpu": A, "issue": "model-stuck", "since": "2026-07-18T07:00:00Z", "n": 1,
                             "actions": ["restart-llama-server"], "started_at": T - 60}},
        "escalated": {f"{A}/model-stuck": {"at": T - 10}},
        "paused": {"fleet": {"reason": "old"}},
        "run_seq": {"day": "2026-07-18", "n": 3}}}),
    "huge": json.dumps({"schema_version": 1, "data": {
        "restarts": {A: [T - i for i in range(2000)]},
        "attempts": {f"k{i}": attempt(A if i % 2 else B, "model-stuck", key=f"k{i}", n=i, started_at=T - i,
                                      since=f"2026-07-18T07:{i % 60:02d}:00Z") for i in range(3000)},
        "escalated": {f"{A}/x{i}": {"at": T, "reason": "r" * 5000} for i in range(200)},
        "paused": {"fleet": None, "gpus": {f"g{i}": {"reason": "p" * 300} for i in range(500)}},
        "litellm_restarts": [T - i for i in range(5000)],
        "run_seq": {"day": "20260718", "n": 10**7}}}),
}


def _seed(state: Path, text: str | None) -> None:
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    if text is not None:
        (state / files.HEAL).write_text(text)
    health = {"schema_version": 1, "status": "down", "generated_at": "2026-07-18T08:29:00Z", "actions": [],
              "issues": [{"gpu": g, "issue": i, "severity": "critical", "state": "firing",
                          "since": "2026-07-18T07:00:00Z", "detected": {}}
                         for g, i in ((A, "model-stuck"), (B, "vram-leak"))]}
    (state / files.GPU_HEALTH).write_text(json.dumps(health))


def _plain(value: Any) -> Any:
    """JSON-able and stable (tuples as lists, dataclasses as dicts, sets sorted)."""
    return json.loads(json.dumps(value, default=lambda o: sorted(o) if isinstance(o, set) else o.__dict__))


def callers(state: Path) -> dict[str, Any]:
    """What each former reader's caller makes of the heal state in ``state``."""
    from gpuheal.actions.ledger import Ledger
    from gpuheal.core.heal_state import HealState
    from gpuheal.rules import REMEDIES
    from gpuheal.runtime import Runtime
    from gpuheal.steps import bench, check, evaluate, pause, report, trend

    out: dict[str, Any] = {}
    rt = Runtime(cfg=CFG, state_dir=state, now=NOW)
    with StateDir(state, 1.0) as store:
        out["report"] = report.build_summary(CFG, store, NOW)
        heal_state = HealState.from_json(store.read(files.HEAL, {}))
        plan = check.plan_check(CFG, heal_state)
        out["check.window_starts"] = plan.window_starts
        out["bench.recent_restarts"] = bench.recent_restarts(store)
        out["trend"] = trend.command(rt, store).document
        obs = fleet_trace(CFG, n=1, start=NOW)[0]
        history = History()
        history.add(obs, CFG.aliases)
        out["evaluate.issues"] = evaluate.run_full(CFG, store, obs, history, NOW, heal_state, plan.restarts).issues
        out["evaluate.breakers"] = json.loads((state / files.CIRCUIT_BREAKER_STATUS).read_text())
        out["ledger"] = Ledger(store, NOW, (), REMEDIES).state.to_json()
        out["store.next_run_id"] = store.next_run_id(NOW, old_run_counter)
        out["pause"] = pause.command(rt, store, gpu=A, reason="drill").document
        out["pause.written"] = store.read(files.HEAL, None)
        out["warnings"] = [re.sub(r"corrupt-\S+", "corrupt-X", w.replace(str(state), "STATE")) for w in store.warnings]
    return _plain(out)


def _recorded(got: dict[str, Any]) -> dict[str, Any]:
    """Each result as stored in the golden file: itself, or its digest when it is large (the huge file)."""
    out = {}
    for key, value in got.items():
        text = json.dumps(value, sort_keys=True)
        out[key] = value if len(text) <= 4000 else "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return out


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    if os.environ.get("GPUHEAL_UPDATE_GOLDEN") == "1":
        return {}
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", list(HOSTILE))
def test_every_caller_reads_a_hostile_heal_state_as_before(name, tmp_path, golden):
    state = tmp_path / "state"
    _seed(state, HOSTILE[name])
    got = callers(state)
    if os.environ.get("GPUHEAL_UPDATE_GOLDEN") == "1":
        recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        recorded[name] = _recorded(got)
        GOLDEN.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        return
    assert _recorded(got) == golden[name]
    # a file that is not a heal state is set aside with one line, never silently dropped
    aside = [w for w in got["warnings"] if files.HEAL in w]
    assert len(aside) == (1 if name in ("not-json", "no-schema", "wrong-schema") else 0), got["warnings"]


STATE_KEYS = {"restarts", "attempts", "escalated", "paused", "active", "litellm_restarts", "service_restarts",
              "run_seq"}
READER = ROOT / "core" / "heal_state.py"


def _key_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``x.get("attempts")`` / ``x["paused"]``: a heal-state section read from a dict by its key."""
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop"):
            if node.args and isinstance(node.args[0], ast.Constant):
                key = node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        if key in STATE_KEYS:
            found.append((node.lineno, str(key)))
    return found


def _reads_heal_file(source: str) -> bool:
    return "files.HEAL" in source or "heal-state.json" in source or "heal_state" in source


def test_no_module_but_the_reader_reads_the_heal_state_by_key():
    """Modules that touch the heal state (its file name, ``files.HEAL``, or a ``heal_state``) never
    read one of its sections from a dict: they get :class:`HealState` from its one reader."""
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == READER or "sim" in path.relative_to(ROOT).parts:
            continue
        source = path.read_text()
        if not _reads_heal_file(source):
            continue
        offenders += [f"{path.relative_to(ROOT)}:{line}: {key!r}" for line, key in _key_reads(ast.parse(source))]
    assert offenders == []


def test_the_scan_sees_a_key_read():
    tree = ast.parse('def f(store):\n    d = store.read(files.HEAL, {})\n    return d.get("attempts"), d["paused"]\n')
    assert _key_reads(tree) == [(3, "attempts"), (3, "paused")]
