"""Layers that only point down (issue 10, item 3), read from the source with ``ast`` (milliseconds).

- the pure layers — ``core/``, ``rules/``, ``parse/`` and ``config/model.py`` — import nothing
  that does IO (network, processes, files through the state directory, the clock) and nothing
  of the layers above them (steps, the executor, sources, transports, state, zulip);
- no import cycle between gpuheal's packages (``gpuheal.core`` → ``gpuheal.actions`` →
  ``gpuheal.core`` would be one), counting imports inside functions too;
- no module imports another module's ``_private`` name.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "gpuheal"

PURE = ["gpuheal/core", "gpuheal/rules", "gpuheal/parse", "gpuheal/config/model.py", "gpuheal/source_kinds"]
IO_MODULES = (
    "socket",
    "subprocess",
    "http",
    "urllib",
    "requests",
    "time",
    "shutil",
    "fcntl",
    "select",
    "ssl",
    "paramiko",
    "fabric",
    "invoke",
    "threading",
    "concurrent",
)
ABOVE = (
    "gpuheal.steps",
    "gpuheal.actions",
    "gpuheal.sources",
    "gpuheal.transport",
    "gpuheal.state",
    "gpuheal.zulip",
    "gpuheal.cli",
    "gpuheal.runtime",
    "gpuheal.config",
    "gpuheal.kg",
    "gpuheal.metrics",
    "gpuheal.render",
    "gpuheal.sim",
)
BELOW = ("gpuheal.config.model",)  # the pure half of config (dataclasses), under ABOVE's "gpuheal.config"


def model_names() -> set[str]:
    """What ``gpuheal.config`` re-exports from its pure ``model`` (importing the package loads only it)."""
    tree = ast.parse((PKG / "config" / "model.py").read_text())
    return {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)} | {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
    }

# Known exceptions being removed by work in flight elsewhere (issue 10, item 3). Each must still
# exist — test_exceptions_are_still_needed fails once one is fixed, so this list only shrinks.
KNOWN_UPWARD: set[str] = set()
KNOWN_PRIVATE: set[str] = set()
KNOWN_CYCLES: set[str] = set()


def module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def imports(path: Path, root: Path = ROOT) -> list[tuple[str, list[str]]]:
    """(module, names) of every import in ``path``, relative imports resolved."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path, root).split(".")
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((from_module(node, here, is_pkg), [a.name for a in node.names]))
    return out


def from_module(node: ast.ImportFrom, here: list[str], is_pkg: bool) -> str:
    """The module a ``from ... import`` names, a relative one resolved against ``here``."""
    base = node.module or ""
    if node.level:
        anchor = here if is_pkg else here[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def files(target: str) -> list[Path]:
    path = ROOT / target
    return [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("target", PURE)
def test_pure_layers_do_no_io_and_import_nothing_above_them(target):
    if not (ROOT / target).exists():
        pytest.skip(f"{target} does not exist yet")
    assert [bad for path in files(target) for bad in upward(path) if bad not in KNOWN_UPWARD] == []


def upward(path: Path, root: Path = ROOT) -> list[str]:
    out = []
    for name, names in imports(path, root):
        if name == "gpuheal.config" and names and set(names) <= model_names():
            name, names = "gpuheal.config.model", names
        full = [name, *(f"{name}.{n}" for n in names)]
        if under(name, IO_MODULES) or any(under(f, ABOVE) and not under(f, BELOW) for f in full):
            out.append(f"{path.relative_to(root)}: {name} {names or ''}".strip())
    return out


def package_of(module: str) -> str:
    """gpuheal.core.plan -> gpuheal.core; gpuheal.kg -> gpuheal.kg (a top-level module is its own)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_no_import_cycle_between_gpuheal_packages():
    graph = package_graph()
    assert [c for c in find_cycles(graph) if c not in KNOWN_CYCLES] == []


def package_graph() -> dict[str, set[str]]:
    modules = all_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        src = package_of(name)
        for target, names in imports(path):
            for cand in (target, *(f"{target}.{n}" for n in names)):
                if cand in modules and package_of(cand) != src and cand.startswith("gpuheal."):
                    graph.setdefault(src, set()).add(package_of(cand))
    return graph


def test_exceptions_are_still_needed():
    upward_now = {bad for target in PURE if (ROOT / target).exists() for p in files(target) for bad in upward(p)}
    assert KNOWN_UPWARD - upward_now == set(), "fixed: remove it from KNOWN_UPWARD"
    assert KNOWN_CYCLES - set(find_cycles(package_graph())) == set(), "fixed: remove it from KNOWN_CYCLES"
    private_now = {bad for name, path in all_modules().items() for bad in private_imports(name, path)}
    assert KNOWN_PRIVATE - private_now == set(), "fixed: remove it from KNOWN_PRIVATE"


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every elementary cycle once, starting from its smallest node."""
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == trail[0]:
                cycles.append(" -> ".join([*trail, nxt]))
            elif nxt not in trail and nxt > trail[0]:
                visit(nxt, [*trail, nxt])

    for start in sorted(graph):
        visit(start, [start])
    return cycles


def test_no_module_imports_another_modules_private_names():
    found = [bad for name, path in all_modules().items() for bad in private_imports(name, path)]
    assert [bad for bad in found if bad not in KNOWN_PRIVATE] == []


def private_imports(name: str, path: Path, root: Path = ROOT) -> list[str]:
    out = []
    package = name.rsplit(".", 1)[0]
    for target, names in imports(path, root):
        if not target.startswith("gpuheal") or target == name or target == package:
            continue  # a package's own private modules (rules/_util.py) are its business
        # a sibling private module (rules/_util.py) shares its names with its package; a sibling
        # public module (sim/smi.py) does not share its private ones (sim.rocm_smi <- sim.smi._pick)
        own = target.rsplit(".", 1)[0] == package and _private(target.rsplit(".", 1)[-1])
        hidden = [n for n in names if _private(n) and not own]
        hidden += [p for p in target.split(".")[1:] if _private(p) and not own]
        if hidden:
            out.append(f"{name}: from {target} import {', '.join(hidden)}")
    out += [f"{name}: {target}.{attr}" for target, attr in private_attributes(path, root) if target != name]
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_attributes(path: Path, root: Path = ROOT) -> list[tuple[str, str]]:
    """(module, name) for each ``alias._name`` read where ``alias`` is an imported gpuheal module
    (``la._num`` after ``from gpuheal.sources import litellm_admin as la``)."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path, root).split(".")
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname})
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, here, path.name == "__init__.py")
            aliases.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names})
    modules = {module_name(p, root) for p in (root / "gpuheal").rglob("*.py")}
    return [
        (aliases[node.value.id], node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr)
        and aliases.get(node.value.id) in modules
    ]


def test_the_layer_checks_see_a_violation(tmp_path):
    """The checks above can fail: a module importing upward, privately and in a cycle is caught."""
    bad = tmp_path / "gpuheal" / "core" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from gpuheal.steps.check import _config_rows\nimport subprocess\nfrom . import plan\n")
    assert len(upward(bad, tmp_path)) == 2
    assert private_imports("gpuheal.core.bad", bad, tmp_path) == [
        "gpuheal.core.bad: from gpuheal.steps.check import _config_rows"
    ]
    sibling = tmp_path / "gpuheal" / "core" / "other.py"
    sibling.write_text("from gpuheal.core.plan import _pick\nfrom gpuheal.core import _util\n")
    (tmp_path / "gpuheal" / "core" / "plan.py").write_text("x = 1\n")
    reader = tmp_path / "gpuheal" / "core" / "reader.py"
    reader.write_text("from gpuheal.core import plan as p\n\nprint(p._num(1), p.x)\n")
    assert private_imports("gpuheal.core.other", sibling, tmp_path) == [
        "gpuheal.core.other: from gpuheal.core.plan import _pick"
    ]
    assert private_imports("gpuheal.core.reader", reader, tmp_path) == ["gpuheal.core.reader: gpuheal.core.plan._num"]
    assert ("gpuheal.core", ["plan"]) in imports(bad, tmp_path)
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a -> b -> c -> a"]


# --------------------------------------------------------------------------- cron's start-up path

# What `check` loads before it can act: the entry point, the CLI and every module it imports at module level (issue 19,
# "Performance": cron starts gpuheal every minute, and the check/sweep ratio is <= 2.5). These never
# load at module level on that path; each is imported inside the function that needs it:
# PyYAML (a config text not yet in the state directory's parse cache, config/parsed.py), jsonschema
# (a text not yet validated), h11 (the HTTP framing's test oracle only), the SSH stack (an action),
# rich (the human table), ssl (an https URL), prometheus_client's public package (its parser is loaded
# privately, parse/llama_metrics.py).
CHECK_ENTRY = (
    "gpuheal.entry", "gpuheal.command", "gpuheal.cli", "gpuheal.runtime", "gpuheal.config.load", "gpuheal.state.store", "gpuheal.steps.check",
    "gpuheal.steps.evaluate", "gpuheal.sources.sense", "gpuheal.sources.gpu_source", "gpuheal.core.engine",
    "gpuheal.core.coverage", "gpuheal.rules", "gpuheal.render.jsontext",
)
NOT_AT_START = (
    "yaml", "jsonschema", "h11", "fabric", "paramiko", "invoke", "requests", "rich", "ssl", "prometheus_client",
    "http.client", "email", "urllib.request", "asyncio", "hashlib",
)


def module_level_imports(path: Path, root: Path = ROOT) -> list[str]:
    """The modules ``path`` imports when it is itself imported: not inside a function, nor under
    ``if TYPE_CHECKING:`` (relative imports resolved; ``from a import b`` gives ``a`` and ``a.b``)."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path, root).split(".")
    is_pkg = path.name == "__init__.py"
    out: list[str] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                out.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = from_module(node, here, is_pkg)
                out.append(base)
                out.extend(f"{base}.{a.name}" for a in node.names)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list) and not isinstance(node, ast.ImportFrom):
                    visit(inner)

    visit(tree.body)
    return out


def start_up_imports(entry: tuple[str, ...], root: Path = ROOT) -> dict[str, str]:
    """Every module loaded at module level from ``entry``, following gpuheal's own modules (and each
    package's ``__init__``): {module: the gpuheal module that imports it}."""
    modules = {module_name(p, root): p for p in (root / "gpuheal").rglob("*.py")}
    seen: dict[str, str] = {}
    todo = [(name, "(entry)") for name in entry]
    while todo:
        name, by = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            prefix = ".".join(parts[:i])
            if prefix in seen:
                continue
            seen[prefix] = by
            if prefix in modules:
                todo += [(target, prefix) for target in module_level_imports(modules[prefix], root)]
    return seen


def test_check_loads_no_heavy_module_at_start_up():
    loaded = start_up_imports(CHECK_ENTRY)
    heavy = {f"{name} (imported by {by})" for name, by in loaded.items() if under(name, NOT_AT_START)}
    assert heavy == set()


def test_the_start_up_walk_sees_a_heavy_import(tmp_path):
    """It can fail: a module-level import reached through a package and a relative import is found;
    one inside a function or under TYPE_CHECKING is not."""
    pkg = tmp_path / "gpuheal"
    (pkg / "steps").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "steps" / "__init__.py").write_text("from . import helper\n")
    (pkg / "steps" / "helper.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import jsonschema\n"
        "try:\n    import yaml\nexcept ImportError:\n    yaml = None\n"
        "def later():\n    import h11\n"
    )
    (pkg / "steps" / "check.py").write_text("import json\n")
    loaded = start_up_imports(("gpuheal.steps.check",), tmp_path)
    assert loaded["yaml"] == "gpuheal.steps.helper" and "json" in loaded
    assert "jsonschema" not in loaded and "h11" not in loaded
