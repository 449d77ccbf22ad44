"""Configuration: every error is ONE line naming the key path and the problem, exit 3 at the CLI
(contract: "A config error names the offending key path and the problem in one line")."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuheal.config import load_config, load_config_dict, resolve_config_path
from gpuheal.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "fleet.yaml"
GPUHEAL = [sys.executable, "-m", "gpuheal"]


@pytest.fixture
def fleet() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def error_of(data) -> str:
    with pytest.raises(ConfigError) as info:
        load_config_dict(data)
    message = str(info.value)
    assert "\n" not in message, message  # one line
    assert "Traceback" not in message
    return message


def mutated(fleet: dict, change) -> dict:
    data = copy.deepcopy(fleet)
    change(data)
    return data


# --------------------------------------------------------------------------- the example


def test_example_fleet_loads_with_the_spec_numbers():
    cfg = load_config(EXAMPLE)
    assert cfg.aliases == ("gpu-dense", "gpu-light", "strix-moe")
    dense = cfg.gpu("gpu-dense")
    assert (dense.host, dense.endpoint, dense.vendor, dense.vram_total_mb) == ("ct8", "http://ct8:8080", "nvidia", 24576)
    assert dense.baseline_tok_s == 74.8
    assert dense.command("restart_command") == ("systemctl", "restart", "llama-server")
    strix = cfg.gpu("strix-moe")
    assert strix.vendor == "amd" and strix.vram_leak_mb_per_hour == 200
    assert cfg.rule_params("vram-leak", "strix-moe")["mb_per_hour"] == 200
    assert cfg.rule_params("vram-leak", "gpu-dense")["mb_per_hour"] == 300
    # defaults fill what the file does not say (the spec's numbers)
    assert cfg.rule_params("thermal-critical")["temp_c"] == 85
    assert cfg.state.lock_wait_s == 10
    assert cfg.history.raw_hours >= 6.5
    assert cfg.monitor.max_response_bytes == 1048576
    assert cfg.litellm.url == "http://litellm/litellm"
    assert cfg.path == str(EXAMPLE)


def test_minimal_config_of_only_the_contract_keys_runs_on_defaults():
    cfg = load_config_dict({"gpus": [{"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:1/"}]})
    gpu = cfg.gpu("a")
    assert gpu.endpoint == "http://127.0.0.1:1"  # trailing slash dropped
    assert gpu.vendor == "nvidia" and gpu.transport == "ssh"
    assert gpu.vram_total_mb is None and gpu.baseline_tok_s is None  # not known, never zero
    assert cfg.probe.timeout_s == 5
    assert cfg.monitor is None  # issue 12: no monitor: = no gpu-monitor, readings from smi
    assert cfg.litellm.url is None
    with_monitor = load_config_dict({"monitor": {}, "gpus": [{"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:1/"}]})
    assert with_monitor.monitor.timeout_s == 5 and with_monitor.monitor.url == "http://localhost:9100/gpu-data"


# --------------------------------------------------------------------------- one-line errors


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d["gpus"][1].update(vram_total_mb=0), "gpus[1].vram_total_mb: must be > 0"),
        (lambda d: d["gpus"][1].update(vram_total_mb=-5), "gpus[1].vram_total_mb: must be > 0"),
        (lambda d: d["gpus"][1].update(vram_total_mb="lots"), "gpus[1].vram_total_mb: must be a number, not a string"),
        (lambda d: d["gpus"][0].update(vram_total_mb=float("nan")), "gpus[0].vram_total_mb: must be a finite number"),
        (lambda d: d["gpus"][2].update(baseline_tok_s=float("inf")), "gpus[2].baseline_tok_s: must be a finite number"),
        (lambda d: d["gpus"][0].update(ssh_port=True), "gpus[0].ssh_port: must be a whole number, not a boolean"),
        (lambda d: d["gpus"][0].update(ssh_port=70000), "gpus[0].ssh_port: must be <= 65535"),
        (lambda d: d["gpus"][0].update(weight=2), "gpus[0].weight: must be <= 1"),
        (lambda d: d["gpus"][0].update(vendor="intel"), "gpus[0].vendor: must be one of: nvidia, amd"),
        (lambda d: d["gpus"][0].update(transport="telnet"), "gpus[0].transport: must be one of: ssh, local"),
        (lambda d: d["gpus"][0].update(endpoint="ct8:8080"), "gpus[0].endpoint: must be an http:// or https:// URL"),
        (lambda d: d["gpus"][0].update(alias="GPU Dense"), "gpus[0].alias: must be lower-case"),
        (lambda d: d["gpus"][0].update(alias="fleet"), "gpus[0].alias: 'fleet' is reserved"),
        (lambda d: d["gpus"][1].pop("host"), "gpus[1].host: is required"),
        (lambda d: d.pop("gpus"), "gpus: is required"),
        (lambda d: d.update(gpus=[]), "gpus: must not be empty"),
        (lambda d: d.update(gpus="ct8"), "gpus: must be a list, not a string"),
        (lambda d: d["gpus"].__setitem__(0, "ct8"), "gpus[0]: must be a mapping, not a string"),
        (lambda d: d["monitor"].update(timeout_s=None), "monitor.timeout_s: must be a number, not null"),
        (lambda d: d["monitor"].update(max_response_bytes=10), "monitor.max_response_bytes: must be >= 1024"),
        (lambda d: d["litellm"].update(url=5), "litellm.url: must be a string, not a whole number"),
        (lambda d: d.update(state={"lock_wait_s": -1}), "state.lock_wait_s: must be >= 0"),
        (lambda d: d.update(history={"raw_hours": 2}), "history.raw_hours: must be >= 6.5"),
        (lambda d: d["zulip"].update(topic="t" * 61), "zulip.topic: must be at most 60 characters"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_values_name_the_key_path(fleet, change, expected):
    message = error_of(mutated(fleet, change))
    assert message.startswith(expected), message


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda d: d.update(colour="red"), "colour"),
        (lambda d: d["monitor"].update(timeout=3), "monitor.timeout"),
        (lambda d: d["gpus"][2].update(vram_total=1), "gpus[2].vram_total"),
        (lambda d: d["zulip"].update(api_key="secret"), "zulip.api_key"),
    ],
)
def test_unknown_keys_are_rejected_with_the_allowed_ones(fleet, change, path):
    message = error_of(mutated(fleet, change))
    assert message.startswith(f"{path}: unknown key (allowed: "), message


def test_wrong_type_of_a_whole_section(fleet):
    assert error_of(mutated(fleet, lambda d: d.update(monitor="http://x"))).startswith("monitor: must be a mapping")
    assert error_of(mutated(fleet, lambda d: d.update(rules=[1]))).startswith("rules: must be a mapping")


def test_several_problems_are_counted_but_one_line(fleet):
    def change(d):
        d["gpus"][0]["vram_total_mb"] = -1
        d["gpus"][1]["vram_total_mb"] = -1
        d["monitor"]["timeout_s"] = "x"

    message = error_of(mutated(fleet, change))
    assert "more problem" in message


def test_duplicate_alias(fleet):
    message = error_of(mutated(fleet, lambda d: d["gpus"][2].update(alias="gpu-dense")))
    assert message == "gpus[2].alias: duplicate alias 'gpu-dense' (also gpus[0])"


def test_a_shared_host_needs_gpu_index_on_each_entry(fleet):
    # issue 12: two GPUs on one host are configurable, but only when each names its index
    message = error_of(mutated(fleet, lambda d: d["gpus"][1].update(host="ct8")))
    assert message.startswith("gpus[1].host: host 'ct8' is shared by gpus[0] ('gpu-dense', index unset)")
    assert "gpu_index" in message


def test_duplicate_host_and_index_names_both_entries(fleet):
    def change(d):
        d["gpus"][0]["gpu_index"] = 1
        d["gpus"][1].update(host="ct8", gpu_index=1)

    message = error_of(mutated(fleet, change))
    assert message == (
        "gpus[1].gpu_index: duplicate GPU (host 'ct8', index 1): gpus[1] ('gpu-light', index 1) "
        "and gpus[0] ('gpu-dense', index 1)"
    )


def test_two_gpus_on_one_host_with_their_indexes(fleet):
    def change(d):
        d["gpus"][0]["gpu_index"] = 0
        d["gpus"][1].update(host="ct8", gpu_index=1, endpoint="http://ct8:8081")

    cfg = load_config_dict(mutated(fleet, change))
    assert [(g.host, g.gpu_index, g.index) for g in cfg.gpus[:2]] == [("ct8", 0, 0), ("ct8", 1, 1)]
    assert cfg.gpus[2].gpu_index is None and cfg.gpus[2].index == 0


@pytest.mark.parametrize("bad", [-1, 1024, "1", 1.5, True])
def test_gpu_index_must_be_a_small_whole_number(fleet, bad):
    message = error_of(mutated(fleet, lambda d: d["gpus"][0].update(gpu_index=bad)))
    assert message.startswith("gpus[0].gpu_index: must be")


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("systemctl restart {service}", "unknown placeholder {service}"),
        (["ssh", "{hostt}", "reboot"], "unknown placeholder {hostt}"),
        ("echo {0}", "unknown placeholder {0}"),
        ("echo {host.__class__}", "unknown placeholder"),
        ("echo {unclosed", "bad placeholder"),
        ("echo 'unclosed", "cannot split command: No closing quotation"),
        ("", "must not be empty"),
        ([], "must not be empty"),
        (5, "must be a string"),
    ],
)
def test_bad_commands(fleet, command, expected):
    message = error_of(mutated(fleet, lambda d: d["gpus"][1].update(restart_command=command)))
    assert message.startswith("gpus[1].restart_command: "), message
    assert expected in message


def test_placeholders_in_fleet_wide_commands_are_checked(fleet):
    message = error_of(mutated(fleet, lambda d: d["litellm"].update(restart_command="docker restart {container}")))
    assert message.startswith("litellm.restart_command: unknown placeholder {container}")
    message = error_of(mutated(fleet, lambda d: d["heal"].update(gpu_monitor_restart_command="x {y}")))
    assert message.startswith("heal.gpu_monitor_restart_command: unknown placeholder {y}")


def test_commands_split_like_a_shell_and_keep_placeholders(fleet):
    data = mutated(
        fleet,
        lambda d: d["gpus"][0].update(
            restart_command="systemctl restart 'llama server@{alias}'",
            shed_load_command=["curl", "-X", "POST", "{endpoint}/slots?id={host}"],
        ),
    )
    gpu = load_config_dict(data).gpu("gpu-dense")
    assert gpu.command("restart_command") == ("systemctl", "restart", "llama server@{alias}")
    assert gpu.command("shed_load_command") == ("curl", "-X", "POST", "{endpoint}/slots?id={host}")
    assert gpu.command("kill_command") is None


def test_unknown_rule_id_fleet_wide_and_per_gpu(fleet):
    message = error_of(mutated(fleet, lambda d: d.update(rules={"thermal-crit": {"temp_c": 80}})))
    assert message.startswith("rules: unknown rule id 'thermal-crit' (known: ")
    assert "thermal-critical" in message
    message = error_of(mutated(fleet, lambda d: d["gpus"][1].update(rules={"no-such": {}})))
    assert message.startswith("gpus[1].rules: unknown rule id 'no-such'")


def test_rule_param_of_a_wrong_type(fleet):
    message = error_of(mutated(fleet, lambda d: d["gpus"][0].update(rules={"thermal-critical": {"temp_c": [80]}})))
    assert message.startswith("gpus[0].rules.thermal-critical.temp_c: must be a number")


def test_per_gpu_rule_override_merges_over_fleet_and_defaults(fleet):
    def change(d):
        d["rules"] = {"thermal-critical": {"temp_c": 83}, "model-stuck": {"hold_polls": 3}}
        d["gpus"][1]["rules"] = {"thermal-critical": {"hold_polls": 4}}

    cfg = load_config_dict(mutated(fleet, change))
    light = cfg.rule_params("thermal-critical", "gpu-light")
    dense = cfg.rule_params("thermal-critical", "gpu-dense")
    assert light["temp_c"] == 83 and light["hold_polls"] == 4  # fleet value kept, GPU value added
    assert light["clear_below_c"] == 80  # default kept
    assert dense["temp_c"] == 83 and dense["hold_polls"] == 2
    assert cfg.rule_params("thermal-critical")["temp_c"] == 83
    assert cfg.rule_params("model-stuck", "strix-moe")["hold_polls"] == 3
    assert cfg.rule_params("context-window", "strix-moe")["settling"] is True
    assert cfg.rule_params("context-window", "gpu-dense")["settling"] is False  # declared in defaults.yaml now
    # a GPU's own override never leaks to another GPU
    assert cfg.rule_params("thermal-critical", "strix-moe")["hold_polls"] == 2


def test_vram_leak_shorthand_is_the_rule_parameter(fleet):
    def change(d):
        d["gpus"][0]["vram_leak_mb_per_hour"] = 123
        d["gpus"][1]["rules"] = {"vram-leak": {"mb_per_hour": 77}}
        d["gpus"][1].pop("vram_leak_mb_per_hour")

    cfg = load_config_dict(mutated(fleet, change))
    assert cfg.gpu("gpu-dense").vram_leak_mb_per_hour == 123
    assert cfg.rule_params("vram-leak", "gpu-dense")["mb_per_hour"] == 123
    assert cfg.gpu("gpu-light").vram_leak_mb_per_hour == 77


def test_api_key_from_an_environment_variable(fleet, monkeypatch):
    monkeypatch.setenv("GPUHEAL_TEST_LITELLM_KEY", "sk-from-env")
    data = mutated(fleet, lambda d: d["litellm"].update(api_key_env="GPUHEAL_TEST_LITELLM_KEY"))
    cfg = load_config_dict(data)
    assert cfg.litellm.api_key == "sk-from-env"
    assert "sk-from-env" not in repr(cfg.litellm) and "sk-from-env" not in repr(cfg)
    monkeypatch.delenv("GPUHEAL_TEST_LITELLM_KEY")
    assert load_config_dict(data).litellm.api_key == "not-needed"  # falls back to api_key


def test_the_loaded_config_is_not_aliased_to_the_defaults(fleet):
    a = load_config_dict(mutated(fleet, lambda d: d.update(rules={"thermal-critical": {"temp_c": 70, "clear_below_c": 65}})))
    b = load_config_dict(fleet)
    assert a.rule_params("thermal-critical")["temp_c"] == 70
    assert b.rule_params("thermal-critical")["temp_c"] == 85


@pytest.mark.parametrize("data", [None, [], "gpus", 3], ids=repr)
def test_not_a_mapping(data):
    error_of(data)


# --------------------------------------------------------------------------- files


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml")
    assert "config file not found" in str(info.value) and "nope.yaml" in str(info.value)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# only a comment\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "empty" in str(info.value)


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("gpus:\n  - alias: a\n    host: b\n   endpoint: http://x\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "not valid YAML at line 4" in message and "bad.yaml" in message
    assert "\n" not in message


def test_binary_file_and_directory(tmp_path):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00gpus")
    with pytest.raises(ConfigError):
        load_config(binary)
    with pytest.raises(ConfigError):
        load_config(tmp_path)


def test_yaml_alias_cycle_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "cycle.yaml"
    path.write_text("gpus: &x\n  - *x\n")
    with pytest.raises(ConfigError):
        load_config(path)


def test_yaml_tags_that_build_objects_are_refused(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("gpus: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError):
        load_config(path)


def test_config_path_resolution(monkeypatch):
    monkeypatch.delenv("GPUHEAL_CONFIG", raising=False)
    assert resolve_config_path(None) == Path("gpuheal.yaml")
    monkeypatch.setenv("GPUHEAL_CONFIG", "/etc/gpuheal.yaml")
    assert resolve_config_path(None) == Path("/etc/gpuheal.yaml")
    assert resolve_config_path("x.yaml") == Path("x.yaml")


# --------------------------------------------------------------------------- `gpuheal config validate`


def run_cli(*args, cwd=None, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHEAL_")}
    full_env.update(env or {})
    return subprocess.run([*GPUHEAL, *args], capture_output=True, text=True, cwd=cwd, env=full_env, timeout=60)


def test_config_validate_ok():
    proc = run_cli("config", "validate", str(EXAMPLE))
    assert proc.returncode == 0, proc.stderr
    assert "valid" in proc.stdout and "gpu-dense" in proc.stdout
    assert proc.stderr == ""


def test_config_validate_json_and_global_config_option():
    import json

    proc = run_cli("--config", str(EXAMPLE), "config", "validate", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"valid": True, "path": str(EXAMPLE), "gpus": ["gpu-dense", "gpu-light", "strix-moe"]}


def test_config_validate_uses_gpuheal_config_env():
    proc = run_cli("config", "validate", env={"GPUHEAL_CONFIG": str(EXAMPLE)})
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "config file not found"),
        ("", "empty"),
        ("gpus:\n  - alias: a\n   host: b\n", "not valid YAML at line 3"),
        ("gpus:\n  - {alias: a, host: b, endpoint: 'http://x', vram_total_mb: 0}\n", "gpus[0].vram_total_mb: must be > 0"),
        ("gpus:\n  - {alias: a, host: b, endpoint: 'http://x', vram_total_mb: .nan}\n", "gpus[0].vram_total_mb: must be a finite number"),
        ("gpus:\n  - {alias: a, host: b, endpoint: 'http://x', colour: red}\n", "gpus[0].colour: unknown key"),
        ("gpus: &x\n  - *x\n", "gpus[0]"),
    ],
    ids=["missing", "empty", "syntax", "zero", "nan", "unknown-key", "cycle"],
)
def test_config_validate_bad_exits_3_with_one_line(tmp_path, text, expected):
    path = tmp_path / "gpuheal.yaml"
    if text is not None:
        path.write_text(text)
    proc = run_cli("config", "validate", str(path))
    assert proc.returncode == 3
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpuheal: ") and expected in lines[0], lines[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("locale", ["C.UTF-8", "C"])
@pytest.mark.parametrize("text", [None, "gpus: [\n", "EXAMPLE"], ids=["missing", "syntax", "valid"])
def test_config_validate_of_a_non_utf8_file_name_prints_valid_utf8(tmp_path, locale, text):
    """A file name that is not UTF-8 (byte 0xff): the one line — error or "valid" — is valid UTF-8
    with the byte escaped as ``\\xff``, under a UTF-8 locale and under C (issue 9)."""
    import json

    name = os.fsencode(tmp_path) + b"/fleet\xff.yaml"
    if text is not None:
        Path(os.fsdecode(name)).write_text(EXAMPLE.read_text() if text == "EXAMPLE" else text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEAL_", "LC_", "LANG", "PYTHONIOENCODING"))}
    for json_opt in ([], ["--json"]):
        argv = [os.fsencode(a) for a in [*GPUHEAL, "config", "validate", *json_opt]] + [name]
        proc = subprocess.run(argv, capture_output=True, timeout=60, env={**env, "LC_ALL": locale})
        out, err = proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8")  # strict: raises on raw bytes
        shown = os.fsdecode(tmp_path) + "/fleet\\xff.yaml"
        if text != "EXAMPLE":
            assert proc.returncode == 3 and out == "" and len(err.splitlines()) == 1, err
            assert err.startswith("gpuheal: ") and shown in err, err
        elif json_opt:
            assert proc.returncode == 0 and json.loads(out)["path"] == shown and err == "", (out, err)
        else:
            assert proc.returncode == 0 and out.startswith(f"{shown}: valid") and err == "", (out, err)


def test_config_validate_defaults_to_gpuheal_yaml_in_the_working_directory(tmp_path):
    proc = run_cli("config", "validate", cwd=tmp_path)
    assert proc.returncode == 3 and "gpuheal.yaml" in proc.stderr
    (tmp_path / "gpuheal.yaml").write_text(EXAMPLE.read_text())
    proc = run_cli("config", "validate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- the validated-text cache


def test_a_validated_text_is_remembered_in_the_state_dir(tmp_path, monkeypatch):
    from gpuheal.config import load as config_load

    config = tmp_path / "gpuheal.yaml"
    config.write_text(EXAMPLE.read_text())
    state = tmp_path / "state"
    state.mkdir()
    load_config(config, cache_dir=state)
    marker = state / config_load.VALIDATED_FILE
    assert marker.exists() and oct(marker.stat().st_mode & 0o777) == "0o600"

    calls = []
    real = config_load._validate_schema
    monkeypatch.setattr(config_load, "_validate_schema", lambda data: calls.append(1) or real(data))
    cfg = load_config(config, cache_dir=state)
    assert calls == [] and cfg.aliases == ("gpu-dense", "gpu-light", "strix-moe")  # skipped
    config.write_text(EXAMPLE.read_text() + "\n# edited\n")
    load_config(config, cache_dir=state)
    assert calls == [1]  # a different text is validated again
    load_config(config)  # no cache: always validated
    assert calls == [1, 1]


def test_an_invalid_text_is_never_remembered(tmp_path):
    from gpuheal.config import load as config_load

    config = tmp_path / "gpuheal.yaml"
    config.write_text("gpus:\n  - {alias: a, host: b, endpoint: 'http://x', vram_total_mb: 0}\n")
    state = tmp_path / "state"
    state.mkdir()
    for _ in range(2):
        with pytest.raises(ConfigError, match="must be > 0"):
            load_config(config, cache_dir=state)
    assert not (state / config_load.VALIDATED_FILE).exists()


def test_the_environment_is_read_at_every_load_of_a_remembered_text(tmp_path, monkeypatch):
    """The cache only skips the JSON Schema; everything else (the environment too) is read anew."""
    config = tmp_path / "gpuheal.yaml"
    config.write_text(EXAMPLE.read_text())
    state = tmp_path / "state"
    state.mkdir()
    load_config(config, cache_dir=state)
    monkeypatch.setenv("GPUHEAL_TEST_KEY", "from-env")
    config.write_text(EXAMPLE.read_text().replace("api_key: not-needed", "api_key: not-needed\n  api_key_env: GPUHEAL_TEST_KEY"))
    load_config(config, cache_dir=state)
    assert load_config(config, cache_dir=state).litellm.api_key == "from-env"


def test_a_garbage_cache_file_means_validate_again(tmp_path):
    from gpuheal.config import load as config_load

    state = tmp_path / "state"
    state.mkdir()
    (state / config_load.VALIDATED_FILE).write_bytes(b"\xff\xfe garbage")
    cfg = load_config(EXAMPLE, cache_dir=state)
    assert cfg.aliases
    assert len((state / config_load.VALIDATED_FILE).read_text().strip()) == 64


def test_missing_state_dir_is_not_created_by_config_loading(tmp_path):
    load_config(EXAMPLE, cache_dir=tmp_path / "nope")
    assert not (tmp_path / "nope").exists()


def test_litellm_key_from_env_then_dotenv_then_config(tmp_path, monkeypatch, caplog):
    """Lesson L4: the credential source is checked, with a .env fallback and a warning."""
    from gpuheal.config import load_config_dict

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUHEAL_TEST_LITELLM_KEY", raising=False)
    raw = {"litellm": {"api_key": "not-needed", "api_key_env": "GPUHEAL_TEST_LITELLM_KEY"},
           "gpus": [{"alias": "a", "host": "h", "endpoint": "http://127.0.0.1:1"}]}
    cfg_path = str(tmp_path / "sub" / "gpuheal.yaml")
    (tmp_path / "sub").mkdir()
    with caplog.at_level("WARNING", logger="gpuheal"):
        assert load_config_dict(dict(raw), path=cfg_path).litellm.api_key == "not-needed"
    assert "Lesson L4" in caplog.text
    (tmp_path / "sub" / ".env").write_text("GPUHEAL_TEST_LITELLM_KEY=sk-from-dotenv-123\n")
    assert load_config_dict(dict(raw), path=cfg_path).litellm.api_key == "sk-from-dotenv-123"
    monkeypatch.setenv("GPUHEAL_TEST_LITELLM_KEY", "sk-from-env-456")
    assert load_config_dict(dict(raw), path=cfg_path).litellm.api_key == "sk-from-env-456"


@pytest.mark.parametrize("value", ["hot", True])
def test_rule_param_that_must_be_a_number_is_a_config_error_not_an_internal_one(fleet, value):
    # the schema admits strings and booleans for rule parameters; `temp_c: hot` used to load and
    # then crash every check inside the rules engine ("internal error")
    message = error_of(mutated(fleet, lambda d: d.update(rules={"thermal-critical": {"temp_c": value}})))
    assert message == f"rules.thermal-critical.temp_c: must be a number, not {value!r}"
    message = error_of(mutated(fleet, lambda d: d["gpus"][1].update(rules={"model-stuck": {"failure_ratio": value}})))
    assert message.startswith("gpus[1].rules.model-stuck.failure_ratio: must be a number")


# --------------------------------------------------------------------------- typed sections (issue 19 item 4)

SECTION_RECORDS = {"heal": "HealConfig", "probe": "ProbeConfig", "zulip": "ZulipConfig", "bench": "BenchConfig",
                   "history": "HistoryConfig", "state": "StateConfig", "alerts": "AlertsConfig"}


@pytest.mark.parametrize(("section", "record"), SECTION_RECORDS.items())
def test_each_section_is_a_frozen_record_naming_every_schema_key(section, record, fleet):
    import dataclasses
    import json
    from importlib import resources

    from gpuheal import sinks
    from gpuheal.config import model

    cls = getattr(model, record, None) or getattr(sinks, record)
    schema = json.loads(resources.files("gpuheal.config").joinpath("schema.json").read_text("utf-8"))
    keys = set(schema["properties"][section]["properties"])
    if section == "zulip":  # its alert-policy keys from before alerts: are read into cfg.alerts
        keys -= set(model.ALERT_KEYS)
    assert {f.name for f in dataclasses.fields(cls)} == keys
    cfg = load_config_dict(fleet)
    value = getattr(cfg, section)
    assert type(value) is cls
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, next(iter(keys)), None)


def test_section_values_take_their_field_types_once_at_load(fleet):
    doc = fleet
    doc["heal"] = {"startup_grace_s": 60, "protect_processes": ["sshd"], "max_restarts_per_hour": 2}
    doc["zulip"] = {"site": "http://127.0.0.1:9", "timeout_s": 3}
    cfg = load_config_dict(doc)
    assert cfg.heal.startup_grace_s == 60.0 and isinstance(cfg.heal.startup_grace_s, float)
    assert cfg.heal.protect_processes == ("sshd",) and cfg.heal.max_restarts_per_hour == 2
    assert cfg.heal.ssh_user is None and cfg.heal.command_timeout_s == 60.0  # defaults.yaml
    assert cfg.zulip.site == "http://127.0.0.1:9" and cfg.zulip.timeout_s == 3.0 and cfg.zulip.stream == "agent-hub"
    assert isinstance(cfg.history.coarse_bucket_s, int) and cfg.bench.prompt is None
