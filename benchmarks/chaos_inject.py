"""The chaos week's injector (issue 29): what goes wrong, and what merely looks as if it did, when and where.

Every incident — a **fault** or a **benign event** — is drawn per unit (a GPU, a host, a rack or the
fleet, the kind's ``scope``) per poll minute from a categorical draw whose probabilities are the
kinds' rates per unit-hour / 60, from one seeded ``random.Random``: the same seed gives the same
week, byte for byte, and every system of the benchmark lives through that same week. An incident
whose targets are already in one (or within ``SETTLE_S`` of its natural end) is not drawn: each
fault has one ground truth. Faults start early enough in the week for a healer to act within the
kind's ``budget_s`` (the rule timings of the spec: Rule 2 needs six hours of trend, Rule 4 three
benchmarks six hours apart); the last ``budget_s`` of the week only holds the kinds that fit.

Rates (per unit-hour; ``--rates FILE`` overrides any of them) and why
----------------------------------------------------------------------

The public figure with causes is Meta's Llama 3 report: 419 unexpected interruptions in 54 days on
16,384 GPUs, i.e. 2.0e-5 per GPU-hour, of which GPU 30.1 %, HBM3 17.2 % (hardware, ~47 %), software
bugs 12.9 %, network 8.4 % (switch/cable 8.4 %), host maintenance 7.6 %, dependencies and the rest.
That is a training fleet of datacenter GPUs whose software is one job; an inference fleet of
llama.cpp servers is dominated by the server's own faults, which its users report often:

- crashes: "It crashes around once a day on heavy use with cuda error" (llama.cpp#27749, an RTX 3090),
  crashes under concurrent connections (#27835), on a client that hangs up mid-request (#9928);
- freezes and wedges with ``/health`` still ok: "generation stalls mid-decode; /health OK but /slots
  hangs; needs SIGKILL" — 3 times in 2 days on two RTX 3090s (#27388); "Completions hang after CUDA
  error, but health endpoint reports all OK" (#13281); watchdogs asked for (lemonade-sdk#1789);
- VRAM that grows until OOM: "llama-server vram usage gradually increasing each run until OOM"
  (#23446, quantized KV cache);
- LiteLLM's breaker: deployments left out of rotation after they recovered, or kept in it while
  failing (BerriAI/litellm#40130 re-cooling keeps the first deadline; PR #34836: 25 consecutive 500s
  left in rotation, cooldowns enforced on a 10 s cycle); LiteLLM 1.108.7 cools a deployment for
  ``DEFAULT_COOLDOWN_TIME_SECONDS`` = 5 s after > 50 % failures (``DEFAULT_FAILURE_THRESHOLD_PERCENT``)
  or ``DEFAULT_ALLOWED_FAILS`` = 3 in a minute.

No tracker gives a rate per GPU-hour. The defaults below are therefore a **stress week**: about
2.8e-3 faults per GPU-hour all told, ~140 × Meta's rate (one fault per GPU every ~15 days; still ~15 ×
below the "once a day on heavy use" of #27749, one user's worst case), so that a 100-GPU week holds
about fifty faults and every kind appears. The *mix* follows the sources: the server's own faults
first (crash 6e-4, freeze and task-loop wedge 3.6e-4 each, leak 1.8e-4 per GPU-hour), hardware
(``crash-hardware``, a restart does not help) one crash in six, network (a host unreachable 4e-4 per
host-hour, a rack partitioned 1e-3 per rack-hour) and cooling (a rack's 1e-3 per rack-hour, one GPU's
1.8e-4) rarer, the services a few times a week (gpu-monitor down 2e-2 and answering no GPUs 1.2e-2 per
fleet-hour; a LiteLLM breaker stuck open 1.8e-4 per GPU-hour). Benign events are what a fleet does
every day: deploys (1.8e-3 per GPU-hour: one every ~23 days per GPU), long generations filling every
slot (1.2e-3), one-poll blips (2.4e-3), spikes and slow answers (6e-4 each), maintenance announced
with ``gpuheal pause`` (1e-3 per host-hour), ``n_ctx`` changes (3e-4) and wall-clock steps (2e-2 per
fleet-hour).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

HOUR_S = 3600.0
SETTLE_S = 600.0  # a target's next incident starts at least this long after the last one's natural end
GPUS_PER_HOST = 4
HOSTS_PER_RACK = 4


@dataclass(frozen=True)
class Kind:
    """One kind of incident. ``claim``: what gpuheal's catalog says it does about a fault of this kind
    (``heal``: an automatic remedy; ``escalate``: nothing safe to do, tell the humans; ``report``: an
    info recommendation, never acted on or paged); ``-`` for a benign event."""

    name: str
    fault: bool
    scope: str  # gpu | host | rack | fleet: what one draw picks
    rate_per_hour: float  # per unit of the scope
    claim: str
    duration_s: tuple[float, float]  # how long it lasts when nobody acts (uniform)
    budget_s: float = 0.0  # a healer's time to act; the fault starts at least this long before the week ends
    slot: str = "gpu"  # what it occupies: its GPUs, or the fleet's "monitor" / "clock"


H = HOUR_S
KINDS: tuple[Kind, ...] = (
    # ---- faults: the server's own (llama.cpp tracker), then hardware, network, cooling, services
    Kind("crash", True, "gpu", 6e-4, "heal", (2 * H, 8 * H), 900),
    Kind("crash-hardware", True, "gpu", 1.2e-4, "escalate", (4 * H, 12 * H), 1800),
    Kind("freeze", True, "gpu", 3.6e-4, "heal", (2 * H, 8 * H), 900),
    Kind("taskloop-hang", True, "gpu", 3.6e-4, "heal", (2 * H, 8 * H), 900),
    Kind("vram-leak", True, "gpu", 1.8e-4, "heal", (30 * H, 40 * H), 9 * H),
    Kind("vram-leak-foreign", True, "gpu", 6e-5, "escalate", (30 * H, 40 * H), 9 * H),
    Kind("overheat", True, "gpu", 1.8e-4, "heal", (1 * H, 3 * H), 1800),
    Kind("power-cap", True, "gpu", 1.2e-4, "heal", (60 * H, 96 * H), 30 * H),
    Kind("breaker-stuck", True, "gpu", 1.8e-4, "heal", (2 * H, 6 * H), 1800),
    Kind("context-perf-loss", True, "gpu", 6e-5, "report", (24 * H, 48 * H), 8 * H),
    Kind("role-drift", True, "gpu", 6e-5, "report", (6 * H, 24 * H), 3 * H),
    Kind("host-unreachable", True, "host", 4e-4, "escalate", (2 * H, 6 * H), 1800),
    Kind("rack-cooling", True, "rack", 1e-3, "escalate", (1 * H, 3 * H), 1800),
    Kind("partition", True, "rack", 1e-3, "escalate", (600, 1.5 * H), 1800),
    Kind("monitor-down", True, "fleet", 2e-2, "heal", (2 * H, 6 * H), 900, slot="monitor"),
    Kind("monitor-empty", True, "fleet", 1.2e-2, "heal", (2 * H, 6 * H), 900, slot="monitor"),
    # ---- benign: acting on one is a false action
    Kind("deploy", False, "gpu", 1.8e-3, "-", (90, 240)),
    Kind("maintenance", False, "host", 1e-3, "-", (1800, 2 * H)),
    Kind("saturated", False, "gpu", 1.2e-3, "-", (1200, 2 * H)),
    Kind("traffic-spike", False, "gpu", 6e-4, "-", (600, 3600)),
    Kind("blip", False, "gpu", 2.4e-3, "-", (25, 25)),
    Kind("slow", False, "gpu", 6e-4, "-", (1800, 2 * H)),
    Kind("nctx-change", False, "gpu", 3e-4, "-", (120, 240)),
    Kind("clock-step", False, "fleet", 2e-2, "-", (600, 2 * H), slot="clock"),
)
BY_NAME = {k.name: k for k in KINDS}


@dataclass(frozen=True)
class Incident:
    """One fault or benign event of the week: the ground truth every system is judged against."""

    id: int
    kind: str
    start_s: float
    natural_end_s: float  # when it ends if no system acts (a human notices, or it passes)
    gpus: tuple[str, ...]  # the GPUs it touches (fleet-wide: every GPU, or none for the services)
    unit: str  # the alias, host, rack or "fleet" it was drawn for
    params: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def spec(self) -> Kind:
        return BY_NAME[self.kind]

    @property
    def fault(self) -> bool:
        return self.spec.fault

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "start_s": round(self.start_s, 3),
                "natural_end_s": round(self.natural_end_s, 3), "unit": self.unit, "gpus": list(self.gpus),
                "params": self.params}


@dataclass(frozen=True)
class Layout:
    """The fleet: GPUs ``gpu-0001``…, four to a host ``node-001``…, four hosts to a rack ``rack-01``…"""

    gpus: tuple[str, ...]
    host_of: dict[str, str]
    rack_of: dict[str, str]  # host -> rack

    @classmethod
    def of(cls, n_gpus: int) -> Layout:
        gpus = tuple(f"gpu-{i + 1:04d}" for i in range(n_gpus))
        host_of = {g: f"node-{i // GPUS_PER_HOST + 1:03d}" for i, g in enumerate(gpus)}
        hosts = sorted(set(host_of.values()))
        rack_of = {h: f"rack-{i // HOSTS_PER_RACK + 1:02d}" for i, h in enumerate(hosts)}
        return cls(gpus, host_of, rack_of)

    @property
    def hosts(self) -> list[str]:
        return sorted(set(self.host_of.values()))

    @property
    def racks(self) -> list[str]:
        return sorted(set(self.rack_of.values()))

    def gpus_of_host(self, host: str) -> tuple[str, ...]:
        return tuple(g for g in self.gpus if self.host_of[g] == host)

    def gpus_of_rack(self, rack: str) -> tuple[str, ...]:
        return tuple(g for g in self.gpus if self.rack_of[self.host_of[g]] == rack)

    def rack_of_gpu(self, alias: str) -> str:
        return self.rack_of[self.host_of[alias]]


class RatesError(ValueError):
    """A rates file that cannot be used (one line)."""


def load_rates(path: str | None) -> dict[str, float]:
    """The default rates with ``path``'s (YAML or JSON ``{kind: rate per unit-hour}``) over them."""
    rates = {k.name: k.rate_per_hour for k in KINDS}
    if path is None:
        return rates
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            given = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise RatesError(f"{path}: cannot read the rates ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})") \
            from None
    if not isinstance(given, dict):
        raise RatesError(f"{path}: expected a mapping of kind -> rate per unit-hour")
    for name, rate in given.items():
        if name not in BY_NAME:
            raise RatesError(f"{path}: unknown kind {name!r} (known: {', '.join(sorted(BY_NAME))})")
        if isinstance(rate, str):  # YAML 1.1 reads `1e-3` (no dot) as text: take it as the number it says
            try:
                rate = float(rate)
            except ValueError:
                pass
        if isinstance(rate, bool) or not isinstance(rate, int | float) or rate != rate or rate in (float("inf"),):
            raise RatesError(f"{path}: {name}: the rate must be a number, not {json.dumps(rate, default=str)[:40]}")
        if rate < 0:
            raise RatesError(f"{path}: {name}: a rate cannot be negative ({rate})")
        rates[name] = float(rate)
    for scope in ("gpu", "host", "rack", "fleet"):
        per_poll = sum(rates[k.name] / 60.0 for k in KINDS if k.scope == scope)
        if per_poll > 1.0:
            raise RatesError(f"{path}: the {scope} rates sum to {per_poll:.3g} per poll; they must not pass 1")
    return rates


def _units(layout: Layout, scope: str) -> list[tuple[str, tuple[str, ...]]]:
    if scope == "gpu":
        return [(g, (g,)) for g in layout.gpus]
    if scope == "host":
        return [(h, layout.gpus_of_host(h)) for h in layout.hosts]
    if scope == "rack":
        return [(r, layout.gpus_of_rack(r)) for r in layout.racks]
    return [("fleet", ())]


def inject(layout: Layout, days: float, seed: int, rates: dict[str, float]) -> list[Incident]:
    """The week: every incident, ordered by start. Deterministic in (layout, days, seed, rates)."""
    rng = random.Random(f"chaos-inject:{seed}")
    week_s = days * 24 * HOUR_S
    minutes = int(week_s // 60)
    free_at: dict[str, float] = {}  # slot (a GPU alias, "monitor", "clock") -> when it is free again
    drawn: list[tuple[float, str, str, tuple[str, ...]]] = []
    for scope in ("fleet", "rack", "host", "gpu"):
        kinds = [k for k in KINDS if k.scope == scope and rates[k.name] > 0]
        if not kinds:
            continue
        cumulative, total = [], 0.0
        for k in kinds:
            total += rates[k.name] / 60.0
            cumulative.append((total, k))
        for unit, gpus in _units(layout, scope):
            for m in range(minutes):
                r = rng.random()
                if r >= total:
                    continue
                kind = next(k for edge, k in cumulative if r < edge)
                drawn.append((m * 60.0 + rng.uniform(0, 60), kind.name, unit, gpus))
    drawn.sort()
    out: list[Incident] = []
    for start, name, unit, gpus in drawn:
        kind = BY_NAME[name]
        if start + kind.budget_s > week_s:
            continue
        slots = gpus if kind.slot == "gpu" else (kind.slot,)
        if scope_busy(slots, free_at, start):
            continue
        duration = rng.uniform(*kind.duration_s)
        params = _params(kind, rng, layout, gpus)
        targets = tuple(params.pop("gpus", gpus))
        incident = Incident(len(out) + 1, name, start, start + duration, targets, unit, params)
        for slot in (targets if kind.slot == "gpu" else (kind.slot,)):
            free_at[slot] = incident.natural_end_s + SETTLE_S
        out.append(incident)
    return out


def scope_busy(slots: tuple[str, ...], free_at: dict[str, float], start: float) -> bool:
    return any(free_at.get(s, -1.0) > start for s in slots)


def _params(kind: Kind, rng: random.Random, layout: Layout, gpus: tuple[str, ...]) -> dict[str, Any]:
    """What varies between incidents of a kind, drawn with the week's generator."""
    n = kind.name
    if n in ("vram-leak", "vram-leak-foreign"):
        return {"mb_per_hour": round(rng.uniform(450, 1200), 1)}
    if n == "overheat":
        return {"c_per_min": round(rng.uniform(1.0, 2.5), 2), "max_c": round(rng.uniform(90, 95), 1)}
    if n == "rack-cooling":
        return {"c_per_min": round(rng.uniform(0.8, 1.5), 2), "max_c": round(rng.uniform(90, 94), 1)}
    if n == "power-cap":
        return {"ratio": round(rng.uniform(0.55, 0.7), 3)}
    if n == "partition":  # "most of a group's hosts": every host of the rack but at most one
        hosts = sorted({layout.host_of[g] for g in gpus})
        keep = max(1, (len(hosts) * 3 + 3) // 4)
        chosen = sorted(rng.sample(hosts, keep))
        return {"hosts": chosen, "gpus": [g for g in gpus if layout.host_of[g] in chosen]}
    if n in ("context-perf-loss", "nctx-change"):
        return {"n_ctx_ratio": rng.choice([0.5, 2.0]),
                "tok_ratio": round(rng.uniform(0.6, 0.75), 3) if n == "context-perf-loss" else 1.0}
    if n == "role-drift":
        return {"requests_ratio": round(rng.uniform(3.0, 5.0), 2)}
    if n == "blip":
        return {"how": rng.choice(["refused", "timeout"])}
    if n == "slow":
        return {"slow_s": round(rng.uniform(2.0, 8.0), 2)}
    if n == "clock-step":
        return {"step_s": rng.choice([-1, 1]) * round(rng.uniform(30, 600))}
    if n == "traffic-spike":
        return {"requests_ratio": round(rng.uniform(2.0, 3.0), 2)}
    return {}


def counts(incidents: list[Incident], faults: bool) -> dict[str, int]:
    """{kind: incidents of the kind} for the faults (or the benign events), every kind listed."""
    out = {k.name: 0 for k in KINDS if k.fault == faults}
    for inc in incidents:
        if inc.fault == faults:
            out[inc.kind] += 1
    return out
