"""Parse what ``nvidia-smi``, ``rocm-smi``/``amd-smi`` and ``ps`` print (formats.md §2, §3). Pure.

Used for Rule 2's VRAM snapshot ("Log VRAM snapshot with process list") and Rule 7's fallback
("direct nvidia-smi/rocm-smi probe via SSH if all API paths fail"). Every field may be a bracketed
sentinel (``[N/A]``, ``[Not Supported]``); every line may be junk. Nothing here raises on input:
numbers go through :mod:`gpuheal.parse.values` (ASCII decimal only — ``'1²234'`` and ``'³0'`` pass
``str.isdigit()`` but are not numbers; more than 64 characters is not a number), and every string
kept is bounded and valid UTF-8.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gpuheal.parse.gpu_data import LIMITS
from gpuheal.parse.values import clean_text, number_text, parse_integer

PID_MAX = 2**22  # Linux's pid_max ceiling


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_mb: float | None = None
    user: str | None = None
    rss_mb: float | None = None


def _value(text: str, hi: float | None = None) -> float | None:
    text = text.strip()
    if text.startswith("["):
        return None
    text = re.sub(r"\s*(MiB|W|%|MHz|C)$", "", text)
    return number_text(text, hi=hi)


def parse_compute_apps(text: str) -> list[GpuProcess]:
    """``nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits``.

    Split ``pid`` from the left and ``used_memory`` from the right, so a process name containing
    ", " survives (formats.md §2.3). A header line, blank lines and junk are skipped.
    """
    out: list[GpuProcess] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.lower().startswith("pid"):
            continue
        head, _, rest = line.partition(", ")
        name, _, mem = rest.rpartition(", ")
        pid = parse_integer(head, lo=1, hi=PID_MAX)
        if pid is None or not rest:
            continue
        if not name:  # only two columns
            name, mem = rest, ""
        used = _value(mem, hi=16 * 1024 * 1024.0) if mem else None
        out.append(GpuProcess(pid=pid, name=clean_text(name.strip()[:200]), used_mb=used))
    return out


QUERY_GPU_FIELDS = (
    "index",
    "name",
    "temperature.gpu",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "power.draw",
    "power.limit",
)


def parse_query_gpu(text: str) -> list[dict[str, float | str | None]]:
    """``nvidia-smi --query-gpu=<QUERY_GPU_FIELDS> --format=csv,noheader,nounits``, positionally."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(", ")]
        index = parse_integer(parts[0], hi=1023) if parts else None
        if len(parts) != len(QUERY_GPU_FIELDS) or index is None:
            continue
        rows.append(
            {
                "index": index,
                "name": clean_text(parts[1][:200]),
                "temp_c": _value(parts[2], LIMITS["temp_c"]),
                "vram_used_mb": _value(parts[3], LIMITS["vram_used_mb"]),
                "vram_total_mb": _value(parts[4], LIMITS["vram_total_mb"]),
                "util_pct": _value(parts[5], LIMITS["util_pct"]),
                "power_w": _value(parts[6], LIMITS["power_w"]),
                "power_limit_w": _value(parts[7], LIMITS["power_limit_w"]),
            }
        )
    return rows


THROTTLE_BITS = {
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",
    0x20: "sw-thermal-slowdown",
    0x40: "hw-thermal-slowdown",
    0x80: "hw-power-brake",
}


def decode_throttle(mask: str) -> list[str]:
    """``0x0000000000000024`` → ["sw-power-cap", "sw-thermal-slowdown"]; sentinels → []."""
    text = mask.strip().lower() if isinstance(mask, str) else ""
    text = text[2:] if text.startswith("0x") else text
    if not text or len(text) > 32 or not re.fullmatch(r"[0-9a-f]+", text):
        return []
    value = int(text, 16)
    return [name for bit, name in THROTTLE_BITS.items() if value & bit]


def _first_json(text: str):
    """amd-smi may print warnings before the JSON (formats.md §3.5): start at the first { or [."""
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        return None
    try:
        return json.loads(text[min(starts) :])
    except (ValueError, RecursionError):
        return None


def parse_rocm_smi(text: str) -> list[dict[str, float | str | None]]:
    """``rocm-smi --showtemp --showmeminfo vram --showuse --showpower --json`` (all values strings,
    memory in bytes). On APUs (Strix Halo) the model lives in GTT: when GTT figures exist and VRAM
    is a small carve-out, GTT is reported as the usable memory (formats.md §3.4)."""
    doc = _first_json(text)
    if not isinstance(doc, dict):
        return []
    rows = []
    for card, values in sorted(doc.items()):
        if not isinstance(values, dict) or not str(card).startswith("card"):
            continue

        lowered = {str(k).lower(): v for k, v in values.items()}

        def get(*keys: str, _vals: dict = lowered) -> float | None:
            for key in keys:
                raw = _vals.get(key.lower())
                if isinstance(raw, str):  # rocm-smi prints every value as a string
                    return number_text(raw)
                if raw is not None:
                    return None  # a wrong type is not known, never guessed at
            return None

        vram_total = get("VRAM Total Memory (B)")
        vram_used = get("VRAM Total Used Memory (B)")
        gtt_total = get("GTT Total Memory (B)")
        gtt_used = get("GTT Total Used Memory (B)")
        temp = get("Temperature (Sensor junction) (C)", "Temperature (Sensor edge) (C)")
        power = get("Current Socket Graphics Package Power (W)", "Average Graphics Package Power (W)")
        util = get("GPU use (%)")
        if gtt_total and (vram_total is None or vram_total < gtt_total / 4):
            vram_total, vram_used = gtt_total, gtt_used
        rows.append(
            {
                "card": clean_text(str(card)[:64]),
                "temp_c": _within(temp, "temp_c"),
                "power_w": _within(power, "power_w"),
                "util_pct": _within(util, "util_pct"),
                "vram_total_mb": _within(vram_total / 1048576 if vram_total is not None else None, "vram_total_mb"),
                "vram_used_mb": _within(vram_used / 1048576 if vram_used is not None else None, "vram_used_mb"),
            }
        )
    return rows


def _within(value: float | None, key: str) -> float | None:
    return value if value is not None and 0 <= value <= LIMITS[key] else None


def parse_ps(text: str) -> list[GpuProcess]:
    """``ps -eo pid,user,rss,args`` → processes (rss in MB). The header and junk lines are skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4:
            continue
        pid = parse_integer(parts[0], lo=1, hi=PID_MAX)
        rss_kb = parse_integer(parts[2], hi=2**50)
        if pid is None or rss_kb is None:
            continue
        out.append(
            GpuProcess(
                pid=pid,
                user=clean_text(parts[1][:64]),
                rss_mb=round(rss_kb / 1024, 1),
                name=clean_text(parts[3].strip()[:300]),
            )
        )
    return out


def row_index(row: dict[str, float | str | None]) -> int | None:
    """The GPU index of one parsed smi row: nvidia-smi's ``index`` column, or rocm-smi's card
    number (``card1`` → 1: rocm-smi's device index, formats.md §3.1)."""
    index = row.get("index")
    if isinstance(index, int) and not isinstance(index, bool):
        return index
    card = row.get("card")
    if isinstance(card, str) and card.startswith("card") and card[4:].isascii() and card[4:].isdigit():
        return int(card[4:]) if len(card) <= 8 else None
    return None


def select_row(
    rows: list[dict[str, float | str | None]], gpu_index: int | None
) -> dict[str, float | str | None] | None:
    """The row of one configured GPU, matched by (host, index) (contract "Direct sensing"):
    ``gpu_index`` given → the row with that index, or ``None`` when the host has no such GPU;
    not given → the host's only GPU, or index 0 when it reports several. Never blindly row 0: on a
    two-GPU host row 0 is the other GPU's reading (issue 12)."""
    if gpu_index is None:
        if len(rows) == 1:
            return rows[0]
        gpu_index = 0
    matches = [row for row in rows if row_index(row) == gpu_index]
    return matches[0] if len(matches) == 1 else None
