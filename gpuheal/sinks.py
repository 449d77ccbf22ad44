"""Which :class:`gpuheal.sink.AlertSink` a config sends through (issue 19 item 3).

:data:`SINKS` names the sink modules; the first one the config sets up is used (none set up: the
first, whose ``open_sink`` then says what is missing). A sink module provides ``configured(cfg)``,
``destination(cfg)`` (:class:`gpuheal.sink.Destination`, no credentials) and ``open_sink(cfg, post)``
(the :class:`~gpuheal.sink.AlertSink`, or :class:`~gpuheal.sink.SinkUnavailable`).

**A second sink** (Slack, Matrix, a webhook) takes four files: its module (``gpuheal/<name>.py``:
those three functions and a class satisfying :class:`~gpuheal.sink.AlertSink`); this module — its
section's record (a frozen dataclass, as :class:`ZulipConfig`) and its line in :data:`SINKS`; and its
config section in ``config/schema.json`` and ``config/defaults.yaml``. Its record is built by the
config loader into ``cfg.sections[<section>]``. The records live here, not in the sink modules: the
loader reads this module, and a sink module does IO (tests/test_import_graph.py).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpuheal.sink import AlertSink, Destination


@dataclass(frozen=True)
class ZulipConfig:
    """``zulip:`` — the Zulip sink: its server, stream and topic; the credentials come from the
    environment (``*_env``). What to send and how often is sink-neutral: :class:`AlertsConfig`."""

    site: str | None
    email_env: str
    api_key_env: str
    stream: str
    topic: str
    timeout_s: float


@dataclass(frozen=True)
class SinkKind:
    """One alert sink: its module (named: it does IO, and the config loader reads this list), its
    config section and that section's record, built by the loader into ``cfg.sections[section]``."""

    module: str
    section: str
    record: type


SINKS: tuple[SinkKind, ...] = (  # one line per sink, in order of preference
    SinkKind("gpuheal.zulip", "zulip", ZulipConfig),
)


def _chosen(cfg: Any) -> ModuleType:
    modules = [importlib.import_module(kind.module) for kind in SINKS]
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
