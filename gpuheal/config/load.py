"""Load, validate and merge the configuration: the file, the environment and ``.env`` (through
:mod:`gpuheal.credentials`). The records it builds are the pure dataclasses of
:mod:`gpuheal.config.model`. IO (reading the file) happens only in :func:`load_config`;
:func:`load_config_dict` is pure but for the L4 credential lookup, and is what the tests drive."""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuheal.config.model import (  # noqa: F401  (re-exported: the public names live in model.py)
    ALERT_KEYS,
    COMMAND_KEYS,
    ENGINE_PARAMS,
    PLACEHOLDERS,
    SSH_PORT,
    AlertsConfig,
    BenchConfig,
    Config,
    GpuConfig,
    HealConfig,
    HistoryConfig,
    LiteLLMConfig,
    ProbeConfig,
    Role,
    StateConfig,
    WakeConfig,
    section_record,
    split_command,
)
from gpuheal.config.params import check_section
from gpuheal.config.parsed import ParsedTexts
from gpuheal.config.yamlsafe import load_yaml
from gpuheal.credentials import env_or_dotenv
from gpuheal.errors import ConfigError

if TYPE_CHECKING:  # jsonschema loads only when a config text is validated (its import is ~50-75 ms)
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

# --------------------------------------------------------------------------- loading

# The package's own files, read by path: ``importlib.resources`` costs ~3-5 ms of import on every
# cron start (issue 19, "Performance"), and gpuheal is always installed as a directory.
_HERE = Path(__file__).resolve().parent


def _defaults(parsed: ParsedTexts | None = None) -> dict[str, Any]:
    """``defaults.yaml``, parsed once a process; :func:`load_config` asks first, through the state
    directory's cache of parsed texts (``config/parsed.py``), so a cached run never imports PyYAML.
    The result is shared: callers copy before they change it."""
    if _DEFAULTS_SEEN and (parsed is None or parsed.cache_dir is None):
        return _DEFAULTS_SEEN[0]
    text = (_HERE / "defaults.yaml").read_text("utf-8")
    data: dict[str, Any] = (parsed or ParsedTexts(None)).parse(text, _parse_defaults)
    _DEFAULTS_SEEN[:] = [data]
    return data


_DEFAULTS_SEEN: list[dict[str, Any]] = []  # what the first _defaults() call of this process gave


def _parse_defaults(text: str) -> Any:
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@cache
def _validator() -> Validator:
    """Compiled once per process (issue 2: "validated against a JSON Schema ... compiled once")."""
    import jsonschema

    schema = json.loads((_HERE / "schema.json").read_text("utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def resolve_config_path(explicit: str | None) -> Path:
    """``--config`` → ``$GPUHEAL_CONFIG`` → ``./gpuheal.yaml`` (contract: Commands)."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("GPUHEAL_CONFIG")
    if env:
        return Path(env)
    return Path("gpuheal.yaml")


def load_config(path: Path | str, cache_dir: Path | str | None = None) -> Config:
    """Read, parse and validate the config file.

    ``cache_dir`` (the state directory): remember there the digest of a text that passed the
    JSON Schema, so the next cron run of the same text skips jsonschema (its import alone is
    ~50-75 ms of every start; validating 1000 GPUs another ~100 ms). The digest covers the schema
    too, so a new schema revalidates; every other check still runs. ``config validate`` passes
    no cache and always validates in full. The same directory keeps what the config text and
    ``defaults.yaml`` parsed into (``config/parsed.py``): an unchanged text skips PyYAML.
    """
    path = Path(path)
    text = read_config_text(path)
    cache_path = Path(cache_dir) if cache_dir is not None else None
    parsed = ParsedTexts(cache_path)
    if text.lstrip().startswith("{"):  # JSON (a generated fleet): its own parser is fast, nothing to keep
        data = load_yaml(text, str(path))
    else:
        data = parsed.parse(text, lambda config: load_yaml(config, str(path)))
    _defaults(parsed)
    checked = None if cache_path is None else (cache_path, _schema_digest(text))
    known_ok = checked is not None and _read_validated(checked[0]) == checked[1]
    cfg = load_config_dict(data, path=str(path), schema_checked=known_ok)
    if checked is not None and not known_ok:
        _remember_validated(*checked)
    parsed.save()
    return cfg


MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a 1,000-GPU fleet is ~300 KB; issue 9: a 50 MB file took 4.4 s


def read_config_text(path: Path) -> str:
    """The config's text, refused unread past :data:`MAX_CONFIG_BYTES` (never more is read, so a
    FIFO or ``/dev/zero`` cannot hold the run either)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path} (pass --config PATH or set GPUHEAL_CONFIG)") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB; not a gpuheal config")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config {path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


VALIDATED_FILE = ".config-validated"


def _schema_digest(text: str) -> str:
    import hashlib

    schema = (_HERE / "schema.json").read_bytes()
    return hashlib.sha256(schema + b"\0" + text.encode("utf-8")).hexdigest()


def _read_validated(cache_dir: Path) -> str | None:
    try:
        return (cache_dir / VALIDATED_FILE).read_text("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _remember_validated(cache_dir: Path, digest: str) -> None:
    """Best effort, outside the state lock: temp file + rename, so a reader sees all or nothing."""
    if not cache_dir.is_dir():
        return
    from gpuheal.atomic import write_atomic

    try:
        write_atomic(cache_dir / VALIDATED_FILE, [digest, "\n"])
    except OSError:
        pass


def load_config_dict(data: Any, path: str | None = None, *, schema_checked: bool = False) -> Config:
    """Validate ``data`` (parsed YAML) and build the :class:`Config`. Pure but for Lesson L4's ``.env``
    lookup of ``litellm.api_key_env``.

    ``schema_checked``: this exact document already passed the JSON Schema (see
    :func:`load_config`); the other checks run regardless.
    """
    if data is None:
        raise ConfigError("the config file is empty; it needs at least a 'gpus' list")
    if not isinstance(data, dict):
        raise ConfigError("the config must be a mapping of keys (monitor, litellm, gpus, ...)")
    _check_finite(data)
    if not schema_checked:
        _validate_schema(data)
    _validate_semantics(data)
    merged = _merge(copy.deepcopy(_defaults()), {k: v for k, v in data.items() if k != "gpus"})
    fleet_rules: dict[str, dict[str, Any]] = merged.get("rules") or {}
    shared = _fleet_rules_copy(fleet_rules)
    gpus = tuple(_gpu(i, g, fleet_rules, shared) for i, g in enumerate(data["gpus"]))
    lite = merged["litellm"]
    api_key = _litellm_key(lite, path)
    return Config(
        path=path,
        litellm=LiteLLMConfig(
            url=lite.get("url"),
            api_key=api_key or "",
            timeout_s=float(lite["timeout_s"]),
            restart_command=_argv(lite.get("restart_command")),
            host=lite.get("host"),
            transport=lite.get("transport", "local"),
            admin_key_env=lite.get("admin_key_env") or "LITELLM_MASTER_KEY",
            read_metrics=lite.get("read_metrics") is True,
            read_spend_logs=lite.get("read_spend_logs") is True,
            spend_logs_max_rows=int(lite.get("spend_logs_max_rows") or 20000),
            config_file=lite.get("config_file") or None,
            reload_wait_s=float(lite.get("reload_wait_s") or 120.0),
        ),
        gpus=gpus,
        probe=section_record(ProbeConfig, merged["probe"]),
        alerts=section_record(AlertsConfig, _alerts(data, merged)),
        state=section_record(StateConfig, merged["state"]),
        history=section_record(HistoryConfig, merged["history"]),
        bench=section_record(BenchConfig, merged["bench"]),
        heal=section_record(HealConfig, merged["heal"]),
        knowledge_graph=merged.get("knowledge_graph") or {},
        rules=fleet_rules,
        metrics_file=merged.get("metrics_file"),
        sections={**_source_sections(data, merged, gpus, fleet_rules, shared), **_sink_sections(merged)},
        wake=WakeConfig(str(merged["wake"]["token_env"]), float(merged["wake"]["min_interval_s"]), "wake" in data),
    )


def _alerts(data: dict[str, Any], merged: dict[str, Any]) -> dict[str, Any]:
    """``alerts:`` over its defaults, with what a config written before it put under ``zulip:``
    (``zulip.group_by`` …) still read; one key set in both places to two values is refused."""
    out = dict(merged["alerts"])
    written = data.get("alerts") or {}
    legacy = data.get("zulip") or {}
    for key in ALERT_KEYS:
        if key not in legacy:
            continue
        if key in written and written[key] != legacy[key]:
            raise ConfigError(f"also set as zulip.{key} ({legacy[key]!r}); keep alerts.{key} only", f"alerts.{key}")
        out[key] = legacy[key]
    return out


def _sink_sections(merged: dict[str, Any]) -> dict[str, Any]:
    """Each alert sink's section record (:data:`gpuheal.sinks.SINKS`), from its section over its defaults."""
    from gpuheal.sinks import SINKS

    return {kind.section: section_record(kind.record, merged[kind.section]) for kind in SINKS
            if kind.section and kind.record}


def _source_sections(
    data: dict[str, Any],
    merged: dict[str, Any],
    gpus: tuple[GpuConfig, ...],
    fleet_rules: dict[str, dict[str, Any]],
    shared: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The GPU source's section record, built by the source's own declaration
    (:mod:`gpuheal.source_kinds`): at most one source section may be written."""
    from gpuheal.source_kinds import REGISTRY, SectionInput

    written = [k.section for k in REGISTRY if k.section and data.get(k.section) is not None]
    if len(written) > 1:
        names = " and ".join(f"{s}:" for s in sorted(written))
        raise ConfigError(f"{names} are two GPU data sources; keep one", written[0])
    out: dict[str, Any] = {}
    for kind in REGISTRY:
        if kind.section is None or kind.build is None:
            continue
        record = kind.build(SectionInput(data, merged.get(kind.section) or {}, gpus, fleet_rules, shared))
        if record is not None:
            out[kind.section] = record
    return out


def _litellm_key(lite: dict[str, Any], path: str | None) -> str | None:
    """The key every llama-server must accept (L1): ``litellm.api_key_env`` (environment, then
    ``.env``), else ``litellm.api_key`` — with a warning when the named source has nothing, since a
    wrong key makes every llama-server look like an L1 mismatch (L4: check the source)."""
    name = lite.get("api_key_env")
    if not name:
        return lite.get("api_key")
    value = env_or_dotenv(name, path)
    if value:
        return value
    import logging

    logging.getLogger("gpuheal").warning(
        "litellm.api_key_env: %s is set neither in the environment nor in a .env file; "
        "using litellm.api_key (Lesson L4)",
        name,
    )
    return lite.get("api_key")


def _argv(value: Any) -> tuple[str, ...] | None:
    return None if value is None else split_command(value)


def _fleet_rules_copy(fleet_rules: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    # rule parameters are flat mappings of scalars (schema): a copy per rule is a deep copy
    return {rule_id: dict(params) for rule_id, params in fleet_rules.items()}


def _role(raw: Any) -> Role | None:
    """``gpus[].role`` as an object (the schema checked its types) → :class:`Role`; a plain string
    names the role without saying which requests belong to it (``None``: Rule 10 judges weight only)."""
    if not isinstance(raw, dict):
        return None
    return Role(name=raw.get("name"), model_groups=tuple(raw.get("model_groups") or ()),
                request_tags=tuple(raw.get("request_tags") or ()), min_prompt_tokens=raw.get("min_prompt_tokens"),
                max_prompt_tokens=raw.get("max_prompt_tokens"))


def _gpu(
    index: int, raw: dict[str, Any], fleet_rules: dict[str, dict[str, Any]], shared: dict[str, dict[str, Any]]
) -> GpuConfig:
    """``shared``: the fleet's rule parameters, one copy for every GPU that overrides none (nothing
    writes to a loaded config; a copy per GPU was 130,000 dicts at 10,000 GPUs, issue 13)."""
    own = raw.get("rules") or {}
    if not own and "vram_leak_mb_per_hour" not in raw:
        rules = shared
    else:
        rules = _fleet_rules_copy(fleet_rules)
        for rule_id, params in own.items():
            rules.setdefault(rule_id, {}).update(params)
        if "vram_leak_mb_per_hour" in raw:
            rules.setdefault("vram-leak", {})["mb_per_hour"] = raw["vram_leak_mb_per_hour"]
    leak = float(rules["vram-leak"]["mb_per_hour"])  # defaults.yaml always has it (merged at load)
    commands = {k: split_command(raw[k]) for k in COMMAND_KEYS if k in raw}
    return GpuConfig(
        alias=raw["alias"],
        host=raw["host"],
        endpoint=raw["endpoint"].rstrip("/"),
        vendor=raw.get("vendor", "nvidia"),
        vram_total_mb=raw.get("vram_total_mb"),
        baseline_tok_s=raw.get("baseline_tok_s"),
        vram_leak_mb_per_hour=leak,
        transport=raw.get("transport", "ssh"),
        name=raw.get("name"),
        ssh_user=raw.get("ssh_user"),
        ssh_port=raw.get("ssh_port", SSH_PORT),
        role=raw["role"].get("name") if isinstance(raw.get("role"), dict) else raw.get("role"),
        role_kinds=_role(raw.get("role")),
        weight=raw.get("weight"),
        n_ctx=raw.get("n_ctx"),
        litellm_model_id=raw.get("litellm_model_id"),
        litellm_rpm=raw.get("litellm_rpm"),
        paused=bool(raw.get("paused", False)),
        gpu_index=raw.get("gpu_index"),
        unified_memory=raw.get("unified_memory"),
        prometheus_match=raw.get("prometheus_match"),
        labels=dict(raw.get("labels") or {}),
        commands=commands,
        rules=rules,
    )


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = _merge(base[key], value)
        else:
            base[key] = value
    return base


def _validate_semantics(data: dict[str, Any]) -> None:
    seen_alias: dict[str, int] = {}
    seen_gpu: dict[tuple[str, int | str | None], int] = {}
    for i, gpu in enumerate(data["gpus"]):
        alias = gpu["alias"]
        if alias in seen_alias:
            raise ConfigError(f"duplicate alias {alias!r} (also gpus[{seen_alias[alias]}])", f"gpus[{i}].alias")
        if alias == "fleet":
            raise ConfigError("'fleet' is reserved for fleet-wide issues", f"gpus[{i}].alias")
        _check_gpu_slot(seen_gpu, data["gpus"], i)
        seen_alias[alias] = i
        for key in COMMAND_KEYS:
            if key in gpu:
                _check_placeholders(gpu[key], f"gpus[{i}].{key}")
    for section, key in (("litellm", "restart_command"), ("heal", "gpu_monitor_restart_command")):
        value = (data.get(section) or {}).get(key)
        if value is not None:
            _check_placeholders(value, f"{section}.{key}")
    # the strict rule-parameter schema, generated from defaults.yaml (contract: "Rule parameters")
    defaults = _defaults()["rules"]
    check_section(data.get("rules"), defaults, "rules", common=ENGINE_PARAMS)
    for i, gpu in enumerate(data["gpus"]):
        check_section(
            gpu.get("rules"),
            defaults,
            f"gpus[{i}].rules",
            common=ENGINE_PARAMS,
            inherited=data.get("rules") or {},
            inherited_where="rules",
        )


def _check_gpu_slot(seen: dict[tuple[str, int | str | None], int], gpus: list[dict[str, Any]], i: int) -> None:
    """Entries may share a ``host`` when each names its ``gpu_index`` (contract "Direct sensing"):
    GPUs are matched to smi rows and gpu-monitor entries by (host, index), so two entries on one
    (host, index) — or a host shared by an entry without an index — would read the same GPU."""
    host, index = gpus[i]["host"], gpus[i].get("gpu_index")
    where = f"gpus[{i}].gpu_index" if index is not None else f"gpus[{i}].host"
    clash = seen.get((host, index))
    if clash is None and index is None:
        clash = seen.get((host, "any"))  # any entry on this host (kept below: no scan of the fleet)
    if clash is None and index is not None:
        clash = seen.get((host, None))
    if clash is not None:
        other = gpus[clash]

        def shown(g: dict[str, Any], n: int) -> str:
            return f"gpus[{n}] ({g['alias']!r}, index {g.get('gpu_index', 'unset')})"

        if index is not None and other.get("gpu_index") == index:
            problem = f"duplicate GPU (host {host!r}, index {index}): {shown(gpus[i], i)} and {shown(other, clash)}"
        else:
            problem = (
                f"host {host!r} is shared by {shown(other, clash)} and {shown(gpus[i], i)}: "
                "give each of them its gpu_index"
            )
        raise ConfigError(problem, where)
    seen[(host, index)] = i
    seen.setdefault((host, "any"), i)  # the first entry on the host


_FLOAT_MAX = sys.float_info.max


def _check_finite(data: Any) -> None:
    """YAML has ``.nan`` and ``.inf``; JSON Schema's bounds do not reject them (NaN compares
    false with everything), so a threshold of NaN would silently never fire. An integer too large
    for a float (400 digits) is refused here too: every reader takes numbers with ``float()``, which
    raised OverflowError at load (``monitor.timeout_s``) or later in a run (issue 9).

    Every number of a 10,000-GPU config is looked at each cron run: first without the key paths
    (a tuple per value was most of the cost), which are built only to name a bad value."""
    if not _all_finite(data):
        _name_first_non_finite(data)


def _all_finite(data: Any) -> bool:
    import math

    stack, seen = [data], set()
    while stack:
        value = stack.pop()
        if type(value) is str:  # most of a config: skipped before the checks below
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                return False
        elif isinstance(value, dict | list):
            if id(value) in seen:  # a YAML alias cycle; the schema check reports the shape
                continue
            seen.add(id(value))
            stack.extend(value.values() if isinstance(value, dict) else value)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > _FLOAT_MAX:
            return False
    return True


def _name_first_non_finite(data: Any) -> None:
    import math

    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    seen: set[int] = set()
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"must be a finite number, not {value}", format_key_path(path) or "(top level)")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _FLOAT_MAX:
            raise ConfigError("must be a finite number, not an integer too large for one", format_key_path(path))
        if isinstance(value, dict | list):
            if id(value) in seen:
                continue
            seen.add(id(value))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend((v, (*path, k)) for k, v in items)


def _check_placeholders(value: str | list[str], key_path: str) -> None:
    import string

    try:
        argv = split_command(value)
    except ValueError as exc:  # shlex: "No closing quotation"
        raise ConfigError(f"cannot split command: {exc}", key_path) from None
    if not argv:
        raise ConfigError("command is empty", key_path)
    for arg in argv:
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(arg) if name is not None}
        except ValueError as exc:
            raise ConfigError(f"bad placeholder in {arg!r}: {exc}", key_path) from None
        allowed = PLACEHOLDERS | ({"pid"} if key_path.endswith("kill_command") else set())
        unknown = names - allowed
        if unknown:
            shown = " ".join("{" + n + "}" for n in sorted(allowed))
            raise ConfigError(f"unknown placeholder {{{sorted(unknown)[0]}}} (allowed: {shown})", key_path)


# --------------------------------------------------------------------------- schema errors


def _validate_schema(data: dict[str, Any]) -> None:
    import jsonschema

    errors = list(_validator().iter_errors(data))
    if not errors:
        return
    best = jsonschema.exceptions.best_match(errors)
    # best_match prefers shallow errors; a oneOf wrapper hides the useful leaf.
    while best.context:
        best = jsonschema.exceptions.best_match(best.context)
    path, message = _describe(best)
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    raise ConfigError(message + more, key_path=path or "(top level)")


def format_key_path(parts: Iterable[str | int]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_TYPE_NAMES: dict[str, str] = {
    "number": "a number",
    "integer": "a whole number",
    "string": "a string",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}


def _yaml_type(value: Any) -> str:
    """The YAML word for what the user wrote (``null``, not ``NoneType``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _describe(error: ValidationError) -> tuple[str, str]:
    path = format_key_path(error.absolute_path)
    v = error.validator
    # jsonschema types these "or unset"; every error its validator yields has them set
    instance: Any = error.instance
    schema: Any = error.schema
    value: Any = error.validator_value
    if v == "required":
        missing = error.message.split("'")[1] if "'" in error.message else "?"
        return (f"{path}.{missing}" if path else missing), "is required"
    if v == "additionalProperties":
        extra = sorted(set(instance) - set(schema.get("properties", {})))
        name = extra[0] if extra else "?"
        allowed = ", ".join(sorted(schema.get("properties", {})))
        return (f"{path}.{name}" if path else name), f"unknown key (allowed: {allowed})"
    if v == "exclusiveMinimum":
        return path, f"must be > {value}"
    if v == "minimum":
        return path, f"must be >= {value}"
    if v == "maximum":
        return path, f"must be <= {value}"
    if v == "type":
        names = [_TYPE_NAMES.get(t, str(t)) for t in (value if isinstance(value, list) else [value])]
        return path, f"must be {' or '.join(names)}, not {_yaml_type(instance)}"
    if v == "enum":
        return path, "must be one of: " + ", ".join(map(str, value))
    if v == "pattern":
        if path.endswith("alias"):
            return path, "must be lower-case letters, digits, '-' or '.' (a stable alias, L6)"
        if path.endswith(("url", "endpoint", "site")):
            return path, f"must be an http:// or https:// URL, not {instance!r}"
        return path, f"{instance!r} is not allowed here"
    if v in ("minItems", "minLength"):
        return path, "must not be empty"
    if v == "maxLength":
        return path, f"must be at most {value} characters"
    return path, error.message
