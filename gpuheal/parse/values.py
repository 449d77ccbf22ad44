"""The one strict reader of untrusted values, shared by every parser (issue 9, point 2). Pure.

Every source gpuheal reads — gpu-monitor's document, ``nvidia-smi`` CSV, ``rocm-smi`` JSON,
llama-server's ``/health``, ``/props``, ``/metrics``, ``/slots`` and completion ``timings``,
LiteLLM, Prometheus — is untrusted (contract: "wrong types, NaN, negative numbers, garbage ... are
each reported as a data-source fault"). The rules are the same everywhere, so they live here once:

* **Type.** A JSON number field must be a JSON number: ``"temp_c": "99"`` is not 99 °C but a fault.
  ``bool`` is never a number (``True == 1`` in Python). Text formats (CSV, Prometheus exposition,
  rocm-smi's all-string JSON) go through :func:`parse_decimal`, which takes ASCII decimal notation
  only: ``'1²234'`` and ``'³0'`` pass ``str.isdigit()`` and then break ``int()``; here they are
  simply not numbers.
* **Finiteness.** NaN and ±Infinity (which ``json.loads`` accepts) are not readings.
* **Size.** An integer of 400 digits is compared as an integer, never converted to ``float`` first
  (``OverflowError``); a text of more than :data:`MAX_NUMBER_CHARS` characters is not parsed at all
  (``int()`` refuses more than 4,300 digits with ``ValueError``, and parsing is quadratic below it).
* **Range and unit.** Each caller gives the physical range of its field (``temp_c`` 0..200); the
  unit is in the field's name, and a value outside the range is garbage, not a measurement.
* **Text.** Strings are bounded and made valid UTF-8 (a lone surrogate such as ``"\\ud800"`` is
  valid JSON but cannot be encoded: it is replaced by U+FFFD), so every string that reaches output
  can be printed.

A value that is absent (missing key or JSON ``null``) is "not known" without a fault; a value that
is present but wrong is "not known" *and* a problem that names the field (:class:`Fields`).
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from math import isfinite
from typing import Any, TypeVar

_T = TypeVar("_T")

MAX_NUMBER_CHARS = 64  # "-1.7976931348623157e+308" is 24; anything longer is not a reading
MAX_TEXT_CHARS = 200
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,4})?", re.ASCII)
_INTEGER = re.compile(r"[+-]?\d+", re.ASCII)
_FLOAT_EXACT = 2**53  # every int within ±2**53 is a float exactly


class Bad:
    """Marker for "present but wrong": ``reason`` says what was wrong (never the whole value)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Bad({self.reason!r})"


def sub_object(doc: dict[str, Any], key: str) -> dict[str, Any]:
    """The JSON object under ``key`` of an untrusted document (an answer, a state file), or an empty
    one when it is missing or not an object: the reader then finds each field "not known"."""
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def shown(raw: Any) -> str:
    """A short, printable description of a bad value. Never ``str()`` of a nested one (a deep
    list recurses) nor of a huge int (``repr`` of more than 4,300 digits raises)."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, str):
        return repr(clean_text(raw[:40]))
    if isinstance(raw, int):
        digits = int_digits(raw)
        return repr(raw) if digits <= 40 else f"an integer of {digits} digits"
    if isinstance(raw, float):
        return repr(raw)
    names = {dict: "object", list: "array", type(None): "null"}
    return f"a JSON {names.get(type(raw), type(raw).__name__)}"


def int_digits(value: int) -> int:
    """Decimal digits of ``value`` without converting it to text (``str()`` refuses > 4,300)."""
    n = abs(value)
    return max(1, math.floor(n.bit_length() * 0.30103) + 1) if n else 1


# --------------------------------------------------------------------------- numbers


def check_number(
    raw: Any, *, lo: float | None = 0.0, hi: float | None = None, integer: bool = False
) -> float | int | Bad | None:
    """A JSON number within [lo, hi] (``integer``: also whole) → the value; absent → ``None``;
    anything else → :class:`Bad`. Integers are returned as ``int``, the rest as ``float``."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return Bad(f"{shown(raw)} is not a number")
    if isinstance(raw, float):
        if not math.isfinite(raw):
            return Bad(f"{shown(raw)} is not a finite number")
        if integer:
            if raw != int(raw):
                return Bad(f"{raw!r} is not a whole number")
            raw = int(raw)
    # int compared with float bounds is exact in Python and never overflows
    if (lo is not None and raw < lo) or (hi is not None and raw > hi):
        return Bad(f"{shown(raw)} is out of range {_range(lo, hi)}")
    if integer:
        return int(raw)
    try:
        return float(raw)
    except OverflowError:  # an int past 1.8e308 with no upper bound given
        return Bad(f"{shown(raw)} is too large")


def parse_decimal(text: Any) -> float | None:
    """ASCII decimal notation (``64``, ``-1.5``, ``2.5e3``) → a finite float, else ``None``.

    For text formats only (CSV, exposition, rocm-smi's strings). Not ``float()`` directly: that
    also reads ``'nan'``, ``'inf'``, ``'1_000'`` and non-ASCII digits (``'٣'``)."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not text or len(text) > MAX_NUMBER_CHARS or not _DECIMAL.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def parse_integer(text: Any, *, lo: int | None = 0, hi: int | None = None) -> int | None:
    """ASCII decimal integer text within [lo, hi] → ``int``, else ``None`` (``'³0'`` → None)."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not text or len(text) > MAX_NUMBER_CHARS or not _INTEGER.fullmatch(text):
        return None
    value = int(text)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        return None
    return value


def number_text(text: Any, *, lo: float | None = 0.0, hi: float | None = None) -> float | None:
    """:func:`parse_decimal` within [lo, hi]; ``None`` otherwise."""
    value = parse_decimal(text)
    if value is None or (lo is not None and value < lo) or (hi is not None and value > hi):
        return None
    return value


def _range(lo: float | None, hi: float | None) -> str:
    def fmt(x: float | None) -> str:
        return "" if x is None else (str(int(x)) if float(x).is_integer() else str(x))

    return f"[{fmt(lo)}..{fmt(hi)}]"


# --------------------------------------------------------------------------- text and time


def clean_text(value: str) -> str:
    """``value`` made encodable as UTF-8: lone surrogates become U+FFFD."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in value)


def printable(text: object, limit: int | None = 200) -> str:
    """A peer's text made safe to show (a fault detail, a log line, a table cell): every character
    that is not printable (ANSI escapes, newlines, lone surrogates) becomes a space, runs of
    whitespace one space, at most ``limit`` characters. The one copy every source, the doctor and
    the renderers use (issue 19 item 6)."""
    shown = " ".join("".join(ch if ch.isprintable() else " " for ch in str(text)).split())
    return shown if limit is None else shown[:limit]


def check_text(raw: Any, max_len: int = MAX_TEXT_CHARS) -> str | Bad | None:
    """A non-blank JSON string, bounded and valid UTF-8; absent or blank → ``None``."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        return Bad(f"{shown(raw)} is not a string")
    if not raw.strip():
        return None
    return clean_text(raw[:max_len])


def check_bool(raw: Any) -> bool | Bad | None:
    if raw is None:
        return None
    if not isinstance(raw, bool):
        return Bad(f"{shown(raw)} is not true or false")
    return raw


def check_time(raw: Any) -> datetime | Bad | None:
    """An ISO 8601 timestamp (a naive one is UTC); absent → ``None``."""
    from gpuheal.clock import parse_iso

    if raw is None:
        return None
    if not isinstance(raw, str) or len(raw) > 64:
        return Bad(f"{shown(raw)} is not an ISO 8601 time")
    try:
        return parse_iso(clean_text(raw))
    except (ValueError, OverflowError):  # year 1 at +01:00 overflows when moved to UTC
        return Bad(f"{shown(raw)} is not an ISO 8601 time")


# --------------------------------------------------------------------------- one JSON object


class Fields:
    """Reads the fields of one untrusted JSON object; each wrong field adds one problem naming
    it (``gpus[0].temp_c: '99' is not a number``) and reads as ``None`` ("not known")."""

    def __init__(self, obj: Any, where: str, problems: list[str]) -> None:
        self.obj = obj if isinstance(obj, dict) else {}
        self.where = where
        self.problems = problems

    def _keep(self, key: str, value: _T | Bad | None) -> _T | None:
        if isinstance(value, Bad):
            self.problems.append(f"{self.path(key)}: {value.reason}")
            return None
        return value

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    # number, count, text and flag first take the common case — a JSON float or int in range, an ASCII
    # string, a bool — at once (issue 29: a 100-GPU gpu-monitor document is ~1,000 fields a poll); anything
    # else goes the general way (``_number``, ...), which is the reference: tests/test_values_fast_path.py requires
    # the same value and the same problems of both, whatever the value.

    def number(self, key: str, *, lo: float | None = 0.0, hi: float | None = None) -> float | None:
        raw: Any = self.obj.get(key)
        kind = type(raw)
        if kind is float:
            if isfinite(raw) and (lo is None or raw >= lo) and (hi is None or raw <= hi):
                return raw  # type: ignore[no-any-return]
        elif kind is int and -_FLOAT_EXACT <= raw <= _FLOAT_EXACT and (lo is None or raw >= lo) and (
                hi is None or raw <= hi):
            return float(raw)  # never past float's range
        return self._number(key, raw, lo, hi)

    def _number(self, key: str, raw: Any, lo: float | None, hi: float | None) -> float | None:
        value = self._keep(key, check_number(raw, lo=lo, hi=hi))
        return None if value is None else float(value)

    def count(self, key: str, *, hi: int = 10**9) -> int | None:
        raw: Any = self.obj.get(key)
        if type(raw) is int and 0 <= raw <= hi:
            return raw
        return self._count(key, raw, hi)

    def _count(self, key: str, raw: Any, hi: int) -> int | None:
        value = self._keep(key, check_number(raw, lo=0, hi=hi, integer=True))
        return None if value is None else int(value)  # an int already (integer=True)

    def text(self, key: str, max_len: int = MAX_TEXT_CHARS) -> str | None:
        """The string, bounded; a lone surrogate is replaced (kept readable) and noted as a fault."""
        raw: Any = self.obj.get(key)
        if type(raw) is str and raw.isascii():  # valid UTF-8 as it is: nothing to replace
            return raw[:max_len] if raw.strip() else None
        return self._text(key, raw, max_len)

    def _text(self, key: str, raw: Any, max_len: int) -> str | None:
        value = self._keep(key, check_text(raw, max_len))
        if value is not None and isinstance(raw, str) and value != raw[:max_len]:
            self.problems.append(f"{self.path(key)}: not valid Unicode (lone surrogate replaced by U+FFFD)")
        return value

    def flag(self, key: str) -> bool | None:
        raw: Any = self.obj.get(key)
        if type(raw) is bool:
            return raw
        return self._flag(key, raw)

    def _flag(self, key: str, raw: Any) -> bool | None:
        return self._keep(key, check_bool(raw))

    def time(self, key: str) -> datetime | None:
        return self._keep(key, check_time(self.obj.get(key)))

    def mapping(self, key: str) -> dict[str, Any] | None:
        raw: Any = self.obj.get(key)
        if raw is None or isinstance(raw, dict):
            return raw
        self._keep(key, Bad(f"{shown(raw)} is not an object"))
        return None

    def array(self, key: str) -> list[Any] | None:
        raw: Any = self.obj.get(key)
        if raw is None or isinstance(raw, list):
            return raw
        self._keep(key, Bad(f"{shown(raw)} is not an array"))
        return None
