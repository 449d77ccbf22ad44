"""The README's "Configuration reference" and what gpuheal accepts cannot drift (issue 27 item 18).

Every key the reference documents is set, alone, to the value its row gives (the "e.g." value when
there is one, else the default) in a one-GPU config, and ``gpuheal config validate`` must accept it;
every key the schema (``config/schema.json``) and the rule parameters (``config/defaults.yaml`` plus
the engine's common ones) accept must have its row; a documented default must be the one
``defaults.yaml`` holds. A failure names each key and says what to write.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuheal.config.model import ENGINE_PARAMS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SCHEMA = ROOT / "gpuheal" / "config" / "schema.json"
DEFAULTS = ROOT / "gpuheal" / "config" / "defaults.yaml"
SECTION = "## Configuration reference"
ROW_HINT = ("add a row to README.md's \"Configuration reference\" (the table of its section): "
            "| `{key}` | `DEFAULT` or none (e.g. `EXAMPLE`) | unit | what it does | spec rule |")
BASE_GPU = {"alias": "gpu-a", "host": "h1", "endpoint": "http://127.0.0.1:8080"}
EXAMPLE = re.compile(r"e\.g\.\s*`([^`]*)`")
FIRST_CODE = re.compile(r"`([^`]*)`")
# keys that only make sense with another key set (what their row says)
TOGETHER: dict[str, dict[str, Any]] = {"prometheus.labels.match": {"gpus[].prometheus_match": "GPU-5f1a"}}


# --------------------------------------------------------------------------- what the README documents


def reference_rows(text: str) -> dict[str, tuple[str, str]]:
    """``{key: (default cell, whole row)}`` of every table row in the reference section whose first
    cell is one backticked key path."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    rows: dict[str, tuple[str, str]] = {}
    for line in text[start:end if end > 0 else None].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) < 5:
            continue
        key = cells[0].strip("`")
        assert key not in rows, f"README reference documents `{key}` twice"
        rows[key] = (cells[1], line)
    return rows


def row_value(key: str, cell: str) -> tuple[bool, Any]:
    """(found, the value to validate with): the cell's "e.g." value, else its first backticked one."""
    m = EXAMPLE.search(cell) or FIRST_CODE.search(cell)
    if m is None:
        return False, None
    return True, yaml.safe_load(m.group(1)) if m.group(1) else ""


def documented_default(cell: str) -> tuple[bool, Any]:
    """(stated, value): the default a cell states — its leading backticked value, or ``none``."""
    if cell.startswith("none") or cell.startswith("required"):
        return True, None
    m = re.match(r"`([^`]*)`", cell)
    return (True, yaml.safe_load(m.group(1)) if m.group(1) else "") if m else (False, None)


# --------------------------------------------------------------------------- what gpuheal accepts


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    return node


def schema_keys() -> set[str]:
    """Every key path the schema accepts: ``section.key``, ``gpus[].key``, an object form's keys
    (``gpus[].role.name``), the free maps as themselves (``gpus[].labels``, ``gpus[].rules``), and
    ``rules.<id>.<param>`` for each rule parameter ``defaults.yaml`` and the engine accept."""
    schema = json.loads(SCHEMA.read_text("utf-8"))
    defs = schema["$defs"]
    out: set[str] = set()

    def walk(node: dict[str, Any], path: str) -> None:
        node = _resolve(node, defs)
        if path == "rules":
            return
        props = node.get("properties")
        if props is not None:
            for k, v in props.items():
                walk(v, f"{path}.{k}" if path else k)
            return
        items = node.get("items")
        if node.get("type") == "array" and isinstance(items, dict) and "properties" in _resolve(items, defs):
            for k, v in _resolve(items, defs)["properties"].items():
                walk(v, f"{path}[].{k}")
            return
        out.add(path)
        for branch in node.get("oneOf", []):
            for k, v in (branch.get("properties") or {}).items():
                walk(v, f"{path}.{k}")

    walk(schema, "")
    rules = yaml.safe_load(DEFAULTS.read_text("utf-8"))["rules"]
    for rid, params in rules.items():
        for p in {**ENGINE_PARAMS, **(params or {})}:
            out.add(f"rules.{rid}.{p}")
    return out


def defaults_value(key: str) -> tuple[bool, Any]:
    """(in defaults.yaml, its value) for a key path; ``rules.*.P``: the engine's common default."""
    if key.startswith("rules.*."):
        name = key.split(".", 2)[2]
        return name in ENGINE_PARAMS, ENGINE_PARAMS.get(name)
    node: Any = yaml.safe_load(DEFAULTS.read_text("utf-8"))
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def config_with(key: str, value: Any, required: dict[str, Any] | None = None) -> dict[str, Any]:
    """A one-GPU config with ``key`` set to ``value`` (``rules.*.P``: for every rule id), after the
    ``required`` keys (rows whose default is "required") of its section, e.g. ``prometheus.url``."""
    cfg: dict[str, Any] = {"gpus": [dict(BASE_GPU)]}
    section = key.split(".", 1)[0]
    for other, v in (required or {}).items():
        if other != key and other.split(".", 1)[0] == section:
            cfg = _set(cfg, other, v)
    for other, v in TOGETHER.get(key, {}).items():
        cfg = _set(cfg, other, v)
    return _set(cfg, key, value)


def _set(cfg: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    if key.startswith("rules."):
        _, rid, param = key.split(".", 2)
        ids = yaml.safe_load(DEFAULTS.read_text("utf-8"))["rules"] if rid == "*" else [rid]
        cfg["rules"] = {r: {param: value} for r in ids}
        return cfg
    if key.startswith("gpus[]."):
        target, parts = cfg["gpus"][0], key[len("gpus[]."):].split(".")
    else:
        target, parts = cfg, key.split(".")
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value
    return cfg


# --------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def rows() -> dict[str, tuple[str, str]]:
    return reference_rows(README.read_text("utf-8"))


def test_every_key_gpuheal_accepts_is_documented(rows):
    documented = set(rows)
    missing = []
    for key in sorted(schema_keys()):
        if key in documented:
            continue
        if key.startswith("rules.") and f"rules.*.{key.split('.', 2)[2]}" in documented:
            continue
        missing.append(key)
    assert not missing, "undocumented config keys:\n" + "\n".join(
        f"  {k}: {ROW_HINT.format(key=k)}" for k in missing
    )


def test_every_documented_key_is_one_gpuheal_accepts(rows):
    accepted = schema_keys()
    params = {k.split(".", 2)[2] for k in accepted if k.startswith("rules.")}
    stale = [k for k in rows if k not in accepted and not (k.startswith("rules.*.") and k.split(".", 2)[2] in params)]
    assert not stale, f"README documents keys gpuheal does not accept (remove or rename their rows): {stale}"


def test_documented_defaults_are_the_real_ones(rows):
    wrong = []
    for key, (cell, _) in sorted(rows.items()):
        has, real = defaults_value(key)
        stated, said = documented_default(cell)
        if has and not isinstance(real, dict) and (not stated or said != real):
            wrong.append(f"  {key}: README says {cell!r}, config/defaults.yaml has {real!r}")
    assert not wrong, "README reference defaults that are not gpuheal's:\n" + "\n".join(wrong)


def test_config_validate_accepts_every_documented_key(rows, tmp_path, capsys, monkeypatch):
    """``gpuheal config validate`` itself (the CLI's code, in-process) on one file per key. Typer's
    command tree is built once (60 ms a build), not per file."""
    from functools import cache

    import typer

    from gpuheal import cli

    monkeypatch.setattr(typer.main, "get_command", cache(typer.main.get_command))

    required = {k: row_value(k, cell)[1] for k, (cell, _) in rows.items() if cell.startswith("required")}
    refused = []
    for i, (key, (cell, _)) in enumerate(sorted(rows.items())):
        found, value = row_value(key, cell)
        if not found:
            refused.append(f"  {key}: its row gives no value to validate (write `DEFAULT` or none (e.g. `EXAMPLE`))")
            continue
        path = tmp_path / f"k{i}.yaml"
        path.write_text(yaml.safe_dump(config_with(key, value, required)), "utf-8")
        with pytest.raises(SystemExit) as ended:
            cli.main(["config", "validate", str(path), "--json"])
        out, err = capsys.readouterr()
        if ended.value.code != 0 or '"valid": true' not in out:
            refused.append(f"  {key}: {value!r} -> exit {ended.value.code}: {err.strip() or out.strip()}")
    assert not refused, "README reference keys `gpuheal config validate` refuses:\n" + "\n".join(refused)


def test_the_checks_can_fail(tmp_path):
    """The drift checks above are not vacuous: a reference missing a key, stating a wrong default or
    giving a value the schema refuses is caught, with the key named."""
    text = README.read_text("utf-8")
    rows = reference_rows(text)
    assert len(rows) > 150 and "monitor.timeout_s" in rows
    cut = reference_rows(text.replace(rows["alerts.group_by"][1] + "\n", ""))
    assert "alerts.group_by" not in cut and "alerts.group_by" in schema_keys()
    assert documented_default("`7`") == (True, 7) and defaults_value("monitor.timeout_s") == (True, 5)
    from gpuheal.config import load_config_dict
    from gpuheal.errors import ConfigError

    with pytest.raises(ConfigError, match="heal.redirect_rpm"):
        load_config_dict(config_with("heal.redirect_rpm", "many"))
    with pytest.raises(ConfigError, match="temp_cc"):
        load_config_dict(config_with("rules.thermal-critical.temp_cc", 90))
