"""Clocks: the only source of time for controllers, so the simulator can run them on virtual time."""

from __future__ import annotations

import time
from typing import Protocol


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
