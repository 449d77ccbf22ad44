"""Which :class:`gpuheal.sink.AlertSink` a config sends through (issue 19 item 3): Zulip today; a
second sink is one more branch here."""

from __future__ import annotations

from gpuheal.sink import AlertSink


def open_sink(cfg, post=None) -> AlertSink:
    """The configured sink, or :class:`gpuheal.sink.SinkUnavailable` (not configured, no credentials).
    ``post`` replaces the HTTP transport in tests."""
    from gpuheal import zulip

    return zulip.ZulipSink.from_config(cfg, post)
