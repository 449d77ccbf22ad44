"""A function named ``"module:function"`` — how a pure declaration names the IO it goes with without
importing it (a GPU source's reader, doctor checks and memory; a sink's destination and opener), and
how a module reaches one that imports it (the Prometheus source asking the rule registry how the rules
read their trends): an import either way would be a cycle (tests/test_import_graph.py)."""

from __future__ import annotations

import importlib
from typing import Any


def resolve(name: str) -> Any:
    """``"module:function"`` → the function (or any module attribute)."""
    module, attr = name.split(":")
    return getattr(importlib.import_module(module), attr)
