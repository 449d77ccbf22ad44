"""Kept so that existing imports keep working: the many-exchanges loop is now
:mod:`gpuheal.sources.http` itself, gpuheal's one HTTP client (issue 19, item 5)."""

from gpuheal.sources.http import Ask, Exchange, run_exchanges

__all__ = ["Ask", "Exchange", "run_exchanges"]
