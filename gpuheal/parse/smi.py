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
from typing import Any

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
    rows: list[dict[str, float | str | None]] = []
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


def _first_json(text: str) -> Any:
    """amd-smi may print warnings before the JSON (formats.md §3.5): start at the first { or [."""
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        return None
    try:
        return json.loads(text[min(starts) :])
    except (ValueError, RecursionError):
        return None


# AMD APUs, whose memory is system RAM handed out as GTT (formats.md §3.4): by gfx id, and by the
# marketing / code names rocm-smi prints in "Card Series" / "Card Model" / "Device Name".
APU_GFX = frozenset({"gfx902", "gfx909", "gfx90c", "gfx1033", "gfx1035", "gfx1036", "gfx1037", "gfx1103",
                     "gfx1150", "gfx1151", "gfx1152", "gfx1153"})
APU_NAMES = ("8060s", "8050s", "8040s", "890m", "880m", "860m", "840m", "780m", "760m", "740m", "680m", "660m",
             "610m", "strix", "phoenix", "hawk point", "krackan", "rembrandt", "raphael", "renoir", "cezanne",
             "lucienne", "barcelo", "picasso", "raven", "van gogh", "mendocino", "radeon graphics",
             "radeon vega mobile", "vega 8 graphics", "vega 11 graphics")
PRODUCT_KEYS = ("card series", "card model", "device name", "card sku", "marketing name")


def is_apu(product: str | None, gfx: str | None) -> bool | None:
    """Whether this AMD GPU is an APU (UMA: GTT is its memory), from what it *is* — the gfx id or
    the product name rocm-smi reports — never from a GTT/VRAM size ratio: a discrete MI100 reports
    GTT 3.93× its VRAM (issue 12). ``None`` when rocm-smi said neither."""
    if gfx:
        return gfx.strip().lower() in APU_GFX
    if product:
        name = product.lower()
        return any(word in name for word in APU_NAMES)
    return None


def parse_rocm_smi(text: str, unified: bool | None = None) -> list[dict[str, float | str | bool | None]]:
    """``rocm-smi --showproductname --showtemp --showmeminfo vram gtt --showuse --showpower --json``
    (all values strings, memory in bytes). On an APU (Strix Halo) the model lives in GTT, so GTT is
    reported as the GPU's memory; whether it is an APU comes from ``unified`` (the config's
    ``gpus[].unified_memory``) or else from the product (:func:`is_apu`). Each row also keeps
    ``gtt_total_mb`` / ``gtt_used_mb``, ``product``, ``gfx`` and the ``unified`` decision, so a
    per-GPU setting can be applied later (:func:`apply_unified`)."""
    doc = _first_json(text)
    if not isinstance(doc, dict):
        return []
    rows = []
    for card, values in sorted(doc.items()):
        if not isinstance(values, dict) or not str(card).startswith("card"):
            continue

        lowered = {str(k).lower(): v for k, v in values.items()}

        def get(*keys: str, _vals: dict[str, Any] = lowered) -> float | None:
            for key in keys:
                raw = _vals.get(key.lower())
                if isinstance(raw, str):  # rocm-smi prints every value as a string
                    return number_text(raw)
                if raw is not None:
                    return None  # a wrong type is not known, never guessed at
            return None

        def joined(*keys: str, _vals: dict[str, Any] = lowered) -> str | None:
            found = [v for k in keys if isinstance(v := _vals.get(k), str) and v.strip()]
            return clean_text(" ".join(found)[:200]) if found else None

        def mb(value: float | None, key: str) -> float | None:
            return _within(value / 1048576 if value is not None else None, key)

        product, gfx = joined(*PRODUCT_KEYS), joined("gfx version")
        row: dict[str, float | str | bool | None] = {
            "card": clean_text(str(card)[:64]),
            "temp_c": _within(get("Temperature (Sensor junction) (C)", "Temperature (Sensor edge) (C)"), "temp_c"),
            "power_w": _within(get("Current Socket Graphics Package Power (W)", "Average Graphics Package Power (W)"),
                               "power_w"),
            "util_pct": _within(get("GPU use (%)"), "util_pct"),
            "vram_total_mb": mb(get("VRAM Total Memory (B)"), "vram_total_mb"),
            "vram_used_mb": mb(get("VRAM Total Used Memory (B)"), "vram_used_mb"),
            "gtt_total_mb": mb(get("GTT Total Memory (B)"), "vram_total_mb"),
            "gtt_used_mb": mb(get("GTT Total Used Memory (B)"), "vram_used_mb"),
            "product": product,
            "gfx": gfx,
            "name": product,
        }
        rows.append(apply_unified(row, unified))
    return rows


Row = dict[str, float | str | bool | None]


def apply_unified(row: Row, unified: bool | None) -> Row:
    """The row with ``vram_*`` = GTT when the GPU is an APU (``unified``, else :func:`is_apu` of its
    product); the carve-out VRAM figures are kept as ``carveout_*``."""
    out = dict(row)
    product = out.get("product")
    gfx = out.get("gfx")
    apu = unified if unified is not None else is_apu(product if isinstance(product, str) else None,
                                                      gfx if isinstance(gfx, str) else None)
    out["unified"] = apu
    if apu and out.get("gtt_total_mb") is not None and "carveout_total_mb" not in out:
        out["carveout_total_mb"], out["carveout_used_mb"] = out.get("vram_total_mb"), out.get("vram_used_mb")
        out["vram_total_mb"], out["vram_used_mb"] = out["gtt_total_mb"], out.get("gtt_used_mb")
    return out


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


def parse_rocm_pids(text: str) -> tuple[list[GpuProcess], int] | None:
    """``rocm-smi --showpids --json``: the ``system`` object's ``"PID<pid>": "<name>, <gpus>,
    <vram bytes>, <sdma>, <cu occupancy>"`` entries (rocm_smi.py's showPids; a real MI100 capture
    holds ``"PID104225": "mlir-cpu-runner, 0, 0, 0, 0"``). The four numbers are split from the
    right, so a name with ", " survives; ``UNKNOWN`` VRAM is ``None``. Returns the processes and
    how many entries could not be read, or ``None`` when the output holds no such JSON at all."""
    doc = _first_json(text)
    system = doc.get("system") if isinstance(doc, dict) else None
    if not isinstance(system, dict):
        return None if not isinstance(doc, dict) else ([], 0)
    out: list[GpuProcess] = []
    unreadable = 0
    for key, value in system.items():
        if not (isinstance(key, str) and key.startswith("PID")):
            continue
        pid = parse_integer(key[3:], lo=1, hi=PID_MAX)
        parts = value.rsplit(", ", 4) if isinstance(value, str) else []
        if pid is None or len(parts) != 5:
            unreadable += 1
            continue
        vram_b = None if parts[2].strip().upper() == "UNKNOWN" else number_text(parts[2], hi=2.0**54)
        if vram_b is None and parts[2].strip().upper() != "UNKNOWN":
            unreadable += 1
            continue
        used_mb = round(vram_b / 1048576, 1) if vram_b is not None else None
        out.append(GpuProcess(pid=pid, name=clean_text(parts[0].strip()[:200]), used_mb=used_mb))
    return out, unreadable
