"""Discovery writes a node's `kubegpu.io/gpu-memory` capacity: room for the most its GPU resources can be charged (a
whole GPU or a replica of one at the largest model's charge, as an unpinned pod pays; MIG and MPS by their names)."""

from __future__ import annotations

from kubegpu.clock import VirtualClock
from kubegpu.discovery.agent import NodeCapacityWriter, discover_gpu_memory
from kubegpu.gpu.simulated import SimulatedBackend, parse_gpu_spec
from kubegpu.kube import MemoryCluster
from kubegpu.sharing.capacity import apply_mig_config

GIB = 1 << 30


def test_gpu_memory_of_whole_timesliced_mig_and_mps_nodes() -> None:
    backend = SimulatedBackend(None, gpus=parse_gpu_spec("2xA100-SXM4-80GB"), node_name="n")
    try:
        assert discover_gpu_memory(backend, {"version": "v1"}) == 2 * 180 * GIB  # the catalog's largest, a B200
        shared = {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
            {"name": "nvidia.com/gpu", "replicas": 3}]}}}
        assert discover_gpu_memory(backend, shared) == 2 * 3 * (180 * GIB // 3)
        assert discover_gpu_memory(backend, {"version": "v1"}, {0: [10, 20], 1: [40]}) == 70 * GIB  # slices only
        apply_mig_config(backend, "A100-SXM4-80GB", "all-1g.10gb")
        assert discover_gpu_memory(backend, {"version": "v1", "flags": {"migStrategy": "mixed"}}) == 2 * 7 * 10 * GIB
    finally:
        backend.close()


def test_writer_sets_capacity_and_allocatable_once() -> None:
    cluster = MemoryCluster(VirtualClock())
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                    "status": {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"}}})
    writer = NodeCapacityWriter(cluster, "n")
    assert writer.write(160 * GIB)
    status = cluster.get("Node", "n")["status"]
    assert status["capacity"] == {"nvidia.com/gpu": "2", "kubegpu.io/gpu-memory": "160Gi"}
    assert status["allocatable"]["kubegpu.io/gpu-memory"] == "160Gi"
    assert not writer.write(160 * GIB)  # unchanged: no write
    assert writer.write(80 * GIB) and cluster.get("Node", "n")["status"]["capacity"]["kubegpu.io/gpu-memory"] == "80Gi"
