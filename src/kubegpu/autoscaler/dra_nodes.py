"""The ResourceSlices a node of an instance type publishes through kubegpu's DRA driver, predicted and published.

One source for both: an in-memory simulated node with the type's GPUs (`kubegpu.sharing.capacity`), read the way the
driver reads its node (`kubegpu.dra.devices.read_node`) and turned into slices by the driver's own pure generation
(`gpu_offers` with dynamic MIG, `build_slices`): whole GPUs, every MIG placement with its counters. The provisioner
predicts what a node it would buy can allocate from these (`predicted_slices`); with the kwok provider the autoscaler
publishes the very same slices for each node it launches (`publish_node_slices`), standing in for the driver a real
node runs, and deletes them with the node. Slices carry an ownerReference to their Node, as the driver's do, so the
garbage collector removes any left behind.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from kubegpu.dra.devices import NodeGpus, gpu_offers, read_node
from kubegpu.dra.slices import build_slices
from kubegpu.kube.errors import Conflict, NotFound
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.sharing.capacity import simulated_gpu_backend

if TYPE_CHECKING:
    from kubegpu.gpu.backend import GpuBackend
    from kubegpu.kube import Cluster

RESOURCE_SLICE = register_kind(ResourceKind("ResourceSlice", "resource.k8s.io", "v1", "resourceslices",
                                            namespaced=False, status_subresource=False, strategic_merge=False))


@lru_cache(maxsize=64)
def _node_gpus(gpu_model: str, gpu_count: int) -> NodeGpus:
    """What the driver reads on a fresh node of this shape (cached: the same for every node of the type)."""
    backend = simulated_gpu_backend(gpu_model, gpu_count, None)
    try:
        return read_node(backend)
    finally:
        backend.close()


def slices_for(node_name: str, gpus: NodeGpus) -> list[dict[str, Any]]:
    """The driver's slices for a node (dynamic MIG on: MIG-capable GPUs offer every placement)."""
    return build_slices(node_name, gpu_offers(gpus, dynamic_mig=True))


def predicted_slices(node_name: str, gpu_model: str | None, gpu_count: int) -> list[dict[str, Any]]:
    """The slices a fresh node of `gpu_count` × `gpu_model` would publish under `node_name`; none without GPUs."""
    if not gpu_model or gpu_count <= 0:
        return []
    return slices_for(node_name, _node_gpus(gpu_model, gpu_count))


def publish_node_slices(cluster: Cluster, node: dict[str, Any], backend: GpuBackend) -> list[str]:
    """Create the driver's slices for `node` (GPUs read from `backend`), owned by the Node; the names written. A
    slice that exists already (a retried tick) is left as it is; a cluster without the DRA API gets none."""
    meta = node.get("metadata") or {}
    owner = {"apiVersion": "v1", "kind": "Node", "name": meta.get("name"), "uid": meta.get("uid"),
             "controller": True}
    names = []
    for obj in slices_for(str(meta.get("name")), read_node(backend)):
        if owner["uid"]:
            obj["metadata"]["ownerReferences"] = [owner]
        try:
            cluster.create(obj)
        except NotFound:   # the cluster serves no resource.k8s.io/v1: no DRA there, nothing to publish
            return []
        except Conflict as exc:
            if exc.reason != "AlreadyExists":
                raise
        names.append(obj["metadata"]["name"])
    return names


def remove_node_slices(cluster: Cluster, node_name: str, backend: GpuBackend) -> None:
    """Delete the slices `publish_node_slices` wrote for the node (their names follow from its GPUs)."""
    for obj in slices_for(node_name, read_node(backend)):
        with contextlib.suppress(NotFound):
            cluster.delete("ResourceSlice", obj["metadata"]["name"])
