"""A config written as JSON (valid YAML; what generated fleet configs are) takes the JSON parser:
the same data, repeated keys still refused, YAML flow mappings that are not JSON still YAML."""

from __future__ import annotations

import json

import pytest

from gpuheal.config.yamlsafe import load_yaml
from gpuheal.errors import ConfigError

DOC = {"prometheus": {"url": "http://127.0.0.1:9090"}, "gpus": [{"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:1"}]}


def test_json_and_yaml_read_the_same():
    text = json.dumps(DOC)
    assert load_yaml(text, "x") == DOC
    import yaml

    assert load_yaml(yaml.safe_dump(DOC), "x") == DOC


def test_a_repeated_key_is_refused_in_json_too():
    with pytest.raises(ConfigError, match="'url' appears twice"):
        load_yaml('{"prometheus": {"url": "a", "url": "b"}, "gpus": []}', "x")


def test_a_yaml_flow_mapping_is_still_yaml():
    assert load_yaml("{a: 1, b: [x, y]}", "x") == {"a": 1, "b": ["x", "y"]}


def test_deep_json_is_one_error():
    with pytest.raises(ConfigError):
        load_yaml("{" + '"a":[' * 100000, "x")
