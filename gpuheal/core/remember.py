"""What a rule declares it remembers between runs: one memory's key, the loader of its typed rows and
its pure fold over the fleet this poll. Pure.

The store of the rows (:class:`~gpuheal.core.memory.Memory`) sits below the fleet view, which carries
it; a declaration sits above both, since its fold reads the view (:class:`~gpuheal.core.view.FleetView`).
The engine folds each declared memory once per poll (:func:`gpuheal.core.engine.remember`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic

from gpuheal.core.memory import R
from gpuheal.core.view import FleetView


@dataclass(frozen=True)
class Remember(Generic[R]):
    """One memory a rule keeps per subject (a GPU alias, or ``fleet`` for a fleet rule).

    ``key``: its name in the issue book (unique among the rules: the registry checks it);
    ``load``: the stored JSON → the row record, ``None`` when damaged;
    ``fold(row, view, subject)``: the row after this poll (``view.now_s``, ``view.sample(subject)``),
    or ``None`` when this poll cannot say (the row stays). Pure: values in, values out."""

    key: str
    load: Callable[[object], R | None]
    fold: Callable[[R | None, FleetView, str], R | None]
