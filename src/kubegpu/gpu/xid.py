"""Which XID errors mean a GPU is unhealthy, in one place for every component that acts on them.

The device plugin marks devices unhealthy, the DRA driver taints them and the autoscaler's node repair replaces
nodes, and all three must agree on what an XID means. Numbers from NVIDIA's XID catalogue as its device plugin
uses it: application-caused XIDs (a user's bad kernel) say nothing about the GPU and are ignored; the rest are
critical. Among the critical ones, a few mean work already on the GPU cannot go on (double-bit ECC error, GPU
fallen off the bus, uncontained ECC error): those are *fatal*, our choice for NoExecute taints.

`HealthTracker` is the recovery rule both node agents that watch XIDs share (the device plugin's device health and
the discovery agent's `AcceleratedHardwareReady` Node condition): a GPU is unhealthy from its last critical XID
until a quiet period without one has passed and a probe of the GPU succeeds. Pure: events and the time in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs caused by the application, which NVIDIA's health check ignores."""
DEFAULT_QUIET_PERIOD_S = 300.0
"""Seconds without a critical XID before an unhealthy GPU may recover."""
FATAL_XIDS = frozenset({48, 79, 95})
"""Critical XIDs after which running work cannot continue."""


def is_critical(xid: int, ignored: frozenset[int] = APPLICATION_XIDS) -> bool:
    """Whether an XID marks the GPU unhealthy (anything not in `ignored`)."""
    return xid not in ignored


def is_fatal(xid: int) -> bool:
    return xid in FATAL_XIDS


@dataclass(frozen=True)
class HealthPolicy:
    """Which XIDs make a GPU unhealthy, and how long it must stay quiet before it may recover."""

    enabled: bool = True
    ignored: frozenset[int] = APPLICATION_XIDS
    forced: frozenset[int] = frozenset()
    force_all: bool = False
    quiet_period_s: float = DEFAULT_QUIET_PERIOD_S

    def is_critical(self, xid: int) -> bool:
        if not self.enabled:
            return False
        if self.force_all or xid in self.forced:
            return True
        return xid not in self.ignored


@dataclass
class HealthTracker:
    """Which physical GPUs are unhealthy, and since the last critical XID when."""

    policy: HealthPolicy
    last_critical: dict[int, float] = field(default_factory=dict)  # gpu index → time of its last critical XID
    last_xid: dict[int, int] = field(default_factory=dict)

    @property
    def unhealthy(self) -> frozenset[int]:
        return frozenset(self.last_critical)

    def observe(self, events: Iterable[Any], now: float) -> set[int]:
        """Record XID events (anything with `gpu_index` and `xid`); return GPUs that just became unhealthy."""
        newly = set()
        for event in events:
            if not self.policy.is_critical(int(event.xid)):
                continue
            if event.gpu_index not in self.last_critical:
                newly.add(int(event.gpu_index))
            self.last_critical[int(event.gpu_index)] = now
            self.last_xid[int(event.gpu_index)] = int(event.xid)
        return newly

    def recover(self, now: float, probe: Callable[[int], bool]) -> set[int]:
        """GPUs quiet for the whole quiet period whose probe succeeds become healthy again."""
        recovered = {
            index
            for index, since in self.last_critical.items()
            if now - since >= self.policy.quiet_period_s and probe(index)
        }
        for index in recovered:
            del self.last_critical[index]
            self.last_xid.pop(index, None)
        return recovered
