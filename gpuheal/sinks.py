"""Which :class:`gpuheal.sink.AlertSink` a config sends through (issue 19 item 3).

:data:`SINKS` names the sink modules; the first one the config sets up is used (none set up: the
first, whose ``open_sink`` then says what is missing). A sink module provides ``configured(cfg)``,
``destination(cfg)`` (:class:`gpuheal.sink.Destination`, no credentials) and ``open_sink(cfg, post)``
(the :class:`~gpuheal.sink.AlertSink`, or :class:`~gpuheal.sink.SinkUnavailable`).

**A second sink** (Slack, Matrix, a webhook) takes: its module (``gpuheal/<name>.py``: those three
functions and a class satisfying :class:`~gpuheal.sink.AlertSink`), its line in :data:`SINKS`, and its
config section in ``config/schema.json`` and ``config/defaults.yaml`` — plus, today, its section's
record in ``config/model.py`` and one line in ``config/load.py`` (``zulip:`` is a fixed field of the
config; sinks do not yet declare their sections as GPU sources do in :mod:`gpuheal.source_kinds`).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from gpuheal.sink import AlertSink, Destination

SINKS = ("gpuheal.zulip",)  # one line per sink module, in order of preference


def _chosen(cfg: Any) -> ModuleType:
    modules = [importlib.import_module(name) for name in SINKS]
    return next((m for m in modules if m.configured(cfg)), modules[0])


def destination(cfg: Any) -> Destination:
    """Where the configured sink delivers and how it fits content (no credentials needed)."""
    found: Destination = _chosen(cfg).destination(cfg)
    return found


def open_sink(cfg: Any, post: Any = None) -> AlertSink:
    """The configured sink, or :class:`gpuheal.sink.SinkUnavailable` (not configured, no credentials).
    ``post`` replaces the HTTP transport in tests."""
    sink: AlertSink = _chosen(cfg).open_sink(cfg, post)
    return sink
