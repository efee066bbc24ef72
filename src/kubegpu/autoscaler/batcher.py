"""Karpenter's provisioning batch window, as a pure state machine on caller-supplied times.

The first pending pod opens a window; every new pod pushes the idle deadline out by `idle` seconds; the window
closes when the idle deadline passes or `max_duration` after it opened, whichever comes first. Waiting a moment
turns a burst of pods into one scheduling pass — and one well-packed set of nodes instead of a node per pod.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Batcher:
    idle: float = 1.0
    max_duration: float = 10.0
    opened_at: float | None = None
    last_trigger: float | None = None
    seen: set[str] = field(default_factory=set)

    def trigger(self, uids: Iterable[str], now: float) -> None:
        """Note pods seen pending; only UIDs new to this window extend it."""
        new = [u for u in uids if u not in self.seen]
        if not new:
            return
        self.seen.update(new)
        if self.opened_at is None:
            self.opened_at = now
        self.last_trigger = now

    def ready(self, now: float) -> bool:
        """True when an open window has closed (idle or max elapsed)."""
        if self.opened_at is None or self.last_trigger is None:
            return False
        return now >= self.last_trigger + self.idle or now >= self.opened_at + self.max_duration

    def deadline(self) -> float | None:
        if self.opened_at is None or self.last_trigger is None:
            return None
        return min(self.last_trigger + self.idle, self.opened_at + self.max_duration)

    def reset(self) -> None:
        """Start over after a pass; pods still pending will open the next window."""
        self.opened_at = None
        self.last_trigger = None
        self.seen.clear()
