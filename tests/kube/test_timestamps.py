"""metav1.Time and MicroTime: what controllers write, they read back; junk reads as "no time", never a crash."""

from __future__ import annotations

import pytest

from kubegpu.kube import format_timestamp, parse_timestamp


def test_time_and_micro_time_round_trip() -> None:
    assert format_timestamp(1_700_000_000) == "2023-11-14T22:13:20Z"
    assert format_timestamp(1_700_000_000.25, micro=True) == "2023-11-14T22:13:20.250000Z"
    assert parse_timestamp(format_timestamp(1_700_000_000)) == 1_700_000_000
    assert parse_timestamp(format_timestamp(1_700_000_000.25, micro=True)) == pytest.approx(1_700_000_000.25)
    assert parse_timestamp("2023-11-14T22:13:20+00:00") == 1_700_000_000


@pytest.mark.parametrize("junk", [None, "", "yesterday", "2023-13-40T99:00:00Z"])
def test_unreadable_times_are_none(junk: str | None) -> None:
    assert parse_timestamp(junk) is None
