"""The Node condition `AcceleratedHardwareReady`: whether this node's GPUs are fit to keep, for node repair.

The autoscaler replaces a node whose `AcceleratedHardwareReady` condition (the EKS node monitoring agent's name,
which Karpenter's node repair watches) has been `False` for 10 minutes. Discovery is the node agent that already
writes to its own Node, so it owns the condition: `False` (reason `GpuXidError`) while a GPU has had a critical
XID and not recovered, `True` (reason `GpusHealthy`) otherwise. Which XIDs count and when a GPU recovers come from
`kubegpu.gpu.xid` (the same quiet-period rule as the device plugin), so the two agents never disagree.

`HardwareHealth` and `condition_update` are pure (XID events and the time in, a condition out);
`NodeConditionReporter` is the thin adapter that reads the backend and patches the Node's status.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubegpu.gpu.backend import responds
from kubegpu.gpu.xid import DEFAULT_QUIET_PERIOD_S, HealthPolicy, HealthTracker
from kubegpu.kube import format_timestamp

if TYPE_CHECKING:
    from kubegpu.clock import Clock
    from kubegpu.gpu.backend import GpuBackend, XidEvent
    from kubegpu.kube import Cluster

CONDITION_TYPE = "AcceleratedHardwareReady"
HEALTHY_REASON = "GpusHealthy"
UNHEALTHY_REASON = "GpuXidError"


@dataclass(frozen=True)
class HardwareCondition:
    """What the condition should say now (status `True`/`False`, reason, message)."""

    status: str
    reason: str
    message: str


class HardwareHealth:
    """The node's GPU health from XID events: a `HealthTracker` turned into one node-level condition."""

    def __init__(self, policy: HealthPolicy | None = None) -> None:
        self.tracker = HealthTracker(policy or HealthPolicy())

    def update(self, events: Iterable[XidEvent], now: float, probe: Callable[[int], bool]) -> HardwareCondition:
        """Record new events, let quiet GPUs recover, and say what the condition should be.

        Each event counts from its own timestamp (never later than `now`), so events read back after an agent
        restart keep their age and a GPU does not wait a second quiet period.
        """
        for event in sorted(events, key=lambda e: e.timestamp):
            self.tracker.observe([event], min(float(event.timestamp), now))
        self.tracker.recover(now, probe)
        return self.condition()

    def condition(self) -> HardwareCondition:
        bad = sorted(self.tracker.unhealthy)
        if not bad:
            return HardwareCondition("True", HEALTHY_REASON, "no GPU has an unrecovered critical XID")
        failures = ", ".join(f"GPU {index} XID {self.tracker.last_xid.get(index, 0)}" for index in bad)
        quiet = self.tracker.policy.quiet_period_s
        return HardwareCondition("False", UNHEALTHY_REASON,
                                 f"critical XID error: {failures} (healthy after {quiet:g}s without one)")


def condition_update(conditions: Iterable[Mapping[str, Any]] | None, wanted: HardwareCondition,
                     now: float) -> dict[str, Any] | None:
    """The condition entry to write, or None when the Node already says this.

    `lastTransitionTime` moves only when the status flips; a new message with the same status (a second GPU
    failing) is written with the old transition time, so the condition's age stays the time since it went bad.
    """
    current = next((c for c in conditions or () if c.get("type") == CONDITION_TYPE), None)
    if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
            wanted.status, wanted.reason, wanted.message):
        return None
    transition = format_timestamp(now)
    if current is not None and current.get("status") == wanted.status and current.get("lastTransitionTime"):
        transition = str(current["lastTransitionTime"])
    return {"type": CONDITION_TYPE, "status": wanted.status, "reason": wanted.reason, "message": wanted.message,
            "lastTransitionTime": transition}


class NodeConditionReporter:
    """Reads new XID events from the backend and keeps the Node's `AcceleratedHardwareReady` condition current.

    The patch is a strategic merge on the status subresource: `conditions` is merged by `type`, so the kubelet's
    Ready, MemoryPressure etc. are left as they are; nothing is sent when the condition already says the same.
    """

    def __init__(self, cluster: Cluster, node_name: str, backend: GpuBackend, clock: Clock,
                 quiet_period_s: float = DEFAULT_QUIET_PERIOD_S) -> None:
        self.cluster = cluster
        self.node_name = node_name
        self.backend = backend
        self.clock = clock
        self.health = HardwareHealth(HealthPolicy(quiet_period_s=quiet_period_s))
        # look back one quiet period on start: a GPU that failed just before a restart is still unhealthy
        self._since = clock.now() - quiet_period_s

    def report(self) -> dict[str, Any] | None:
        """One check; returns the condition written, or None when nothing changed."""
        now = self.clock.now()
        events = self.backend.xid_events(self._since)
        if events:
            self._since = max(self._since, *(e.timestamp for e in events))
        wanted = self.health.update(events, now, functools.partial(responds, self.backend))
        node = self.cluster.get("Node", self.node_name)
        entry = condition_update((node.get("status") or {}).get("conditions"), wanted, now)
        if entry is not None:
            self.cluster.patch("Node", self.node_name, {"status": {"conditions": [entry]}},
                               patch_type="strategic", subresource="status")
        return entry
