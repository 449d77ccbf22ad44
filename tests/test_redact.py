"""Redaction masks a secret's value and nothing else (issue 9, point 8: the L1 alert read "align
--api-key <redacted> litellm.api_key" — the word after the flag's name was swallowed)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuheal.redact import MASK, redact, redact_text
from gpuheal.rules import REMEDIES


def l1_texts() -> list[str]:
    """Every text the remedies say about the L1 api-key mismatch."""
    found = []
    for value in REMEDIES.values():
        for text in re.findall(r"[^\"']*--api-key[^\"']*", repr(value)):
            found.append(text)
    return found


def test_the_l1_advice_keeps_every_word():
    text = "llama-server rejects the LiteLLM api key: align --api-key with litellm.api_key (Lesson L1)"
    assert redact_text(text, ("sk-live-123456",)) == text
    assert l1_texts(), "no remedy names --api-key any more: update this test"
    for text in l1_texts():
        assert MASK not in redact_text(text), text


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("llama-server -m m.gguf --api-key sk-abc123XYZ -c 4096", f"llama-server -m m.gguf --api-key {MASK} -c 4096"),
        ("llama-server --api-key changeme --port 8080", f"llama-server --api-key {MASK} --port 8080"),
        ("llama-server --api-key=hunter22 --port 8080", f"llama-server --api-key={MASK} --port 8080"),
        ("llama-server --api-key-file /etc/key --port 1", f"llama-server --api-key-file {MASK} --port 1"),
        ("llama-server --hf-token hf_abcdefgh", f"llama-server --hf-token {MASK}"),
        ("--api-key --port 8080", "--api-key --port 8080"),  # no value given: the next flag stays
        ("set --api-key to the key in litellm.api_key", "set --api-key to the key in litellm.api_key"),
        ("--api-key with-secret-99", f"--api-key {MASK}"),  # a word only as a whole token is prose
        ("--api-key With", "--api-key With"),
        ("api_key: s3cr3t-value, next", f"api_key: {MASK}, next"),
        ("Authorization: Bearer abcdefgh1234", f"Authorization: Bearer {MASK}"),
    ],
)
def test_only_the_value_is_masked(text, want):
    assert redact_text(text) == want


_PROSE_WORDS = {"with", "to", "and", "or", "of", "in", "on", "for", "from", "is", "are", "was", "be", "the",
                "a", "an", "as", "at", "by", "must", "should", "matches", "match", "differs", "flag",
                "option", "argument", "value", "that", "which", "used", "given", "set"}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40))
def test_any_argv_value_is_masked(value):
    if value.lower() in _PROSE_WORDS or value.startswith("--"):
        return
    assert redact(f"llama-server --api-key {value} -c 1") == f"llama-server --api-key {MASK} -c 1"
    assert redact(f"llama-server --api-key={value}") == f"llama-server --api-key={MASK}"
