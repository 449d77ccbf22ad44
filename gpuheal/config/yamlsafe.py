"""YAML for configuration files: safe tags only, no duplicate keys, bounded aliases (issue 9, point 4).

PyYAML's ``SafeLoader`` builds no objects, but it silently keeps the *last* of two equal keys (a
typo'd second ``temp_c`` wins) and expands aliases without limit: a "billion laughs" document of
nine nested aliases is a few hundred bytes and 10^9 values once walked — ``config validate``
hung past 20 s and ended in ``MemoryError`` inside jsonschema. Here the composed node graph is
checked *before* anything is constructed, in one pass over its distinct nodes:

* a mapping with the same key twice is an error naming the key path and both lines;
* the size of the document once aliases are expanded is computed without expanding it (each
  distinct node's size is counted once and reused); above :data:`MAX_EXPANDED_NODES` it is refused;
* an alias that refers to a node containing it (a cycle) is refused;
* nesting deeper than :data:`MAX_DEPTH` is refused;
* a number longer than :data:`MAX_NUMBER_CHARS` is refused (PyYAML's ``int()`` of 5,000 digits
  raises ``ValueError``), and any scalar its resolver typed but cannot build (a date
  ``2001-13-45``) is a config error, not an internal one.

Each refusal is a :class:`ConfigError` with the key path, raised in well under a second.
"""

from __future__ import annotations

from typing import Any

from gpuheal.errors import ConfigError

MAX_EXPANDED_NODES = 200_000  # a 1,000-GPU fleet config is ~40,000 nodes
MAX_DEPTH = 64
MERGE_TAG = "tag:yaml.org,2002:merge"
NUMBER_TAGS = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})
MAX_NUMBER_CHARS = 64  # int() refuses more than 4,300 digits, and is slow well before


def load_yaml(text: str, source: str) -> Any:
    """Parse ``text`` (from ``source``, for messages) into plain data, or raise :class:`ConfigError`.

    A document that is JSON (YAML's flow style; what a generated fleet config usually is) takes the
    JSON parser: a 10,000-GPU config parses in ~20 ms instead of ~2.5 s of PyYAML (issue 13's
    benchmark). JSON has no aliases; a repeated key is refused as in YAML."""
    if text.lstrip().startswith("{"):
        data = _load_json(text, source)
        if data is not _NOT_JSON:
            return data
    import yaml

    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_cls(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_nodes(node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{source}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{source}: YAML nested too deeply (more than {MAX_DEPTH} levels)") from None
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - PyYAML's constructors raise anything on typed scalars
        # a date 2001-13-45 (ValueError), "!!timestamp x" (AttributeError), "!!int x" (ValueError)
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:120]
        raise ConfigError(f"{source}: a YAML value cannot be read ({detail})") from None
    finally:
        loader.dispose()


_NOT_JSON = object()


def _load_json(text: str, source: str) -> Any:
    import json

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ConfigError(f"{source}: the key {key!r} appears twice in one mapping")
            out[key] = value
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except ValueError:  # not JSON after all (a YAML flow mapping): PyYAML reads it
        return _NOT_JSON
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply (more than {MAX_DEPTH} levels)") from None


def check_nodes(root: Any) -> None:
    """Duplicate keys, alias cycles, depth and expanded size of a composed YAML node graph."""
    from yaml.nodes import MappingNode, SequenceNode

    sizes: dict[int, int] = {}  # id(node) -> expanded size, for nodes fully walked
    open_nodes: set[int] = set()  # on the current path (an alias back to one of them is a cycle)
    # iterative post-order walk: (node, key path, depth, children done?)
    stack: list[tuple[Any, str, int, bool]] = [(root, "", 0, False)]
    while stack:
        node, path, depth, done = stack.pop()
        nid = id(node)
        if done:
            open_nodes.discard(nid)
            sizes[nid] = 1 + sum(sizes[id(child)] for child, _ in _children(node, path))
            if sizes[nid] > MAX_EXPANDED_NODES:
                raise ConfigError(
                    f"the document expands to more than {MAX_EXPANDED_NODES:,} values through YAML aliases "
                    "(a 'billion laughs' document?); write the values out",
                    path or "(top level)",
                )
            continue
        if nid in sizes:
            continue  # an alias to a node already measured
        if nid in open_nodes:
            raise ConfigError("a YAML alias refers to a node that contains it (a cycle)", path or "(top level)")
        if depth > MAX_DEPTH:
            raise ConfigError(f"nested more than {MAX_DEPTH} levels deep", path or "(top level)")
        if not isinstance(node, MappingNode | SequenceNode):
            if node.tag in NUMBER_TAGS and len(node.value) > MAX_NUMBER_CHARS:
                raise ConfigError(f"a number of {len(node.value)} characters is not a setting", path or "(top level)")
            sizes[nid] = 1
            continue
        if isinstance(node, MappingNode):
            _check_duplicate_keys(node, path)
        open_nodes.add(nid)
        stack.append((node, path, depth, True))
        for child, child_path in _children(node, path):
            stack.append((child, child_path, depth + 1, False))


def _children(node: Any, path: str) -> list[tuple[Any, str]]:
    from yaml.nodes import MappingNode, ScalarNode, SequenceNode

    if isinstance(node, SequenceNode):
        return [(child, f"{path}[{i}]") for i, child in enumerate(node.value)]
    if isinstance(node, MappingNode):
        out = []
        for key, value in node.value:
            name = key.value if isinstance(key, ScalarNode) else "?"
            out.append((key, path))
            out.append((value, f"{path}.{name}" if path else str(name)))
        return out
    return []


def _check_duplicate_keys(node: Any, path: str) -> None:
    from yaml.nodes import ScalarNode

    seen: dict[tuple[str, str], int] = {}
    for key, _ in node.value:
        if not isinstance(key, ScalarNode) or key.tag == MERGE_TAG:
            continue  # a merge key ("<<") may repeat; complex keys are refused later by the schema
        ident = (key.tag, key.value)
        line = key.start_mark.line + 1
        if ident in seen:
            where = f"{path}.{key.value}" if path else str(key.value)
            raise ConfigError(f"duplicate key (lines {seen[ident]} and {line}); the second would silently win", where)
        seen[ident] = line
