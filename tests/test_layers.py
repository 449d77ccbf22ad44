"""Issue 10, point 3, for the config and parse layers: the pure modules import no IO, and
credentials are one module that ``config`` and ``zulip`` both use (neither imports the other).
Read from the source with ``ast``: milliseconds."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "gpuheal"
IO = ("requests", "socket", "subprocess", "fabric", "http", "urllib", "os", "pathlib", "shutil",
      "gpuheal.sources", "gpuheal.state", "gpuheal.transport", "gpuheal.zulip", "gpuheal.steps",
      "gpuheal.actions.execute", "gpuheal.config.load", "gpuheal.credentials")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _offenders(path: Path, banned: tuple[str, ...]) -> list[str]:
    return [f"{path.name}: {n}" for n in sorted(_imports(path)) if any(n == b or n.startswith(b + ".") for b in banned)]


@pytest.mark.parametrize("module", ["config/model.py", *(f"parse/{p.name}" for p in (ROOT / "parse").glob("*.py"))])
def test_pure_modules_import_no_io(module):
    assert _offenders(ROOT / module, IO) == []


def test_config_and_zulip_share_the_credentials_module_and_not_each_other():
    load = _imports(ROOT / "config" / "load.py")
    zulip = _imports(ROOT / "zulip.py")
    assert "gpuheal.credentials" in load and "gpuheal.credentials" in zulip
    assert not any(n.startswith("gpuheal.zulip") or n.startswith("gpuheal.sources") for n in load)
    assert _offenders(ROOT / "credentials.py", ("gpuheal.zulip", "gpuheal.sources", "gpuheal.config", "http")) == []


def test_importing_the_config_package_loads_only_the_model():
    code = ("import sys, gpuheal.config; from gpuheal.config import Config; "
            "print(sorted(m for m in sys.modules if m.startswith('gpuheal')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['gpuheal', 'gpuheal.config', 'gpuheal.config.model']"


@pytest.mark.parametrize("package", ["core", "rules", "parse"])
def test_pure_packages_reach_config_only_through_the_model(package):
    """core/, rules/ and parse/ get the config as values: never the loader, .env or credentials."""
    banned = ("gpuheal.config.load", "gpuheal.credentials", "gpuheal.zulip")
    offenders = [o for path in sorted((ROOT / package).rglob("*.py")) for o in _offenders(path, banned)]
    assert offenders == []
