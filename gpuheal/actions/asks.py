"""The one store of re-benchmarks asked for (``rebench.json``, :class:`gpuheal.core.rebench.Asks`): read
and written here, by ``heal`` (a fix's ask, its disproved attempts), ``check`` (the asks the rules'
memory holds) and ``bench`` (the answers, :mod:`gpuheal.steps.rebench`).

Bad input is normal input: an unreadable file is set aside by the store; a readable one with damaged
entries is set aside too before it is first written again, with one line saying so — the asks that
could be read go on, and what could not is kept beside the state for a human, never lost.
"""

from __future__ import annotations

from gpuheal.core.rebench import Asks
from gpuheal.state import files
from gpuheal.state.store import StateDir


def load(store: StateDir) -> Asks:
    """The store's asks; its damaged entries counted (:func:`save` sets the file aside before writing)."""
    return Asks.load(store.read(files.REBENCH, {}))


def save(store: StateDir, asks: Asks, read: Asks) -> None:
    """Write ``asks`` (changed from ``read``, as loaded). A file with damaged entries is set aside
    first, with one line, so nothing of it is lost."""
    if read.dropped and (store.path / files.REBENCH).exists():
        store.set_aside(files.REBENCH, f"{read.dropped} damaged re-benchmark ask(s); the rest were kept")
    store.write(files.REBENCH, Asks(asks.asks, asks.failed).to_json())
