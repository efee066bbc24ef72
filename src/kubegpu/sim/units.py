"""Durations as scenario files write them ("24h", "90m", "30s", "1d", or plain seconds)."""

from __future__ import annotations

import re

_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
MAX_DURATION_S = 10 * 366 * 86400.0  # ten years: far beyond any simulated day or week, far below float overflow


def parse_duration(value: object) -> float:
    """Seconds from a number (already seconds) or a string of number+unit parts ("1h30m"); ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '24h' or a number of seconds, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value) if abs(value) <= MAX_DURATION_S else float("inf")
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        elif text and re.fullmatch(r"(?:\d+(?:\.\d+)?[smhd])+", text):
            seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _PART.findall(text))
        else:
            raise ValueError(f"expected a duration such as '24h', '90m' or '30s', got {value!r}")
    else:
        raise ValueError(f"expected a duration such as '24h' or a number of seconds, got {value!r}")
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {value!r}")
    if not seconds <= MAX_DURATION_S:  # also NaN and inf
        raise ValueError(f"a duration must be at most {MAX_DURATION_S / 86400:.0f} days, got {str(value)[:40]!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Short human form for tables: 42s, 7.5m, 3.2h."""
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"
