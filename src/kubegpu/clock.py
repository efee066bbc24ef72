"""Clocks: the only source of time for controllers, so the simulator can run them on virtual time."""

from __future__ import annotations

import re
import time
from typing import Protocol

MAX_DURATION_S = 2562047 * 3600.0  # Go's time.Duration limit (~292 years)
_GO_DURATION = re.compile(r"^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration string (`60s`, `1m30s`, `500ms`); ValueError when it is not one.

    The one parser of Go durations: NVIDIA config files (`sleepInterval`) and every duration flag of the CLI."""
    if text == "0":
        return 0.0
    if not _GO_DURATION.match(text):
        raise ValueError(f"must be a duration such as '60s' or '1m30s' (or 'infinite'), got {text!r}")
    seconds = sum(float(n) * _DURATION_UNITS[unit] for n, unit in _DURATION_PART.findall(text))
    if not seconds <= MAX_DURATION_S:  # also catches inf from a 400-digit number
        raise ValueError(f"must be a duration of at most {MAX_DURATION_S / 3600:.0f}h (Go's limit), got {text[:40]!r}")
    return -seconds if text.startswith("-") else seconds


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (real) or since the start of a simulation (virtual)."""
        ...


class RealClock:
    def now(self) -> float:
        return time.time()


class VirtualClock:
    """A clock that only moves when told to: a simulated day passes in as long as the events take to process."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"virtual clock cannot go back from {self._now} to {t}")
        self._now = t

    def advance(self, seconds: float) -> None:
        self.advance_to(self._now + seconds)
