"""kwok GPU nodes for the real control plane: capacity from our GPU catalog, labels from our GPU discovery.

A node is what a GPU node's kubelet, device plugin and GFD would register: `nvidia.com/gpu` capacity counted from a
`COUNTxMODEL` spec (the simulated backend's syntax), the `kubegpu.io/gpu-memory` discovery writes for it, and the
exact label set `kubegpu discover` computes for a simulated node holding those GPUs. kwok manages every node
carrying `KWOK_ANNOTATION` (Ready, heartbeats, pods).
"""

from __future__ import annotations

from typing import Any

from kubegpu.discovery.agent import discover_gpu_memory, discover_labels
from kubegpu.gpu.simulated import SimulatedBackend, parse_gpu_spec
from kubegpu.sharing.charges import quantity_of_bytes
from kubegpu.sharing.names import GPU_MEMORY_RESOURCE, GPU_RESOURCE

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_ANNOTATION_VALUE = "fake"
KWOK_SELECTOR = f"{KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}"
HOST_CAPACITY = {"cpu": "96", "memory": "1024Gi", "pods": "110", "ephemeral-storage": "1Ti"}
NODE_PREFIX = "kwok-gpu-"


def gpu_node(name: str, gpus: str, labels: dict[str, str] | None = None,
             extra_capacity: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node object for kwok: ``gpus`` like `8xA100-SXM4-80GB` (or `4xH100-SXM5-80GB,4xL4`); ConfigError if
    the spec names an unknown model or no GPUs."""
    models = parse_gpu_spec(gpus)
    backend = SimulatedBackend(None, gpus=models, node_name=name)
    try:
        gfd = discover_labels(backend, {"version": "v1"}, None, None)
        gpu_memory = discover_gpu_memory(backend, {"version": "v1"})   # what discovery writes on such a node
    finally:
        backend.close()
    capacity = {**HOST_CAPACITY, GPU_RESOURCE: str(len(models)), GPU_MEMORY_RESOURCE: quantity_of_bytes(gpu_memory),
                **(extra_capacity or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "type": "kwok", **gfd, **(labels or {})},
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }


def node_names(count: int) -> list[str]:
    return [f"{NODE_PREFIX}{index}" for index in range(count)]


def is_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
