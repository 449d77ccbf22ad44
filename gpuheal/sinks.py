"""The alert sinks, each declared in one place, and the one list of them (issue 19 item 3; issue 26
item 4: the same registry style as the GPU sources', :mod:`gpuheal.source_kinds`).

A sink is a :class:`SinkKind`: its name, its config section and that section's record (built by the
config loader into ``cfg.sections[section]``), whether a config sets it up, the secrets it reads
(redacted from everything gpuheal writes), and — named ``"module:function"``, not imported, since they
do IO and the config loader reads this module (tests/test_import_graph.py) — where it delivers
(``destination(cfg) -> Destination``: no credentials, with the service's length limit) and its opener
(``open_sink(cfg, post) -> AlertSink``, or :class:`~gpuheal.sink.SinkUnavailable`). :data:`SINKS` lists
them; the first one the config sets up is used (none set up: the first, whose opener then says what is
missing).

**A second sink** (Slack, Matrix, a webhook) takes: its module (``gpuheal/<name>.py``: a class satisfying
:class:`~gpuheal.sink.AlertSink`, its ``destination`` and ``open_sink``); here, its section's record (a
frozen dataclass, as :class:`ZulipConfig`) and its :class:`SinkKind` line in :data:`SINKS` — with its
secrets (a webhook URL is one); and its config section in ``config/schema.json`` and
``config/defaults.yaml``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuheal.named import resolve
from gpuheal.secret import Secret
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


def _always(section: Any) -> bool:
    return True


@dataclass(frozen=True)
class SinkKind:
    """One alert sink, declared in one place (see the module's docstring): ``configured`` is asked of
    its section's record (``None`` for a sink without a section); ``destination`` and ``opener`` are
    ``"module:function"``; ``secrets`` are what redaction removes."""

    name: str
    section: str | None
    record: type | None
    destination: str
    opener: str
    configured: Callable[[Any], bool] = _always
    secrets: tuple[Secret, ...] = ()


ZULIP = SinkKind(
    "Zulip", "zulip", ZulipConfig, "gpuheal.zulip:destination", "gpuheal.zulip:open_sink",
    configured=lambda section: bool(section is not None and section.site),
    secrets=(Secret(field="api_key_env", env="ZULIP_API_KEY"),),
)

SINKS: tuple[SinkKind, ...] = (ZULIP,)  # THE REGISTRY: one line per sink, in order of preference


def chosen(cfg: Any) -> SinkKind:
    """The sink a config sends through: the first it sets up, else the first registered."""
    sections = getattr(cfg, "sections", {}) or {}
    return next((k for k in SINKS if k.configured(sections.get(k.section) if k.section else None)), SINKS[0])


def destination(cfg: Any) -> Destination:
    """Where the configured sink delivers, and how it fits content (no credentials needed)."""
    found: Destination = resolve(chosen(cfg).destination)(cfg)
    return found


def open_sink(cfg: Any, post: Any = None) -> AlertSink:
    """The configured sink, or :class:`gpuheal.sink.SinkUnavailable` (not configured, no credentials).
    ``post`` replaces the HTTP transport in tests."""
    sink: AlertSink = resolve(chosen(cfg).opener)(cfg, post)
    return sink
