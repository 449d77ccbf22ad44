"""House rules that reviewers used to check by eye (issue 10, items 1 and 4), read from the source
with ``ast`` (milliseconds):

- no function in ``gpuheal/`` outside ``sim/`` runs over 80 lines;
- every step module (``steps/*.py``) stays at 300 lines at most (aim 250): the pure decisions
  live in ``core/``, the terminal output in ``render/``;
- no ``.get(key, <number>)`` fallback: a number that is operator configuration lives in
  ``config/defaults.yaml`` (under the strict parameter schema), any other is a named constant
  with its reason. ``0`` is allowed: the start of a count (``seen.get(host, 0) + 1``, polls
  counted so far in a state document) is the identity of a sum, not a setting anyone tunes.

Line length (120) is ruff's E501, run by ``make lint`` as part of ``make test``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "gpuheal"
MAX_FUNCTION_LINES = 80
MAX_STEP_LINES = 300
STEP_MODULES = sorted(p.relative_to(PKG).as_posix() for p in (PKG / "steps").glob("*.py"))

# Being split by work in flight elsewhere; test_exceptions_are_still_needed fails once one is
# fixed, so these lists only shrink.
KNOWN_LONG: set[str] = set()
KNOWN_NUMERIC_GET: set[str] = set()


def sources() -> list[Path]:
    return [p for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).parts[0] != "sim"]


def long_functions(path: Path, root: Path = PKG) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.relative_to(root)} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def numeric_gets(path: Path, root: Path = PKG) -> list[str]:
    """``x.get(key, 3)``, ``x.get(key, -0.5)``: a number other than 0 as the fallback of a lookup."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"):
            continue
        if len(node.args) != 2:
            continue
        default = node.args[1]
        if isinstance(default, ast.UnaryOp) and isinstance(default.op, ast.USub):
            default = default.operand
        if isinstance(default, ast.Constant) and type(default.value) in (int, float) and default.value != 0:
            out.append(f"{path.relative_to(root)}: {ast.unparse(node)}")
    return out


def _strip_lines(found: list[str]) -> set[str]:
    return {f.split(" (")[0] for f in found}


def test_no_function_over_80_lines():
    found = [f for p in sources() for f in long_functions(p)]
    assert [f for f in found if f.split(" (")[0] not in KNOWN_LONG] == []


def test_every_step_module_is_checked():
    """The list below is the steps package itself, with the modules that orchestrate healing in it."""
    assert {"steps/heal.py", "steps/escalate.py", "steps/bench.py", "steps/report.py"} <= set(STEP_MODULES)


@pytest.mark.parametrize("module", STEP_MODULES)
def test_step_modules_stay_short(module):
    assert len((PKG / module).read_text().splitlines()) <= MAX_STEP_LINES


def test_no_numeric_get_fallbacks():
    found = [f for p in sources() for f in numeric_gets(p)]
    assert [f for f in found if f not in KNOWN_NUMERIC_GET] == []


def test_exceptions_are_still_needed():
    long_now = _strip_lines([f for p in sources() for f in long_functions(p)])
    assert KNOWN_LONG - long_now == set(), "fixed: remove it from KNOWN_LONG"
    gets_now = {f for p in sources() for f in numeric_gets(p)}
    assert KNOWN_NUMERIC_GET - gets_now == set(), "fixed: remove it from KNOWN_NUMERIC_GET"


def test_the_checks_see_a_violation(tmp_path):
    """The checks can fail: a long function and numeric fallbacks in a module are caught."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    probe = tmp_path / "probe.py"
    tail = "cfg.get('timeout_s', 5) + d.get('k', -0.5) + d.get('n', None) + d.get('m', 0)"
    probe.write_text(f"def long():\n{body}\n    return {tail}\n")
    assert long_functions(probe, tmp_path) == [f"probe.py long ({MAX_FUNCTION_LINES + 2} lines)"]
    assert numeric_gets(probe, tmp_path) == ["probe.py: cfg.get('timeout_s', 5)", "probe.py: d.get('k', -0.5)"]
