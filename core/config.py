"""Typed job configs: YAML file + dotted `key=value` overrides -> a validated dataclass.

Every job declares one dataclass tree. Loading is strict: an unknown key, a value of the wrong type or a
missing file raises `ConfigError` naming the dotted key (and the file), which the CLI turns into exit code 2
before any work starts.

    cfg = load_config(DemoConfig, "configs/demo.yaml", ["generate.batch_size=8", "run.root=/tmp/runs"])

A field whose values need a check this floor cannot make (a prompt template must load: `eval.prompts`) declares it
in its type, `Annotated[str, FieldCheck(fn)]`; `check_tree` runs it with the field's dotted key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Union

from core.errors import ConfigError
from core.files import load_yaml, read_utf8

# ---------------------------------------------------------------------------------------------------------------
# Reading YAML and applying overrides


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    data = load_yaml(read_utf8(path, ConfigError), str(path), ConfigError) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def apply_override(data: dict, override: str) -> None:
    """Set `a.b.c=value` in a nested dict; list items are addressed by index (`models.0.name=x`)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key=value")
    dotted, raw = override.split("=", 1)
    keys = dotted.strip().split(".")
    value = load_yaml(raw, f"override {dotted}: value {raw!r}", ConfigError) if raw.strip() else ""
    node: Any = data
    for i, key in enumerate(keys[:-1]):
        where = ".".join(keys[: i + 1])
        if isinstance(node, list):
            node = node[_list_index(key, node, where)]
        else:
            node = node.setdefault(key, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"override {dotted}: {where} is a value, not a section")
    last = keys[-1]
    if isinstance(node, list):
        node[_list_index(last, node, dotted)] = value
    else:
        node[last] = value


def _list_index(key: str, node: list, where: str) -> int:
    if not key.isdigit() or int(key) >= len(node):
        raise ConfigError(f"override {where}: list index {key!r} out of range (list has {len(node)} items)")
    return int(key)


# ---------------------------------------------------------------------------------------------------------------
# Building dataclasses with type checks


def build(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass `cls` from a plain mapping, checking every key and type recursively."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        raise ConfigError(f"unknown config key {key!r} (known keys here: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        kwargs[name] = _coerce(hints[name], value, key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or 'config'}: {exc}") from exc


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} matches none of {tp}")
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: {value!r} is not one of {list(allowed)}")
        return value
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        items = [_coerce(item_tp, v, f"{key}.{i}") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        _, val_tp = typing.get_args(tp) or (Any, Any)
        return {str(k): _coerce(val_tp, v, f"{key}.{k}") for k, v in value.items()}
    return _coerce_scalar(tp, value, key)


def _coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            # YAML turns `seed_tag: 1e3` into a float; a str field accepts the literal text back
            return str(value)
    else:
        raise ConfigError(f"{key}: unsupported config type {tp}")
    raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")


# ---------------------------------------------------------------------------------------------------------------
# Public entry points


def with_defaults(cls: type, data: Any) -> Any:
    """The class defaults overlaid with `data`: nested sections merge, lists/dicts/values replace.

    Overrides then address any default too (`generate.1.sampling.seed=3` works without a YAML entry). Unknown
    keys are carried over untouched so `build` can name them.
    """
    if not isinstance(data, dict):
        return data
    merged = dataclasses.asdict(cls())
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        field_type = hints.get(key)
        if field_type is not None and dataclasses.is_dataclass(field_type) and isinstance(value, dict):
            merged[key] = with_defaults(field_type, value)
        else:
            merged[key] = value
    return merged


def load_config(cls: type, path: str | Path | None, overrides: list[str] = ()) -> Any:
    """Read YAML `path` (may be None for all defaults), apply overrides, build and validate `cls`."""
    data = read_yaml(path) if path else {}
    data.pop("job", None)
    data = with_defaults(cls, data)
    for override in overrides:
        apply_override(data, override)
    where = f"{path}: " if path else ""
    try:
        cfg = build(cls, data)
        check_tree(cfg)
        validate = getattr(cfg, "validate", None)
        if validate is not None:
            validate()
    except (ConfigError, ValueError) as exc:
        raise ConfigError(f"{where}{exc}") from exc
    return cfg


def split_command(argv: list[str]) -> tuple[str, list[str], list[str]]:
    """A config command line `CONFIG [key=value ...] [--flag ...]` (flags anywhere after CONFIG) as
    (config path, overrides, flags), each in the order given; the caller knows its flags and refuses others."""
    rest = argv[1:]
    return argv[0], [a for a in rest if not a.startswith("--")], [a for a in rest if a.startswith("--")]


# ---------------------------------------------------------------------------------------------------------------
# Checks every job shares, run on the whole built config tree before the job's own `validate`

@dataclasses.dataclass(frozen=True)
class FieldCheck:
    """`fn(value, key)` raises ConfigError naming `key`; declared by the layer that owns the check, so this module
    imports nothing of ours (see `eval.prompts.TemplateName`)."""

    fn: Callable[[Any, str], None]


# numeric keys that may be negative, with their floor (top_k -1 = "no top-k filter"; CRAFT self-training's
# rounds.min_margin -1 = tied candidates make pairs too)
NEGATIVE_OK = {"top_k": -1, "min_margin": -1}
# keys naming an input file or directory, wherever a job nests them: when set, it must exist now
INPUT_PATHS = ("model_dir", "checkpoint", "rubrics", "rubrics_path", "domains_path", "nouns_path", "adapter",
               "init_adapter")


# environment variables that always hold secrets, whatever their name (tracking redacts them from logs too)
ALWAYS_SECRET = ("WANDB_API_KEY", "OPENAI_API_KEY", "QUORUM_SERVE_TOKEN", "HF_TOKEN")
# variable names that hold secrets: never in a Ray runtime env (`*.env_vars`), which Ray logs in clear text
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|CREDENTIALS?)$", re.IGNORECASE)


def check_env_vars(env_vars: dict, key: str) -> None:
    """A runtime-env map must not carry secrets: Ray writes its variables to runtime_env_agent.log."""
    for name in env_vars:
        if name in ALWAYS_SECRET or _SECRET_NAME.search(name):
            raise ConfigError(f"{key}.{name}: looks like a secret; Ray writes runtime-env variables to its logs in "
                              f"clear text. Export {name} in the environment instead (it reaches actors by name)")


def check_tree(node: Any, where: str = "") -> None:
    """Check every section of a built config, wherever a job nests it (lists and dicts included).

    Every number must be finite and >= 0 (a config has no meaningful negative count, size, rate or offset;
    `NEGATIVE_OK` lists the sentinels); then each section's own `check(where)` runs with its dotted key, so the
    sampling / engine / pool / judge sections validate themselves the same way in every job and in `quorum serve`.
    """
    if not dataclasses.is_dataclass(node):
        return
    hints = typing.get_type_hints(type(node), include_extras=True)
    for f in dataclasses.fields(node):
        key = f"{where}.{f.name}" if where else f.name
        _check_value(getattr(node, f.name), key, f.name, _field_checks(hints.get(f.name)))
    check = getattr(node, "check", None)
    if callable(check):
        try:
            check(where)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def _field_checks(tp: Any) -> tuple[FieldCheck, ...]:
    """The `FieldCheck`s in an `Annotated[...]` field type (also inside `X | None`)."""
    if typing.get_origin(tp) is typing.Annotated:
        return tuple(m for m in tp.__metadata__ if isinstance(m, FieldCheck))
    if typing.get_origin(tp) in (Union, types.UnionType):
        return tuple(c for arg in typing.get_args(tp) for c in _field_checks(arg))
    return ()


def _check_value(value: Any, key: str, name: str, checks: tuple[FieldCheck, ...] = ()) -> None:
    if isinstance(value, bool):
        return
    if checks and value not in (None, ""):
        # "" = the job's default (e.g. a template)
        for check in checks:
            check.fn(value, key)
    elif name in INPUT_PATHS and isinstance(value, str) and value and "://" not in value:
        if not Path(value).expanduser().exists():
            from core.corpora import hint_suffix

            raise ConfigError(f"{key}: no such file or directory: {value}{hint_suffix(value)}")
    elif isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}: must be a finite number, got {value}")
        floor = NEGATIVE_OK.get(name, 0)
        if value < floor:
            raise ConfigError(f"{key}: must be >= {floor}, got {value}")
    elif dataclasses.is_dataclass(value):
        check_tree(value, key)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(item, f"{key}.{i}", name)
    elif isinstance(value, dict):
        if name == "env_vars":
            check_env_vars(value, key)
        for k, item in value.items():
            _check_value(item, f"{key}.{k}", str(k))


# ---------------------------------------------------------------------------------------------------------------
# The one validation style (docs/configuration.md): a section checks its own fields in `check(where)` with the
# helpers below, which raise ConfigError naming the dotted YAML key; `check_tree` calls every section's `check`
# with the key the job nests it under, so a section never guesses its prefix; a job's `validate()` holds only rules
# that span sections or depend on what the run does.


class Section:
    """Base of every config section (a dataclass): `check(where)` holds its own rules.

    `validate(where)` checks a section built outside `load_config` (a trainer config rebuilt on a Ray Train worker,
    a section in a test) exactly as a job's load would: field floors, nested sections, then `check`.
    """

    def check(self, where: str = "") -> None:
        """The section's own rules; raise ConfigError through the helpers below, naming `dotted(where, field)`."""

    def validate(self, where: str = "") -> None:
        check_tree(self, where)


def dotted(where: str, name: str) -> str:
    """The dotted YAML key of field `name` in the section at `where` ("" = the top level)."""
    return f"{where}.{name}" if where else name


def fail(key: str, message: str) -> typing.NoReturn:
    raise ConfigError(f"{key}: {message}")


def positive(value: float, key: str) -> None:
    if value <= 0:
        fail(key, f"must be > 0, got {value!r}")


def in_range(value: float, low: float, high: float, key: str, *, low_open: bool = False,
             high_open: bool = False) -> None:
    """Raise ConfigError naming `key` unless value lies in [low, high] (open ends with `low_open` / `high_open`)."""
    if value < low or value > high or (low_open and value == low) or (high_open and value == high):
        fail(key, f"must be in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}, got {value!r}")


def one_of(value: Any, allowed: tuple | list, key: str) -> None:
    if value not in allowed:
        fail(key, f"{value!r} is not one of {', '.join(map(str, allowed))}")


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def config_hash(obj: Any) -> str:
    """Stable short hash of a config (or any section of one, or any JSON-able object)."""
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    blob = json.dumps(obj, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def require_file(path: str, key: str) -> None:
    """Raise ConfigError if the file behind config key `key` does not exist; when the path is where a corpus of
    `core/corpora.yaml` goes, the message names the `quorum data get` command that puts it there."""
    if path and not Path(path).exists():
        from core.corpora import hint_suffix

        fail(key, f"file not found: {path}{hint_suffix(path)}")


# CPU / GPU / memory have their own fields (num_cpus, num_gpus, ...); Ray refuses them inside `resources`
RESERVED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def check_custom_resources(resources: dict, key: str) -> None:
    """A `{name: amount}` map of custom Ray resources (`{gpu_slot: 1}`): names non-empty strings other than Ray's
    built-in ones, amounts finite numbers >= 0. Errors name `key.<name>`."""
    if not isinstance(resources, dict):
        fail(key, f"must be a mapping of resource name to amount, got {type(resources).__name__}")
    for name, amount in resources.items():
        if not isinstance(name, str) or not name.strip():
            fail(key, f"resource names must be non-empty strings, got {name!r}")
        if name in RESERVED_RESOURCES:
            fail(dotted(key, name), f"{name} is not a custom resource; use the section's num_cpus / num_gpus field")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount < 0:
            fail(dotted(key, name), f"must be a finite number >= 0, got {amount!r}")
