"""A week of chaos (issue 29): healing quality as a measured figure, against the alternatives.

    .venv/bin/python benchmarks/chaos.py                          # 100 GPUs, 7 days, seed 1
    .venv/bin/python benchmarks/chaos.py --gpus 10 --days 1 --seed 3 --json out.json
    .venv/bin/python benchmarks/chaos.py --rates my-rates.yaml    # {kind: rate per unit-hour}
    .venv/bin/python benchmarks/chaos.py --only gpuheal,no-heal   # some of the systems
    .venv/bin/python benchmarks/chaos.py --confirm-budget-s 0     # gpuheal without its in-run confirmation

A simulated fleet (``gpuheal.sim``) lives through a week of injected faults and benign events
(:mod:`chaos_inject`: the kinds, their rates and why), on the sim's virtual clock. The same week is
lived once by each system: **gpuheal** through the code paths cron runs (:mod:`chaos_gpuheal`; with
its in-run confirmation, ``heal.confirm_budget_s``, waiting on the simulated clock: ``--confirm-budget-s``),
and four baselines (:mod:`chaos_baselines`): no healing, restart on crash only (systemd, llama-swap),
a probe every 300 s with a restart after 3 failures (GPUStack), LiteLLM's cooldown only. Each is
measured against the ground truth (:mod:`chaos_measure` defines every figure).

Output: a markdown table on stdout; ``--json OUT`` writes ``{"seed", "gpus", "days", "faults":
{kind: n}, "benign": {kind: n}, "systems": {name: {recall, precision, false_actions, mttr_p50_s,
mttr_p90_s, messages_per_incident, pages_per_incident, capacity_lost_gpu_min, …, by_kind}}}``;
``--incidents OUT`` the week's ground truth. A progress bar on stderr when it is a terminal; the wall
time and peak memory go to stderr (they are the only things that differ between two runs of one
seed: the same seed gives the same week and the same output, byte for byte). A bad ``--rates`` file
is one line on stderr and exit 3. A crash of gpuheal during the week is counted in its figures.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from chaos_baselines import BASELINES  # noqa: E402
from chaos_inject import Layout, RatesError, counts, inject, load_rates  # noqa: E402
from chaos_measure import measure  # noqa: E402
from chaos_week import Driver, progress_bar  # noqa: E402
from chaos_world import scenario  # noqa: E402

SYSTEMS = ("gpuheal", "no-heal", "crash-only", "probe-300s", "litellm-cooldown")
COLUMNS = (
    ("recall", "recall", "{:.2f}"), ("recall (claimed)", "recall_claimed", "{:.2f}"),
    ("precision", "precision", "{:.3f}"), ("false actions", "false_actions", "{}"),
    ("detect p50 s", "detect_p50_s", "{:.0f}"), ("MTTR p50 s", "mttr_p50_s", "{:.0f}"),
    ("MTTR p90 s", "mttr_p90_s", "{:.0f}"), ("restarts/fault", "restarts_per_fault", "{:.2f}"),
    ("msgs/incident", "messages_per_incident", "{:.2f}"), ("pages/incident", "pages_per_incident", "{:.2f}"),
    ("capacity lost GPU-min", "capacity_lost_gpu_min", "{:.0f}"), ("crashes", "crashes", "{}"),
)


def run_system(name: str, layout: Layout, incidents, days: float, seed: int, workdir: Path,
               confirm_budget_s: float | None = None, log_every_min: int = 0):
    """One system's week on a fresh world: its :class:`chaos_week.Week` and its wall seconds. gpuheal runs
    with its in-run confirmation's default budget unless ``confirm_budget_s`` is given (0: off)."""
    from gpuheal.sim import Scenario, SimFleet

    scn = Scenario.from_dict(scenario(layout, seed))
    fleet = SimFleet(scn, ports="ephemeral", serve="in-process").start()
    try:
        if name == "gpuheal":
            from chaos_gpuheal import GpuhealSystem

            system = GpuhealSystem(fleet, layout, workdir / "gpuheal", confirm_budget_s)
        else:
            system = next(b for b in BASELINES if b.name == name)(fleet.world)
        driver = Driver(fleet.world, system, incidents, days, seed, progress_bar(name, log_every_min))
        return driver.run()
    finally:
        fleet.stop()


def run(gpus: int, days: float, seed: int, rates: dict[str, float], only: tuple[str, ...] = SYSTEMS,
        workdir: Path | None = None, weeks: dict | None = None,
        confirm_budget_s: float | None = None, log_every_min: int = 0,
        jobs: int = 1) -> tuple[dict, list, dict[str, float]]:
    """The document, the incidents and each system's wall seconds; ``weeks`` (when given) gets each
    system's recorded :class:`chaos_week.Week`. ``jobs`` > 1: the systems run in that many processes
    (forked), each on its own world as in one process; the document is the same byte for byte."""
    layout = Layout.of(gpus)
    incidents = inject(layout, days, seed, rates)
    doc = {"seed": seed, "gpus": gpus, "days": days, "faults": counts(incidents, True),
           "benign": counts(incidents, False), "systems": {}}
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="chaos-", dir=_scratch()) as tmp:
        args = (layout, incidents, days, seed, Path(workdir or tmp), confirm_budget_s, log_every_min, weeks is not None)
        if jobs > 1 and len(only) > 1:
            ctx = multiprocessing.get_context("fork")
            with concurrent.futures.ProcessPoolExecutor(max_workers=min(jobs, len(only)), mp_context=ctx) as pool:
                # the longest first (gpuheal: ~99 % of the CPU), the baselines share the other worker
                order = sorted(only, key=lambda n: n != "gpuheal")
                futures = {name: pool.submit(_one, name, *args) for name in order}
                results = {name: futures[name].result() for name in only}
        else:
            results = {name: _one(name, *args) for name in only}
        for name in only:  # merged in the order asked, whoever finished first: the same document
            figures, wall_s, week = results[name]
            doc["systems"][name] = figures
            walls[name] = wall_s
            if weeks is not None:
                weeks[name] = week
    return doc, incidents, walls


def _one(name: str, layout: Layout, incidents, days: float, seed: int, workdir: Path,
         confirm_budget_s: float | None, log_every_min: int, keep_week: bool):
    """One system's figures, wall seconds and (``keep_week``) recorded week: what a worker sends back.
    Each system lives the week on its own fresh world, so running them in parallel processes changes
    nothing they see (the same seed gives the same incidents, the same cron jitter)."""
    week = run_system(name, layout, incidents, days, seed, workdir, confirm_budget_s, log_every_min)
    return measure(week), week.wall_s, week if keep_week else None


def _scratch() -> str | None:
    """The state directory on tmpfs when there is one: gpuheal fsyncs every write (as it must), and a
    week is ~100,000 of them; the disk's speed is not what the benchmark measures."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None


def _cell(value, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


def table(doc: dict) -> str:
    """The systems side by side (markdown), then gpuheal's figures per fault kind."""
    lines = [f"chaos week: {doc['gpus']} GPUs, {doc['days']:g} days, seed {doc['seed']}: "
             f"{sum(doc['faults'].values())} faults, {sum(doc['benign'].values())} benign events", ""]
    lines.append("| system | " + " | ".join(c[0] for c in COLUMNS) + " |")
    lines.append("|---|" + "---:|" * len(COLUMNS))
    for name, m in doc["systems"].items():
        lines.append(f"| {name} | " + " | ".join(_cell(m.get(key), fmt) for _, key, fmt in COLUMNS) + " |")
    for name, m in doc["systems"].items():
        lines += ["", f"{name} per fault kind:", "",
                  "| kind | claim | faults | recall | detect p50 s | MTTR p50 s | restarts/fault | pages/incident "
                  "| capacity lost GPU-min |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for kind, k in m["by_kind"].items():
            lines.append(f"| {kind} | {k['claim']} | {k['faults']} | {_cell(k['recall'], '{:.2f}')} | "
                         f"{_cell(k['detect_p50_s'], '{:.0f}')} | {_cell(k['mttr_p50_s'], '{:.0f}')} | "
                         f"{_cell(k['restarts_per_fault'], '{:.2f}')} | {_cell(k['pages_per_incident'], '{:.2f}')} | "
                         f"{k['capacity_lost_gpu_min']:.0f} |")
        esc = m["escalations"]
        lines.append("")
        lines.append(f"{name}: false actions on benign events {m['false_actions_on_benign'] or '{}'}; escalations "
                     f"needed {esc['needed']}, not needed {esc['not_needed']}; unhealable faults escalated exactly "
                     f"once {esc['unhealable_escalated_exactly_once']}/{esc['unhealable_faults']}; stray messages "
                     f"{m['stray_messages']} ({m['stray_pages']} pages)")
        if name == "gpuheal":
            continue
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=100)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rates", help="YAML/JSON {kind: rate per unit-hour} over the defaults")
    ap.add_argument("--json", dest="json_out", help="write the figures here")
    ap.add_argument("--incidents", help="write the week's ground truth (every incident) here")
    ap.add_argument("--only", default=",".join(SYSTEMS), help=f"systems to run (of {', '.join(SYSTEMS)})")
    ap.add_argument("--confirm-budget-s", type=float, default=None,
                    help="gpuheal's heal.confirm_budget_s (default: the product's, 30 s; 0: cron's poll holds only)")
    ap.add_argument("--log-every-min", type=int, default=0,
                    help="without a terminal: a progress line on stderr every this many simulated minutes")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="run the systems in this many processes (default: 2 where there are 2 CPUs); the same output")
    ap.add_argument("--save-weeks", help="pickle every system's recorded week here (to measure again later)")
    args = ap.parse_args(argv)
    only = tuple(s for s in args.only.split(",") if s)
    budget = args.confirm_budget_s
    if args.gpus < 1 or args.days <= 0 or args.jobs < 1 or any(s not in SYSTEMS for s in only) or (budget is not None
                                                                                    and not 0 <= budget <= 50):
        sys.stderr.write(f"chaos: --gpus must be >= 1, --days > 0, --confirm-budget-s 0..50, --jobs >= 1, --only among "
                         f"{', '.join(SYSTEMS)}\n")
        return 3
    try:
        rates = load_rates(args.rates)
    except RatesError as exc:
        sys.stderr.write(f"chaos: {exc}\n")
        return 3
    started = time.perf_counter()
    weeks: dict = {}
    doc, incidents, walls = run(args.gpus, args.days, args.seed, rates, only, weeks=weeks, confirm_budget_s=budget,
                                log_every_min=args.log_every_min, jobs=args.jobs)
    if args.save_weeks:
        import pickle

        with open(args.save_weeks, "wb") as fh:
            pickle.dump(weeks, fh)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    if args.incidents:
        Path(args.incidents).write_text(json.dumps([i.to_json() for i in incidents], indent=1) + "\n")
    sys.stdout.write(table(doc))
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime
    sys.stderr.write(f"chaos: {time.perf_counter() - started:.0f} s wall ("
                     + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items())
                     + f"), {cpu_s:.0f} s CPU, peak RSS {max(own.ru_maxrss, workers.ru_maxrss) / 1024:.0f} MB"
                     + (f" (the largest process; {args.jobs} processes)" if args.jobs > 1 and len(only) > 1 else "")
                     + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
