"""Leader election on a `coordination.k8s.io/v1` Lease, so a controller can run several replicas and only one acts.

The holder renews the Lease on every pass; another replica takes it over only once it has expired (renewTime +
leaseDurationSeconds in the past), so a replica that stops is replaced within one lease duration. Every write
carries the resourceVersion it read, so when two replicas race for an expired lease the API server lets exactly one
write through (409 Conflict for the other). Times come from the caller (real or virtual clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubegpu.kube.cluster import Cluster, format_timestamp, parse_timestamp
from kubegpu.kube.errors import Conflict, NotFound


@dataclass
class LeaderElector:
    cluster: Cluster
    identity: str
    name: str  # the Lease's name: one per controller (kubegpu-partitioner, kubegpu-autoscaler)
    namespace: str = "kube-system"
    lease_duration: float = 15.0

    def try_acquire(self, now: float) -> bool:
        """Hold (create, renew or take over) the Lease at `now`; False while another replica holds it."""
        try:
            lease = self.cluster.get("Lease", self.name, self.namespace)
        except NotFound:
            return self._create(now)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = parse_timestamp(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        expired = renewed is None or now >= renewed + duration
        if holder not in (None, "", self.identity) and not expired:
            return False
        renew = format_timestamp(now, micro=True)
        patch_spec: dict[str, Any] = {"holderIdentity": self.identity, "renewTime": renew,
                                      "leaseDurationSeconds": int(self.lease_duration)}
        if holder != self.identity:
            patch_spec["acquireTime"] = format_timestamp(now, micro=True)
            patch_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        rv = (lease.get("metadata") or {}).get("resourceVersion")
        try:
            self.cluster.patch("Lease", self.name, {"metadata": {"resourceVersion": rv}, "spec": patch_spec},
                               namespace=self.namespace)
        except Conflict:
            return False
        return True

    def _create(self, now: float) -> bool:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration),
                     "acquireTime": format_timestamp(now, micro=True),
                     "renewTime": format_timestamp(now, micro=True), "leaseTransitions": 0},
        }
        try:
            self.cluster.create(lease)
        except Conflict:
            return False
        return True
