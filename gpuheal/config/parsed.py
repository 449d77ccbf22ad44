"""The parsed config texts, remembered in the state directory so that cron's next run of the same
text skips PyYAML (issue 19, "Performance": "cached compiled config").

cron starts gpuheal every minute, and the config and ``defaults.yaml`` rarely change. Importing
PyYAML costs ~10-20 ms of each start (its reader and resolver compile ~20 regular expressions) and
parsing the two texts a few more; a JSON decode of the same data costs well under a millisecond.
So the plain data each text parsed into is kept as JSON in :data:`CACHE_FILE`, keyed by a SHA-256
of the text and of the code that parses it (``yamlsafe.py`` and this file's :data:`FORMAT`): an
edited config, a new ``defaults.yaml`` or new parsing rules miss the cache and are parsed in full.

Only what JSON gives back exactly is kept: a text whose data holds anything else (a YAML date, a
non-string key, ``1`` against ``1.0`` against ``true``) is parsed every run, as before. A missing,
torn or hostile cache file is a miss, never an error (a hit is a digest match, so a cache that
lies can only hold data some text parsed into). Errors are never cached: a text that fails to
parse fails every run with its own message. ``config validate`` passes no state directory and
always parses in full.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

CACHE_FILE = ".config-parsed.json"
FORMAT = 1  # bump when the cached form changes
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
                data = json.loads(cached)
            except ValueError:
                data = None
            else:
                self.used[key] = cached
                return data
        data = parser(text)
        dumped = _exact_json(data)
        if dumped is not None:
            self.used[key] = dumped
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


def _exact_json(data: Any) -> str | None:
    """``data`` as JSON text when decoding it gives back exactly ``data`` (the same types all the
    way down); None otherwise."""
    try:
        dumped = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError):  # a date, bytes, a set, NaN
        return None
    return dumped if same(json.loads(dumped), data) else None


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types throughout (``1 == 1.0 == True`` in Python, not here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
