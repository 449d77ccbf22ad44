#!/usr/bin/env python3
"""10,000 GPUs behind a real Prometheus (issue 13 "Benchmark"): figures, not timed tests.

Starts on 127.0.0.1: the dcgm-exporter look-alike (``gpuheal/sim/dcgm.py``) serving N GPUs (5
series each; VRAM of every 100th GPU ramps, so ``deriv`` has work), Debian's ``prometheus``
scraping it every ``--scrape-s`` seconds (own port, config and TSDB in a temp dir), and one port
answering every GPU's llama-server ``/health``. Then runs the installed ``gpuheal check --json`` as
cron would (a fresh process, ``GPUHEAL_NOW`` moving on):

  prometheus-N     wall time and peak RSS, median of 5 after one warm-up run
  state-6.5h       the state directory's size after runs spread over 6.5 simulated hours
  --history-h H    Prometheus first holds H hours of the trend series (VRAM used, temperature),
                   written with ``promtool tsdb create-blocks-from openmetrics`` one sample every
                   ``--history-step-s``: what Rule 2's 6-hour ``deriv`` reads once the fleet has run
                   that long (without it Prometheus holds the minute of the warm-up)
  --hot N          the first N GPUs at 72-74 °C, above Rule 8's threshold: their rise is asked each
                   poll (by host name up to 100, fleet-wide past that); without it the fleet runs cool
  --recorded-vram  with --history-h: Rule 2's trend over the recording rule the README gives for
                   large fleets (a 5-minute average of VRAM used, recorded every 5 minutes;
                   ``prometheus.queries.vram_series``) instead of every raw sample
  monitor-N        the same fleet through gpu-monitor (one document of N GPUs, 6.5 h of
                   per-minute history in the state directory, as benchmarks/run.py builds it),
                   median of ``--monitor-runs``, for the ratio

    .venv/bin/python benchmarks/prometheus.py                 # 10,000 GPUs
    .venv/bin/python benchmarks/prometheus.py --gpus 1000 --monitor-runs 3
    .venv/bin/python benchmarks/prometheus.py --history-h 6.5 --monitor-runs 0   # 3.2 GB of text, ~2 min
    .venv/bin/python benchmarks/prometheus.py --history-h 6.5 --recorded-vram --monitor-runs 0

Prints JSON; ``--update`` also writes it to the tracked ``benchmarks/results/prometheus-latest.json``
(``--out PATH`` anywhere else), so a plain run leaves the tree clean.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from prom import PrometheusServer  # noqa: E402
from run import (  # noqa: E402
    START,
    clean_env,
    framing_argv,
    make_history,
    profile_check,
    run_figures,
    run_with_rss,
    stamp,
    write_state_file,
)

LATEST = ROOT / "benchmarks" / "results" / "prometheus-latest.json"  # tracked: rewritten only with --update

from servers import HEALTH_OK, LoopbackServer, Reply, gpu_entry, gpuheal_argv, json_reply, write_config  # noqa: E402

from gpuheal.sim.dcgm import METRICS, uuid_of  # noqa: E402

TARGETS = {"wall_s": 3.0, "rss_mb": 250.0, "state_mb": 5.0}
# the README's recording rule for large fleets: Rule 2's deriv reads one point per 5 minutes
RECORDED_VRAM = ("gpuheal:vram_used_mb:avg5m", "avg_over_time(DCGM_FI_DEV_FB_USED[5m])", 300.0)


class FleetText:
    """The exposition of N GPUs, built fast: label strings once, values per scrape."""

    def __init__(self, n: int, with_up: bool = False, hot: int = 0):
        self.n = n
        self.with_up = with_up
        self.hot = hot  # the first ``hot`` GPUs run at 72-74 °C: above Rule 8's 70 °C, so their rise is asked
        self.labels = [
            f'gpu="0",UUID="{uuid_of(h, 0)}",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="{h}"'
            for h in (host(i) for i in range(n))
        ]
        self.t0 = time.time()

    def __call__(self) -> str:
        dt = time.time() - self.t0
        out = []
        for reading, metric, help_text, _ in METRICS:
            out.append(f"# HELP {metric} {help_text}\n# TYPE {metric} gauge\n")
            if reading == "temp_c":
                out.extend(f"{metric}{{{lb}}} {self.temp_c(i)}\n" for i, lb in enumerate(self.labels))
            elif reading == "vram_used_mb":
                ramp = int(dt * 2)
                out.extend(
                    f"{metric}{{{lb}}} {10000 + (ramp if i % 100 == 0 else 0)}\n" for i, lb in enumerate(self.labels)
                )
            elif reading == "vram_free_mb":
                out.extend(f"{metric}{{{lb}}} {70000}\n" for lb in self.labels)
            elif reading == "util_pct":
                out.extend(f"{metric}{{{lb}}} {40 + i % 50}\n" for i, lb in enumerate(self.labels))
            else:
                out.extend(f"{metric}{{{lb}}} {180 + i % 90}.000000\n" for i, lb in enumerate(self.labels))
        if self.with_up:
            # stands in for the `up` of N llama-server scrape targets (N targets cannot be scraped
            # on this machine): one series per GPU keyed by instance, as Prometheus's own `up`
            out.append("# TYPE bench_llama_up gauge\n")
            out.extend(f'bench_llama_up{{instance="{endpoint_netloc(i)}",job="llama"}} 1\n' for i in range(self.n))
        return "".join(out)

    def temp_c(self, i: int) -> int:
        return 72 + i % 3 if i < self.hot else 55 + i % 10


def endpoint_netloc(i: int) -> str:
    return f"127.0.0.{1 + i // 50000}:{10000 + i % 50000}"


def host(i: int) -> str:
    return f"node{i:05d}"


def alias(i: int) -> str:
    return f"gpu-{i:05d}"


def dir_size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def file_sizes(path: Path) -> dict[str, int]:
    """Bytes of each file under ``path``, largest first."""
    sizes = {str(p.relative_to(path)): p.stat().st_size for p in path.rglob("*") if p.is_file()}
    return dict(sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])))


def health_server():
    def health(req):
        return HEALTH_OK if req.path.endswith("/health") else Reply(404, "")

    return LoopbackServer(default=health, record=False, backlog=4096)


def timed_checks(base: list[str], runs: int, first_minute: int, framings: tuple[str, ...] = ()) -> dict:
    """One warm-up, then ``runs`` checks (minute by minute); with ``framings`` (issue 19 item 5),
    each check once per HTTP/1.1 framing in turn, so that every framing meets the same load and the
    same Prometheus. The top-level figures are the first framing's; ``next_minute`` is the next free."""
    tail = base[len(gpuheal_argv()):]
    argvs = {f: [*framing_argv(f), *tail] for f in framings} or {"": base}
    cold = {}
    for f, argv in argvs.items():
        rc, cold_wall, cold_rss, _, err = run_with_rss(argv, clean_env(GPUHEAL_NOW=stamp(first_minute)))
        if rc not in (0, 1, 2):
            raise SystemExit(f"check failed ({rc}):\n{err}")
        cold[f] = cold_wall
    measured: dict[str, list[tuple[float, float, float]]] = {f: [] for f in argvs}
    minute = first_minute + 1
    for _ in range(runs):
        for f, argv in argvs.items():
            rc, wall, peak, cpu, err = run_with_rss(argv, clean_env(GPUHEAL_NOW=stamp(minute)))
            minute += 1
            if rc not in (0, 1, 2):
                raise SystemExit(f"check failed ({rc}):\n{err}")
            measured[f].append((wall, peak, cpu))
    by_framing = {f: {**{k: round(v, 3) for k, v in run_figures(m).items()}, "first_run_s": round(cold[f], 3)}
                  for f, m in measured.items()}
    out = {**next(iter(by_framing.values())), "runs": runs, "next_minute": minute}
    if framings:
        out["framings"] = by_framing
    return out


def backfill(text: FleetText, tsdb: Path, target: str, hours: float, step_s: float, recorded: bool = False) -> dict:
    """``hours`` of the trend series up to now, as the exporter's scrape labels them (its ``instance``,
    job ``dcgm``), so the live scrape continues the same series: VRAM used flat, temperature flat;
    with ``recorded``, also the recording rule's series, one point per its interval."""
    import subprocess

    end = int(time.time() - 2 * step_s)
    times = range(end - int(hours * 3600), end, max(1, int(step_s)))
    source = tsdb.parent / "history.om"
    started = time.monotonic()
    with open(source, "w") as out:
        for reading, metric, _, _ in METRICS:
            if reading not in ("vram_used_mb", "temp_c"):
                continue
            out.write(f"# TYPE {metric} gauge\n")
            for i, lb in enumerate(text.labels):
                value = 10000 if reading == "vram_used_mb" else text.temp_c(i)
                head = f'{metric}{{{lb},instance="{target}",job="dcgm"}} {value} '
                out.write("".join(f"{head}{t}\n" for t in times))
        if recorded:
            record, _, every_s = RECORDED_VRAM
            out.write(f"# TYPE {record.replace(':', '_')} gauge\n")
            for lb in text.labels:
                head = f'{record}{{{lb},instance="{target}",job="dcgm"}} 10000 '
                out.write("".join(f"{head}{t}\n" for t in range(times.start, end, int(every_s))))
        out.write("# EOF\n")
    size_mb = source.stat().st_size / 1e6
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
                   check=True, capture_output=True, timeout=1800)
    source.unlink()
    return {"hours": hours, "step_s": step_s, "samples": 2 * len(text.labels) * len(times),
            "openmetrics_mb": round(size_mb), "backfill_s": round(time.monotonic() - started, 1)}


def bench_prometheus(
    n: int, runs: int, scrape_s: float, work: Path, profile: bool = False, probe: bool = False,
    history: tuple[float, float] = (0.0, 0.0), recorded: bool = False, hot: int = 0, framings: tuple[str, ...] = (),
) -> dict:
    """``probe``: every GPU's llama-server /health probed directly (one port, a path per GPU);
    else (``probe_endpoints: false``) its liveness is one more instant query of N series.
    ``history``: (hours, step_s) of trend series Prometheus holds before the first scrape."""
    text = FleetText(n, with_up=not probe, hot=hot)
    from gpuheal.sim.dcgm import Exporter

    with Exporter(text) as exporter, health_server() as gpus:
        record, expr, every_s = RECORDED_VRAM
        srv = PrometheusServer(
            work / f"prom-{probe}", {"dcgm": {"targets": [exporter.target], "honor_labels": True}}, interval_s=scrape_s,
            rules={record: expr} if recorded else None, rule_interval_s=every_s,
        )
        filled = None
        if history[0] > 0:
            filled = backfill(text, srv.workdir / "tsdb", exporter.target, *history, recorded=recorded)
        srv.start(timeout_s=120)
        try:
            started = time.monotonic()
            # four live scrapes of every GPU (a backfilled history has at most one sample that recent)
            srv.wait_for(f"count(count_over_time(DCGM_FI_DEV_FB_USED[{4 * scrape_s + 1:g}s]) >= 4)",
                         lambda r: bool(r) and float(r[0]["value"][1]) >= n, timeout_s=60 + 10 * scrape_s)
            warm_s = time.monotonic() - started
            prom = {"url": srv.url, "timeout_s": 20, "max_response_bytes": 64 * 1024 * 1024}
            if recorded:
                prom["queries"] = {"vram_series": record + "{selector}"}
            if probe:
                endpoints = [f"{gpus.url}/{alias(i)}" for i in range(n)]
            else:
                prom.update(probe_endpoints=False)
                prom.setdefault("queries", {})["endpoint_up"] = "bench_llama_up{selector}"
                endpoints = [f"http://{endpoint_netloc(i)}" for i in range(n)]
            cfg = {
                "prometheus": prom,
                "probe": {"timeout_s": 5},
                "gpus": [{"alias": alias(i), "host": host(i), "endpoint": endpoints[i], "transport": "local"}
                         for i in range(n)],
            }
            config = work / f"prom-{probe}.yaml"
            config.write_text(json.dumps(cfg))  # generated fleet configs are JSON (valid YAML)
            state = work / f"state-prom-{probe}"
            base = [*gpuheal_argv(), "--config", str(config), "--state-dir", str(state), "check", "--json"]
            if profile:
                # as cron runs it: the 2nd run records the validated config, later ones skip jsonschema
                for minute in (1, 2):
                    run_with_rss(base, clean_env(GPUHEAL_NOW=stamp(minute)))
                return {"profile_top": profile_check(config, state, stamp(3))}
            out = timed_checks(base, runs, 1, framings)
            doc = json.loads(run_with_rss_json(base, stamp(out["next_minute"])))
            out["gpus_with_temp"] = sum(1 for g in doc["gpus"].values() if g.get("temp_c") is not None)
            out["hot_gpus"] = hot
            out["gpus_endpoint_ok"] = sum(1 for g in doc["gpus"].values() if g.get("endpoint") == "ok")
            # Rule 2 had its data: a fit of min_samples over min_span_h (defaults.yaml: 30, 5.75 h)
            trend = json.loads((state / "vram-trend.json").read_text())
            out["gpus_rule2_fit_known"] = sum(
                1 for v in trend.values() if isinstance(v, dict) and v["samples"] >= 30 and v["span_h"] >= 5.75
            )
            # the state directory after runs spread over 6.5 simulated hours (cron's clock)
            for minute in range(30, 6 * 60 + 31, 60):
                run_with_rss(base, clean_env(GPUHEAL_NOW=stamp(minute)))
            out["state_dir_mb_after_6_5h"] = round(dir_size_mb(state), 2)
            out["state_files"] = sorted(p.name for p in state.iterdir())
            # per file, largest first: which file grew when the total moves (issue 13's <= 5 MB)
            out["state_file_bytes_after_6_5h"] = file_sizes(state)
            out["series"] = n * len(METRICS) + (0 if probe else n)
            out["scrape_interval_s"] = scrape_s
            out["prometheus_warmup_s"] = round(warm_s, 1)
            out["history_before_first_scrape"] = filled
            series = record if recorded else "DCGM_FI_DEV_FB_USED"
            window = srv.query(f"quantile(0.5, count_over_time({series}[6h]))")
            out["rule2_series"] = series
            out["rule2_window_samples_median"] = round(float(window[0]["value"][1])) if window else 0
            out["endpoints"] = "probed /health" if probe else "Prometheus up (probe_endpoints: false)"
        finally:
            srv.stop()
    return out


def run_with_rss_json(base: list[str], now: str) -> str:
    import subprocess

    proc = subprocess.run(base, capture_output=True, text=True, env=clean_env(GPUHEAL_NOW=now), timeout=300)
    return proc.stdout


def bench_monitor(n: int, runs: int, work: Path) -> dict:
    hosts = [host(i) for i in range(n)]
    aliases = [alias(i) for i in range(n)]
    rows = [gpu_entry(h, temp_c=55 + i % 10, vram_used_mb=10_195) for i, h in enumerate(hosts)]
    doc = {"generated_at": stamp(0), "gpus": rows}
    body = json.dumps(doc)
    with LoopbackServer({"/gpu-data": json_reply(doc)}, record=False) as monitor, health_server() as gpus:
        cfg = {
            "monitor": {"url": monitor.url + "/gpu-data", "timeout_s": 20, "max_response_bytes": 64 * 1024 * 1024},
            "probe": {"timeout_s": 5},
            "gpus": [{"alias": a, "host": h, "endpoint": f"{gpus.url}/{a}", "transport": "local"}
                     for a, h in zip(aliases, hosts, strict=True)],
        }
        config = write_config(work / "mon.yaml", cfg)
        state = work / "state-mon"
        from gpuheal.state.history import History

        write_state_file(state, "history.json", History.from_dict(make_history(aliases, START)).to_dict())
        base = [*gpuheal_argv(), "--config", str(config), "--state-dir", str(state), "check", "--json"]
        out = timed_checks(base, runs, 1)
        out["state_dir_mb"] = round(dir_size_mb(state), 1)
        out["monitor_document_mb"] = round(len(body) / 1e6, 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--monitor-runs", type=int, default=3, help="0 skips the gpu-monitor comparison")
    ap.add_argument("--scrape-s", type=float, default=5.0)
    ap.add_argument("--profile", action="store_true", help="cProfile one Prometheus check (top 25), nothing else")
    ap.add_argument("--probe", action="store_true", help="also the Prometheus case with every /health probed")
    ap.add_argument("--history-h", type=float, default=0.0, help="hours of trend series backfilled first (promtool)")
    ap.add_argument("--history-step-s", type=float, default=30.0, help="their sample interval (dcgm-exporter: 30 s)")
    ap.add_argument("--recorded-vram", action="store_true", help="Rule 2 over the README's recording rule")
    ap.add_argument("--hot", type=int, default=0, help="GPUs above Rule 8's temp_c (their rise is asked)")
    ap.add_argument("--framing", default="", help="the checks with these HTTP/1.1 framings, alternating: 'hand,h11' "
                    "(benchmarks/framing_run.py; issue 19 item 5)")
    ap.add_argument("--update", action="store_true", help=f"write the result to {LATEST.relative_to(ROOT)}")
    ap.add_argument("--out", type=Path, help="write the result here (default: nowhere, unless --update)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuheal-bench-prom-") as tmp:
        work = Path(tmp)
        result = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "gpus": a.gpus,
            "targets": TARGETS,
            "load_avg_before": [round(x, 2) for x in os.getloadavg()],
            "prometheus": bench_prometheus(
                a.gpus, a.runs, a.scrape_s, work, a.profile, history=(a.history_h, a.history_step_s),
                recorded=a.recorded_vram, hot=a.hot, framings=tuple(f for f in a.framing.split(",") if f),
            ),
        }
        if a.probe and not a.profile:
            result["prometheus_probed"] = bench_prometheus(a.gpus, a.runs, a.scrape_s, work, probe=True)
        if a.profile:
            print("\n".join(result["prometheus"]["profile_top"]))
            return 0
        if a.monitor_runs:
            result["monitor"] = bench_monitor(a.gpus, a.monitor_runs, work)
            result["ratio_wall_monitor_over_prometheus"] = round(
                result["monitor"]["median_s"] / result["prometheus"]["median_s"], 2
            )
    result["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=1))
    out = a.out or (LATEST if a.update else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
