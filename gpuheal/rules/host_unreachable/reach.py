"""Rule 6.1's question before heal's in-run confirmation (issue 29 item 5, the chaos week's 25 s network blip):
does the host of a GPU whose ``/health`` refused or timed out answer over SSH at all? A crashed or frozen
server sits on a host that answers; a host silent as a whole is a network blip or a host down, and no restart
over SSH could arrive — that GPU is left to cron's poll holds (spec Rule 6: "if the host itself is unreachable
→ infrastructure alert")."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

from gpuheal.config.model import Config
from gpuheal.core.confirm import GpuWatch, Seen, asks_host

log = logging.getLogger("gpuheal")
Reacher = Callable[[Config, Collection[str]], set[str]]  # the GPUs (of those given) whose host is silent


def ask_hosts(cfg: Config, result: Any, watches: dict[str, GpuWatch], reach: Reacher | None) -> dict[str, GpuWatch]:
    """The watches after asking the hosts of those whose ``/health`` refused or timed out
    (:func:`gpuheal.core.confirm.asks_host`): a silent host's GPU is not confirmed in-run."""
    ask = [a for a in watches if asks_host(result.obs.gpus.get(a))]
    silent = reach(cfg, ask) if reach is not None and ask else set()
    for alias in sorted(silent & set(ask)):
        log.info("%s: /health %s and its host %s does not answer over SSH either: not confirmed in this run "
                 "(a network blip or the host down; cron's polls judge it)", alias, watches[alias].probes[0].answer,
                 cfg.gpu(alias).host)  # fmt: skip
    return {a: w.after(Seen.HOST_SILENT) if a in silent else w for a, w in watches.items()}
