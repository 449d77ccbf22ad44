"""``GET {litellm.url}/spend/logs/v2``: the requests LiteLLM routed over Rule 10's window, one row each
(issue 22, item 6: "track per-GPU request distribution via LiteLLM spend logs").

What the real proxy (1.108.7) does, and therefore what this module does:

* the route needs the admin (master) key and LiteLLM's database; without one it answers
  ``401 {"error": {"message": "Prisma Client is not initialized", ...}}`` (``/spend/logs``: ``500
  "Database not connected"``) — that is :data:`NO_DATABASE`, a configuration fact (``doctor`` says it
  once; Rule 10 reads LiteLLM's counters or gpu-monitor instead), not a fault of every poll;
* ``start_date`` / ``end_date`` as ``YYYY-MM-DD HH:MM:SS`` (UTC), ``page`` from 1, ``page_size`` at most
  1000; sorted by ``startTime`` ascending so that rows written while we page only ever join the end.

Every page is read under one deadline for the whole window and a byte cap; more than ``max_rows`` rows
in the window is ``oversized`` ("not known": a partial count would misstate the shares). The key goes
in the ``Authorization`` header only and never into a detail.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlencode

from gpuheal.model import DataFault
from gpuheal.parse.litellm_spend import InvalidSpendLogs, SpendPage, SpendRow, parse_spend_page
from gpuheal.sources.http import HttpFault, printable, request

PAGE_SIZE = 1000  # the proxy's maximum
MAX_PAGE_BYTES = 16 << 20  # a row may carry the request's messages when the proxy stores prompts
NO_DATABASE = "no-database"
NO_DATABASE_HINT = "spend logs need LiteLLM's database"
_NO_DB_WORDS = ("Prisma Client is not initialized", "Database not connected", "No DB Connected", "no connected db")


@dataclass(frozen=True)
class SpendLogs:
    """Every row of the window ``[start_s, end_s]``, and what the pages held that was not readable."""

    rows: tuple[SpendRow, ...]
    start_s: float
    end_s: float
    pages: int
    problems: tuple[str, ...] = ()


def stamp(epoch_s: float, up: bool) -> str:
    """The proxy's date format, to the second: the window's start rounded down, its end up."""
    whole = math.ceil(epoch_s) if up else math.floor(epoch_s)
    return datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%d %H:%M:%S")


def fetch_spend(url: str, admin_key: str | None, start_s: float, end_s: float, *, deadline_s: float,
                max_rows: int) -> SpendLogs | DataFault:
    """The window's rows, or the fault that says why they are not known (``kind`` :data:`NO_DATABASE`
    when the proxy has no database)."""
    if not admin_key:
        return DataFault("litellm", "http-401", "GET /spend/logs/v2: no admin key (litellm.admin_key_env)")
    started = time.monotonic()
    rows: list[SpendRow] = []
    problems: list[str] = []
    page = 1
    while True:
        left = deadline_s - (time.monotonic() - started)
        if left <= 0.05:
            return DataFault("litellm", "timeout", f"GET /spend/logs/v2: page {page} not read within {deadline_s:g} s")
        got = _page(url, admin_key, start_s, end_s, page, left)
        if isinstance(got, DataFault):
            return got
        rows.extend(got.rows)
        problems.extend(got.problems)
        if len(rows) > max_rows:
            return DataFault("litellm", "oversized", f"GET /spend/logs/v2: more than {max_rows} requests in the window"
                             " (litellm.spend_logs_max_rows): not known")
        if not got.rows or len(got.rows) < PAGE_SIZE or (got.total_pages is not None and page >= got.total_pages):
            return SpendLogs(tuple(rows), start_s, end_s, page, tuple(dict.fromkeys(problems))[:10])
        page += 1


def _page(url: str, key: str, start_s: float, end_s: float, page: int, deadline_s: float) -> SpendPage | DataFault:
    query = urlencode({"start_date": stamp(start_s, False), "end_date": stamp(end_s, True), "page": page,
                       "page_size": PAGE_SIZE, "sort_by": "startTime", "sort_order": "asc"})
    where = f"GET /spend/logs/v2 (page {page})"
    result = request("GET", f"{url.rstrip('/')}/spend/logs/v2?{query}", deadline_s=deadline_s,
                     max_bytes=MAX_PAGE_BYTES, headers={"Authorization": f"Bearer {key}"})
    if isinstance(result, HttpFault):
        return DataFault("litellm", result.kind, f"{where}: {result.detail}")
    body = result.body[:4000].decode("utf-8", "replace")
    if result.status != 200:
        if any(w.lower() in body.lower() for w in _NO_DB_WORDS):
            return DataFault("litellm", NO_DATABASE, f"{where}: HTTP {result.status}: {NO_DATABASE_HINT}")
        status = result.status
        return DataFault("litellm", f"http-{status:03d}", f"{where}: HTTP {status} {printable(body, 120)}")
    try:
        return parse_spend_page(json.loads(result.body))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, InvalidSpendLogs
        reason = str(exc) if isinstance(exc, InvalidSpendLogs) else "not JSON"
        return DataFault("litellm", "invalid", f"{where}: {reason}")
