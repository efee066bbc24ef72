"""The autoscaler on AWS: the shared pass plus what only a real cloud needs — EC2NodeClasses read from the
cluster (or a file) with their resolved status written back, the interruption queue, and garbage collection of
instances that carry our tags but no NodeClaim (every 10 s for the first 20 passes, then every 2 min, as
Karpenter's controller runs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kubegpu.autoscaler.aws.interruption import InterruptionHandler
from kubegpu.autoscaler.aws.nodeclass import KIND, PLURAL, EC2NodeClass, parse_ec2nodeclass
from kubegpu.autoscaler.aws.provider import AwsProvider
from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.provisioner import take_snapshot
from kubegpu.autoscaler.state import name_of
from kubegpu.errors import KubegpuError
from kubegpu.kube import NotFound

if TYPE_CHECKING:
    from kubegpu.clock import Clock
    from kubegpu.kube import Cluster
    from kubegpu.kube.leader import LeaderElector

GC_FAST, GC_SLOW, GC_FAST_PASSES = 10.0, 120.0, 20


def register_kind() -> None:
    """Let the cluster interface read and write EC2NodeClass objects."""
    from kubegpu.autoscaler import labels as L
    from kubegpu.kube.resources import ResourceKind
    from kubegpu.kube.resources import register_kind as register

    register(ResourceKind(KIND, L.GROUP, "v1", PLURAL, namespaced=False, status_subresource=True,
                          strategic_merge=False))


class AwsAutoscaler(Autoscaler):
    def __init__(self, cluster: Cluster, provider: AwsProvider, clock: Clock, options: Options | None = None,
                 log: Callable[[str], None] | None = None, elector: LeaderElector | None = None,
                 interruption_queue: str | None = None, nodeclasses_from_cluster: bool = True) -> None:
        super().__init__(cluster, provider, clock, options, log, elector)
        self.aws = provider
        self.nodeclasses_from_cluster = nodeclasses_from_cluster
        self.interruption = InterruptionHandler(provider, interruption_queue, cluster, self.provisioner,
                                                self.termination, clock, self.log) if interruption_queue else None
        self._gc_passes = 0
        self._gc_at = -1e18
        if nodeclasses_from_cluster:
            register_kind()

    def sync_nodeclasses(self) -> None:
        """EC2NodeClasses from the cluster; each resolved one gets its status (subnets, AMIs, ...) written back."""
        try:
            raw = self.cluster.list(KIND)
        except NotFound:
            return
        classes: dict[str, EC2NodeClass] = {}
        for item in raw:
            try:
                classes[name_of(item)] = parse_ec2nodeclass(item)
            except KubegpuError as exc:
                self.log(str(exc))
        self.aws.nodeclasses = classes
        for name in classes:
            try:
                # ready or not: a class that is not shows why in its conditions, as Karpenter's do
                status: dict[str, Any] = self.aws.resolved(name).status.model_dump(mode="json", exclude_none=True)
            except KubegpuError as exc:
                self.log(str(exc))
                continue
            current = next((i.get("status") for i in raw if name_of(i) == name), None)
            if current != status:
                self.cluster.patch(KIND, name, {"status": status}, subresource="status")

    def step(self) -> bool:
        if self.nodeclasses_from_cluster and (self.elector is None or self.elector.try_acquire(self.clock.now())):
            self.sync_nodeclasses()
        if not super().step():
            return False
        if self.interruption is not None:
            self.interruption.reconcile(take_snapshot(self.cluster))
        self.collect_garbage()
        return True

    def collect_garbage(self) -> list[str]:
        now = self.clock.now()
        every = GC_FAST if self._gc_passes < GC_FAST_PASSES else GC_SLOW
        if now - self._gc_at < every:
            return []
        self._gc_at = now
        self._gc_passes += 1
        snapshot = take_snapshot(self.cluster)
        known = {(c.get("status") or {}).get("providerID") for c in snapshot.nodeclaims}
        gone = self.aws.garbage_collect(p for p in known if p)
        for node in snapshot.nodes.values():
            pid = (node.get("spec") or {}).get("providerID") or ""
            if any(pid.endswith(f"/{i}") for i in gone):
                self.cluster.delete("Node", name_of(node))
        return gone
