"""Mutated gpu-monitor documents (issue 9, "Done when"): shared by ``benchmarks/fuzz_monitor.py``
(2,000 documents through ``check``) and ``tests/test_fuzz_check.py`` (a smaller run in the suite).

Each document starts from a realistic one for the fleet ``ct8`` / ``ct110`` / ``ct15`` and gets
one to five mutations: a leaf replaced by a hostile value (the wrong JSON type, NaN, ±Infinity, a
400- or 5,000-digit integer, a lone surrogate, ``'1²234'``, a deep nesting, ...), a key deleted, a
container swapped for a scalar (``"available_models": 5``), an entry duplicated, and sometimes the
serialized bytes themselves cut, spliced or corrupted. Deterministic for a seed.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

HOSTS = {"gpu-dense": "ct8", "gpu-light": "ct110", "strix-moe": "ct15"}

BIG_400 = "__BIG_400__"
BIG_5000 = "__BIG_5000__"
NEG_BIG_400 = "__NEG_BIG_400__"
RAW = {BIG_400: "1" + "0" * 399, BIG_5000: "9" * 5000, NEG_BIG_400: "-" + "7" * 400}

HOSTILE: list[Any] = [
    "99", "64.5", "", " ", "NaN", "nan", "1²234", "³0", "٣", "RTX \ud800 3090", "\ud800", "\udfff x",
    "\x1b[31mred\x1b[0m", "[bold]x[/]", "ct8", "ct8 ", "CT8", "x" * 5000,
    float("nan"), float("inf"), float("-inf"), -1, -0.0, 0, 1e308, -1e308, 2**63, 2**64 + 1, 1e-320,
    BIG_400, BIG_5000, NEG_BIG_400, True, False, None,
    [], {}, [1, 2], {"v": 64}, [[[[[[[[[[1]]]]]]]]]], "2026-07-18T08:00:00Z", "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00", "yesterday", 14.5, 3, 1000,
]


def base_document(minute: int = 0) -> dict[str, Any]:
    """A healthy document for the three hosts, stamped ``minute`` minutes after 08:00."""
    stamp = f"2026-07-18T{8 + minute // 60 % 16:02d}:{minute % 60:02d}:00Z"
    gpus = [
        {"hostname": h, "name": "NVIDIA GeForce RTX 3090", "vendor": "nvidia", "temp_c": 60 + i, "vram_used_mb": 12000,
         "vram_total_mb": 24576, "util_pct": 40, "power_w": 200.5, "power_limit_w": 350, "index": 0}
        for i, h in enumerate(("ct8", "ct110"))
    ]
    return {
        "generated_at": stamp,
        "gpus": gpus,
        "benchmarks": {"ct8": {"current_tok_s": 74.9, "baseline_tok_s": 74.8, "measured_at": stamp}},
        "summary": {
            "available_models": [
                {"name": "gpu-dense", "hostname": "ct8", "requests_60s": 14, "failures_60s": 0, "consecutive_timeouts": 0},
                {"name": "gpu-light", "hostname": "ct110", "requests_60s": 9, "failures_60s": 1, "consecutive_timeouts": 0},
            ],
            "circuit_breakers_open": 1,
            "circuit_breakers": [{"model": "gpu-light", "hostname": "ct110", "open": True, "opened_at": stamp}],
        },
        "strix": {"running": True, "hostname": "ct15", "temp_c": 58, "vram_used_mb": 10240, "vram_total_mb": 65536},
    }


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


def mutate(doc: Any, rng: random.Random) -> Any:
    """One structural mutation of ``doc`` (in place where possible; returns the document)."""
    paths = _paths(doc)
    path = rng.choice(paths)
    op = rng.random()
    if op < 0.55 or not path:  # a leaf or a container replaced by something hostile
        value = rng.choice(HOSTILE)
        return _set(doc, path, copy.deepcopy(value)) if path else (doc if rng.random() < 0.9 else value)
    parent = _get(doc, path[:-1])
    if op < 0.70:  # a key or an entry deleted
        del parent[path[-1]]
    elif op < 0.80 and isinstance(parent, list):  # an entry duplicated (same hostname twice)
        parent.append(copy.deepcopy(parent[path[-1]]))
    elif op < 0.90:  # an unknown field added beside it
        if isinstance(parent, dict):
            parent[rng.choice(["extra", "temp_f", "gpus", "\ud800", ""])] = copy.deepcopy(rng.choice(HOSTILE))
        else:
            parent.insert(rng.randrange(len(parent) + 1), copy.deepcopy(rng.choice(HOSTILE)))
    else:  # the value's container type swapped
        value = parent[path[-1]]
        parent[path[-1]] = list(value.values()) if isinstance(value, dict) else {"0": value}
    return doc


def serialize(doc: Any) -> bytes:
    """JSON as a careless producer might write it: NaN allowed, huge integers as raw digits."""
    text = json.dumps(doc, allow_nan=True)
    for marker, digits in RAW.items():
        text = text.replace(json.dumps(marker), digits)
    return text.encode("utf-8", "surrogatepass")


def corrupt(body: bytes, rng: random.Random) -> bytes:
    """Damage the bytes: cut, splice junk (invalid UTF-8, NUL, control), or nest deeply."""
    op = rng.random()
    if op < 0.3:
        return body[: rng.randrange(len(body) + 1)]
    if op < 0.6:
        at = rng.randrange(len(body) + 1)
        junk = rng.choice([b"\xff\xfe", b"\x00", b"\x1b[2J", b"}", b"]", b",", b'"', b"\\u", b"\xed\xa0\x80"])
        return body[:at] + junk + body[at:]
    if op < 0.8:
        return b'{"gpus": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    return b"\xef\xbb\xbf" + body  # a UTF-8 byte order mark


def mutated_documents(n: int, seed: int = 9) -> list[bytes]:
    """``n`` mutated documents, deterministic for ``seed``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        doc: Any = base_document(i)
        for _ in range(rng.randint(1, 5)):
            doc = mutate(doc, rng)
        body = serialize(doc)
        if rng.random() < 0.15:
            body = corrupt(body, rng)
        out.append(body)
    return out


# --------------------------------------------------------------------------- running check on them


def run_in_process(argv: list[str], now: str) -> tuple[int, str, str]:
    """``gpuheal ARGV`` through :func:`gpuheal.cli.main` in this process (what the console script
    runs, minus the interpreter start): (exit code, stdout, stderr). ~50x faster than a subprocess,
    which is what lets 2,000 documents run in minutes on a small machine."""
    import contextlib
    import io
    import os

    from gpuheal.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = os.environ.get("GPUHEAL_NOW")
    os.environ["GPUHEAL_NOW"] = now
    code: Any = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
            except SystemExit as exc:
                code = exc.code
            except BaseException as exc:  # noqa: BLE001 - escaping cli.main at all is the finding
                import traceback

                err.write("Traceback (escaped cli.main)\n" + "".join(traceback.format_exception(exc)))
                code = -1
    finally:
        if old is None:
            os.environ.pop("GPUHEAL_NOW", None)
        else:
            os.environ["GPUHEAL_NOW"] = old
    return (code if isinstance(code, int) else 0), out.getvalue(), err.getvalue()


def judge(code: int, stdout: str, stderr: str, json_out: bool) -> str | None:
    """``None`` when the run is what the contract promises for a bad monitor document (a fault,
    exit 0/1/2, one valid UTF-8 JSON document with ``--json``); else what went wrong."""
    if "Traceback" in stderr:
        return "traceback"
    if "internal error" in stderr:
        return "internal error: " + stderr.split("internal error", 1)[1].splitlines()[0][:200]
    if code not in (0, 1, 2):
        return f"exit {code}: {stderr.strip()[:200]}"
    try:
        stdout.encode("utf-8")
        stderr.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"output is not valid UTF-8: {exc}"
    if json_out:
        try:
            doc = json.loads(stdout, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        except ValueError as exc:
            return f"--json is not one JSON document: {exc}"
        if not isinstance(doc, dict) or "gpus" not in doc:
            return "--json document has no 'gpus'"
        for alias, gpu in doc["gpus"].items():
            temp = gpu.get("temp_c")
            if temp is not None and not (isinstance(temp, int | float) and 0 <= temp <= 200):
                return f"{alias}.temp_c is {temp!r}"
    return None
