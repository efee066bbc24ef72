"""The batch window both controllers wait on before they act: a pure state machine on caller-supplied times.

The first item (a pending pod's key) opens a window; every item new to the window pushes the idle deadline out by
`idle` seconds; the window closes when the idle deadline passes or `window` seconds after it opened, whichever
comes first. Waiting a moment turns a burst of pending pods into one pass — one well-packed set of nodes for the
autoscaler (Karpenter's batch idle/max duration), one re-cut serving many pods for the partitioner (nos's batch
window timeout/idle) — at a bounded delay. Times come from the caller, so the same object runs on the real clock
and on the simulator's virtual one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Batcher:
    window: float = 60.0  # longest a window stays open after its first item
    idle: float = 10.0  # a window closes this long after its last new item
    items: set[str] = field(default_factory=set)
    first_at: float | None = None
    last_at: float | None = None

    def add(self, keys: str | Iterable[str], now: float) -> None:
        """Note items seen (one key or several); only keys new to this window open or extend it."""
        new = [keys] if isinstance(keys, str) else list(keys)
        new = [key for key in new if key not in self.items]
        if not new:
            return
        self.items.update(new)
        if self.first_at is None:
            self.first_at = now
        self.last_at = now

    def discard(self, keys: Iterable[str]) -> None:
        """Forget items that no longer wait (a pod bound or deleted); a window left empty closes unfired."""
        self.items.difference_update(keys)
        if not self.items:
            self.reset()

    def ready(self, now: float) -> bool:
        """True once an open window has closed: idle or window elapsed."""
        if self.first_at is None or self.last_at is None:
            return False
        return now - self.first_at >= self.window or now - self.last_at >= self.idle

    def deadline(self) -> float | None:
        """When `ready` turns true if nothing new arrives (None: no window open); lets a simulator jump there."""
        if self.first_at is None or self.last_at is None:
            return None
        return min(self.first_at + self.window, self.last_at + self.idle)

    def reset(self) -> None:
        """Start over after a pass: items still waiting open the next window."""
        self.items.clear()
        self.first_at = self.last_at = None
