"""Two autoscaler replicas on one cluster: exactly one acts, the other takes over within the lease when it stops.

Both replicas share the (simulated) cloud provider, as two pods of the Deployment share the real cloud: the Lease is
all that keeps them from each buying a node for the same pending pod.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kubegpu.autoscaler.controller import LEASE_NAME, Autoscaler, Options
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from kubegpu.kube.leader import LeaderElector
from tests.autoscaler.builders import instance_type, nodepool, pod

TYPES = [instance_type("cpu.4", 4, 16, 0.2)]
LEASE_S = 15.0


class Writes:
    """A replica's view of the cluster that counts what it writes, Leases aside (every replica may try those)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.writes: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.cluster, name)
        if name not in ("create", "patch", "delete"):
            return method

        def counted(*args: Any, **kwargs: Any) -> Any:
            kind = args[0]["kind"] if name == "create" else args[0]
            if kind != "Lease":
                self.writes.append((name, kind))
            return method(*args, **kwargs)

        return counted


def replicas(clusters: tuple[Writes, Writes], clock: VirtualClock, namespace: str) -> tuple[Autoscaler, Autoscaler]:
    provider = SimulatedProvider(clusters[0].cluster, TYPES, clock, registration_delay=5.0)  # the shared cloud
    built = []
    for identity, cluster in zip(("a", "b"), clusters, strict=True):
        elector = LeaderElector(cluster, identity, LEASE_NAME, namespace=namespace, lease_duration=LEASE_S)
        built.append(Autoscaler(cluster, provider, clock, Options(disruption=False), elector=elector))
    return built[0], built[1]


def claims(cluster: Any, prefix: str) -> list[str]:
    return sorted(c["metadata"]["name"] for c in cluster.list("NodeClaim")
                  if c["metadata"]["labels"].get("kubegpu.io/nodepool") == prefix)


def walk(raw: tuple[Any, Any], clock: VirtualClock, namespace: str, pool: str) -> None:
    cluster = raw[0]
    cluster.create(nodepool(pool))
    mine = {"nodeSelector": {"kubegpu.io/nodepool": pool}}
    cluster.create(pod(f"{pool}-first", cpu="3", namespace=namespace, spec=mine))
    clusters = (Writes(raw[0]), Writes(raw[1]))
    a, b = replicas(clusters, clock, namespace)
    try:
        _take_over(cluster, clusters, a, b, clock, namespace, pool, mine)
    finally:
        a.close()   # their informers' watches end with them
        b.close()


def _take_over(cluster: Any, clusters: tuple[Writes, Writes], a: Autoscaler, b: Autoscaler, clock: VirtualClock,
               namespace: str, pool: str, mine: dict[str, Any]) -> None:
    for _ in range(10):  # both pass every second; a got the Lease first and renews it on every pass
        assert [a.step(), b.step()] == [True, False]
        clock.advance(1.0)
    assert len(claims(cluster, pool)) == 1
    assert ("create", "NodeClaim") in clusters[0].writes and clusters[1].writes == []  # b never acted
    cluster.create(pod(f"{pool}-second", cpu="3", namespace=namespace, spec=mine))  # a stops: b alone passes
    last_renewal = clock.now() - 1.0
    took_over = None
    for _ in range(30):
        acted = b.step()
        assert acted == (clock.now() >= last_renewal + LEASE_S)
        if acted and took_over is None:
            took_over = clock.now()
        clock.advance(1.0)
    assert took_over == last_renewal + LEASE_S
    assert len(claims(cluster, pool)) == 2  # b provisioned for the pod that arrived after a stopped
    assert ("create", "NodeClaim") in clusters[1].writes
    lease = cluster.get("Lease", LEASE_NAME, namespace)["spec"]
    assert lease["holderIdentity"] == "b" and lease["leaseTransitions"] == 1


def test_one_replica_acts_and_the_other_takes_over_in_memory() -> None:
    clock = VirtualClock(1_000_000.0)
    cluster = MemoryCluster(clock)
    walk((cluster, cluster), clock, "kube-system", "gpu")


@pytest.mark.integration
def test_one_replica_acts_and_the_other_takes_over_over_http(apiserver: Any) -> None:
    apiserver.reset()  # other tests' pools, nodes and DaemonSets would change what gets provisioned
    clock = VirtualClock(1_000_000.0)
    namespace = f"ns-{uuid.uuid4().hex[:8]}"
    walk((apiserver.cluster(), apiserver.cluster()), clock, namespace, f"pool-{uuid.uuid4().hex[:8]}")
