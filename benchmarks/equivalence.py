#!/usr/bin/env python3
"""Behaviour unchanged (issue 26): the same inputs through two versions of gpuheal, compared.

    .venv/bin/python benchmarks/equivalence.py --before 75d9baf                 # against this worktree
    .venv/bin/python benchmarks/equivalence.py --before 75d9baf --after main
    .venv/bin/python benchmarks/equivalence.py --before main --after main --no-chaos   # the tool's own check

Each ref is materialised into a temp dir (``git archive REF | tar -x``; ``worktree`` = the files of this
checkout as they are, uncommitted changes included) and run with ``PYTHONPATH=<dir>`` by this venv's
Python (both sides share the dependencies). The inputs are fixed, taken once from this checkout, and fed
to both sides alike:

(a) ``gpuheal replay --json`` of every trace in ``tests/traces/*.jsonl``, with ``tests/traces/fleet.json``
    as the config (as ``tests/test_replay.py`` does);
(b) two scenarios on the embedded simulated fleet, 14 simulated minutes each (``--scenarios``):
    ``examples/scenarios/incidents.yaml`` (L1, a dead host restarts cannot heal, a monitor outage, L5) and
    ``demo.yaml`` (Rules 8 and 1 on a heating GPU, a VRAM leak, Rule 5's stuck breaker, Rule 3's stuck
    model), on the sim's virtual clock, pinned into gpuheal by ``GPUHEAL_NOW``; each simulated minute
    ``check --json``, ``heal --apply --json``, ``escalate --json`` (to a loopback Zulip look-alike), then
    ``report --json``. ``heal.confirm_budget_s: 0``: the in-run confirmation re-probes on the wall clock,
    which would make the run timing-dependent; the rest of the config stays at its defaults. Compared:
    every command's stdout and exit status, every file of the state dir (audit trail, alerts file, issue
    book, heal state, …) and the messages the Zulip look-alike got;
(c) the chaos smoke (``benchmarks/chaos.py`` of each side, the smoke rates, 10 GPUs, ``--days``, gpuheal
    only, seed 1) as JSON, minus its timing fields (``--no-chaos`` skips it).

Normalised, and only this (each must differ between two runs of one tree):
- the temp dirs (the tree, the state dir, the work dir) -> ``<tree>``, ``<state>``, ``<work>``;
- ``"ino": N`` (``kg-state.json``: the audit log's inode, a fact of the filesystem) -> ``<ino>``, and that
  file's ``"offset"`` (a byte offset into the audit trail: it moves with the durations below) -> ``<offset>``;
- the wall-clock durations gpuheal measures (``completion_s``: a verification's completion, ``ready_after_s``:
  how long a restarted server took to answer, ``elapsed_s``: a command's run time, and ``after_s`` where it
  is a readiness wait that timed out, ``"after_s": 15.01, "error": "not ready within 15 s"``), wherever
  they appear (state files, audit trail, Zulip messages) -> ``<wall-s>``;
- the config caches in the state dir (``.config-parsed.json``, ``.config-validated``) are left out: they
  are keyed by a hash of the config file's text, which holds the temp paths and ports;
- the loopback ports of the simulated fleet and Zulip (ephemeral, so two runs can overlap) ->
  ``<port:NAME>`` (the fleet's own names for them);
- in the chaos JSON, keys that are wall time (``wall_s``, ``*_wall_s``, ``peak_rss_mb``) would be dropped;
  today's chaos.py writes none there (its wall time and memory go to stderr, which is not compared).
Nothing else: ``GPUHEAL_NOW`` pins every timestamp gpuheal writes, and run ids count per day.

Output: a summary (inputs compared, identical, differing) then a unified diff per differing input.
Exit 0 all identical, 1 differences, 3 could not run (a bad ref, a side that crashed).
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SCENARIOS = ROOT / "examples" / "scenarios"
TRACES = ROOT / "tests" / "traces"
CHAOS_RATES = ROOT / "benchmarks" / "chaos_smoke_rates.yaml"
TIMING_KEYS = re.compile(r"^(wall_s|.*_wall_s|peak_rss_mb)$")
ZULIP_EMAIL, ZULIP_KEY = "gpuheal-bot@zulip.example.org", "equivalence-zulip-key-0123456789"


class CannotRun(Exception):
    """A ref that cannot be materialised, or a side whose driver crashed: exit 3."""


@dataclass(frozen=True)
class Side:
    label: str
    tree: Path


# --------------------------------------------------------------------------- materialise


def materialise(ref: str, into: Path) -> Side:
    """The files of ``ref`` (``git archive``), or of this checkout as it is (``worktree``)."""
    if Path(ref).is_dir():
        shutil.copytree(ref, into, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__"))
        return Side(f"dir {ref}", into)
    into.mkdir(parents=True)
    if ref == "worktree":
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
        for rel in filter(None, listed):
            src = ROOT / rel
            if src.is_file():
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, into / rel)
        return Side("worktree", into)
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         cwd=ROOT, capture_output=True, text=True)
    if sha.returncode != 0:
        raise CannotRun(f"not a commit: {ref!r}")
    archive = subprocess.Popen(["git", "archive", sha.stdout.strip()], cwd=ROOT, stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout)
    if archive.wait() != 0 or untar.returncode != 0:
        raise CannotRun(f"git archive {ref} failed")
    return Side(f"{ref} ({sha.stdout.strip()[:9]})", into)


def side_env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEAL_", "ZULIP_", "LITELLM_"))}
    env["PYTHONPATH"] = str(tree)
    env["PYTHONHASHSEED"] = "0"
    env["NO_COLOR"] = "1"
    return env


# --------------------------------------------------------------------------- the inputs, run on one side


def run_replays(side: Side, work: Path, pattern: str) -> dict[str, str]:
    """(a) ``gpuheal replay --json`` of every recorded trace, the config the tests use."""
    out: dict[str, str] = {}
    cfg = work / "fleet.json"
    shutil.copy(TRACES / "fleet.json", cfg)
    for trace in sorted(TRACES.glob(f"{pattern}.jsonl")):
        proc = subprocess.run([PY, "-m", "gpuheal", "--config", str(cfg), "--state-dir", str(work / "unused"),
                               "replay", "--json", str(trace)],
                              cwd=work, env=side_env(side.tree), capture_output=True, text=True, timeout=300)
        out[f"replay/{trace.stem}"] = f"exit {proc.returncode}\n{proc.stdout}"
    return out


def run_sim(side: Side, work: Path, scenario: str, cycles: int) -> dict[str, dict[str, str]]:
    """(b) the scenario, driven by this same file in ``--drive`` mode under the side's PYTHONPATH (the
    simulated fleet, the look-alike Zulip and gpuheal all come from the side's tree)."""
    argv = [PY, str(Path(__file__).resolve()), "--drive", str(work), "--scenarios", f"{scenario}:{cycles}"]
    drive = subprocess.run(argv, cwd=work, env=side_env(side.tree), capture_output=True, text=True, timeout=1800)
    if drive.returncode != 0:
        raise CannotRun(f"{side.label}: the scenario driver failed:\n{drive.stderr[-3000:]}")
    doc: dict[str, dict[str, str]] = json.loads((work / "sim-out.json").read_text())
    return doc


def run_chaos(side: Side, work: Path, days: float) -> dict[str, str]:
    """(c) the chaos smoke of the side's own benchmarks/chaos.py, minus its wall-time fields."""
    out = work / "chaos.json"
    proc = subprocess.run([PY, str(side.tree / "benchmarks" / "chaos.py"), "--gpus", "10", "--days", str(days),
                           "--seed", "1", "--rates", str(CHAOS_RATES), "--only", "gpuheal", "--json", str(out)],
                          cwd=work, env=side_env(side.tree), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not out.exists():
        raise CannotRun(f"{side.label}: chaos.py failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"chaos/smoke.json": json.dumps(drop_timing(json.loads(out.read_text())), indent=1, sort_keys=True)}


def drop_timing(doc: object) -> object:
    if isinstance(doc, dict):
        return {k: drop_timing(v) for k, v in doc.items() if not TIMING_KEYS.match(str(k))}
    if isinstance(doc, list):
        return [drop_timing(v) for v in doc]
    return doc


# --------------------------------------------------------------------------- the scenario driver (--drive)


def drive(work: Path, scenario: str, cycles: int) -> None:
    """Runs under the side's PYTHONPATH: starts its simulated fleet and Zulip look-alike on ephemeral
    loopback ports, runs what cron runs once per simulated minute, writes ``sim-out.json``."""
    import yaml

    from gpuheal.sim import Scenario, SimFleet
    from gpuheal.sim.zulip import ZulipLookalike

    state = work / "state"
    outputs: dict[str, str] = {}
    with SimFleet(Scenario.load(str(SCENARIOS / f"{scenario}.yaml")), host="127.0.0.1", ports="ephemeral") as fleet, \
            ZulipLookalike(ZULIP_EMAIL, ZULIP_KEY) as zulip:
        cfg = fleet.config_dict(api_key="not-needed")
        cfg["zulip"] = {"site": zulip.url, "timeout_s": 3}
        cfg.setdefault("heal", {})["confirm_budget_s"] = 0
        cfg_path = work / "gpuheal.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        ports = {"monitor": fleet.monitor_url, "litellm": fleet.litellm_url, "control": fleet.control_url,
                 "zulip": zulip.url, **fleet.endpoints}
        env = {**os.environ, "ZULIP_EMAIL": ZULIP_EMAIL, "ZULIP_API_KEY": ZULIP_KEY}
        base = [PY, "-m", "gpuheal", "--config", str(cfg_path), "--state-dir", str(state)]

        def cli(name: str, *args: str) -> None:
            env["GPUHEAL_NOW"] = fleet.now().strftime("%Y-%m-%dT%H:%M:%SZ")
            proc = subprocess.run([*base, *args], env=env, cwd=work, capture_output=True, text=True, timeout=300)
            outputs[name] = f"exit {proc.returncode}\n{proc.stdout}"

        for cycle in range(1, cycles + 1):
            cli(f"sim/{cycle:02d}-check", "check", "--json")
            cli(f"sim/{cycle:02d}-heal", "heal", "--apply", "--json")
            cli(f"sim/{cycle:02d}-escalate", "escalate", "--json")
            fleet.advance(60)
        cli("sim/report", "report", "--json")
        outputs["sim/zulip-messages"] = json.dumps(list(zulip.messages), indent=1, sort_keys=True, ensure_ascii=False)
    for path in sorted(p for p in state.rglob("*") if p.is_file() and not p.name.endswith(".lock")):
        outputs[f"sim/state/{path.relative_to(state)}"] = readable(path)
    named = {f"sim-{scenario}/{k.removeprefix('sim/')}": v for k, v in outputs.items()}
    (work / "sim-out.json").write_text(json.dumps({"outputs": named, "ports": ports}))


def readable(path: Path) -> str:
    """A state file as text: JSON pretty-printed with sorted keys (one key per line diffs well)."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    if path.suffix == ".jsonl":
        return "\n".join(json.dumps(json.loads(line), sort_keys=True, ensure_ascii=False) if line.strip() else line
                         for line in text.splitlines())
    if path.suffix == ".json":
        try:
            return json.dumps(json.loads(text), indent=1, sort_keys=True, ensure_ascii=False)
        except ValueError:
            return text
    return text


# --------------------------------------------------------------------------- normalise and compare


INODE = re.compile(r'^(\s*"ino": )\d+', re.MULTILINE)
# Wall seconds gpuheal measures (not the pinned clock's): a completion's duration, how long a restarted
# server took to answer, a command's run time; as JSON ("key": 0.01) and as a message renders them (key: 0.01).
WALL_DURATIONS = re.compile(r'((?:\\?")?(?:completion_s|ready_after_s|elapsed_s)(?:\\?")?: )-?[0-9][0-9.e+-]*')
# A restart's readiness wait that timed out records how long it waited ("after_s": 15.01, "error": "not ready
# within 15 s"); elsewhere after_s is the configured verification delay, left as it is.
Q = r'(?:\\?")'  # a quote, or an escaped one inside a JSON string
READY_TIMEOUT = re.compile(rf'({Q}after_s{Q}: )[0-9][0-9.e+-]*(,\s*{Q}error{Q}: {Q}not ready within)')
# kg-state.json's byte offset into the audit trail, which moves with the digits of those durations.
KG_OFFSET = re.compile(r'^(\s*"offset": )\d+', re.MULTILINE)
CONFIG_CACHES = (".config-parsed.json", ".config-validated")


def normaliser(side: Side, work: Path, ports: dict[str, str]) -> Callable[[str], str]:
    """Only what must differ run to run: the temp paths and the ephemeral ports (module docstring)."""
    subs = [(str(work / "state"), "<state>"), (str(work), "<work>"), (str(side.tree), "<tree>")]
    for name, url in sorted(ports.items(), key=lambda kv: -len(kv[1])):
        port = url.rstrip("/").rsplit(":", 1)[-1].split("/")[0]
        subs.append((f"127.0.0.1:{port}", f"127.0.0.1:<port:{name}>"))

    def apply(text: str) -> str:
        for old, new in subs:
            text = text.replace(old, new)
        text = WALL_DURATIONS.sub(r"\1<wall-s>", INODE.sub(r"\1<ino>", text))
        text = READY_TIMEOUT.sub(r"\1<wall-s>\2", text)
        return KG_OFFSET.sub(r"\1<offset>", text) if '"ino": <ino>' in text else text
    return apply


@functools.cache
def check_imports(side: Side) -> None:
    """Every gpuheal module must come from the side's tree: a module missing there would otherwise be
    found by this venv's editable install (its finder comes after PYTHONPATH) and mix the two versions."""
    probe = ("import importlib, pkgutil, gpuheal; "
             "[importlib.import_module(m.name) for m in pkgutil.walk_packages(gpuheal.__path__, 'gpuheal.') "
             "if '.sim' not in m.name and '__main__' not in m.name]; import sys; "
             "print('\\n'.join(sorted({str(getattr(m, '__file__', '') or '') for n, m in sys.modules.items() "
             "if n.split('.')[0] == 'gpuheal'})))")
    proc = subprocess.run([PY, "-c", probe], cwd=side.tree, env=side_env(side.tree), capture_output=True, text=True)
    stray = [f for f in proc.stdout.splitlines() if f and not f.startswith(str(side.tree))]
    if proc.returncode != 0 or stray:
        raise CannotRun(f"{side.label}: gpuheal does not import from {side.tree}: {stray or proc.stderr[-2000:]}")


def run_side(side: Side, work: Path, args: argparse.Namespace) -> dict[str, str]:
    work.mkdir(parents=True)
    check_imports(side)
    inputs = set(args.inputs.split(","))
    outputs = run_replays(side, work, args.traces) if "replay" in inputs else {}
    for scenario, cycles in scenarios(args.scenarios) if "sim" in inputs else []:
        (work / scenario).mkdir()
        sim = run_sim(side, work / scenario, scenario, cycles)
        norm_sim = normaliser(side, work / scenario, sim["ports"])
        outputs.update({k: norm_sim(v) for k, v in sim["outputs"].items() if not k.endswith(CONFIG_CACHES)})
    chaos_days = None if args.no_chaos or "chaos" not in inputs else args.chaos_days
    if chaos_days:
        (work / "chaos").mkdir()
        outputs.update(run_chaos(side, work / "chaos", chaos_days))
    norm = normaliser(side, work, {})
    return {k: norm(v) for k, v in outputs.items()}


def scenarios(text: str) -> list[tuple[str, int]]:
    return [(name, int(cycles)) for name, _, cycles in (item.partition(":") for item in text.split(",") if item)]


def compare(before: dict[str, str], after: dict[str, str], labels: tuple[str, str]) -> tuple[list[str], list[str]]:
    """(identical names, differing names) and prints each difference as a unified diff."""
    same, diff = [], []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a == b:
            same.append(name)
            continue
        diff.append(name)
        print(f"\n=== differs: {name}" + (" (only after)" if a is None else " (only before)" if b is None else ""))
        lines_a, lines_b = (a or "").splitlines(keepends=True), (b or "").splitlines(keepends=True)
        sys.stdout.writelines(difflib.unified_diff(lines_a, lines_b, f"{labels[0]}/{name}", f"{labels[1]}/{name}", n=2))
    return same, diff


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="a git ref")
    ap.add_argument("--after", default="worktree", help="a git ref, or `worktree` (this checkout as it is)")
    ap.add_argument("--scenarios", default="incidents:14,demo:14",
                    help="examples/scenarios NAME:MINUTES, comma-separated (default incidents:14,demo:14)")
    ap.add_argument("--chaos-days", type=float, default=0.125, help="the chaos smoke's length (default 3 h)")
    ap.add_argument("--no-chaos", action="store_true", help="skip input (c)")
    ap.add_argument("--inputs", default="replay,sim,chaos", help="which inputs (default: replay,sim,chaos)")
    ap.add_argument("--traces", default="*", help="which traces of tests/traces (a glob of the stem; default *)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs (printed)")
    ap.add_argument("--drive", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.drive:
        [(name, cycles)] = scenarios(args.scenarios)
        drive(Path(args.drive), name, cycles)
        return 0
    if not args.before:
        ap.error("--before REF is required")
    tmp = Path(tempfile.mkdtemp(prefix="gpuheal-equiv-"))
    try:
        sides = [materialise(args.before, tmp / "before"), materialise(args.after, tmp / "after")]
        results = [run_side(s, tmp / f"run-{i}", args) for i, s in enumerate(sides)]
    except (CannotRun, subprocess.SubprocessError, OSError, ValueError) as exc:
        print(f"equivalence: could not run: {exc}", file=sys.stderr)
        return 3
    finally:
        if args.keep:
            print(f"temp dirs kept: {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    same, diff = compare(results[0], results[1], ("before", "after"))
    print(f"\nbefore: {sides[0].label}   after: {sides[1].label}")
    print(f"inputs compared: {len(same) + len(diff)}   identical: {len(same)}   differing: {len(diff)}")
    for name in diff:
        print(f"  differs: {name}")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
