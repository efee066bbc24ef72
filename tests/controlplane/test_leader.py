"""Leader election of every controller, two replicas each, against the real `coordination.k8s.io/v1` Lease API:
exactly one replica wins a race (the API server's resourceVersion check refuses the other's write with 409), the
follower does nothing while the lease is fresh, and takes over — counting the transition — once it has expired."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.clock import VirtualClock
from kubegpu.kube.leader import LeaderElector
from kubegpu.partitioner.controller import PartitionerController
from kubegpu.testing.session import RealCluster
from tests.autoscaler.builders import instance_type

pytestmark = pytest.mark.apiserver


def test_racing_replicas_never_both_win(real_cluster: RealCluster, namespace: str) -> None:
    lease = f"race-{uuid.uuid4().hex[:6]}"
    electors = [LeaderElector(real_cluster.cluster(), f"replica-{i}", lease, namespace=namespace, lease_duration=1)
                for i in range(2)]
    now = time.time()
    for round_ in range(4):  # a fresh lease, then three takeovers of an expired one, each raced by both
        at = now + round_ * 5
        with ThreadPoolExecutor(2) as pool:
            won = list(pool.map(lambda e: e.try_acquire(at), electors))  # noqa: B023 - used at once
        assert won.count(True) == 1, (round_, won)
    spec = real_cluster.admin.get("Lease", lease, namespace)["spec"]
    assert spec["holderIdentity"] in ("replica-0", "replica-1")


def test_two_partitioner_replicas_one_acts_the_other_takes_over(real_cluster: RealCluster, namespace: str) -> None:
    lease = f"partitioner-{uuid.uuid4().hex[:6]}"
    replicas = [PartitionerController(
        real_cluster.cluster(), identity=f"partitioner-{i}", batch_idle=0, batch_timeout=0,
        elector=LeaderElector(real_cluster.cluster(), f"partitioner-{i}", lease, namespace=namespace,
                              lease_duration=2)) for i in range(2)]
    now = time.time()
    assert replicas[0].tick(now).leader
    assert not replicas[1].tick(now + 1).leader  # lease fresh: the follower does nothing
    assert replicas[0].tick(now + 1.5).leader  # renewals keep it
    assert not replicas[1].tick(now + 3).leader
    assert replicas[1].tick(now + 4).leader  # replica 0 stopped renewing at +1.5; the lease expired at +3.5
    assert not replicas[0].tick(now + 4.5).leader
    spec = real_cluster.admin.get("Lease", lease, namespace)["spec"]
    assert spec["holderIdentity"] == "partitioner-1" and spec["leaseTransitions"] == 1
    assert spec["leaseDurationSeconds"] == 2


def test_two_autoscaler_replicas_one_acts_the_other_takes_over(real_cluster: RealCluster, namespace: str,
                                                              crds: list[str]) -> None:
    lease = f"autoscaler-{uuid.uuid4().hex[:6]}"
    clock = VirtualClock(time.time())
    types = [instance_type("cpu.4", 4, 16, 0.2)]
    replicas = []
    for i in range(2):
        cluster = real_cluster.cluster()
        elector = LeaderElector(cluster, f"autoscaler-{i}", lease, namespace=namespace, lease_duration=5)
        replicas.append(Autoscaler(cluster, SimulatedProvider(cluster, types, clock), clock,
                                   Options(disruption=False), elector=elector))
    assert replicas[0].step() is True
    assert replicas[1].step() is False
    clock.advance(6)
    assert replicas[1].step() is True  # replica 0 went quiet for longer than the lease
    assert replicas[0].step() is False
    spec = real_cluster.admin.get("Lease", lease, namespace)["spec"]
    assert spec["holderIdentity"] == "autoscaler-1" and spec["leaseTransitions"] == 1
    for replica in replicas:
        replica.close()
