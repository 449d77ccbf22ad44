"""A rule's outcome on a GPU with no issue of that rule in the book, where the finding does not hold, is not looked up
(``engine._Pass.run_rule``, issue 29): every rule still detects on every GPU it did, and the book, the transitions and
the issues are what advancing every outcome made — checked against the earlier loop, kept here as the reference, on
random scripts of findings, quiet and unknown polls and recoveries over several GPUs and rules."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

try:
    from tests.series import START, fleet_config
except ImportError:
    from series import START, fleet_config

from gpuheal import benchdata
from gpuheal.core import engine
from gpuheal.core.engine import Finding, new_book
from gpuheal.core.view import NO_PARAMS, FleetView, Restarts
from gpuheal.rules import BY_ID
from gpuheal.state.history import History

CFG = fleet_config()
ALIASES = [g.alias for g in CFG.gpus]
RULE_IDS = ["thermal-critical", "vram-leak", "model-stuck"]


def _reference_run_rule(self: Any, rule: Any, inhibition: Any) -> None:
    """The loop before issue 29's change: every gated outcome advanced (looked up in the book)."""
    if self.only is not None and rule.ID not in self.only:
        return
    if rule.SCOPE == engine.FLEET:
        if inhibition.by(rule, engine.FLEET) is None and engine._gate_open(rule, self.view, engine.FLEET):
            self.advance(rule, engine.FLEET)
        return
    hidden = inhibition.hidden(rule)
    if hidden is None:
        return
    skip = self.muted | hidden
    for alias, _provided, rules in self.provided:
        if alias in skip or not engine._gate_open(rule, self.view, alias):
            continue
        self.advance(rule, alias, self.view.cfg.rule_record(rule.Params, rules.get(rule.ID, NO_PARAMS)))


def _rule(rule_id: str, script: dict[str, str], polls: int, clear_polls: int, calls: list[tuple[int, str, str]]):
    """A scripted rule: per GPU a string of F (finding), . (quiet), _ (not known), R/n (recovered yes/no)."""
    clock = {"i": 0}

    def detect(view: Any, subject: str, p: Any) -> Any:
        calls.append((clock["i"], rule_id, subject))
        c = script.get(subject, "." * 50)[clock["i"]]
        if c == "F":
            return Finding({"poll": clock["i"]}, f"{rule_id} poll {clock['i']}")
        return None if c == "_" else False

    def recovered(view: Any, subject: str, p: Any, record: Any) -> Any:
        c = script.get(subject, "." * 50)[clock["i"]]
        return {"R": True, "n": False}.get(c)

    rule = SimpleNamespace(ID=rule_id, SCOPE="gpu", SEVERITY="critical", NEEDS=(), INHIBITS=None,
                           Params=BY_ID[rule_id].Params, detect=detect, hold=lambda p: (polls, 0.0),
                           recovered=recovered if clear_polls else None)
    return rule, clock


def _drive(scripts: dict[str, dict[str, str]], polls: int, clear_polls: int, n: int) -> tuple[Any, ...]:
    calls: list[tuple[int, str, str]] = []
    made = [_rule(rid, scripts[rid], polls, clear_polls, calls) for rid in RULE_IDS]
    book = new_book()
    out = []
    for i in range(n):
        for _, clock in made:
            clock["i"] = i
        now_s = (START + timedelta(seconds=60 * i)).timestamp()
        view = FleetView(CFG, now_s, None, History(), benchdata.empty(), book.memory, Restarts(last={}, grace_s=0))
        ev = engine.evaluate([r for r, _ in made], view, book)
        out.append((ev.transitions, [i.to_json() for i in ev.issues], list(ev.fired), list(ev.resolved)))
    return out, book.to_json(), calls


_SCRIPT = st.text(alphabet="F._Rn", min_size=12, max_size=12)


@settings(max_examples=150, deadline=None)
@given(st.fixed_dictionaries({rid: st.dictionaries(st.sampled_from(ALIASES), _SCRIPT) for rid in RULE_IDS}),
       st.integers(1, 3), st.integers(0, 2))
def test_the_book_is_what_advancing_every_outcome_made(scripts: dict[str, dict[str, str]], polls: int,
                                                       clear_polls: int) -> None:
    fast = _drive(scripts, polls, clear_polls, 12)
    saved = engine._Pass.run_rule
    try:
        engine._Pass.run_rule = _reference_run_rule  # type: ignore[method-assign]
        slow = _drive(scripts, polls, clear_polls, 12)
    finally:
        engine._Pass.run_rule = saved  # type: ignore[method-assign]
    assert fast == slow
    assert len(fast[2]) == 12 * len(RULE_IDS) * len(ALIASES)  # every rule detected on every GPU at every poll
