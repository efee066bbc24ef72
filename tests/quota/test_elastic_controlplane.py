"""Elastic quotas on the real control plane: pods start behind `kubegpu.io/quota` (the shipped gate policy), the
controller lets them through within `min` and borrowing up to `max`, the real kube-scheduler binds them on a kwok
node whose `kubegpu.io/gpu-memory` capacity discovery's writer set, and a team under its `min` gets its guarantee
back by the eviction of the youngest borrowed pod (Eviction API, with an Event)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import lightkube
import pytest
from lightkube import codecs

from kubegpu.discovery.agent import NodeCapacityWriter, discover_gpu_memory
from kubegpu.gpu.simulated import SimulatedBackend, parse_gpu_spec
from kubegpu.kube.errors import NotFound
from kubegpu.quota.controller import QuotaController, has_quota_gate
from kubegpu.testing.session import RealCluster, wait_for
from tests.quota.apply import apply_all, remove_all, shipped, until_admitted

MEMORY = "kubegpu.io/gpu-memory"
SLOW = 60.0  # the scheduler, kwok and the policy informers on a loaded 2-core machine: generous, never slept through
GPUS = "2xA100-SXM4-80GB"
A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}  # an unpinned GPU is charged the catalog's largest


@pytest.fixture(scope="module")
def elastic(real_cluster: RealCluster) -> Iterator[str]:
    """The shipped policies and CRD, and a kwok node of two A100-80GB with the gpu-memory capacity discovery writes."""
    client = real_cluster.client()
    applied = apply_all(client, shipped())
    node = f"kwok-quota-{uuid.uuid4().hex[:5]}"
    # the cluster is this node alone: the session's other GPU nodes are cordoned meanwhile (uncordoned after)
    others = [n["metadata"]["name"] for n in real_cluster.admin.list("Node")
              if MEMORY in ((n.get("status") or {}).get("allocatable") or {})
              and not (n.get("spec") or {}).get("unschedulable")]
    for other in others:
        real_cluster.admin.patch("Node", other, {"spec": {"unschedulable": True}})
    real_cluster.add_gpu_node(node, GPUS)
    backend = SimulatedBackend(None, gpus=parse_gpu_spec(GPUS), node_name=node)
    try:
        # a kwok GPU node carries what discovery writes already: its writer finds nothing to change
        assert not NodeCapacityWriter(real_cluster.admin, node).write(discover_gpu_memory(backend, {"version": "v1"}))
        wait_for(lambda: (real_cluster.admin.get("Node", node)["status"].get("allocatable") or {}).get(MEMORY),
                 "the node's gpu-memory allocatable", 20)
        yield node
    finally:
        backend.close()
        real_cluster.delete_node(node)
        remove_all(client, applied)
        for other in others:
            real_cluster.admin.patch("Node", other, {"spec": {"unschedulable": None}})


def _quota(client: lightkube.Client, namespace: str, low: str, high: str | None = None) -> None:
    spec: dict[str, Any] = {"min": {MEMORY: low}}
    if high:
        spec["max"] = {MEMORY: high}
    client.create(codecs.from_dict({"apiVersion": "kubegpu.io/v1", "kind": "ElasticQuota",
                                    "metadata": {"name": "team", "namespace": namespace}, "spec": spec}))


def _pod(real: RealCluster, namespace: str, name: str) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeSelector": A100, "containers": [{"name": "main", "image": "busybox",
                                                           "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    return real.admin.create(body)


def _team(real: RealCluster, hint: str) -> str:
    return real.create_namespace(hint)


def test_gate_within_min_borrow_up_to_max_and_reclaim(real_cluster: RealCluster, elastic: str) -> None:
    client = real_cluster.client()
    team_a, team_b = _team(real_cluster, "team-a"), _team(real_cluster, "team-b")
    closing: list[QuotaController] = []
    try:
        _quota(client, team_a, "80Gi", "160Gi")
        _quota(client, team_b, "80Gi")
        # the gate policy reads the namespace's ElasticQuota: wait until a dry-run pod comes back gated
        probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": team_b},
                 "spec": {"containers": [{"name": "c", "image": "busybox",
                                          "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
        wait_for(lambda: has_quota_gate(until_admitted(
            lambda: client.create(codecs.from_dict(probe), dry_run=True).to_dict()) or {}),
                 "the quota gate policy to see the ElasticQuota", SLOW)
        controller = QuotaController(real_cluster.admin, identity="one", lease_namespace="kubegpu")
        standby = QuotaController(real_cluster.admin, identity="two", lease_namespace="kubegpu")
        closing.extend((controller, standby))

        first = _pod(real_cluster, team_a, "a-0")
        assert has_quota_gate(first) and first["spec"]["containers"][0]["resources"]["requests"][MEMORY] == "80Gi"
        time.sleep(1.1)  # creation timestamps have second resolution: a-1 is the younger
        _pod(real_cluster, team_a, "a-1")
        # a-0 within min, a-1 borrows the idle half; pods other tests left terminating may hold capacity a moment
        lifted, deadline = 0, time.monotonic() + SLOW
        while lifted < 2 and time.monotonic() < deadline:
            result = controller.tick(time.time())
            assert result.acted
            lifted += result.lifted
            if lifted < 2:
                time.sleep(0.5)
        assert lifted == 2
        assert not standby.tick(time.time()).acted  # the Lease is held: one replica acts
        assert real_cluster.wait_bound("a-0", team_a, SLOW) == elastic
        assert real_cluster.wait_bound("a-1", team_a, SLOW) == elastic

        wait_for(lambda: (client.get(_eq(), "team", namespace=team_a).to_dict().get("status") or {}).get("used"),
                 "status.used", SLOW)
        used = client.get(_eq(), "team", namespace=team_a).to_dict()["status"]["used"]
        assert used == {MEMORY: "160Gi", "nvidia.com/gpu": "2"}

        _pod(real_cluster, team_b, "b-0")
        # within team b's min: let through though nothing is free (once the controller's watch has delivered it)
        assert wait_for(lambda: controller.tick(time.time()).lifted, "b-0's gate lifted", SLOW) == 1
        reclaim = wait_for(lambda: controller.tick(time.time()).evicted, "a reclaim", SLOW)
        assert reclaim == 1
        wait_for(lambda: _gone(real_cluster, team_a, "a-1"), "the youngest borrowed pod to be evicted", 2 * SLOW)
        assert real_cluster.wait_bound("b-0", team_b, 2 * SLOW) == elastic
        assert real_cluster.admin.get("Pod", "a-0", team_a)["spec"]["nodeName"] == elastic  # within min: kept
        events = real_cluster.admin.list("Event", namespace=team_a)
        assert any(e.get("reason") == "QuotaReclaimed" and "a-1" in e["involvedObject"]["name"]
                   and "borrows beyond its min" in e.get("message", "") for e in events), events
        assert controller.tick(time.time()).evicted == 0  # b is served: nothing more to reclaim
    finally:
        for running in closing:
            running.close()
        for namespace in (team_a, team_b):
            real_cluster.delete_namespace(namespace)


def _eq() -> Any:
    from lightkube.generic_resource import get_generic_resource

    return get_generic_resource("kubegpu.io/v1", "ElasticQuota")


def _gone(real: RealCluster, namespace: str, name: str) -> bool:
    with contextlib.suppress(NotFound):
        real.admin.get("Pod", name, namespace)
        return False
    return True
