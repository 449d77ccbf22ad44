"""The drill's bookkeeping (benchmarks/drill.py, issues 20 and 28): what one run recorded, the
per-server figures worked out from it, and the median and worst over several runs.

Pure: values in, values out (the recorded probes, heal polls, supervisor restarts and audit records);
``tests/test_drill_report.py`` checks it with hand-made records.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

FAULTS = {"hang": "SIGSTOP", "frozen": "ptrace task loop", "kill": "SIGKILL", "slow-load": "SIGKILL, 40 s load",
          "busy": "none (saturated)", "control-1": "none", "control-2": "none"}
FAULTED = ("hang", "frozen", "kill", "slow-load")
QUIET = ("busy", "control-1", "control-2")
TWIN = "-twin"  # with --litellm: each faulted server's healthy twin in its model group
SLOW_S = 5.0  # a served request through LiteLLM slower than this waited on a sick deployment (healthy: < 1 s)


def servers(litellm: bool) -> list[str]:
    """Every server of the fleet, in table order: the faulted, their twins (with LiteLLM), the quiet."""
    return [*FAULTED, *([n + TWIN for n in FAULTED] if litellm else []), *QUIET]


def fault_of(name: str) -> str:
    return FAULTS.get(name, "none (twin)")


def quiet(name: str) -> bool:
    """Servers that must see 0 actions: the busy one, the controls, the twins."""
    return name not in FAULTED


def group_of(name: str) -> str:
    """The LiteLLM model group a server is in: a twin shares its faulted server's."""
    return "drill-" + name.removesuffix(TWIN)


@dataclass
class Run:
    """Everything the drill records while it runs (times are seconds since the drill's t0)."""

    t0: float
    probes: list[dict] = field(default_factory=list)
    cycles: list[dict] = field(default_factory=list)
    faults: dict[str, float] = field(default_factory=dict)
    load: list[tuple[float, float]] = field(default_factory=list)  # (t, 1-minute load average)
    busy_done: int = 0
    end: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def rel(self, t: float | None = None) -> float:
        return round((time.time() if t is None else t) - self.t0, 2)


def first_cycle(cycles: list[dict], gpu: str, *, fired: bool) -> int | None:
    """The first cycle whose poll saw an issue on ``gpu``: any, or one past pending (firing, verifying...)."""
    for rec in sorted(cycles, key=lambda r: r["cycle"]):
        if any(i["gpu"] == gpu and (not fired or i["state"] != "pending") for i in rec["issues"] or ()):
            return rec["cycle"]
    return None


def direct_figures(probes: list[dict], fault_t: float | None) -> dict:
    """MTTR (fault -> the first good completion sent after it) and the failed requests before it,
    from the client probes sent straight to the server."""
    after = [p for p in probes if fault_t is not None and p["sent"] >= fault_t]
    first_ok = next((p for p in sorted(after, key=lambda p: p["sent"]) if p["ok"]), None)
    return {
        "mttr_s": round(first_ok["done"] - fault_t, 1) if first_ok and fault_t is not None else None,
        "failed_after_fault": sum(not p["ok"] for p in after if first_ok is None or p["sent"] < first_ok["sent"]),
        "probes_ok": sum(p["ok"] for p in probes), "probes": len(probes),
    }


def proxy_figures(probes: list[dict], fault_t: float | None) -> dict:
    """What LiteLLM's users of the server's model group saw: every failed request through the proxy
    from the fault to the end of the run (a twin serves some, a restart does not end a cooldown), or
    over the whole run for a group with no fault."""
    counted = [p for p in probes if fault_t is None or p["sent"] >= fault_t]
    return {"proxy_failed": sum(not p["ok"] for p in counted), "proxy_probes": len(counted),
            "proxy_slow": sum(p["ok"] and p["done"] - p["sent"] > SLOW_S for p in counted),
            "proxy_errors": sorted({p["error"] for p in counted if not p["ok"]})}


def summarize(run: Run, restarts: dict[str, list[dict]], audit: list[dict], names: list[str] | None = None) -> dict:
    """Per server: detection cycles, restarts, MTTR, failed requests (direct and through LiteLLM),
    and the action intents gpuheal's audit trail records on it."""
    per: dict[str, dict] = {}
    for name in names or list(FAULTS):
        fault_t = run.faults.get(name)
        direct = [p for p in run.probes if p["server"] == name and p.get("via", "direct") == "direct"]
        actions = [a for a in audit if a.get("gpu") == name and a.get("phase") == "intent"]
        per[name] = {
            "fault": fault_of(name), "injected_s": fault_t,
            "pending_cycle": first_cycle(run.cycles, name, fired=False),
            "fired_cycle": first_cycle(run.cycles, name, fired=True),
            "restarts": [{**r, "t": run.rel(r["t"])} for r in restarts.get(name, [])],
            **direct_figures(direct, fault_t),
            "actions": [{"action": a.get("action"), "issue": a.get("issue"), "ts": a.get("ts")} for a in actions],
        }
        if not name.endswith(TWIN):
            via_proxy = [p for p in run.probes if p["server"] == name and p.get("via") == "proxy"]
            if via_proxy:
                per[name].update(proxy_figures(via_proxy, fault_t))
    return per


def load_figures(samples: list[tuple[float, float]]) -> dict:
    """The 1-minute load average over the run, sampled: first, max, mean."""
    vals = [v for _, v in samples]
    if not vals:
        return {"first_1m": None, "max_1m": None, "mean_1m": None, "samples": 0}
    return {"first_1m": vals[0], "max_1m": max(vals), "mean_1m": round(sum(vals) / len(vals), 2),
            "samples": len(vals)}


# ---------------------------------------------------------------------------------- over several runs
def median_worst(values: list[float | int | None]) -> dict:
    """Median and worst of one figure over the runs; ``None`` (never healed) is the worst of all, and
    a median that falls on it is ``None`` too."""
    key = sorted(values, key=lambda v: float("inf") if v is None else v)
    n = len(key)
    if n == 0:
        return {"median": None, "worst": None, "runs": []}
    if n % 2:
        median = key[n // 2]
    else:
        lo, hi = key[n // 2 - 1], key[n // 2]
        median = None if lo is None or hi is None else round((lo + hi) / 2, 2)
    return {"median": median, "worst": key[-1], "runs": list(values)}


def aggregate(runs: list[dict]) -> dict:
    """Per server over the runs: MTTR, failed requests (direct, through LiteLLM), actions — each with
    its median, worst and per-run values; and the actions on quiet servers per run (target: 0)."""
    names = list(runs[0]["servers"]) if runs else []
    per: dict[str, dict] = {}
    for name in names:
        rows = [r["servers"][name] for r in runs]
        per[name] = {
            "fault": rows[0]["fault"],
            "mttr_s": median_worst([s["mttr_s"] for s in rows]),
            "failed_after_fault": median_worst([s["failed_after_fault"] for s in rows]),
            "actions": [len(s["actions"]) for s in rows],
        }
        if all("proxy_failed" in s for s in rows):
            per[name]["proxy_failed"] = median_worst([s["proxy_failed"] for s in rows])
            per[name]["proxy_slow"] = median_worst([s["proxy_slow"] for s in rows])
    false_actions = [sum(len(s["actions"]) for n, s in r["servers"].items() if quiet(n)) for r in runs]
    return {"servers": per, "quiet_actions_per_run": false_actions,
            "load_max_1m_per_run": [r.get("load", {}).get("max_1m") for r in runs]}


# ---------------------------------------------------------------------------------- stdout
def table(result: dict) -> str:
    """One run: a row per server."""
    proxy = any("proxy_failed" in s for s in result["servers"].values())
    woken = "cron and wake" if result.get("wake") else "cron only"
    rows = [f"drill: {result['mode']}, {result['cycles']} cycles every {result['cadence_s']} s ({woken}"
            f"{', a real LiteLLM in front' if result.get('litellm') else ''}"
            f"{' (drain first)' if result.get('drain_first') else ''}), faults before cycle "
            f"{result['fault_cycle']}, stop timeout {result['stop_timeout_s']} s, restart kill signal "
            f"{result.get('restart_kill_signal', 'TERM')}",
            f"{'server':15} {'fault':18} {'inject s':>8} {'pend':>4} {'fire':>4} {'restarts (t s, stop)':24} "
            f"{'MTTR s':>7} {'failed':>6} {'ok/probes':>9} {'actions':>7}"
            + (" via LiteLLM failed/sent (slow)" if proxy else "")]
    for name, s in result["servers"].items():
        rs = ", ".join(f"{r['t']:.0f} {r['stop']}" for r in s["restarts"]) or "-"
        via = f" {s['proxy_failed']:>4}/{s['proxy_probes']} ({s['proxy_slow']})" if "proxy_failed" in s else ""
        rows.append(f"{name:15} {s['fault']:18} {_f(s['injected_s']):>8} {_f(s['pending_cycle']):>4} "
                    f"{_f(s['fired_cycle']):>4} {rs:24} {_f(s['mttr_s']):>7} {s['failed_after_fault']:>6} "
                    f"{s['probes_ok']:>4}/{s['probes']:<4} {len(s['actions']):>7}" + via)
    load = result.get("load") or {}
    if load.get("samples"):
        rows.append(f"load average (1 min) during the run: first {load['first_1m']}, mean {load['mean_1m']}, "
                    f"max {load['max_1m']} on {result.get('machine', {}).get('cpus', '?')} CPUs")
    return "\n".join(rows)


def summary_table(summary: dict, n_runs: int) -> str:
    """Over the runs: median / worst per figure, then the per-run values."""
    proxy = any("proxy_failed" in s for s in summary["servers"].values())
    head = (f"{'server':15} {'fault':18} {'MTTR s med/worst':>17} {'failed med/worst':>17}"
            + (f" {'via LiteLLM med/worst':>22} {'slow med/worst':>15}" if proxy else "")
            + "  per run: MTTR s | failed | actions")
    rows = [f"over {n_runs} run(s): median / worst (never healed = never; slow = served through LiteLLM after "
            f"more than {SLOW_S:g} s)", head]
    for name, s in summary["servers"].items():
        mt, fl = s["mttr_s"], s["failed_after_fault"]
        cells = f"{'-' if quiet(name) else _mw(mt):>17} {_mw(fl):>17}"
        if proxy:
            cells += (f" {_mw(s['proxy_failed']):>22} {_mw(s['proxy_slow']):>15}" if "proxy_failed" in s
                      else f" {'-':>22} {'-':>15}")
        runs = "-" if quiet(name) else " ".join(_never(v) for v in mt["runs"])
        rows.append(f"{name:15} {s['fault']:18} {cells}  {runs} | {' '.join(map(str, fl['runs']))} | "
                    f"{' '.join(map(str, s['actions']))}")
    rows.append(f"actions on the busy server, the controls and the twins, per run: "
                f"{' '.join(map(str, summary['quiet_actions_per_run']))} (target 0)")
    return "\n".join(rows)


def _mw(fig: dict) -> str:
    return f"{_never(fig['median'])} / {_never(fig['worst'])}"


def _never(v: object) -> str:
    return "never" if v is None else str(v)


def _f(v: object) -> str:
    return "-" if v is None else str(v)
