"""Rule 6.1's question before heal's in-run confirmation (issue 29 item 5, the chaos week's 25 s network blip):
does the host of a GPU whose ``/health`` refused or timed out answer over SSH at all? A crashed or frozen
server sits on a host that answers; a host silent as a whole is a network blip or a host down, and no restart
over SSH could arrive — that GPU is left to cron's poll holds (spec Rule 6: "if the host itself is unreachable
→ infrastructure alert").

The answers are remembered between runs (:class:`SilentLooks`, the remedy's ``state_file``): a host silent in
the previous run's look and again in the look before Rule 6's restart is lost, not blipping — no restart goes
down that dead connection and the GPU is escalated (:func:`gpuheal.rules.host_unreachable.remedy.before_step`).
One silent look is a crash whose host's SSH may have blipped at that moment: restarted as before."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuheal.config.model import Config
from gpuheal.core import timing
from gpuheal.core.confirm import GpuWatch, Seen, asks_host

log = logging.getLogger("gpuheal")
Reacher = Callable[[Config, Collection[str]], set[str]]  # the GPUs (of those given) whose host is silent


STATE_FILE = "host-looks.json"  # {HOST: {"since_s", "last_s"}}: the hosts whose latest SSH look got no answer
LOOKS_APART_S = timing.CADENCE_S  # "a cron run apart": the silence began in an earlier run than this one
LOOK_REMEMBERED_S = 2 * timing.CADENCE_S  # the previous run's look; one run missed (the lock held) still counts


@dataclass(frozen=True, slots=True)
class Silence:
    """One host's unbroken run of silent looks: the first one's and the latest one's time (epoch s)."""

    since_s: float
    last_s: float


@dataclass(frozen=True)
class SilentLooks:
    """Rule 6's memory between runs: per host, its silence so far — silent looks each at most
    :data:`LOOK_REMEMBERED_S` after the one before. A look that answered drops the host. Pure: every time
    is an argument (the run's clock, so looks of one run share it)."""

    hosts: Mapping[str, Silence] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: Any) -> SilentLooks:
        """The stored record; a damaged entry is dropped (a silence not known is no silence: restarted)."""
        out: dict[str, Silence] = {}
        for host, row in (doc if isinstance(doc, dict) else {}).items():
            since, last = (row.get(k) if isinstance(row, dict) else None for k in ("since_s", "last_s"))
            if all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in (since, last)):
                out[str(host)] = Silence(float(since), float(last))  # type: ignore[arg-type]
        return cls(out)

    def to_json(self) -> dict[str, dict[str, float]]:
        return {h: {"since_s": s.since_s, "last_s": s.last_s} for h, s in sorted(self.hosts.items())}

    def after(self, looked: Mapping[str, bool], now_s: float) -> SilentLooks:
        """The record after this run's looks (``looked``: host → silent) at ``now_s``: a silent host's silence
        goes on (or starts again, when its last silent look is too long ago or later than now); an answering
        host is dropped; a silence no look renewed within :data:`LOOK_REMEMBERED_S` is forgotten."""
        out = {h: s for h, s in self.hosts.items() if h not in looked and self._recent(s.last_s, now_s)}
        for host, silent in looked.items():
            was = self.hosts.get(host)
            if silent:
                going_on = was is not None and was.last_s <= now_s and self._recent(was.last_s, now_s)
                out[host] = Silence(was.since_s if going_on and was is not None else now_s, now_s)
        return SilentLooks(out)

    def lost(self, host: str, now_s: float) -> bool:
        """Whether a silent look of ``host`` at ``now_s`` is its second a cron run apart: its silence began
        in an earlier run (at least :data:`LOOKS_APART_S` before, counted in polls: ``core/timing``) and its
        latest silent look is recent (the previous run's, or this run's own)."""
        s = self.hosts.get(host)
        if s is None or s.last_s > now_s + timing.TOLERANCE_S:
            return False
        return timing.at_least(now_s - s.since_s, LOOKS_APART_S) and self._recent(s.last_s, now_s)

    @staticmethod
    def _recent(last_s: float, now_s: float) -> bool:
        return not timing.more_than(now_s - last_s, LOOK_REMEMBERED_S)


def ask_hosts(cfg: Config, result: Any, watches: dict[str, GpuWatch], reach: Reacher | None,
              looks: SilentLooks | None = None) -> tuple[dict[str, GpuWatch], SilentLooks]:  # fmt: skip
    """The watches after asking the hosts of those whose ``/health`` refused or timed out
    (:func:`gpuheal.core.confirm.asks_host`): a silent host's GPU is not confirmed in-run. And Rule 6's
    memory (``looks``) after these answers, at the poll's time."""
    ask = [a for a in watches if asks_host(result.obs.gpus.get(a))]
    silent = reach(cfg, ask) if reach is not None and ask else set()
    looks = looks or SilentLooks()
    if reach is not None and ask:
        looked: dict[str, bool] = {}
        for alias in ask:
            g = cfg.gpu(alias)
            if g.transport == "ssh":  # a local GPU's host is here: never asked
                looked[g.host] = looked.get(g.host, False) or alias in silent
        looks = looks.after(looked, result.obs.at.timestamp())
    for alias in sorted(silent & set(ask)):
        log.info("%s: /health %s and its host %s does not answer over SSH either: not confirmed in this run "
                 "(a network blip or the host down; cron's polls judge it)", alias, watches[alias].probes[0].answer,
                 cfg.gpu(alias).host)  # fmt: skip
    return {a: w.after(Seen.HOST_SILENT) if a in silent else w for a, w in watches.items()}, looks
