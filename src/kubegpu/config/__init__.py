"""NVIDIA-compatible configuration files: loading, one-line error messages, and the kind registry.

Every config error a user sees has one shape, `<file>: <field.path[0].sub>: <what is wrong>`, whatever produced it
(a YAML syntax error, a pydantic type error, a cross-field rule). This module owns that shape so the device-plugin
config, the mig-parted config and any kind added later (scenario files, NodePools) report errors the same way.

`kubegpu validate-config` detects a file's kind through a small registry: a kind is a name, a `detect(data)`
predicate over the parsed document and a `validate(data, source, options)` function. Other components add their
kinds with `register_validator(...)` (typically from their CLI module's `register(app)`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from kubegpu.errors import ConfigError
from kubegpu.files import load_yaml_file, parse_yaml_text

__all__ = [
    "ConfigKind",
    "StrictModel",
    "ValidationOptions",
    "describe_value",
    "detect_kind",
    "format_location",
    "load_yaml_file",
    "parse_yaml_text",
    "register_validator",
    "registered_kinds",
    "validate_document",
    "validation_error_line",
]


# ---------------------------------------------------------------------------------------------- YAML loading
# The bounded, safe readers live in kubegpu.files (the one input layer); they are re-exported here because every
# config kind imports them from kubegpu.config.


# ---------------------------------------------------------------------------------------------- error lines

_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_YAML_TYPE_NAMES = {
    "dict": "a mapping", "list": "a list", "str": "a string", "int": "an integer", "float": "a number",
    "bool": "a boolean", "NoneType": "null", "date": "a date", "datetime": "a timestamp", "tuple": "a list",
    "set": "a set", "bytes": "binary data",
}
_EXPECTED_BY_TYPE = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "bool_type": "a boolean (true or false)", "bool_parsing": "a boolean (true or false)",
    "string_type": "a string", "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
    "model_attributes_type": "a mapping", "float_type": "a number", "tuple_type": "a list",
}


_PYDANTIC_TAGS = ("function-", "literal[", "union[", "tagged-union[", "nullable[", "list[", "dict[", "json-or-python[")
_PYDANTIC_TYPES = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


def field_path(loc: Sequence[int | str]) -> str:
    """pydantic's error location as the field path a user wrote: `("spec", "limits", "cpu")` → `spec.limits.cpu`,
    list indexes as `[i]`, pydantic's own validator and union tags (`function-after[...]`, `str`, `literal[...]`)
    left out. One helper for every CR and file model, so a path reads the same whichever component reports it."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in _PYDANTIC_TYPES and not part.startswith(_PYDANTIC_TAGS):
            path += f".{part}" if path else part
    return path


def model_error_message(exc: ValidationError) -> str:
    """The first pydantic error as `field.path: what` (later errors are usually consequences of the first)."""
    first = exc.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    path = field_path(tuple(p for p in first["loc"] if isinstance(p, int | str)))
    return f"{path}: {message}" if path else message


def format_location(loc: Sequence[int | str]) -> str:
    """`("sharing", "timeSlicing", "resources", 0, "replicas")` → `sharing.timeSlicing.resources[0].replicas`.

    Keys that are not plain words (mig-parted config names such as `all-1g.10gb`) are written `["all-1g.10gb"]`
    so the path stays unambiguous.
    """
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            text += f".{part}" if text else part
        else:
            text += f'["{part}"]'
    return text


def describe_value(value: object) -> str:
    """A short, single-line rendering of an offending value with its YAML type (`string 'foo'`, `integer 1`)."""
    kind = _YAML_TYPE_NAMES.get(type(value).__name__, type(value).__name__)
    if value is None:
        return "null"
    if isinstance(value, dict | list | tuple | set):
        return kind
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{kind} {' '.join(shown.split())}"


def _error_text(error: Any) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {describe_value(value)}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        bound = next(iter(ctx.values()), "?")
        words = {"greater_than_equal": "at least", "greater_than": "greater than",
                 "less_than_equal": "at most", "less_than": "less than"}[kind]
        return f"must be {words} {bound}, got {value!r}"
    if kind in ("too_short", "too_long"):
        limit = ctx.get("min_length", ctx.get("max_length"))
        return f"must have {'at least' if kind == 'too_short' else 'at most'} {limit} item(s)"
    if kind in ("value_error", "assertion_error"):
        message = str(ctx.get("error", error["msg"]))
        return message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if kind in _EXPECTED_BY_TYPE:
        return f"must be {_EXPECTED_BY_TYPE[kind]}, got {describe_value(value)}"
    return f"{error['msg'][:1].lower()}{error['msg'][1:]}"


def validation_error_line(exc: ValidationError, source: str, prefix: Sequence[int | str] = ()) -> str:
    """The first pydantic error as `<source>: <field.path>: <what>`; later errors are usually consequences."""
    error = exc.errors()[0]
    loc = [*prefix, *(p for p in error["loc"] if isinstance(p, int | str))]
    path = format_location(loc)
    text = " ".join(_error_text(error).split())
    return f"{source}: {path}: {text}" if path else f"{source}: {text}"


# ---------------------------------------------------------------------------------------------- models


class StrictModel(BaseModel):
    """Common settings: NVIDIA's key names, unknown keys rejected, no lax coercion ("1" is not a number)."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=False, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_means_unset(cls, data: Any) -> Any:
        """`key:` with no value (YAML null) leaves a defaulted field at its default, as NVIDIA's pointers do."""
        if not isinstance(data, dict):
            return data
        defaulted = {
            (info.alias or name)
            for name, info in cls.model_fields.items()
            if not info.is_required()
        }
        return {k: v for k, v in data.items() if not (v is None and k in defaulted)}



# ---------------------------------------------------------------------------------------------- kind registry


@dataclass(frozen=True)
class ValidationOptions:
    """Options of `kubegpu validate-config` that some kinds use (others ignore them)."""

    gpu_models: tuple[str, ...] = ()  # mig-parted: check layouts against these catalog models (default: all)


@dataclass(frozen=True)
class ConfigKind:
    """One file kind `validate-config` knows: `detect` looks at the parsed document, `validate` raises ConfigError.

    `validate` returns a short summary (e.g. "checked against A100-SXM4-80GB") or "" to print nothing extra.
    """

    name: str
    detect: Callable[[object], bool]
    validate: Callable[[object, str, ValidationOptions], str]


@dataclass
class _Registry:
    kinds: list[ConfigKind] = field(default_factory=list)
    builtins_loaded: bool = False


_REGISTRY = _Registry()


def register_validator(
    kind_name: str,
    detect: Callable[[object], bool],
    validate: Callable[[object, str, ValidationOptions], str],
) -> None:
    """Add (or replace, by name) a file kind. Kinds are tried in registration order; the first match wins."""
    kind = ConfigKind(kind_name, detect, validate)
    for i, existing in enumerate(_REGISTRY.kinds):
        if existing.name == kind_name:
            _REGISTRY.kinds[i] = kind
            return
    _REGISTRY.kinds.append(kind)


def registered_kinds() -> list[ConfigKind]:
    _load_builtin_kinds()
    return list(_REGISTRY.kinds)


def _load_builtin_kinds() -> None:
    """Register the device-plugin and mig-parted kinds on first use (imported here to avoid import cycles)."""
    if _REGISTRY.builtins_loaded:
        return
    _REGISTRY.builtins_loaded = True
    from kubegpu.config import deviceplugin, migparted

    deviceplugin.register_kind()
    migparted.register_kind()


def detect_kind(data: object, source: str) -> ConfigKind:
    """The registered kind of a parsed document; a ConfigError naming the known kinds when none matches."""
    if data is None:
        raise ConfigError(f"{source}: the file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {describe_value(data)}")
    for kind in registered_kinds():
        if kind.detect(data):
            return kind
    names = ", ".join(k.name for k in registered_kinds())
    raise ConfigError(f"{source}: cannot tell what kind of file this is (known kinds: {names})")


def validate_document(data: object, source: str, options: ValidationOptions | None = None) -> tuple[str, str]:
    """Detect and validate one parsed document; returns (kind name, summary) or raises a one-line ConfigError."""
    kind = detect_kind(data, source)
    summary = kind.validate(data, source, options or ValidationOptions())
    return kind.name, summary
