"""``--json`` text: exactly ``json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False)``, fast.

With ``indent`` the standard library falls back to its pure-Python encoder; for ``check --json``
at 10,000 GPUs (a 3.7 MB document: 10,000 rows of a dozen scalars) that was ~0.45 s of the run
(issue 13's benchmark). Here every container whose items are all scalars — the GPU rows, the
issues' ``detected`` maps — goes through the C encoder, whose item separator carries the newline
and the indentation; only the few containers above them are walked in Python. JSON text has no
raw newline inside a string, so the two agree byte for byte (``tests/test_jsontext.py``).

A container of scalars with a few nested containers among them (a GPU row with its ``provenance``, issue
19) goes through the C encoder too: each nested value is swapped for a placeholder string, the row is
encoded whole, and each placeholder's text is replaced by its value's own text, one level deeper. The
placeholder carries a random token drawn per document, so no string from the network can forge one.
Walked item by item in Python, those rows were ~1 s of the 10,000-GPU check.
"""

from __future__ import annotations

import json
import secrets
from functools import cache
from typing import Any

_SCALARS = (str, int, float, type(None))  # bool is an int


def dumps(doc: Any, indent: int = 2) -> str:
    """``doc`` as ``json.dumps(doc, indent=indent, ensure_ascii=False, allow_nan=False)`` writes it."""
    out: list[str] = []
    _encode(doc, 0, indent, out, "\x00" + secrets.token_hex(8))
    return "".join(out)


@cache
def _encoder(pad: str | None) -> json.JSONEncoder:
    """The C encoder: for one container of scalars whose items sit at indentation ``pad``, or (None)
    for a scalar."""
    separators = (", ", ": ") if pad is None else (",\n" + pad, ": ")
    return json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=separators)


def _encode(obj: Any, depth: int, indent: int, out: list[str], token: str) -> None:
    outer = " " * (indent * depth)
    if isinstance(obj, _SCALARS):
        out.append(_encoder(None).encode(obj))
        return
    keyed = isinstance(obj, dict)
    if not (keyed or isinstance(obj, list | tuple)) or (keyed and not all(isinstance(k, str) for k in obj)):
        # what only json's own rules cover (keys that are not strings, types it refuses): its text,
        # shifted to this depth (the only newlines in JSON text are its layout)
        out.append(json.dumps(obj, indent=indent, ensure_ascii=False, allow_nan=False).replace("\n", "\n" + outer))
        return
    if not obj:
        out.append("{}" if keyed else "[]")
        return
    inner = outer + " " * indent
    values = list(obj.values() if keyed else obj)
    nested = [i for i, v in enumerate(values) if not isinstance(v, _SCALARS)]
    if 2 * len(nested) > len(values):  # mostly containers: walk them
        _walk(obj, keyed, depth, indent, out, token)
        return
    slots = {i: f"{token}{i}\x00" for i in nested}
    flat = [slots.get(i, v) for i, v in enumerate(values)]
    text = _encoder(inner).encode(dict(zip(obj, flat, strict=True)) if keyed else flat)
    for i in nested:
        sub: list[str] = []
        _encode(values[i], depth + 1, indent, sub, token)
        text = text.replace(_encoder(None).encode(slots[i]), "".join(sub), 1)
    out.append(f"{text[0]}\n{inner}{text[1:-1]}\n{outer}{text[-1]}")


def _walk(obj: Any, keyed: bool, depth: int, indent: int, out: list[str], token: str) -> None:
    outer = " " * (indent * depth)
    inner = outer + " " * indent
    out.append("{" if keyed else "[")
    for i, item in enumerate(obj.items() if keyed else obj):
        out.append(("\n" if i == 0 else ",\n") + inner)
        if keyed:
            out.append(_encoder(None).encode(item[0]) + ": ")
            item = item[1]
        _encode(item, depth + 1, indent, out, token)
    out.append("\n" + outer + ("}" if keyed else "]"))
