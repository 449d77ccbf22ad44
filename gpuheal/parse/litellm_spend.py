"""LiteLLM's spend logs (``GET /spend/logs/v2``) → one typed row per request. Pure (issue 22, item 6).

Rule 10 says "track per-GPU request distribution via LiteLLM spend logs". The rows are LiteLLM's
``LiteLLM_SpendLogs`` table (its ``schema.prisma`` in 1.108.7): ``model_id`` (the deployment's
``model_info.id``), ``model_group`` (the public model name), ``api_base``, ``request_tags`` (a JSON
list), ``prompt_tokens`` and ``startTime``. ``/spend/logs/v2`` answers one page::

    {"data": [ROW, ...], "total": 1234, "page": 1, "page_size": 1000, "total_pages": 2, "total_is_capped": false}

and the older ``/spend/logs`` a bare list. A field that is missing or of the wrong type is "not known"
for that row (and counted once in ``problems``); a row that is not an object is skipped and counted.
Nothing here raises for what the proxy sends except :class:`InvalidSpendLogs` for a page that is not
a list or a ``data`` object at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpuheal.parse.values import Bad, check_number, check_text, check_time

MAX_TAGS = 64  # tags kept per row; a row with more is judged on the first ones
MAX_TAG_CHARS = 100


class InvalidSpendLogs(ValueError):
    """Not a spend-logs page (neither a list of rows nor ``{"data": [...]}``)."""


@dataclass(frozen=True)
class SpendRow:
    """One request as the spend logs record it; ``None`` = not known for this row."""

    model_id: str | None
    model_group: str | None
    api_base: str | None
    request_tags: tuple[str, ...] | None
    prompt_tokens: int | None
    start_s: float | None


@dataclass(frozen=True)
class SpendPage:
    """One page: its rows, ``total_pages`` when the proxy said (v2), and what was skipped or unreadable."""

    rows: tuple[SpendRow, ...]
    total_pages: int | None
    problems: tuple[str, ...] = ()


def parse_spend_page(doc: Any) -> SpendPage:
    """A decoded JSON page → :class:`SpendPage`."""
    if isinstance(doc, list):
        data, pages = doc, None
    elif isinstance(doc, dict) and isinstance(doc.get("data"), list):
        data = doc["data"]
        n = check_number(doc.get("total_pages"), lo=0, hi=10**7, integer=True)
        pages = None if n is None or isinstance(n, Bad) else int(n)
    else:
        raise InvalidSpendLogs("not a spend-logs page: expected a list of rows or {\"data\": [...]}")
    problems: dict[str, int] = {}
    rows = []
    for raw in data:
        if not isinstance(raw, dict):
            problems["a row that is not an object"] = problems.get("a row that is not an object", 0) + 1
            continue
        rows.append(_row(raw, problems))
    return SpendPage(tuple(rows), pages, tuple(f"{what}: {n} row{'s' if n != 1 else ''}"
                                                for what, n in list(problems.items())[:10]))


def _row(raw: dict[str, Any], problems: dict[str, int]) -> SpendRow:
    def text(key: str) -> str | None:
        value = check_text(raw.get(key))
        if isinstance(value, Bad):
            _count(problems, f"{key} {value.reason}")
            return None
        return value

    tokens = check_number(raw.get("prompt_tokens"), lo=0, hi=10**9, integer=True)
    if isinstance(tokens, Bad):
        _count(problems, f"prompt_tokens {tokens.reason}")
        tokens = None
    started = check_time(raw.get("startTime"))
    if isinstance(started, Bad):
        _count(problems, f"startTime {started.reason}")
        started = None
    return SpendRow(text("model_id"), text("model_group"), text("api_base"), _tags(raw.get("request_tags"), problems),
                    None if tokens is None else int(tokens), None if started is None else started.timestamp())


def _tags(raw: Any, problems: dict[str, int]) -> tuple[str, ...] | None:
    """``request_tags``: a JSON list of strings; the database's ``Json`` column may also come back as
    the list's JSON text. Absent → not known; ``[]`` → known to carry no tag."""
    if raw is None:
        return None
    if isinstance(raw, str) and len(raw) <= MAX_TAGS * (MAX_TAG_CHARS + 4):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            raw = None
    if not isinstance(raw, list):
        _count(problems, "request_tags is not a list")
        return None
    tags = tuple(t[:MAX_TAG_CHARS] for t in raw[:MAX_TAGS] if isinstance(t, str))
    if len(tags) != min(len(raw), MAX_TAGS):
        _count(problems, "request_tags holds something that is not a string")
    return tags


def _count(problems: dict[str, int], what: str) -> None:
    problems[what] = problems.get(what, 0) + 1
