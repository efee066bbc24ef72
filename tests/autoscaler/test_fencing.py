"""Leadership lost ⇒ the stage stops writing at once: every write of the autoscaler goes through the elector's fence,
which closes when a renewal fails, finds another holder, or is older than the renew deadline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kubegpu.autoscaler.controller import LEASE_NAME, Autoscaler, Options
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.clock import VirtualClock
from kubegpu.kube import MemoryCluster
from kubegpu.kube.leader import LeaderElector
from tests.autoscaler.builders import instance_type, nodepool, pod

TYPES = [instance_type("cpu.4", 4, 16, 0.2)]
ANTI = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}}]}}


class Landed:
    """The store as the fenced replica reaches it: every write that lands calls `after(kind)`."""

    def __init__(self, store: MemoryCluster, after: Callable[[str, str], None]) -> None:
        self.store, self.after = store, after

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if name not in ("create", "patch", "delete"):
            return method

        def landed(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            self.after(name, args[0]["kind"] if name == "create" else args[0])
            return result

        return landed


def test_a_stage_stops_writing_the_moment_its_lease_is_lost() -> None:
    clock = VirtualClock(1_000_000.0)
    store = MemoryCluster(clock)
    store.create(nodepool("cpu"))
    for i in range(5):   # one node each: a provisioning pass creates five NodeClaims, one write after another
        store.create(pod(f"p{i}", cpu="1", metadata={"labels": {"app": "x"}}, spec={"affinity": ANTI}))
    other = LeaderElector(store, "b", LEASE_NAME, lease_duration=15.0)
    created: list[str] = []
    lost: list[bool] = []
    after_loss: list[tuple[str, str]] = []

    def after(verb: str, kind: str) -> None:
        if lost:
            after_loss.append((verb, kind))
        elif verb == "create" and kind == "NodeClaim":
            created.append(kind)
            if len(created) == 2:   # mid-stage, a's lease runs out and b takes over
                clock.advance(16.0)
                assert other.try_acquire(clock.now())
                lost.append(True)

    cluster = Landed(store, after)
    provider = SimulatedProvider(cluster, TYPES, clock, registration_delay=5.0)
    lines: list[str] = []
    scaler = Autoscaler(cluster, provider, clock, Options(batch_idle=0.0, batch_max=0.0, disruption=False),
                        log=lines.append, elector=LeaderElector(store, "a", LEASE_NAME, lease_duration=15.0))
    try:
        assert scaler.step()
        assert len(store.list("NodeClaim")) == 2 and after_loss == []
        assert any("LeadershipLost" in line for line in lines)
        clock.advance(1.0)
        assert not scaler.step()   # b holds the Lease: a does nothing at all
        assert len(store.list("NodeClaim")) == 2 and after_loss == []
    finally:
        scaler.close()


def test_the_fence_closes_at_the_renew_deadline_and_on_a_failed_renewal() -> None:
    clock = VirtualClock(0.0)
    store = MemoryCluster(clock)
    a = LeaderElector(store, "a", "demo", lease_duration=15.0)
    b = LeaderElector(store, "b", "demo", lease_duration=15.0)
    assert a.try_acquire(0.0) and a.holds(9.9) and not a.holds(10.0)   # 2/3 of the lease: before b may take it
    assert b.try_acquire(15.0) and b.holds(15.0)
    assert not a.try_acquire(16.0) and not a.holds(16.0)


def test_writes_through_the_raw_client_are_fenced_too() -> None:
    """Evictions go through the store's API client (the Eviction API), not `patch`/`delete`: fenced all the same."""
    from kubegpu.kube.leader import Fence, FencedCluster, LeadershipLost

    class Client:
        def __init__(self) -> None:
            self.created: list[str] = []

        def create(self, what: str) -> None:
            self.created.append(what)

    clock = VirtualClock(0.0)
    store = MemoryCluster(clock)
    store.client = Client()  # type: ignore[attr-defined]
    elector = LeaderElector(store, "a", "demo", lease_duration=15.0)
    cluster = FencedCluster(store, Fence(elector, clock))
    assert elector.try_acquire(0.0)
    cluster.client.create("eviction of p0")
    clock.advance(11.0)   # past the renew deadline without a renewal
    with pytest.raises(LeadershipLost):
        cluster.client.create("eviction of p1")
    assert store.client.created == ["eviction of p0"]  # type: ignore[attr-defined]
