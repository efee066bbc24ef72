"""A burst of GPU pods against the REAL kube-scheduler: the autoscaler's command loop (`Autoscaler.run`, parallel
launches, consolidation off as in the Karpenter comparison) with the kwok provider and the shipped catalogue, whose
cheapest plan mixes 1-, 4- and 8-GPU nodes. kube-scheduler's default profile spreads small pods onto big empty nodes,
so left to itself it puts the 1-GPU pods on the nodes bought for the 4- and 8-GPU ones; the autoscaler nominates
each pod to the node it bought for it (`status.nominatedNodeName`, written before the node is registered), which
kube-scheduler honours. Every pod must be bound, and every node launched must be one a pod landed on: no launch
without a pod to land (nor a NodeClaim left empty)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kubegpu.autoscaler.catalog import shipped_catalogue
from kubegpu.autoscaler.controller import Autoscaler, Options
from kubegpu.autoscaler.provider import SimulatedProvider
from kubegpu.clock import RealClock
from kubegpu.kube import NotFound
from kubegpu.testing.session import RealCluster, WaitTimeout, wait_for
from tests.autoscaler.builders import nodepool, pod

pytestmark = pytest.mark.apiserver
POOL_LABEL = "kubegpu.io/nodepool"
MIX = (1, 1, 1, 1, 2, 2, 2, 4, 4, 8)   # GPUs per pod, per 10 pods: 4 × 1, 3 × 2, 2 × 4, 1 × 8 (the mix)
PODS = 50


def burst(pool: str, namespace: str, count: int) -> list[dict[str, Any]]:
    toleration = {"key": "e2e-pool", "operator": "Equal", "value": pool, "effect": "NoSchedule"}
    pods = [pod(f"burst-{i:03d}", cpu=str(2 * gpus), memory=f"{8 * gpus}Gi", namespace=namespace,
                limits={"nvidia.com/gpu": gpus},
                spec={"nodeSelector": {"e2e-pool": pool}, "tolerations": [toleration]})
            for i, gpus in enumerate(MIX[i % len(MIX)] for i in range(count))]
    for each in pods:
        del each["metadata"]["uid"]  # the API server assigns it
    return pods


@pytest.fixture
def pool_name(real_cluster: RealCluster, crds: list[str]) -> Iterator[str]:
    name = f"burst-{uuid.uuid4().hex[:6]}"
    cluster = real_cluster.cluster()
    # tainted: the session is shared, and only this test's pods (which tolerate it) may make it launch nodes
    cluster.create(nodepool(name, labels={"e2e-pool": name},
                            taints=[{"key": "e2e-pool", "value": name, "effect": "NoSchedule"}],
                            disruption={"consolidateAfter": "Never"}))
    yield name
    with contextlib.suppress(NotFound):
        cluster.delete("NodePool", name)


def test_a_gpu_burst_is_all_bound_by_kube_scheduler_with_no_empty_nodeclaim(
        real_cluster: RealCluster, namespace: str, pool_name: str) -> None:
    cluster = real_cluster.cluster()
    clock = RealClock()
    provider = SimulatedProvider(cluster, shipped_catalogue(), clock, registration_delay=0.5, parallelism=16)
    lines: list[str] = []
    # the command's parallel launches; no node cost (the cheapest plan mixes 1-, 4- and 8-GPU nodes, the shape that
    # invites the spread; the command's default node cost buys mostly 8-GPU ones)
    options = Options(batch_idle=0.5, batch_max=3.0, disruption=False, parallelism=16, node_cost=0.0)
    scaler = Autoscaler(cluster, provider, clock, options, log=lines.append)
    stop = threading.Event()
    stopped = asyncio.Event()

    def loop() -> None:
        async def main() -> None:
            task = asyncio.create_task(scaler.run(0.25, stopped))
            while not stop.is_set():
                await asyncio.sleep(0.05)
            stopped.set()
            await task
        asyncio.run(main())

    def claims() -> list[dict[str, Any]]:
        return [c for c in cluster.list("NodeClaim")
                if (c["metadata"].get("labels") or {}).get(POOL_LABEL) == pool_name]

    pods = burst(pool_name, namespace, PODS)
    worker = threading.Thread(target=loop, name="autoscaler-loop", daemon=True)
    started = time.monotonic()
    for p in pods:
        cluster.create(p)
    worker.start()
    first_bound: list[float] = []
    progress: dict[str, int] = {}
    types: set[str] = set()   # the instance types of the NodeClaims the burst ended on

    def settled() -> tuple[int, int] | None:
        listed = cluster.list("Pod", namespace)
        bound = [p["spec"]["nodeName"] for p in listed if p["spec"].get("nodeName")]
        if bound and not first_bound:
            first_bound.append(time.monotonic() - started)
        on = set(bound)
        mine = claims()
        empty = [c for c in mine if (c.get("status") or {}).get("nodeName") not in on]
        progress.update(bound=len(bound), nodeclaims=len(mine), empty=len(empty))
        if len(bound) < PODS:
            return None
        if empty:
            return None
        types.update(c["metadata"]["labels"].get("node.kubernetes.io/instance-type") for c in mine)
        return len(mine), len(on)

    try:
        outcome = wait_for(settled, "every pod bound and no NodeClaim of the pool empty", 60, interval=0.5)
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}; {progress}; autoscaler: {' | '.join(lines[-8:])}") from None
    finally:
        stop.set()
        worker.join(30)
        for claim in claims():  # cleanup: the autoscaler's termination is stopped; free the kwok nodes directly
            with contextlib.suppress(NotFound):
                cluster.patch("NodeClaim", claim["metadata"]["name"], {"metadata": {"finalizers": None}})
                cluster.delete("NodeClaim", claim["metadata"]["name"])
            node = (claim.get("status") or {}).get("nodeName")
            if node:
                with contextlib.suppress(NotFound):
                    cluster.patch("Node", node, {"metadata": {"finalizers": None}})
                    cluster.delete("Node", node)
        scaler.close()
    nclaims, nodes = outcome
    elapsed = time.monotonic() - started
    print(f"\n{PODS} GPU pods: all bound after {elapsed:.1f}s (first after {first_bound[0]:.1f}s), "
          f"{provider.create_calls} launched, {nclaims} NodeClaims, {nodes} nodes in use; "
          f"autoscaler failures {scaler.failures}")
    assert nclaims == nodes
    assert len(types) > 1, types   # the plan mixed node sizes: the shape that invites the spread
    assert provider.create_calls == nodes, lines[-10:]   # every node launched took a pod
    status = cluster.get("NodePool", pool_name)["status"]   # written through the real status subresource
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "ValidationSucceeded": "True", "NodeClassReady": "True", "Ready": "True"}
    assert not scaler.failures, lines[-10:]
