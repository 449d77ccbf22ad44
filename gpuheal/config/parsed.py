"""The parsed config texts, remembered in the state directory so that cron's next run of the same
text skips PyYAML (issue 19, "Performance": "cached compiled config").

cron starts gpuheal every minute, and the config and ``defaults.yaml`` rarely change. Importing
PyYAML costs ~10-20 ms of each start (its reader and resolver compile ~20 regular expressions) and
parsing the two texts a few more; a JSON decode of the same data costs well under a millisecond.
So the plain data each text parsed into is kept in :data:`CACHE_FILE`, keyed by a SHA-256 of the
text and of the code that parses it (``yamlsafe.py`` and this file's :data:`FORMAT`): an edited
config, a new ``defaults.yaml`` or new parsing rules miss the cache and are parsed in full. A JSON
config (what a generated fleet usually is) is not kept: ``json`` parses it as fast as the cache
would, and its offsets would add ~2 MB to the state directory of a 10,000-GPU fleet (issue 13: <= 5 MB).

No string of the config is ever written there (a config may hold ``litellm.api_key`` or another
secret inline; house rule: "secrets never written"): every string, key or value, is stored as the
offsets of the same characters in the text itself, which a run reads anyway and whose digest is the
key. A text with a string that does not appear verbatim in it (an escape sequence, a folded block)
is parsed every run, as is one whose data holds anything but strings, finite numbers, booleans,
null, lists and string-keyed mappings (a YAML date, ``1`` against ``1.0`` against ``true`` stay
apart). A missing, torn or hostile cache file is a miss, never an error. Errors are never cached: a
text that fails to parse fails every run with its own message. ``config validate`` passes no state
directory and always parses in full.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

CACHE_FILE = ".config-parsed.json"
FORMAT = 2  # bump when the cached form changes
_SALTS = (Path(__file__).resolve().with_name("yamlsafe.py"),)  # the parsing rules a cached result follows


class ParsedTexts:
    """The cache of one run: :meth:`parse` answers from it or parses, :meth:`save` keeps this run's
    entries (so the file holds the config and the defaults, never a growing list)."""

    def __init__(self, cache_dir: Path | None) -> None:
        self.cache_dir = cache_dir
        self.known: dict[str, str] = _read(cache_dir) if cache_dir is not None else {}
        self.used: dict[str, str] = {}
        self.changed = False
        self._salt: bytes | None = None

    def parse(self, text: str, parser: Callable[[str], Any]) -> Any:
        """``parser(text)``, or the data it gave for this text before. The result is the caller's
        own (a fresh copy each call)."""
        if self.cache_dir is None:
            return parser(text)
        key = self._digest(text)
        cached = self.known.get(key)
        if cached is not None:
            try:
                data = decode(json.loads(cached), text)
            except (ValueError, TypeError, IndexError, RecursionError):
                data = None
            else:
                self.used[key] = cached
                return data
        data = parser(text)
        try:
            stored = encode(data, text)
        except NotCached:
            return data
        self.used[key] = json.dumps(stored, allow_nan=False, separators=(",", ":"))
        self.changed = True
        return data

    def save(self) -> None:
        """Best effort, outside the state lock, as the schema marker: temp file + rename."""
        if not self.changed or self.cache_dir is None or not self.cache_dir.is_dir():
            return
        from gpuheal.atomic import write_atomic

        try:
            write_atomic(self.cache_dir / CACHE_FILE, [json.dumps({"format": FORMAT, "texts": self.used})])
        except OSError:
            pass

    def _digest(self, text: str) -> str:
        import hashlib

        if self._salt is None:
            self._salt = b"".join(_read_bytes(path) for path in _SALTS) + b"format %d" % FORMAT
        return hashlib.sha256(self._salt + b"\0" + text.encode("utf-8", "surrogatepass")).hexdigest()


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _read(cache_dir: Path) -> dict[str, str]:
    """The cached entries, or none for a missing, unreadable or malformed file."""
    try:
        doc = json.loads((cache_dir / CACHE_FILE).read_bytes())
    except (OSError, ValueError):
        return {}
    texts = doc.get("texts") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    if not isinstance(texts, dict):
        return {}
    return {k: v for k, v in texts.items() if isinstance(k, str) and isinstance(v, str)}


class NotCached(Exception):
    """A value the cache does not keep (the text is then parsed every run)."""


def encode(data: Any, text: str) -> Any:
    """``data`` with every string replaced by ``["s", start, end]``, the offsets of the same
    characters in ``text``; lists as ``["l", item, ...]``, mappings as ``["d", key, value, ...]``.
    Raises :class:`NotCached` when some value cannot be stored so (see the module docstring)."""
    cursor = [0]  # strings come mostly in the text's order: look from the last one found first

    def walk(value: Any, depth: int) -> Any:
        kind = type(value)
        if value is None or kind is bool or kind is int or (kind is float and math.isfinite(value)):
            return value
        if kind is str:
            start = text.find(value, cursor[0])
            if start < 0:
                start = text.find(value)
            if start < 0:
                raise NotCached
            cursor[0] = start + len(value)
            return ["s", start, start + len(value)]
        if depth > 100:
            raise NotCached
        if kind is list:
            return ["l", *(walk(item, depth + 1) for item in value)]
        if kind is dict and all(type(k) is str for k in value):
            return ["d", *(part for k, v in value.items() for part in (walk(k, depth + 1), walk(v, depth + 1)))]
        raise NotCached  # a date, bytes, a set, a non-string key, NaN

    return walk(data, 0)


def decode(stored: Any, text: str) -> Any:
    """The data :func:`encode` stored, its strings cut from ``text``. Raises ValueError, TypeError or
    IndexError for anything it did not write."""
    if stored is None or type(stored) in (bool, int, float):
        return stored
    if type(stored) is not list or not stored:
        raise ValueError("not an encoded value")
    tag, rest = stored[0], stored[1:]
    if tag == "s" and len(rest) == 2 and all(type(i) is int for i in rest) and 0 <= rest[0] <= rest[1] <= len(text):
        return text[rest[0] : rest[1]]
    if tag == "l":
        return [decode(item, text) for item in rest]
    if tag == "d" and len(rest) % 2 == 0:
        out = {}
        for i in range(0, len(rest), 2):
            key = decode(rest[i], text)
            if type(key) is not str:
                raise ValueError("a mapping key that is not a string")
            out[key] = decode(rest[i + 1], text)
        return out
    raise ValueError("not an encoded value")
