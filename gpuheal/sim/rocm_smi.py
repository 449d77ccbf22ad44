"""A ``rocm-smi --json`` look-alike for the simulated fleet: the subset gpuheal runs, in the real
tool's shapes (keys and string values as in the captures of ../shared/fixtures/smi; checked by
tests/test_sim_smi.py), from the sim's live state.

    python -m gpuheal.sim.rocm_smi CONTROL_URL [--sim-gpu ALIAS] [-d INDEX] FLAGS... --json

Flags: ``--resetpoweroverdrive`` (the cap back to ``power_default_limit_w``), ``--setpoweroverdrive
WATTS`` (sets ``power_limit_w``, as the real tool: whole watts only, above the board's max refused;
prints its log line, not JSON — issue 27 items 7 and 12), ``--showtemp``, ``--showmeminfo vram [gtt]``,
``--showuse``, ``--showpower``, ``--showmaxpower`` (the cap in force: ``power_limit_w``), ``--showpids``
(under ``system``: the GPU's llama-server, and ``python3`` when ``competing_pid`` is set, as ``"name,
gpus, vram bytes, sdma, cu"``). Without ``--json`` it refuses (gpuheal always asks for JSON). Stdlib
only.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gpuheal.sim.control import ControlError, call
from gpuheal.sim.processes import gpu_processes
from gpuheal.sim.smi import pick_gpu

MIB = 1024 * 1024


def _s(value: Any, places: int = 1) -> str:
    return "N/A" if value is None else f"{float(value):.{places}f}"


def card(flags: set[str], g: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    if "--showtemp" in flags:
        out["Temperature (Sensor edge) (C)"] = _s(g.get("temp_c"))
        out["Temperature (Sensor junction) (C)"] = _s(None if g.get("temp_c") is None else g["temp_c"] + 2)
    if "--showmaxpower" in flags:
        out["Max Graphics Package Power (W)"] = _s(g.get("power_limit_w"))
    if "--showpower" in flags:
        out["Average Graphics Package Power (W)"] = _s(g.get("power_w"))
    if "--showuse" in flags:
        out["GPU use (%)"] = _s(g.get("util_pct"), 0)
    if "vram" in flags:
        out["VRAM Total Memory (B)"] = str(int(float(g.get("vram_total_mb") or 0) * MIB))
        out["VRAM Total Used Memory (B)"] = str(int(float(g.get("vram_used_mb") or 0) * MIB))
    return out


def pids(g: dict[str, Any], n: int) -> dict[str, str]:
    alive = g.get("endpoint") != "refused"
    procs = gpu_processes(g, n, int(g.get("restart_count") or 0), alive)
    out = {f"PID{p.pid}": f"{p.name.rsplit('/', 1)[-1]}, 1, {p.used_mb * MIB}, 0, 0" for p in procs}
    return out


def set_cap(url: str, alias: str, g: dict[str, Any], n: int, raw: str) -> tuple[int, str, str]:
    """``--setpoweroverdrive WATTS``: rocm-smi's ``int(value)`` check, its range check, its log lines;
    ``--resetpoweroverdrive``: the board's default (``power_default_limit_w``, when the scenario has one)."""
    if raw == "reset":
        default = g.get("power_default_limit_w")
        if default is not None:
            call(url, "POST", "/set", {"gpu": alias, "set": {"power_limit_w": float(default)}})
        now = default if default is not None else g.get("power_limit_w")
        return 0, f"GPU[{n}]\t\t: Successfully reset Power OverDrive to: {int(float(now or 0))}W\n", ""
    try:
        watts = int(raw)
    except ValueError:
        return 1, "", f"ERROR: {raw} is not an integer\n"
    top = g.get("power_max_limit_w")
    if watts <= 0 or (top is not None and watts > float(top)):
        return 1, f"GPU[{n}]\t\t: Unable to set Power OverDrive\n", ""
    call(url, "POST", "/set", {"gpu": alias, "set": {"power_limit_w": float(watts)}})
    return 0, f"GPU[{n}]\t\t: Successfully set power to: {watts}W\n", ""


def run(argv: list[str]) -> tuple[int, str, str]:
    url, args = argv[0], argv[1:]
    alias, index, flags, cap = None, 0, set(), None
    while args:
        a = args.pop(0)
        if a == "--sim-gpu" and args:
            alias = args.pop(0)
        elif a == "-d" and args:
            index = int(args.pop(0)) if args[0].isdigit() else -1
        elif a == "--setpoweroverdrive" and args:
            cap = args.pop(0)
        elif a == "--resetpoweroverdrive":
            cap = "reset"
        else:
            flags.add(a)
    if cap is not None:
        name, g, n = pick_gpu(call(url, "GET", "/state"), alias, index)
        return set_cap(url, name, g, n, cap)
    if "--json" not in flags:
        return 1, "", "gpuheal's rocm-smi look-alike answers --json only\n"
    name, g, n = pick_gpu(call(url, "GET", "/state"), alias, index)
    doc: dict[str, Any] = {f"card{n}": card(flags, g)}
    if "--showpids" in flags:
        doc["system"] = pids(g, n)
    return 0, json.dumps(doc) + "\n", ""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m gpuheal.sim.rocm_smi CONTROL_URL [--sim-gpu ALIAS] FLAGS... --json", file=sys.stderr)
        return 1
    try:
        rc, out, err = run(args)
    except ControlError as exc:
        print(f"ERROR: GPU[{exc}] : not found", file=sys.stderr)
        return 2
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
