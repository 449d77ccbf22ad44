"""One bounded memo, for answers that a key alone decides (stdlib only, no IO at import).

The sources remember what a URL or an answer's head parses to, and the simulated fleet what a request's bytes
ask for: a poll sends the same few to every server every minute (issue 29). Each memo is a plain dict that is
emptied when it holds ``most`` entries, so its memory stays bounded whatever a peer sends.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)


def remembered(memo: dict[K, Any], key: K, make: Callable[[K], Any], most: int) -> Any:
    """``make(key)``, kept in ``memo`` (emptied first when it holds ``most``); a remembered ``None`` counts."""
    got = memo.get(key, memo)
    if got is memo:
        if len(memo) >= most:
            memo.clear()
        got = memo[key] = make(key)
    return got
