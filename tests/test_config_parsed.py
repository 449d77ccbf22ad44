"""The state directory's cache of parsed config texts (``gpuheal/config/parsed.py``, issue 19
"Performance"): the same Config from the cache as from PyYAML, every change a miss, bad cache
files a miss, no string of the config ever written (secrets), and only data it gives back
exactly is ever cached."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.config import load_config
from gpuheal.config.parsed import CACHE_FILE, ParsedTexts
from gpuheal.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fleet.yaml"


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


class Counting:
    """A parser that counts its calls and returns ``value``."""

    def __init__(self, value: object) -> None:
        self.value, self.calls = value, 0

    def __call__(self, text: str) -> object:
        self.calls += 1
        return self.value


def test_a_cached_text_gives_the_same_config_and_the_next_run_skips_pyyaml(tmp_path, state):
    config = tmp_path / "gpuheal.yaml"
    config.write_text(EXAMPLE.read_text())
    first = load_config(config, cache_dir=state)
    assert (state / CACHE_FILE).exists() and oct((state / CACHE_FILE).stat().st_mode & 0o777) == "0o600"
    assert load_config(config, cache_dir=state) == first == load_config(config)  # cache, cache, PyYAML
    code = ("import sys; from gpuheal.config import load_config; "
            f"cfg = load_config({str(config)!r}, cache_dir={str(state)!r}); "
            "print(cfg.aliases, 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "('gpu-dense', 'gpu-light', 'strix-moe') False"


def test_an_edited_text_is_parsed_again(tmp_path, state):
    config = tmp_path / "gpuheal.yaml"
    config.write_text(EXAMPLE.read_text())
    load_config(config, cache_dir=state)
    config.write_text(EXAMPLE.read_text().replace("alias: gpu-dense", "alias: gpu-edited"))
    assert load_config(config, cache_dir=state).aliases[0] == "gpu-edited"
    # the file keeps this run's texts only (the config and defaults.yaml), never a growing list
    assert len(json.loads((state / CACHE_FILE).read_text())["texts"]) == 2


def test_a_text_that_fails_is_never_cached(tmp_path, state):
    config = tmp_path / "gpuheal.yaml"
    config.write_text("gpus: [\n")
    for _ in range(2):
        with pytest.raises(ConfigError, match="not valid YAML"):
            load_config(config, cache_dir=state)
    assert not (state / CACHE_FILE).exists()


def test_no_string_of_the_config_is_written(tmp_path, state):
    """A config may hold a secret inline (litellm.api_key): the cache holds offsets into the text."""
    secret = "sk-inline-SECRET-0b9d"
    config = tmp_path / "gpuheal.yaml"
    config.write_text(EXAMPLE.read_text().replace("api_key: not-needed", f"api_key: {secret}"))
    assert load_config(config, cache_dir=state).litellm.api_key == secret
    cached = (state / CACHE_FILE).read_text()
    assert secret not in cached and "gpu-dense" not in cached and "litellm" not in cached
    assert load_config(config, cache_dir=state).litellm.api_key == secret  # cut from the text again


@pytest.mark.parametrize(
    "value",
    [{1: "int key"}, {"when": dt.date(2026, 12, 4)}, {"raw": b"bytes"}, {"x": (1, 2)}, {"s": {1}},
     {"n": float("nan")}, {"tab": "x\ty"}, {"missing": "not in the text"}],
    ids=["int-key", "date", "bytes", "tuple", "set", "nan", "escaped", "not-verbatim"],
)
def test_data_the_cache_cannot_give_back_exactly_is_parsed_every_time(state, value):
    parser = Counting(value)
    for _ in range(2):
        texts = ParsedTexts(state)
        assert texts.parse('tab: "x\\ty"\nwhen: 2026-12-04\nraw: ..., s, x, n, int key, missing', parser) is value
        texts.save()
    assert parser.calls == 2 and not (state / CACHE_FILE).exists()


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xfe garbage", b"", b"[]", b'{"format": 2, "texts": []}', b'{"format": 99, "texts": {}}',
     b'{"format": 2, "texts": {"KEY": 5}}', b'{"format": 2, "texts": {"KEY": "{not json"}}',
     b'{"format": 2, "texts": {"KEY": "[\\"s\\", 0, 99]"}}', b'{"format": 2, "texts": {"KEY": "[\\"d\\", 1, 2]"}}',
     b'{"format": 2, "texts": {"KEY": "[\\"x\\"]"}}', b'{"format": 2, "texts": {"KEY": "{\\"a\\": 1}"}}'],
)
def test_a_bad_cache_file_is_a_miss_and_is_replaced(state, garbage):
    texts = ParsedTexts(state)
    key = texts._digest("a: 1")
    (state / CACHE_FILE).write_bytes(garbage.replace(b"KEY", key.encode()))
    parser = Counting({"a": 1})
    texts = ParsedTexts(state)
    assert texts.parse("a: 1", parser) == {"a": 1} and parser.calls == 1
    texts.save()
    again = ParsedTexts(state)
    assert again.parse("a: 1", parser) == {"a": 1} and parser.calls == 1  # now from the cache


def test_no_state_directory_means_no_cache(tmp_path):
    parser = Counting({"a": 1})
    for _ in range(2):
        texts = ParsedTexts(None)
        texts.parse("a: 1", parser)
        texts.save()
    assert parser.calls == 2 and list(tmp_path.iterdir()) == []


def test_a_cached_result_is_the_callers_own(state):
    first = ParsedTexts(state)
    first.parse("a: [1]", Counting({"a": [1]}))
    first.save()
    texts = ParsedTexts(state)
    data = texts.parse("a: [1]", Counting(None))
    data["a"].append(2)
    assert texts.parse("a: [1]", Counting(None)) == {"a": [1]}


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


def strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *strings(v))]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return []


@settings(max_examples=200, deadline=None)
@given(JSONISH)
def test_what_yaml_gives_as_plain_data_comes_back_from_the_cache_exactly(tmp_path_factory, value):
    state = tmp_path_factory.mktemp("state")
    text = "\n".join(strings(value))  # a text where every string of the data appears verbatim
    writer = ParsedTexts(state)
    writer.parse(text, Counting(value))
    writer.save()
    parser = Counting(None)
    back = ParsedTexts(state).parse(text, parser)
    assert parser.calls == 0 and same(back, value)


def same(a: object, b: object) -> bool:
    """Equal and of the same types throughout (``1 == 1.0 == True`` in Python, not here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_same_tells_types_apart():
    assert same({"a": [1, 2.0, True, None, "x"]}, {"a": [1, 2.0, True, None, "x"]})
    assert not same(1, 1.0) and not same(1, True) and not same([1], (1,)) and not same({"a": 1}, {"a": 1, "b": 2})


def test_a_json_config_is_not_kept(tmp_path, state):
    """JSON parses as fast as the cache; keeping a 10,000-GPU fleet's offsets would cost ~2 MB of the
    state directory's 5 MB (issue 13). defaults.yaml is kept alone."""
    config = tmp_path / "gpuheal.json"
    config.write_text(json.dumps({"gpus": [{"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:9"}]}))
    assert load_config(config, cache_dir=state).aliases == ("a",)
    assert len(json.loads((state / CACHE_FILE).read_text())["texts"]) == 1
