"""Real nvidia-smi / rocm-smi output from ../shared/fixtures/smi/ (captured on real machines).

The nvidia captures are single-GPU machines; a multi-GPU host's answer to gpuheal's query is built
from them by taking each capture's real ``--query-gpu --format=csv`` row, picking gpuheal's fields
by the header's canonical names, dropping the units (what ``nounits`` does) and numbering the rows
0..N-1 as nvidia-smi numbers the GPUs of one host. Values and sentinels stay as the driver printed.
"""

from __future__ import annotations

from pathlib import Path

from gpuheal.parse.smi import QUERY_GPU_FIELDS

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "smi"
if not FIXTURES.is_dir():  # worktrees live at /work/wt/NAME, the main checkout at /work/main
    FIXTURES = Path("/work/shared/fixtures/smi")

NVIDIA_CAPTURES = sorted(p.name for p in FIXTURES.glob("linux-*nvidia*.txt")) if FIXTURES.is_dir() else []
ROCM_CAPTURES = sorted(p.name for p in FIXTURES.glob("rocm-smi__*.json")) if FIXTURES.is_dir() else []

_CANONICAL = {"temperature.gpu": "temperature.gpu", "memory.used": "memory.used [MiB]",
              "memory.total": "memory.total [MiB]", "utilization.gpu": "utilization.gpu [%]",
              "power.draw": "power.draw [W]", "power.limit": "power.limit [W]"}
_UNITS = (" MiB", " W", " %", " MHz")


def query_gpu_row(capture: str, phase: str = "load") -> dict[str, str]:
    """gpuheal's fields from one capture's real ``--query-gpu`` CSV (``phase``: idle | load)."""
    lines = (FIXTURES / capture).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"# {phase} :: query-gpu (csv") and lines[i + 1].startswith("# $ nvidia-smi --query-gpu="):
            header = [h.strip() for h in lines[i + 3].split(", ")]
            values = [v.strip() for v in lines[i + 4].split(", ")]
            row = dict(zip(header, values, strict=False))
            out = {"index": row["index"], "name": row["name"]}
            for field in QUERY_GPU_FIELDS[2:]:
                value = row[_CANONICAL[field]]
                for unit in _UNITS:
                    value = value.removesuffix(unit)
                out[field] = value
            return out
    raise LookupError(f"{capture}: no {phase} query-gpu section")


def multi_gpu_csv(captures: list[str], phase: str = "load") -> str:
    """``nvidia-smi --query-gpu=<gpuheal's fields> --format=csv,noheader,nounits`` of one host
    holding the captured GPUs, in order, as indexes 0..N-1."""
    out = []
    for index, capture in enumerate(captures):
        row = query_gpu_row(capture, phase)
        row["index"] = str(index)
        out.append(", ".join(row[f] for f in QUERY_GPU_FIELDS))
    return "\n".join(out) + "\n"


def rocm_json(capture: str) -> str:
    return (FIXTURES / capture).read_text(encoding="utf-8")
