"""Kubernetes resource quantities ("100m", "1Gi", "1e3") as plain floats.

The scheduler compares amounts of cpu, memory and extended resources; a float is precise enough for every amount a
node can hold (bytes up to 2**53 are exact) and far cheaper to add and compare than `decimal.Decimal`. Parsing is
cached per string because the same handful of quantities ("1", "500m", "16Gi") repeat across thousands of pods.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from kubegpu.errors import ConfigError

_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}
_DECIMAL = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
# Same shape as apimachinery's quantity grammar: a signed decimal number, then a binary suffix, a decimal suffix or a
# decimal exponent ("e3", "E-2"). "E" alone is exa; "E" followed by digits is an exponent.
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE]?)$")


def parse_quantity(value: str | int | float) -> float:
    """Return the quantity as a float in base units ("100m" → 0.1, "1Gi" → 1073741824.0).

    Raises `ConfigError` naming the value when it is not a Kubernetes quantity.
    """
    if isinstance(value, bool):
        raise ConfigError(f"invalid quantity {value!r}: expected a number or a string like '500m' or '4Gi'")
    if isinstance(value, int | float):
        return _finite(value, value)
    if not isinstance(value, str):
        raise ConfigError(f"invalid quantity {value!r}: expected a number or a string like '500m' or '4Gi'")
    return _parse_string(value)


def parse_quantities(amounts: Mapping[Any, Any], where: str) -> dict[str, float]:
    """Every amount of a resource map (requests, capacity, allocatable) parsed, none negative; a bad one is one
    ConfigError line naming its field, `where.<resource>`."""
    parsed: dict[str, float] = {}
    for resource, value in amounts.items():
        try:
            amount = parse_quantity(value)
        except ConfigError as exc:
            raise ConfigError(f"{where}.{resource}: {exc}") from None
        if amount < 0:
            raise ConfigError(f"{where}.{resource}: must not be negative, got {value!r}")
        parsed[str(resource)] = amount
    return parsed


def _finite(value: object, shown: object) -> float:
    """`value` as a finite float; infinities, NaN and numbers beyond a float's range are one ConfigError line."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        text = repr(shown) if len(repr(shown)) <= 40 else repr(shown)[:37] + "..."
        raise ConfigError(f"invalid quantity {text}: must be a finite number (at most {sys.float_info.max:.3g})")
    return number


@lru_cache(maxsize=4096)
def _parse_string(text: str) -> float:
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ConfigError(f"invalid quantity {text!r}: expected a number with an optional suffix like '500m' or '4Gi'")
    number, suffix = match.groups()
    if suffix in _BINARY:
        return _finite(float(number) * _BINARY[suffix], text)
    if suffix in _DECIMAL:
        return _finite(float(number) * _DECIMAL[suffix], text)
    digits = suffix[1:].lstrip("+-").lstrip("0") or "0"
    exponent = int(digits) if len(digits) <= 6 else 10**7  # int() refuses 4,300+ digits; any such exponent is huge
    exponent = -exponent if suffix[1:2] == "-" else exponent
    if abs(exponent) > 400:  # 10.0 ** 400 overflows; a huge negative exponent is just zero
        return _finite(math.inf if exponent > 0 and float(number) != 0 else 0.0, text)
    try:
        return _finite(float(number) * 10.0 ** exponent, text)
    except OverflowError:
        return _finite(math.inf, text)


def format_quantity(value: float) -> str:
    """A compact string for a quantity (integers plain, others in milli-units), for messages and objects."""
    if float(value).is_integer():
        return str(int(value))
    milli = value * 1000.0
    if abs(milli - round(milli)) < 1e-6:
        return f"{round(milli)}m"
    return repr(float(value))
