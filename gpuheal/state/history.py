"""Recorded per-poll samples, bounded: the memory the rules and trends read.

Per alias, columns (``t`` in epoch seconds, then one list per metric, ``None`` = not known).
Samples younger than ``raw_hours`` (≥ 6.5 h: Rule 2 fits a 6 h window) are kept per poll; older
ones are averaged into ``coarse_bucket_s`` buckets kept ``coarse_days`` (the weekly report), then
dropped — so the state directory stops growing (issue 2). Pure: no IO here; ``StateDir`` stores
the dict from :meth:`History.to_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuheal.model import Observation

METRICS = ("temp_c", "vram_used_mb", "util_pct", "power_w")
COLUMNS = ("t", *METRICS, "endpoint")


def _empty() -> dict[str, list[Any]]:
    return {c: [] for c in COLUMNS}


@dataclass
class History:
    raw: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    coarse: dict[str, dict[str, list[Any]]] = field(default_factory=dict)

    # ------------------------------------------------------------------ (de)serialise
    @classmethod
    def from_dict(cls, data: Any) -> History:
        """Tolerant: a malformed alias block is dropped, never raised (state must not crash a run)."""
        hist = cls()
        if not isinstance(data, dict):
            return hist
        for attr in ("raw", "coarse"):
            block = data.get(attr)
            if not isinstance(block, dict):
                continue
            target = getattr(hist, attr)
            for alias, cols in block.items():
                if _valid_columns(cols):
                    target[alias] = {c: list(cols[c]) for c in COLUMNS}
        return hist

    def to_dict(self) -> dict[str, Any]:
        return {"raw": self.raw, "coarse": self.coarse}

    # ------------------------------------------------------------------ update
    def add(self, obs: Observation, aliases: tuple[str, ...] | None = None) -> None:
        """Append one poll; out-of-order or duplicate times (a clock step back) are ignored."""
        t = obs.at.timestamp()
        for alias, sample in obs.gpus.items():
            cols = self.raw.setdefault(alias, _empty())
            if cols["t"] and t <= cols["t"][-1]:
                continue
            cols["t"].append(round(t, 3))
            for metric in METRICS:
                cols[metric].append(getattr(sample, metric))
            cols["endpoint"].append(sample.endpoint)
        if aliases is not None:  # a GPU removed from the config: forget it
            for block in (self.raw, self.coarse):
                for alias in list(block):
                    if alias not in aliases:
                        del block[alias]

    def compact(self, now_s: float, raw_hours: float, bucket_s: int, coarse_days: float) -> None:
        """Move samples older than ``raw_hours`` into coarse buckets; drop what is too old."""
        raw_cut = now_s - raw_hours * 3600
        coarse_cut = now_s - coarse_days * 86400
        for alias, cols in self.raw.items():
            ts = cols["t"]
            n_old = 0
            while n_old < len(ts) and ts[n_old] < raw_cut:
                n_old += 1
            if n_old:
                old = {c: cols[c][:n_old] for c in COLUMNS}
                for c in COLUMNS:
                    del cols[c][:n_old]
                self._fold(alias, old, bucket_s)
        for cols in self.coarse.values():
            ts = cols["t"]
            n_old = 0
            while n_old < len(ts) and ts[n_old] < coarse_cut:
                n_old += 1
            if n_old:
                for c in COLUMNS:
                    del cols[c][:n_old]
        for block in (self.raw, self.coarse):
            for alias in [a for a, cols in block.items() if not cols["t"]]:
                del block[alias]

    def _fold(self, alias: str, old: dict[str, list[Any]], bucket_s: int) -> None:
        target = self.coarse.setdefault(alias, _empty())
        buckets: dict[float, list[int]] = {}
        for i, t in enumerate(old["t"]):
            buckets.setdefault(t - t % bucket_s, []).append(i)
        for start in sorted(buckets):
            idx = buckets[start]
            if target["t"] and start <= target["t"][-1]:
                continue  # already folded (or clock skew): never duplicate a bucket
            target["t"].append(start)
            for metric in METRICS:
                vals = [old[metric][i] for i in idx if old[metric][i] is not None]
                target[metric].append(round(sum(vals) / len(vals), 2) if vals else None)
            states = [old["endpoint"][i] for i in idx]
            target["endpoint"].append("ok" if states and all(s == "ok" for s in states) else states[-1])

    # ------------------------------------------------------------------ queries
    def series(self, alias: str, metric: str, since_s: float | None = None, coarse: bool = False) -> list[tuple[float, float]]:
        """(t, value) pairs with known values, oldest first; ``coarse`` prepends the old buckets."""
        out: list[tuple[float, float]] = []
        blocks = [self.coarse.get(alias), self.raw.get(alias)] if coarse else [self.raw.get(alias)]
        for cols in blocks:
            if not cols:
                continue
            for t, v in zip(cols["t"], cols[metric], strict=False):
                if v is not None and (since_s is None or t >= since_s):
                    out.append((t, v))
        return out

    def sample_count(self) -> int:
        return sum(len(c["t"]) for c in self.raw.values()) + sum(len(c["t"]) for c in self.coarse.values())


def _valid_columns(cols: Any) -> bool:
    if not isinstance(cols, dict) or not all(isinstance(cols.get(c), list) for c in COLUMNS):
        return False
    n = len(cols["t"])
    return all(len(cols[c]) == n for c in COLUMNS) and all(isinstance(t, int | float) for t in cols["t"])
