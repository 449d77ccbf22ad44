"""Parse llama-server's own telemetry: ``GET /metrics``, ``GET /slots`` and the ``n_ctx`` of
``GET /props`` (formats.md §1.3, §1.5; llama-server.md §5, §7). Pure.

``/metrics`` is Prometheus text (0.0.4) parsed by the real Prometheus text parser
(``prometheus_client``'s, imported lazily: cron starts gpuheal every minute and ``check`` is the only
command that needs it), never a regex. Only the unlabelled ``llamacpp:`` series gpuheal uses are
read; every other series is ignored. The body is untrusted:

* a body that is not exposition text at all (JSON-quoted text of builds ~b7010-b7100, HELP/TYPE
  garbage, binary junk) is :class:`InvalidMetrics` — a data fault, never a crash;
* a value that is NaN, ±Inf, negative or absurd, or a series that appears twice, is "not known"
  (``None``) plus a problem naming the series — never 0, so it can never look like a stalled decode.

``/slots`` is a JSON array, one object per slot; a slot that never ran has only ``id``, ``n_ctx``,
``speculative`` and ``is_processing``; ``next_token`` is an object in older builds and a list of
objects in b11312 (llama-server.md §5). Anything but a list is :class:`InvalidSlots`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from gpuheal.parse.values import printable

PREFIX = "llamacpp:"
# series name (without the prefix) -> field of ServerMetrics; counters and gauges gpuheal reads
SERIES = {
    "n_decode_total": "n_decode_total",
    "tokens_predicted_total": "tokens_predicted_total",
    "prompt_tokens_total": "prompt_tokens_total",
    "requests_processing": "requests_processing",
    "requests_deferred": "requests_deferred",
    "predicted_tokens_seconds": "predicted_tokens_seconds",
    "n_busy_slots_per_decode": "n_busy_slots_per_decode",
}
COUNT_FIELDS = frozenset({"requests_processing", "requests_deferred"})
VALUE_MAX = 1e15  # beyond any real counter (a 6-significant-digit double of a year of decoding)
MAX_SLOTS = 4096  # llama-server's -np is a small number; a longer list is not a slot list
# The largest per-slot context believed: 2**27 tokens (134 M) is far beyond any model's n_ctx_train
# today (10 M is the longest advertised); a bigger number is garbage, "not known".
MAX_N_CTX = 1 << 27
MAX_PROBLEMS = 5
# what to tell the operator when the server answers 501 (llama-server.md §7.3 B)
HOW_TO_ENABLE = {
    "metrics": "start llama-server with --metrics (or LLAMA_ARG_ENDPOINT_METRICS=1)",
    "slots": "start llama-server without --no-slots (or with --slots)",
}


class InvalidMetrics(ValueError):
    """The ``/metrics`` body is not Prometheus exposition text."""


class InvalidSlots(ValueError):
    """The ``/slots`` body is not a list of slots."""


@dataclass(frozen=True)
class ServerMetrics:
    """The llama-server counters and gauges gpuheal reads; ``None`` = not known (absent or bad)."""

    n_decode_total: float | None = None
    tokens_predicted_total: float | None = None
    prompt_tokens_total: float | None = None
    requests_processing: int | None = None
    requests_deferred: int | None = None
    predicted_tokens_seconds: float | None = None
    n_busy_slots_per_decode: float | None = None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Slots:
    """``/slots``: how many slots, how many are processing, and the tokens decoded by each busy one."""

    total: int
    busy: int | None
    n_decoded: tuple[int, ...] = ()   # per processing slot that reports it
    problems: tuple[str, ...] = ()


def parse_metrics(text: str, *, fast_path: bool = True) -> ServerMetrics:
    """Prometheus text → :class:`ServerMetrics`. Raises :class:`InvalidMetrics` only.

    ``fast_path``: read the plain lines a llama-server writes without the Prometheus parser — a body of
    nothing else by two regex passes over its whole text (:func:`_whole_body_samples`), else line by line
    (:func:`_plain_samples`); any other line sends the whole body through the parser.
    ``fast_path=False`` is the parser alone, which the property tests compare it with."""
    if not isinstance(text, str):
        raise InvalidMetrics("not text")
    stripped = text.lstrip()
    if stripped.startswith('"'):
        raise InvalidMetrics("JSON-quoted exposition text (llama.cpp ~b7010-b7100): not parseable")
    if "\x00" in text:
        raise InvalidMetrics("binary data, not exposition text")
    seen = _whole_body_samples(text) if fast_path else None
    if seen is None:
        keep, foreign = _wanted_lines(text)
        if not keep and foreign:
            raise InvalidMetrics("no llamacpp: series in the answer (not a llama-server /metrics)")
        seen = _plain_samples(keep) if fast_path else None
        if seen is None:
            seen = _parsed_samples("\n".join(keep) + ("\n" if keep else ""))
    values: dict[str, Any] = {}
    problems: list[str] = []
    for key, samples in seen.items():
        if len(samples) > 1:
            problems.append(f"{PREFIX}{key}: {len(samples)} samples of one series")
            continue
        value = _checked(samples[0], integer=key in COUNT_FIELDS)
        if value is None:
            problems.append(f"{PREFIX}{key}: {samples[0]!r} is not a valid reading")
            continue
        values[SERIES[key]] = value
    return ServerMetrics(**values, problems=tuple(problems[:MAX_PROBLEMS]))


def _parsed_samples(wanted: str) -> dict[str, list[float]]:
    """Every unlabelled sample of a series in :data:`SERIES`, by series, in the body's order —
    through the real Prometheus text parser."""
    text_string_to_metric_families = _text_parser()
    seen: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(wanted):
            for sample in family.samples:
                name = sample.name
                if not name.startswith(PREFIX) or sample.labels:
                    continue
                key = name[len(PREFIX):]
                if key in SERIES:
                    seen.setdefault(key, []).append(sample.value)
    except Exception as exc:  # noqa: BLE001 - the parser raises ValueError, IndexError, ... on junk
        raise InvalidMetrics(f"not Prometheus text: {type(exc).__name__}: {printable(str(exc)[:120])}") from None
    return seen


_WANTED_NAMES = frozenset(PREFIX + key for key in SERIES)
# "# TYPE <series> gauge|counter" exactly as llama-server writes it; a counter whose name does not
# end in _total is left to the parser (it renames such samples to <name>_total: not a series read)
_PLAIN_TYPES = frozenset(
    [f"# TYPE {name} gauge" for name in _WANTED_NAMES]
    + [f"# TYPE {name} counter" for name in _WANTED_NAMES if name.endswith("_total")]
)
# A decimal number in ASCII, as llama-server prints them (``383``, ``1.98956``, ``1.23457e+06``);
# NaN, Inf, hex, underscores, Unicode digits and the like are left to the parser.
_PLAIN_VALUE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _plain_samples(lines: list[str]) -> dict[str, list[float]] | None:
    """The fast path of :func:`parse_metrics` (issue 29: the chaos week parsed 144,000 bodies a
    100-GPU day, a quarter of its sensing time in the pure-Python parser): when every wanted line
    is a plain ``# TYPE <series> gauge|counter`` or ``<series> <decimal>`` line — a real
    llama-server's whole answer — the samples are what the parser would give, in the same order,
    with the value read as the parser reads it (``int``, else ``float``); otherwise ``None`` and
    the body goes through the parser. Equality with the parser is a property test
    (``tests/test_llama_metrics.py``) over random and real bodies."""
    seen: dict[str, list[float]] = {}
    for line in lines:
        if line[0] == "#":
            if line not in _PLAIN_TYPES:
                return None
            continue
        name, sep, value = line.partition(" ")
        if not sep or name not in _WANTED_NAMES or _PLAIN_VALUE.fullmatch(value) is None:
            return None
        try:
            number: float = int(value)
        except ValueError:
            number = float(value)
        seen.setdefault(name[len(PREFIX):], []).append(number)
    return seen


_HELP_OF_OURS = "# HELP " + PREFIX
# The series a llama-server (build b11312, llama-server.md §7) writes that gpuheal does not read: their
# TYPE lines and samples are passed over by one look-up each (see _wanted_lines)
_UNREAD = ("prompt_tokens_cached_total", "prompt_seconds_total", "tokens_predicted_seconds_total", "n_tokens_max",
           "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
           "spec_decode_num_drafts_total", "prompt_tokens_seconds")
_UNREAD_NAMES = frozenset(PREFIX + key for key in _UNREAD)
_UNREAD_TYPES = frozenset(f"# TYPE {name} {kind}" for name in _UNREAD_NAMES for kind in ("gauge", "counter"))
_PRIVATE_PACKAGE = "_gpuheal_prometheus_client"


def _alternatives(names: Iterable[str]) -> str:
    return "|".join(re.escape(name) for name in sorted(names))


_READ_KEYS = _alternatives(SERIES)
_UNREAD_KEYS = _alternatives(_UNREAD)
# One line of a llama-server's own answer, as :func:`_wanted_lines` and :func:`_plain_samples` sort and read it
# without the parser: a HELP line of a llamacpp: series (skipped), a plain TYPE line of a series read (kept, no
# sample) or of one not read (skipped), a plain sample of a series read (kept, read) or any sample of one not
# read (skipped).
_BODY_LINE = (
    rf"# HELP {PREFIX}[^\n]*"
    rf"|# TYPE {PREFIX}(?:{_READ_KEYS}) gauge"
    rf"|# TYPE {PREFIX}(?:{_alternatives(key for key in SERIES if key.endswith('_total'))}) counter"
    rf"|# TYPE {PREFIX}(?:{_UNREAD_KEYS}) (?:gauge|counter)"
    rf"|{PREFIX}(?:{_READ_KEYS}) {_PLAIN_VALUE.pattern}"
    rf"|{PREFIX}(?:{_UNREAD_KEYS}) [^\n]*"
)
_PLAIN_BODY = re.compile(rf"(?:(?:{_BODY_LINE})\n)*(?:{_BODY_LINE})?", re.ASCII)
# a sample of a series read, found after the line break before it (a body is searched with one put first): the
# regex engine looks for a literal start far faster than for one at every line's start
_READ_SAMPLE = re.compile(rf"\n{PREFIX}({_READ_KEYS}) ({_PLAIN_VALUE.pattern})(?=\n|\Z)", re.ASCII)
# every line break of str.splitlines but "\n" in ASCII (a body that is not ASCII goes line by line anyway)
_OTHER_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e")


def _whole_body_samples(text: str) -> dict[str, list[float]] | None:
    """The samples of a body made only of a llama-server's own plain lines (:data:`_BODY_LINE`, ``\\n``
    between them, ASCII), found by two passes of the regex engine over the whole text instead of a Python step
    per line (issue 29: ~45 lines a body, 100 bodies a poll of the 100-GPU chaos fleet, ~2/3 of them lines no
    one reads); ``None`` for any other body, which goes line by line (:func:`_wanted_lines`,
    :func:`_plain_samples`, the parser). What it returns is what :func:`_plain_samples` returns of
    :func:`_wanted_lines`' lines of that body (nothing foreign in it): the same series, samples and order
    (``tests/test_llama_metrics.py`` holds the property)."""
    if not text.isascii() or any(brk in text for brk in _OTHER_BREAKS) or _PLAIN_BODY.fullmatch(text) is None:
        return None
    seen: dict[str, list[float]] = {}
    for key, value in _READ_SAMPLE.findall("\n" + text):
        # _PLAIN_VALUE without a point or an exponent is [+-]?[0-9]+: what int() takes of it (_plain_samples)
        number: float = float(value) if "." in value or "e" in value or "E" in value else int(value)
        seen.setdefault(key, []).append(number)
    return seen


def _text_parser() -> Any:
    """``prometheus_client.parser.text_string_to_metric_families`` — the package's own parser
    module, loaded without the package's ``__init__``: that imports its HTTP server, exposition
    and collectors (~60-150 ms on every cron run of a fleet serving /metrics; issue 12 benchmark)
    while the parser needs three small modules of it. They are loaded under a private package
    name (a bare package with prometheus_client's ``__path__``), so ``import prometheus_client``
    anywhere else still gets the whole, untouched package.

    Why not the public ``from prometheus_client.parser import ...``: measured in a fresh process
    (issue 19, median of 9 on the shared build machine), 102 ms that way against 2.7 ms this way.
    The cost of the trick is that it leans on the package's layout (``parser`` importing only
    ``metrics_core``, ``samples`` and ``validation``): ``tests/test_llama_metrics.py::
    test_the_private_parser_is_exactly_prometheus_clients_and_parses_as_its_public_api`` fails on
    any release where that differs, and checks it parses exactly as the public API does."""
    import sys

    parser = sys.modules.get(_PRIVATE_PACKAGE + ".parser")
    if parser is None:
        import importlib
        import importlib.util
        import types

        spec = importlib.util.find_spec("prometheus_client")  # finds it; runs nothing
        if spec is None or not spec.submodule_search_locations:
            from prometheus_client.parser import text_string_to_metric_families  # ImportError as before

            return text_string_to_metric_families
        bare = types.ModuleType(_PRIVATE_PACKAGE)
        bare.__path__ = list(spec.submodule_search_locations)
        sys.modules.setdefault(_PRIVATE_PACKAGE, bare)
        parser = importlib.import_module(_PRIVATE_PACKAGE + ".parser")
    return parser.text_string_to_metric_families


def _wanted_lines(text: str) -> tuple[list[str], bool]:
    """The TYPE and sample lines of the series gpuheal reads, and whether there was anything
    else that is not a ``llamacpp:`` line. Only those go through the (pure-Python, ~10 µs a line)
    Prometheus parser: a 1000-GPU poll parses 1000 bodies (issue 12 benchmark). HELP lines are
    documentation, never read, and the parser's costliest (it scans them a character at a time):
    without them a body parses in ~0.16 ms instead of ~0.24.

    A llama-server's own lines are sorted first by one look-up each (issue 29: ~45 lines a body,
    1.4 million bodies a 100-GPU chaos week): a TYPE line or a sample of a series read is kept; a HELP
    line of a ``llamacpp:`` series, and the TYPE line or a sample of a series it writes but gpuheal
    does not read, are not; :func:`_sorted_line` says the same of each of them
    (``tests/test_llama_metrics.py``) and sorts every other line."""
    keep: list[str] = []
    foreign = False
    for line in text.splitlines():
        head = line.partition(" ")[0]
        if head in _WANTED_NAMES or line in _PLAIN_TYPES:
            keep.append(line)
        elif not (head in _UNREAD_NAMES or line.startswith(_HELP_OF_OURS) or line in _UNREAD_TYPES):
            verdict = _sorted_line(line)
            if verdict == "keep":
                keep.append(line)
            elif verdict == "foreign":
                foreign = True
    return keep, foreign


def _sorted_line(line: str) -> Literal["keep", "skip", "foreign"]:
    """One line of a ``/metrics`` body: a TYPE line or a sample of a series read (``keep``), a blank
    line, a HELP line of a series read or any other ``llamacpp:`` line (``skip``), or not a
    ``llamacpp:`` line at all (``foreign``)."""
    if not line.strip():
        return "skip"
    if line.startswith("#"):
        if line.startswith(_HELP_OF_OURS):  # documentation of a llamacpp: series: never kept, not foreign
            return "skip"
        parts = line.split(None, 3)
        name = parts[2] if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") else ""
        if name in _WANTED_NAMES and parts[1] == "HELP":
            return "skip"
    else:
        name = line.split(None, 1)[0].split("{", 1)[0]
    if name in _WANTED_NAMES:
        return "keep"
    return "skip" if name.startswith(PREFIX) else "foreign"


def parse_slots(doc: Any) -> Slots:
    """Decoded ``/slots`` JSON → :class:`Slots`. Raises :class:`InvalidSlots` only."""
    if not isinstance(doc, list):
        names = {dict: "an object", str: "a string", type(None): "null"}
        raise InvalidSlots(f"expected a list of slots, got {names.get(type(doc), type(doc).__name__)}")
    if len(doc) > MAX_SLOTS:
        raise InvalidSlots(f"{len(doc)} slots: more than {MAX_SLOTS} is not a slot list")
    busy = 0
    known = True
    decoded: list[int] = []
    problems: list[str] = []
    for i, slot in enumerate(doc):
        if not isinstance(slot, dict):
            problems.append(f"slots[{i}]: not an object")
            known = False
            continue
        processing = slot.get("is_processing")
        if not isinstance(processing, bool):
            problems.append(f"slots[{i}].is_processing: not true/false")
            known = False
            continue
        if processing:
            busy += 1
            n = _n_decoded(slot.get("next_token"))
            if n is not None:
                decoded.append(n)
    return Slots(total=len(doc), busy=busy if known else None, n_decoded=tuple(decoded),
                 problems=tuple(problems[:MAX_PROBLEMS]))


def _n_decoded(next_token: Any) -> int | None:
    """``next_token.n_decoded`` (older builds: an object; b11312: a list of objects)."""
    if isinstance(next_token, list):
        next_token = next_token[0] if next_token else None
    if not isinstance(next_token, dict):
        return None
    value = next_token.get("n_decoded")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= VALUE_MAX:
        return None
    return value


def _checked(value: Any, *, integer: bool) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    if not math.isfinite(number) or number < 0 or number > VALUE_MAX:
        return None
    if integer:
        return int(number) if number == int(number) else None
    return number


def known_n_ctx(value: object) -> int | None:
    """A context size gpuheal believes (``/props`` ``n_ctx``, read for Rule 9's context changes): a
    whole number in 1..``MAX_N_CTX`` (``2048.0`` counts); anything else — missing, 0, negative,
    fractional, a string, a bool, huge — is not known."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value or value < 1 or value > MAX_N_CTX or value != int(value):
        return None
    return int(value)
