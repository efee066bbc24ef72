from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubegpu.errors import ConfigError
from kubegpu.scheduling import format_quantity, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100m", 0.1),
        ("1", 1.0),
        ("2.5", 2.5),
        ("1k", 1e3),
        ("1Ki", 1024.0),
        ("1M", 1e6),
        ("1Mi", 1048576.0),
        ("1G", 1e9),
        ("1Gi", 1073741824.0),
        ("1T", 1e12),
        ("1Ti", 2.0**40),
        ("1P", 1e15),
        ("1Pi", 2.0**50),
        ("1E", 1e18),  # exa, not an exponent
        ("1Ei", 2.0**60),
        ("1e3", 1e3),
        ("1E3", 1e3),
        ("5e-3", 0.005),
        ("1.5Gi", 1.5 * 2**30),
        ("500u", 0.0005),
        ("10n", 1e-8),
        ("+2", 2.0),
        ("-1", -1.0),
        (".5", 0.5),
        (8, 8.0),
        (0.25, 0.25),
    ],
)
def test_parse_quantity_follows_kubernetes_suffixes(text: str | int | float, expected: float) -> None:
    assert parse_quantity(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "Gi", "1GB", "1 Gi", "abc", "1.2.3", "1Kii", "1x"])
def test_parse_quantity_rejects_garbage_naming_the_value(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid quantity"):
        parse_quantity(text)


def test_parse_quantity_rejects_bool_and_none() -> None:
    with pytest.raises(ConfigError):
        parse_quantity(True)
    with pytest.raises(ConfigError):
        parse_quantity(None)  # type: ignore[arg-type]


@settings(max_examples=50)
@given(st.integers(min_value=0, max_value=10**6))
def test_milli_quantities_round_trip_through_format(milli: int) -> None:
    assert parse_quantity(format_quantity(milli / 1000)) == pytest.approx(milli / 1000)
