"""Leader election on a Lease: one holder, renewals keep it, takeover only after expiry, races have one winner."""

from __future__ import annotations

from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from kubegpu.kube.leader import LeaderElector


def test_holder_renews_others_wait_until_the_lease_expires() -> None:
    cluster = MemoryCluster(VirtualClock(0))
    a = LeaderElector(cluster, "a", "demo", namespace="ns", lease_duration=15)
    b = LeaderElector(cluster, "b", "demo", namespace="ns", lease_duration=15)
    assert a.try_acquire(0) and not b.try_acquire(1)
    assert a.try_acquire(10) and not b.try_acquire(24)  # renewed at 10: held until 25
    assert b.try_acquire(25)
    spec = cluster.get("Lease", "demo", "ns")["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
    assert not a.try_acquire(26)


def test_racing_for_an_expired_lease_lets_exactly_one_win() -> None:
    clock = VirtualClock(0)
    cluster = MemoryCluster(clock)
    stale = LeaderElector(cluster, "old", "kubegpu-partitioner", lease_duration=15)
    assert stale.try_acquire(0)
    lease = cluster.get("Lease", "kubegpu-partitioner", "kube-system")
    x = LeaderElector(cluster, "x", "kubegpu-partitioner")
    y = LeaderElector(cluster, "y", "kubegpu-partitioner")
    original_get = cluster.get
    cluster.get = lambda *args, **kwargs: lease  # type: ignore[method-assign]  # both read the same old version
    try:
        won = [x.try_acquire(100), y.try_acquire(100)]
    finally:
        cluster.get = original_get  # type: ignore[method-assign]
    assert won == [True, False]
    assert cluster.get("Lease", "kubegpu-partitioner", "kube-system")["spec"]["holderIdentity"] == "x"
