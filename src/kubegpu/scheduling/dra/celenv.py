"""CEL for DRA device selectors, on the `common-expression-language` library (Rust core).

Why this library: measured on the expressions DRA uses (`device.driver`, `device.attributes[...]`,
`device.capacity[...].compareTo(quantity(...))`), it evaluates a selector in ~85 µs and compiles in ~0.2 ms, against
~2.3 ms for each with `cel-python`; both accept the same expressions and neither ships Kubernetes' quantity/semver
library or `cel.bind`, so those are supplied here:

- Quantities are CEL maps `{"__quantity__": <base units as double>}` and versions `{"__semver__": "<text>"}`; the
  Kubernetes library functions (`quantity`, `isQuantity`, `compareTo`, `isGreaterThan`, `isLessThan`, `add`, `sub`,
  `asInteger`, `asApproximateFloat`, `sign`, `isInteger`, `semver`, `isSemver`, `major`, `minor`, `patch`) work on
  them, method style included, so `device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0` and
  `device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0"))` behave as in the scheduler.
- `cel.bind(v, init, expr)` is rewritten to the equivalent `[init].map(v, expr)[0]` before compiling.
- An unknown attribute domain reads as an empty map (as in Kubernetes), so `has(...)` on it is false.

Each expression is compiled once (`compile_selector` is cached); a compile error or a function outside the
environment is a `CelCompileError`, a runtime error (missing key, non-bool result) a `CelRuntimeError`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import cel  # type: ignore[import-untyped]
import cel.stdlib  # type: ignore[import-untyped]

from kubegpu.errors import ConfigError, KubegpuError
from kubegpu.scheduling.quantity import parse_quantity

QUANTITY_KEY = "__quantity__"
SEMVER_KEY = "__semver__"
MAX_EXPRESSION_LENGTH = 10 * 1024  # CELSelectorExpressionMaxLength

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


class CelCompileError(ConfigError):
    """A selector that does not compile (or uses a function the DRA environment lacks)."""


class CelRuntimeError(KubegpuError):
    """A selector that failed while evaluating against one device; the scheduler aborts that allocation."""


def quantity_value(value: float) -> dict[str, float]:
    return {QUANTITY_KEY: float(value)}


def semver_value(text: str) -> dict[str, str]:
    return {SEMVER_KEY: text}


def is_semver(text: str) -> bool:
    return _SEMVER.match(text) is not None


def semver_key(text: str) -> tuple[Any, ...]:
    """A sort key implementing semver 2.0 precedence (build metadata ignored)."""
    match = _SEMVER.match(text)
    if match is None:
        raise ValueError(f"invalid semver {text!r}")
    major, minor, patch, pre, _build = match.groups()
    release = (int(major), int(minor), int(patch))
    if pre is None:
        return (*release, 1, ())
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (*release, 0, parts)


# --- the Kubernetes quantity / semver library -----------------------------------------------------------------------


def _q(value: object) -> float:
    if isinstance(value, Mapping) and QUANTITY_KEY in value:
        return float(value[QUANTITY_KEY])
    raise ValueError(f"not a quantity: {value!r}")


def _s(value: object) -> tuple[Any, ...]:
    if isinstance(value, Mapping) and SEMVER_KEY in value:
        return semver_key(str(value[SEMVER_KEY]))
    raise ValueError(f"not a semver: {value!r}")


def _compare(a: object, b: object) -> int:
    if isinstance(a, Mapping) and SEMVER_KEY in a:
        x, y = _s(a), _s(b)
        return (x > y) - (x < y)
    fx, fy = _q(a), _q(b)
    return (fx > fy) - (fx < fy)


def _quantity(text: object) -> dict[str, float]:
    try:
        return quantity_value(parse_quantity(str(text)))
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def _is_quantity(text: object) -> bool:
    try:
        parse_quantity(str(text))
    except ConfigError:
        return False
    return True


def _semver(text: object) -> dict[str, str]:
    if not is_semver(str(text)):
        raise ValueError(f"invalid semver {text!r}")
    return semver_value(str(text))


def _version_part(index: int) -> Callable[[object], int]:
    def part(value: object) -> int:
        return int(_s(value)[index])

    return part


def _as_integer(value: object) -> int:
    number = _q(value)
    if not number.is_integer():
        raise ValueError("cannot convert value to integer")
    return int(number)


_K8S_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: _compare(a, b) > 0,
    "isLessThan": lambda a, b: _compare(a, b) < 0,
    "add": lambda a, b: quantity_value(_q(a) + (_q(b) if isinstance(b, Mapping) else float(b))),
    "sub": lambda a, b: quantity_value(_q(a) - (_q(b) if isinstance(b, Mapping) else float(b))),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda a: float(_q(a)),
    "sign": lambda a: (_q(a) > 0) - (_q(a) < 0),
    "isInteger": lambda a: _q(a).is_integer(),
    "semver": _semver,
    "isSemver": lambda text: is_semver(str(text)),
    "major": _version_part(0),
    "minor": _version_part(1),
    "patch": _version_part(2),
}

# Functions the Rust core provides itself (macros and the CEL standard definitions).
_CORE_FUNCTIONS = frozenset({
    "size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double", "string", "bytes", "bool",
    "type", "timestamp", "duration", "dyn", "has", "all", "exists", "exists_one", "map", "filter", "max", "min",
    "getFullYear", "getMonth", "getDayOfYear", "getDayOfMonth", "getDate", "getDayOfWeek", "getHours", "getMinutes",
    "getSeconds", "getMilliseconds",
})
_EXTENSIONS = ["core", "strings", "math", "sets"]


@functools.cache
def _base_functions() -> dict[str, Callable[..., Any]]:
    context = cel.Context()
    cel.stdlib.add_stdlib_to_context(context, _EXTENSIONS)
    functions: dict[str, Callable[..., Any]] = dict(context.functions)
    functions.update(_K8S_FUNCTIONS)
    return functions


# --- cel.bind ---------------------------------------------------------------------------------------------------------

_BIND = re.compile(r"\bcel\s*\.\s*bind\s*\(")


def _split_call(text: str, open_at: int) -> tuple[list[str], int]:
    """Top-level comma-separated arguments of the call whose '(' is at `open_at`, and the index after ')'."""
    depth, quote, start, args, i = 0, "", open_at + 1, [], open_at
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif text.startswith(quote, i):
                i += len(quote) - 1
                quote = ""
        elif ch in "\"'":
            quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else ch
            i += len(quote) - 1
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                args.append(text[start:i])
                return args, i + 1
        elif ch == "," and depth == 1:
            args.append(text[start:i])
            start = i + 1
        i += 1
    raise CelCompileError("unbalanced parentheses in cel.bind(...)")


def rewrite_bind(expression: str) -> str:
    """`cel.bind(v, init, expr)` → `[init].map(v, expr)[0]` (same value, same scoping), innermost calls included."""
    while (match := _BIND.search(expression)) is not None:
        args, end = _split_call(expression, match.end() - 1)
        if len(args) != 3 or not re.fullmatch(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*", args[0]):
            raise CelCompileError("cel.bind needs (variable, init, expression)")
        name, init, body = (a.strip() for a in args)
        expression = f"{expression[:match.start()]}([{init}].map({name}, {body})[0]){expression[end:]}"
    return expression


# --- compiled selectors -----------------------------------------------------------------------------------------------

_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*$")
_DOMAIN_LITERAL = re.compile(r"""(?:attributes|capacity)\s*\[\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*\]""")


@dataclass(frozen=True)
class Selector:
    """One compiled CEL selector; `domains` are the attribute/capacity domains it indexes literally."""

    expression: str
    program: Any
    domains: tuple[str, ...]

    def matches(self, device: Mapping[str, Any], memo: dict[str, Any] | None = None) -> bool:
        """Evaluate against one device's CEL view (`model.Device.view`); errors are `CelRuntimeError`.

        `memo` (one dict per device) keeps the device's converted CEL context and every answer: converting a
        device into CEL values costs several times more than evaluating a selector on it.
        """
        if memo is not None and self.expression in memo:
            return bool(memo[self.expression])
        context = _context(device, self.domains, memo)
        try:
            result = self.program.execute(context)
        except Exception as exc:  # the library raises KeyError/TypeError/RuntimeError/ValueError for runtime errors
            raise CelRuntimeError(f"CEL selector {self.expression!r}: {_one_line(exc)}") from None
        if not isinstance(result, bool):
            raise CelRuntimeError(f"CEL selector {self.expression!r} returned {type(result).__name__}, not bool")
        if memo is not None:
            memo[self.expression] = result
        return result


def _context(device: Mapping[str, Any], domains: tuple[str, ...], memo: dict[str, Any] | None) -> Any:
    """The device's CEL context (every library function bound), reused across selectors through `memo`.

    A selector indexing a domain the device lacks gets a context where that domain is an empty map (Kubernetes'
    behaviour), cached under the missing domains.
    """
    missing = tuple(d for d in domains if d not in device["attributes"] or d not in device["capacity"])
    key = "\0context\0" + "\0".join(missing)
    if memo is not None and key in memo:
        return memo[key]
    view = _with_domains(device, missing) if missing else device
    context = cel.Context(variables={"device": view}, functions=_base_functions())
    if memo is not None:
        memo[key] = context
    return context


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, KeyError):
        return f"no such key: {text}"
    return text[:300]


def _with_domains(device: Mapping[str, Any], domains: tuple[str, ...]) -> Mapping[str, Any]:
    attributes, capacity = device["attributes"], device["capacity"]
    view = dict(device)
    view["attributes"] = {**{d: {} for d in domains}, **attributes}
    view["capacity"] = {**{d: {} for d in domains}, **capacity}
    return view


@functools.lru_cache(maxsize=4096)
def compile_selector(expression: str) -> Selector:
    """Compile (once per distinct text) a DRA selector; CelCompileError with the library's first line otherwise."""
    if not expression.strip():
        raise CelCompileError("empty CEL expression")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CelCompileError(f"CEL expression longer than {MAX_EXPRESSION_LENGTH} bytes")
    source = rewrite_bind(expression)
    try:
        program = cel.compile(source)
    except Exception as exc:
        first = next((line for line in str(exc).splitlines() if "ERROR" in line), str(exc).splitlines()[0])
        raise CelCompileError(f"CEL expression does not compile: {' '.join(first.split())}") from None
    known = _base_functions().keys() | _CORE_FUNCTIONS
    unknown = sorted(f for f in program.functions() if _IDENTIFIER.match(f) and f not in known)  # not operators
    if unknown:
        raise CelCompileError(f"CEL expression uses undeclared function(s): {', '.join(unknown)}")
    domains = tuple(sorted({a or b for a, b in _DOMAIN_LITERAL.findall(source)}))
    return Selector(expression=expression, program=program, domains=domains)
