"""llama-server's own ``/metrics`` and ``/slots`` (issue 12): the real bodies of a b11312 server
(captured verbatim in ../shared/docs/llama-server.md §7, copied to tests/data/llama/), and the bad
input the issue lists — each "not known" or a data fault, never a crash, never 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuheal.parse.llama_metrics import (
    InvalidMetrics,
    InvalidSlots,
    ServerMetrics,
    parse_metrics,
    parse_slots,
)

DATA = Path(__file__).parent / "data" / "llama"


def real(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- real bodies


def test_real_metrics_with_two_busy_slots_and_one_deferred():
    m = parse_metrics(real("metrics-busy-deferred.txt"))
    assert m.n_decode_total == 383
    assert m.tokens_predicted_total == 4  # counted only when a request ends (issue 12)
    assert m.prompt_tokens_total == 42
    assert (m.requests_processing, m.requests_deferred) == (2, 1)
    assert m.n_busy_slots_per_decode == pytest.approx(1.98956)
    assert m.predicted_tokens_seconds == 0
    assert m.problems == ()


def test_real_metrics_after_the_burst_and_while_sleeping():
    after = parse_metrics(real("metrics-after.txt"))
    assert (after.requests_processing, after.requests_deferred) == (0, 0)
    assert after.n_decode_total > 383
    sleeping = parse_metrics(real("metrics-sleeping.txt"))
    assert sleeping.requests_processing == 0 and sleeping.n_decode_total is not None


def test_real_slots_busy_and_fresh():
    busy = parse_slots(json.loads(real("slots-busy.json")))
    assert (busy.total, busy.busy, busy.n_decoded) == (2, 2, (378, 378))
    fresh = parse_slots(json.loads(real("slots-fresh.json")))
    assert (fresh.total, fresh.busy, fresh.n_decoded) == (4, 0, ())


def test_older_builds_next_token_object_is_read_too():
    doc = [{"id": 0, "n_ctx": 1024, "is_processing": True, "next_token": {"n_decoded": 136}}]
    assert parse_slots(doc).n_decoded == (136,)


def test_metrics_of_an_older_build_without_n_decode_total():
    text = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n"
    m = parse_metrics(text)
    assert m.requests_processing == 1 and m.n_decode_total is None


def test_large_counters_in_six_significant_digits():
    m = parse_metrics("llamacpp:n_decode_total 1.23457e+06\n")
    assert m.n_decode_total == 1234570.0


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("llamacpp:n_decode_total NaN", "n_decode_total"),
        ("llamacpp:n_decode_total +Inf", "n_decode_total"),
        ("llamacpp:n_decode_total -Inf", "n_decode_total"),
        ("llamacpp:n_decode_total -5", "n_decode_total"),
        ("llamacpp:n_decode_total 1e300", "n_decode_total"),
        ("llamacpp:requests_processing 1.5", "requests_processing"),
        ("llamacpp:requests_deferred -1", "requests_deferred"),
    ],
)
def test_bad_values_are_not_known_never_zero(line, field):
    m = parse_metrics(f"{line}\nllamacpp:requests_deferred 0\n" if field != "requests_deferred" else line + "\n")
    assert getattr(m, field) is None
    assert any(field in p for p in m.problems)


def test_duplicate_series_is_not_known():
    m = parse_metrics("llamacpp:n_decode_total 5\nllamacpp:n_decode_total 9\nllamacpp:requests_processing 1\n")
    assert m.n_decode_total is None and m.requests_processing == 1
    assert m.problems == ("llamacpp:n_decode_total: 2 samples of one series",)


@pytest.mark.parametrize(
    "body",
    [
        '"# HELP llamacpp:n_decode_total x\\n# TYPE llamacpp:n_decode_total counter\\n"',  # ~b7010-b7100
        "# TYPE llamacpp:n_decode_total garbage\nllamacpp:n_decode_total 5\n",
        "llamacpp:n_decode_total five\n",
        'llamacpp:n_decode_total{a="b 5\n',
        "\x00\x01\x02 binary",
        "<html><body>502 Bad Gateway</body></html>",
    ],
)
def test_garbage_is_invalid_not_a_crash(body):
    with pytest.raises(InvalidMetrics):
        parse_metrics(body)


def test_labelled_and_foreign_series_are_ignored():
    text = (
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3\n'
        "process_cpu_seconds_total 12\n"
        'llamacpp:n_decode_total{instance="x"} 7\n'
    )
    assert parse_metrics(text) == ServerMetrics()


def test_empty_metrics_is_all_not_known():
    assert parse_metrics("") == ServerMetrics()


@pytest.mark.parametrize(
    ("doc", "reason"),
    [({"slots": []}, "an object"), ("[]", "a string"), (None, "null"), (7, "int")],
)
def test_slots_that_are_not_a_list(doc, reason):
    with pytest.raises(InvalidSlots, match=reason):
        parse_slots(doc)


def test_huge_slot_list_is_refused():
    with pytest.raises(InvalidSlots, match="more than"):
        parse_slots([{"id": i, "is_processing": False} for i in range(5000)])


def test_slot_entries_of_the_wrong_shape_make_busy_not_known():
    s = parse_slots([{"id": 0, "is_processing": "yes"}, 3, {"id": 2, "is_processing": True}])
    assert s.total == 3 and s.busy is None and len(s.problems) == 2


@pytest.mark.parametrize("n_decoded", [-1, "12", 1.5, True, None, 10**20])
def test_bad_n_decoded_is_skipped(n_decoded):
    s = parse_slots([{"id": 0, "is_processing": True, "next_token": [{"n_decoded": n_decoded}]}])
    assert s.busy == 1 and s.n_decoded == ()


# --------------------------------------------------------------------------- fuzz


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_fuzz_metrics_text_never_crashes(text):
    try:
        m = parse_metrics(text)
    except InvalidMetrics:
        return
    for value in (m.n_decode_total, m.requests_processing, m.requests_deferred):
        assert value is None or value >= 0


_SERIES = st.sampled_from(
    ["llamacpp:n_decode_total", "llamacpp:requests_processing", "llamacpp:requests_deferred", "x"]
)
_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e309", "0", "-0", "12", "1.23457e+06"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_SERIES, _VALUES), max_size=8))
def test_fuzz_metrics_lines(lines):
    text = "".join(f"{name} {value}\n" for name, value in lines)
    try:
        m = parse_metrics(text)
    except InvalidMetrics:
        return
    for value in (m.n_decode_total, m.requests_processing, m.requests_deferred):
        assert value is None or (value >= 0 and value == value)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
_SLOT = st.fixed_dictionaries(
    {"id": st.integers(0, 8), "is_processing": st.one_of(st.booleans(), _JSON)},
    optional={"next_token": _JSON},
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_JSON, st.lists(st.one_of(_SLOT, _JSON), max_size=6)))
def test_fuzz_slots_never_crash(doc):
    try:
        s = parse_slots(doc)
    except InvalidSlots:
        return
    assert s.busy is None or 0 <= s.busy <= s.total
    assert all(isinstance(n, int) and n >= 0 for n in s.n_decoded)


# --------------------------------------------------------------------------- the parser without the package's __init__

# What gpuheal loads of prometheus_client (parse/llama_metrics._text_parser) — its text parser and
# the three modules that parser imports, nothing else. A release that moves, renames or adds to
# these fails here instead of breaking /metrics silently (issue 19 item 6).
PARSER_MODULES = {"parser", "metrics_core", "samples", "validation"}

def test_the_private_parser_is_exactly_prometheus_clients_and_parses_as_its_public_api():
    import ast
    import importlib.util
    import subprocess
    import sys

    spec = importlib.util.find_spec("prometheus_client")
    package_dir = Path(spec.submodule_search_locations[0])
    for name in PARSER_MODULES:  # each module imports nothing of the package beyond the set
        tree = ast.parse((package_dir / f"{name}.py").read_text())
        relative = {n.module.split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}
        absolute = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert relative <= PARSER_MODULES and not any(a.startswith("prometheus_client") for a in absolute), name
    code = (
        "import json, sys\n"
        "from gpuheal.parse.llama_metrics import _PRIVATE_PACKAGE, _text_parser\n"
        "parse = _text_parser()\n"
        "mods = {m[len(_PRIVATE_PACKAGE) + 1:]: sys.modules[m].__file__ for m in sys.modules\n"
        "        if m.startswith(_PRIVATE_PACKAGE + '.')}\n"
        "print(json.dumps({'mods': mods, 'package_loaded': 'prometheus_client' in sys.modules,\n"
        "                  'parse_module': parse.__module__}))\n"
    )
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert not out["package_loaded"]  # the point of it: no HTTP server, registry, collectors
    assert set(out["mods"]) == PARSER_MODULES
    assert {n: Path(f) for n, f in out["mods"].items()} == {n: package_dir / f"{n}.py" for n in PARSER_MODULES}
    assert out["parse_module"].endswith(".parser")

    from prometheus_client.parser import text_string_to_metric_families as public

    from gpuheal.parse.llama_metrics import _text_parser

    body = real("metrics-busy-deferred.txt")  # captured from a real llama-server, every series

    def shape(families):
        return [(f.name, f.type, [(s.name, s.labels, s.value) for s in f.samples]) for f in families]

    assert shape(_text_parser()(body)) == shape(public(body)) != []


# --------------------------------------------------------------------------- the fast path (issue 29)
# parse_metrics reads a llama-server's plain lines without the Prometheus parser; whatever the body,
# the result (or the InvalidMetrics message) must be exactly the parser's.

_NAMES = st.sampled_from(
    [f"llamacpp:{key}" for key in ("n_decode_total", "tokens_predicted_total", "prompt_tokens_total",
                                   "requests_processing", "requests_deferred", "predicted_tokens_seconds",
                                   "n_busy_slots_per_decode", "prompt_tokens_seconds", "n_decode")]
    + ["process_cpu_seconds_total", "llamacpp:", "x"]
)
_TYPES = st.sampled_from(["gauge", "counter", "untyped", "summary", "histogram", "garbage", "gauge x", ""])
_NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-10**20, 10**20).map(str),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e309", "0", "-0", "+5", "5.", ".5", "1.23457e+06", "1E3", "1_0",
                     "0x10", "\u0663", "five", "", " 5", "5 ", "5 1700000000000", "5 x", "1e", "."]),
)
_SEP = st.sampled_from([" ", "  ", "\t", ""])


@st.composite
def _metric_line(draw):
    kind = draw(st.sampled_from(["sample", "sample", "sample", "type", "type", "help", "comment", "labels", "blank",
                                 "junk"]))
    name, sep = draw(_NAMES), draw(_SEP)
    if kind == "sample":
        return f"{name}{sep}{draw(_NUMBERS)}"
    if kind == "type":
        return f"# TYPE{sep}{name} {draw(_TYPES)}"
    if kind == "help":
        return f"# HELP {name} {draw(st.text(max_size=20))}"
    if kind == "comment":
        return f"# {draw(st.text(max_size=20))}"
    if kind == "labels":
        return f'{name}{{a="{draw(st.text(max_size=5))}"}}{sep}{draw(_NUMBERS)}'
    if kind == "blank":
        return draw(st.sampled_from(["", " ", "\t"]))
    return draw(st.text(max_size=30))


def _outcome(text, fast_path):
    try:
        return parse_metrics(text, fast_path=fast_path)
    except InvalidMetrics as exc:
        return f"InvalidMetrics: {exc}"


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_metric_line(), max_size=12), st.sampled_from(["\n", "\r\n"]), st.booleans())
def test_fast_path_equals_the_prometheus_parser_on_random_bodies(lines, newline, last_newline):
    text = newline.join(lines) + (newline if last_newline else "")
    assert _outcome(text, True) == _outcome(text, False)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_fast_path_equals_the_prometheus_parser_on_any_text(text):
    assert _outcome(text, True) == _outcome(text, False)


@pytest.mark.parametrize("name", ["metrics-busy-deferred.txt", "metrics-after.txt", "metrics-sleeping.txt"])
def test_fast_path_equals_the_prometheus_parser_on_real_bodies(name):
    body = real(name)
    assert parse_metrics(body) == parse_metrics(body, fast_path=False) != ServerMetrics()


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fast_path_equals_the_prometheus_parser_on_edited_real_bodies(data):
    """A real body with lines dropped, repeated, reordered or edited: plain or not, the same result."""
    lines = real("metrics-busy-deferred.txt").splitlines()
    lines = data.draw(st.lists(st.sampled_from(lines), max_size=40))
    if lines and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = data.draw(_metric_line())
    text = "\n".join(lines) + "\n"
    assert _outcome(text, True) == _outcome(text, False)


def test_fast_path_reads_a_real_body_without_the_parser(monkeypatch):
    """The point of it: a real llama-server's answer never reaches the pure-Python parser."""
    import gpuheal.parse.llama_metrics as lm

    def refuse():
        raise AssertionError("the Prometheus parser was used")

    monkeypatch.setattr(lm, "_text_parser", refuse)
    assert parse_metrics(real("metrics-busy-deferred.txt")).requests_deferred == 1
    with pytest.raises(AssertionError):
        parse_metrics("llamacpp:n_decode_total NaN\n")


_SERIES_READ = st.sampled_from([f"llamacpp:{key}" for key in ServerMetrics.__dataclass_fields__ if key != "problems"])


@st.composite
def _plain_line(draw):
    """Lines as a llama-server writes them, of the series read: the fast path's own ground."""
    name = draw(_SERIES_READ)
    if draw(st.integers(0, 3)) == 0:
        return f"# TYPE {name} {draw(st.sampled_from(['gauge', 'counter']))}"
    return f"{name} {draw(st.one_of(st.integers(-5, 10**7).map(str), st.floats(-1e6, 1e16).map(repr), _NUMBERS))}"


@settings(max_examples=1000, deadline=None)
@given(st.lists(_plain_line(), max_size=10))
def test_fast_path_equals_the_prometheus_parser_on_plain_bodies(lines):
    text = "".join(f"{line}\n" for line in lines)
    assert _outcome(text, True) == _outcome(text, False)


# A llama-server's own lines are sorted by one look-up each (issue 29); the general sorting agrees.
from gpuheal.parse.llama_metrics import _UNREAD, _sorted_line, _wanted_lines  # noqa: E402


def _sorted_one_by_one(text: str) -> tuple[list[str], bool]:
    verdicts = [(line, _sorted_line(line)) for line in text.splitlines()]
    return [line for line, v in verdicts if v == "keep"], any(v == "foreign" for _, v in verdicts)


_ANY_LINE = st.one_of(
    _metric_line(), _plain_line(), st.sampled_from(real("metrics-busy-deferred.txt").splitlines()),
    st.builds(lambda a, b: a + b, st.sampled_from([*ServerMetrics.__dataclass_fields__, *_UNREAD, "x"]).map(
        lambda k: f"{'# HELP ' if k == 'x' else ''}llamacpp:{k}"), st.text(max_size=20)))


@settings(max_examples=2000, deadline=None)
@given(st.lists(_ANY_LINE, max_size=12), st.sampled_from(["\n", "\r\n"]))
def test_the_looked_up_lines_are_sorted_as_the_general_rules_sort_them(lines, newline):
    text = newline.join(lines) + newline
    assert _wanted_lines(text) == _sorted_one_by_one(text)


@pytest.mark.parametrize("name", ["metrics-busy-deferred.txt", "metrics-after.txt", "metrics-sleeping.txt"])
def test_a_real_body_is_sorted_as_the_general_rules_sort_it(name):
    body = real(name)
    assert _wanted_lines(body) == _sorted_one_by_one(body)
    assert len(_wanted_lines(body)[0]) >= 12


def test_every_line_of_a_real_body_is_sorted_by_look_up(monkeypatch):
    """Not one line of a real llama-server's answer goes through the general rules (the point of it)."""
    import gpuheal.parse.llama_metrics as lm

    body = real("metrics-busy-deferred.txt")
    want = lm._wanted_lines(body)
    monkeypatch.setattr(lm, "_sorted_line", lambda line: pytest.fail(f"sorted by the general rules: {line!r}"))
    assert lm._wanted_lines(body) == want


# A body of a llama-server's own plain lines is read by two regex passes over the whole text (issue 29, wave 12);
# what it reads is what the line-by-line path reads of it, and any other body goes line by line.
from gpuheal.parse.llama_metrics import _plain_samples, _whole_body_samples  # noqa: E402
from gpuheal.sim.llama import metrics_text  # noqa: E402

_BREAKS = st.sampled_from(["\n"] * 30 + ["\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028",
                                        "\u2029", "\n\n", ""])


@st.composite
def _server_line(draw):
    """A line a llama-server writes (of a series read or not), or one edited a little: the whole-body path's
    ground and its edges."""
    key = draw(st.sampled_from([*ServerMetrics.__dataclass_fields__, *_UNREAD, "n_decode"]))
    key = key if key != "problems" else "n_decode_total"
    kind = draw(st.sampled_from(["help", "type", "sample", "sample", "plain", "plain", "real", "real", "edited"]))
    if kind == "help":
        return f"# HELP llamacpp:{key} {draw(st.text(max_size=12))}"
    if kind == "type":
        return f"# TYPE llamacpp:{key} {draw(st.sampled_from(['gauge', 'counter', 'gauge ', 'untyped']))}"
    if kind == "sample":
        value = draw(st.one_of(st.integers(0, 10**7).map(str), st.floats(0, 1e16).map(repr), _NUMBERS))
        return f"llamacpp:{key} {value}"
    if kind == "plain":
        return draw(_plain_line())
    if kind == "real":
        return draw(st.sampled_from(real("metrics-busy-deferred.txt").splitlines()))
    return draw(_ANY_LINE)


def _joined(lines, breaks):
    return "".join(line + brk for line, brk in zip(lines, breaks, strict=False))


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_server_line(), max_size=16), st.lists(_BREAKS, min_size=16, max_size=16))
def test_the_whole_body_path_reads_what_the_line_by_line_path_reads(lines, breaks):
    text = _joined(lines, breaks)
    got = _whole_body_samples(text)
    if got is not None:
        keep, foreign = _wanted_lines(text)
        assert not foreign and got == _plain_samples(keep)
        assert [type(v) for vs in got.values() for v in vs] == [type(v) for vs in _plain_samples(keep).values()
                                                                 for v in vs]
    assert _outcome(text, True) == _outcome(text, False)


_READ = [key for key in ServerMetrics.__dataclass_fields__ if key != "problems"]
_PRINTABLE_ASCII = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)


@st.composite
def _on_path_line(draw):
    """A line the whole-body path takes: any HELP text (ASCII, no line break), a TYPE line as a llama-server
    writes it, a plain sample of a series read, anything after the name of a series not read."""
    kind = draw(st.sampled_from(["help", "type", "read", "read", "unread"]))
    if kind == "help":
        return f"# HELP llamacpp:{draw(_PRINTABLE_ASCII)}"
    if kind == "type":
        key = draw(st.sampled_from([*_READ, *_UNREAD]))
        kinds = ["gauge", "counter"] if key in _UNREAD or key.endswith("_total") else ["gauge"]
        return f"# TYPE llamacpp:{key} {draw(st.sampled_from(kinds))}"
    if kind == "read":
        value = draw(st.one_of(st.integers(-10**20, 10**20).map(str), st.floats(allow_nan=False,
                                                                                  allow_infinity=False).map(repr),
                               st.sampled_from(["+5", "5.", ".5", "1E3", "-0", "007", "1e-400", "1e400"])))
        return f"llamacpp:{draw(st.sampled_from(_READ))} {value}"
    return f"llamacpp:{draw(st.sampled_from(_UNREAD))} {draw(_PRINTABLE_ASCII)}"


@settings(max_examples=1000, deadline=None)
@given(st.lists(_on_path_line(), max_size=24), st.booleans())
def test_the_whole_body_path_on_its_own_ground_reads_what_the_parser_reads(lines, last_break):
    text = "\n".join(lines) + ("\n" if last_break and lines else "")
    got = _whole_body_samples(text)
    assert got is not None and got == _plain_samples(_wanted_lines(text)[0])
    assert _outcome(text, True) == _outcome(text, False)


def test_the_whole_body_path_takes_a_real_and_a_simulated_body(monkeypatch):
    """The point of it: a llama-server's answer (and the sim's) is read without a Python step per line."""
    import gpuheal.parse.llama_metrics as lm

    sim = metrics_text({"n_decode_total": 383, "predicted_tokens_seconds": 1.98956, "requests_processing": 2}).decode()
    bodies = [real(name) for name in ("metrics-busy-deferred.txt", "metrics-after.txt", "metrics-sleeping.txt")]
    want = [parse_metrics(body, fast_path=False) for body in [*bodies, sim]]
    monkeypatch.setattr(lm, "_wanted_lines", lambda text: pytest.fail("read line by line"))
    assert [parse_metrics(body) for body in [*bodies, sim]] == want
    assert want[-1].n_decode_total == 383 and want[-1].requests_processing == 2


@pytest.mark.parametrize(("edit", "off_path"), [
    (lambda b: b.replace("\n", "\r\n"), True),  # CRLF: line by line
    (lambda b: b.replace("_total Total number", "_total \x85Total number"), True),  # a break splitlines sees
    (lambda b: b.replace("_total Total number", "_total \u2028Total number"), True),
    (lambda b: b.replace("_total Total number", "_total \x0bTotal number"), True),
    (lambda b: b.replace("_total Total number", "_total Total númber"), True),  # not ASCII
    (lambda b: b.replace("llamacpp:n_decode_total 383", "llamacpp:n_decode_total NaN"), True),
    (lambda b: b.replace("llamacpp:requests_deferred 1", "llamacpp:requests_deferred 1 1700000000000"), True),
    (lambda b: b.replace("# TYPE llamacpp:requests_processing gauge", "# TYPE llamacpp:requests_processing counter"),
     True),
    (lambda b: b.replace("llamacpp:n_tokens_max 385", 'llamacpp:n_tokens_max{a="b"} 385'), True),
    (lambda b: b + "\n", True),  # a blank line
    (lambda b: b + "process_cpu_seconds_total 1\n", True),  # a foreign series
    (lambda b: b.replace("llamacpp:n_decode_total 383", "llamacpp:n_decode_total -3"), False),  # read, not known
    (lambda b: b + "llamacpp:n_decode_total 7", False),  # the same series twice, no last break: a problem
    (lambda b: b.replace("llamacpp:n_tokens_max 385", "llamacpp:n_tokens_max junk"), False),  # not read
])
def test_an_edited_body_reads_as_the_parser_reads_it(edit, off_path):
    body = real("metrics-busy-deferred.txt")
    edited = edit(body)
    assert edited != body
    assert (_whole_body_samples(edited) is None) == off_path
    assert _outcome(edited, True) == _outcome(edited, False)
