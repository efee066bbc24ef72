"""A NodePool's GPU capacity per instance type, from the shared capacity model (`kubegpu.sharing.capacity`).

A NodePool carries its sharing config in its template's labels and annotations (copied onto NodeClaims and Nodes);
this module reads it from the pool and caches what each instance type holds under it for the provisioning pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubegpu.sharing.capacity import GpuSharing, sharing_of
from kubegpu.sharing.capacity import sharing_capacity as node_sharing_capacity

if TYPE_CHECKING:
    from kubegpu.autoscaler.api import NodePool
    from kubegpu.autoscaler.instancetypes import InstanceType


def pool_sharing(pool: NodePool) -> GpuSharing:
    meta = pool.spec.template.metadata
    return sharing_of(meta.labels, meta.annotations, f"NodePool {pool.name}: spec.template.metadata")


def sharing_capacity(sharing: GpuSharing, it: InstanceType) -> dict[str, float]:
    """The instance type's allocatable with its GPU resources replaced by what the sharing config yields."""
    return node_sharing_capacity(sharing, it.gpu_model, it.gpu_count, it.allocatable)


class CapacityModel:
    """`capacity_fn` for the scheduler: per NodePool sharing config, cached per (pool, instance type)."""

    def __init__(self) -> None:
        self._sharing: dict[str, GpuSharing] = {}
        self._cache: dict[tuple[str, str], dict[str, float]] = {}

    def sharing(self, pool: NodePool) -> GpuSharing:
        found = self._sharing.get(pool.name)
        if found is None:
            found = self._sharing[pool.name] = pool_sharing(pool)
        return found

    def __call__(self, pool: NodePool, it: InstanceType) -> dict[str, float]:
        key = (pool.name, it.name)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = sharing_capacity(self.sharing(pool), it)
        return found
