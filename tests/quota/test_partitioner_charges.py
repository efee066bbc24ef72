"""The partitioner places charged pods exactly as uncharged ones. A node's `kubegpu.io/gpu-memory` is what discovery
wrote for its current cut (room for the charges of what that cut advertises); a re-cut changes it, and the charge
always fits wherever the GPU resources do, so the planner decides on the GPU resources and not on a stale figure."""

from __future__ import annotations

from typing import Any

from kubegpu.gpu.catalog import get_model
from kubegpu.partitioner.planner import CurrentInstance, GpuInput, NodeInput, plan, plan_violations
from kubegpu.sharing.charges import node_gpu_memory, pod_charge, product_label, quantity_of_bytes
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE

A100 = "A100-SXM4-80GB"


def node(instances: list[tuple[str, int, bool]], pods: list[dict[str, Any]]) -> NodeInput:
    """One A100 cut as `instances`, its allocatable as discovery writes it for that cut."""
    model = get_model(A100)
    gpu = GpuInput(0, model.key, model, tuple(CurrentInstance(model.profile(p).profile_id, s, u)
                                              for p, s, u in instances))
    advertised: dict[str, float] = {}
    for name, _, _ in instances:
        resource = f"nvidia.com/mig-{name}"
        advertised[resource] = advertised.get(resource, 0) + 1
    memory = node_gpu_memory(advertised, product_label(model))
    status = {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110",
                              GPU_MEMORY_RESOURCE: quantity_of_bytes(memory)}}
    return NodeInput("n", "mig", {"metadata": {"name": "n", "labels": {}}, "spec": {}, "status": status}, (gpu,),
                     pods=tuple(pods))


def gpu_pod(name: str, resource: str, charged: bool, bound: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                            "spec": {"containers": [{"name": "main", "resources": {"limits": {resource: "1"}}}]},
                            "status": {"phase": "Running" if bound else "Pending"}}
    if bound:
        body["spec"]["nodeName"] = "n"
    if charged:
        amount = quantity_of_bytes(pod_charge(body).gpu_memory_bytes)
        resources = body["spec"]["containers"][0]["resources"]
        resources["limits"][GPU_MEMORY_RESOURCE] = amount
        resources["requests"] = {GPU_MEMORY_RESOURCE: amount}
    return body


def test_a_recut_places_charged_pods_as_uncharged_ones() -> None:
    # seven 1g.10gb (70Gi advertised), one in use; 3g.40gb + 2g.20gb + 1g.10gb pending: 80Gi charged after a re-cut
    layout = [("1g.10gb", i, i == 0) for i in range(7)]
    results = []
    for charged in (False, True):
        bound = gpu_pod("old", "nvidia.com/mig-1g.10gb", charged, bound=True)
        pending = [gpu_pod(name, f"nvidia.com/mig-{profile}", charged)
                   for name, profile in (("big", "3g.40gb"), ("mid", "2g.20gb"), ("small", "1g.10gb"))]
        nodes = [node(layout, [bound])]
        result = plan(nodes, pending)
        assert plan_violations(nodes, pending, result) == []
        results.append((sorted(result.assignments), [i.profile_id for i in result.nodes["n"].gpus[0].instances]))
    assert results[0] == results[1]
    assert len(results[1][0]) == 3  # every pending pod placed: the 80Gi of charges exceed the 70Gi of the old cut
