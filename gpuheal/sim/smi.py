"""An ``nvidia-smi`` look-alike for the simulated fleet: the subset gpuheal runs, answered as the real
tool does (checked against real captures by tests/test_sim_smi.py), from the sim's live state.

    python -m gpuheal.sim.smi CONTROL_URL [--sim-gpu ALIAS] [-i INDEX] ARGS...

Install it as ``nvidia-smi`` on PATH (a two-line shell script ``exec``-ing this), one per simulated
host: ``--sim-gpu`` names the GPU, else ``-i INDEX`` picks it by its place in the scenario.

- ``--query-gpu=FIELDS --format=csv[,noheader][,nounits]``: ``index``, ``name``, ``temperature.gpu``,
  ``memory.used``, ``memory.total``, ``utilization.gpu``, ``power.draw``, ``power.limit``,
  ``power.default_limit``, ``power.min_limit``, ``power.max_limit``; power with 2 decimals, ``[N/A]`` when not known;
  an unknown field: ``Field "x" is not a valid field to query.``, exit 2.
- ``--query-compute-apps=pid,process_name,used_memory``: who runs on the GPU, decided once in
  :mod:`gpuheal.sim.processes` (its llama-server, and ``python3`` holding ``competing_vram_mb`` when
  ``competing_pid`` is set); no llama-server while it is down.
- ``-pl WATTS``: sets ``power_limit_w``; outside the board's max: nvidia-smi's refusal, exit 2.

Stdlib only, like the rest of the simulator.
"""

from __future__ import annotations

import sys
from typing import Any

from gpuheal.sim.control import ControlError, call
from gpuheal.sim.processes import gpu_processes

BAD_ARG = 2  # nvidia-smi(1) RETURN VALUE: "A supplied argument or flag is invalid"
UNITS = {"memory.used": "MiB", "memory.total": "MiB", "utilization.gpu": "%", "power.draw": "W",
         "power.limit": "W", "power.default_limit": "W", "power.min_limit": "W", "power.max_limit": "W"}  # fmt: skip
FIELDS = {
    "temperature.gpu": ("temp_c", 0),
    "memory.used": ("vram_used_mb", 0),
    "memory.total": ("vram_total_mb", 0),
    "utilization.gpu": ("util_pct", 0),
    "power.draw": ("power_w", 2),
    "power.limit": ("power_limit_w", 2),
    "power.default_limit": ("power_default_limit_w", 2),
    "power.min_limit": ("power_min_limit_w", 2),  # [N/A] unless the scenario sets it (issue 27 item 7)
    "power.max_limit": ("power_max_limit_w", 2),
}
HEADERS = {"temperature.gpu": "temperature.gpu", "index": "index", "name": "name"}


def pick_gpu(state: dict[str, Any], alias: str | None, index: int) -> tuple[str, dict[str, Any], int]:
    """The simulated GPU a tool call names (by alias or index), or the real tool's error: shared by
    the nvidia-smi and rocm-smi stand-ins so both pick alike."""
    gpus = list(state["gpus"].items())
    if alias is not None:
        for n, (a, g) in enumerate(gpus):
            if a == alias:
                return a, g, n
        raise ControlError(f"no simulated GPU {alias!r}")
    if not 0 <= index < len(gpus):
        raise ControlError(f"No devices were found (index {index})")
    return gpus[index][0], gpus[index][1], index


def _value(field: str, g: dict[str, Any], n: int, alias: str, units: bool) -> str:
    if field == "index":
        return str(n)
    if field == "name":
        return str(g.get("name") or alias)
    key, places = FIELDS[field]
    v = g.get(key)
    if v is None:
        return "[N/A]"
    text = f"{float(v):.{places}f}"
    return f"{text} {UNITS[field]}" if units and field in UNITS else text


def _header(field: str, units: bool) -> str:
    unit = UNITS.get(field)
    return f"{field} [{unit}]" if units and unit else field


def query_gpu(fields: list[str], fmt: set[str], g: dict[str, Any], n: int, alias: str) -> tuple[int, str]:
    return query_gpus(fields, fmt, [(g, n, alias)])


def query_gpus(fields: list[str], fmt: set[str], boards: list[tuple[dict[str, Any], int, str]]) -> tuple[int, str]:
    """``--query-gpu`` of several boards (``(state, index, alias)``), one row each, as nvidia-smi
    without ``-i`` lists every GPU of its machine."""
    for f in fields:
        if f not in FIELDS and f not in ("index", "name"):
            return BAD_ARG, f'Field "{f}" is not a valid field to query.\n\n'
    units = "nounits" not in fmt
    rows = [] if "noheader" in fmt else [", ".join(_header(f, units) for f in fields)]
    rows += [", ".join(_value(f, g, n, alias, units) for f in fields) for g, n, alias in boards]
    return 0, "\n".join(rows) + "\n"


def compute_apps(fmt: set[str], g: dict[str, Any], n: int) -> str:
    units = "nounits" not in fmt
    mib = " MiB" if units else ""
    rows = [] if "noheader" in fmt else [f"pid, process_name, used_gpu_memory{' [MiB]' if units else ''}"]
    alive = g.get("endpoint") != "refused"
    procs = gpu_processes(g, n, int(g.get("restart_count") or 0), alive)
    rows += [f"{p.pid}, {p.name}, {p.used_mb}{mib}" for p in procs]
    return "".join(r + "\n" for r in rows)


def set_limit(url: str, alias: str, g: dict[str, Any], n: int, raw: str, setter: Any = None) -> tuple[int, str, str]:
    """``-pl WATTS``; ``setter(alias, watts)`` applies it (default: the control endpoint's ``/set``)."""
    bus = f"00000000:{n + 1:02X}:00.0"
    try:
        watts = float(raw)
    except ValueError:
        return BAD_ARG, "", f'Invalid value "{raw}" for power limit.\n'
    top = g.get("power_max_limit_w")
    if watts <= 0 or (top is not None and watts > float(top)):
        lo = f"{(float(top or 0) * 0.3):.2f}"
        return BAD_ARG, "", (f"Provided power limit {watts:.2f} W is not a valid power limit which should be between "
                             f"{lo} W and {float(top or 0):.2f} W for GPU {bus}\nTerminating early due to previous "
                             "errors.\n")  # fmt: skip
    old = g.get("power_limit_w")
    if setter is None:
        call(url, "POST", "/set", {"gpu": alias, "set": {"power_limit_w": watts}})
    else:
        setter(alias, watts)
    return 0, f"Power limit for GPU {bus} was set to {watts:.2f} W from {float(old or 0):.2f} W.\nAll done.\n", ""


INVALID = (BAD_ARG, "", "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")


def parse_args(args: list[str]) -> dict[str, Any] | None:
    """nvidia-smi's arguments as the look-alikes read them: ``alias`` (``--sim-gpu``), ``index``
    (``-i``; None: not given), ``fmt``, ``query``, ``apps``, ``limit``; None for what it refuses."""
    args = list(args)
    alias, index, fmt, query, apps, limit = None, None, set(), None, False, None
    while args:
        a = args.pop(0)
        if a == "--sim-gpu" and args:
            alias = args.pop(0)
        elif a == "-i" and args:
            index = int(args.pop(0)) if args[0].isdigit() else -1
        elif a.startswith("--format="):
            fmt = set(a.split("=", 1)[1].split(","))
        elif a.startswith("--query-gpu="):
            query = [f.strip() for f in a.split("=", 1)[1].split(",")]
        elif a.startswith("--query-compute-apps="):
            apps = True
        elif a == "-pl" and args:
            limit = args.pop(0)
        else:
            return None
    return {"alias": alias, "index": index, "fmt": fmt, "query": query, "apps": apps, "limit": limit}


def run(argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one invocation."""
    url = argv[0]
    parsed = parse_args(argv[1:])
    if parsed is None:
        return INVALID
    alias, index, fmt, query, apps, limit = (parsed[k] for k in ("alias", "index", "fmt", "query", "apps", "limit"))
    name, g, n = pick_gpu(call(url, "GET", "/state"), alias, 0 if index is None else index)
    if limit is not None:
        return set_limit(url, name, g, n, limit)
    if query is not None:
        rc, out = query_gpu(query, fmt, g, n, name)
        return (rc, out, "") if rc == 0 else (rc, "", out)
    if apps:
        return 0, compute_apps(fmt, g, n), ""
    return INVALID


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m gpuheal.sim.smi CONTROL_URL [--sim-gpu ALIAS] ARGS...", file=sys.stderr)
        return BAD_ARG
    try:
        rc, out, err = run(args)
    except ControlError as exc:
        print(f"Unable to determine the device handle: {exc}", file=sys.stderr)
        return 9  # nvidia-smi(1): "NVIDIA driver is not loaded" — the board cannot be reached
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
