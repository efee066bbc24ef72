"""Publishing the node's ResourceSlices through the Cluster interface, republishing on change.

The desired slices (from `slices.build_slices`) are compared with what the API holds for this node and driver,
ignoring the pool generation; when anything differs (MIG layout, health taints, a GPU gone) every slice is written
with the generation bumped past the highest one seen and surplus slices are deleted, so the scheduler never mixes
two versions of the pool. Nothing is written when nothing changed.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from kubegpu.kube.cluster import Cluster
from kubegpu.kube.errors import NotFound
from kubegpu.kube.resources import ResourceKind, register_kind

RESOURCE_SLICE = register_kind(ResourceKind("ResourceSlice", "resource.k8s.io", "v1", "resourceslices",
                                            namespaced=False, status_subresource=False, strategic_merge=False))
RESOURCE_CLAIM = register_kind(ResourceKind("ResourceClaim", "resource.k8s.io", "v1", "resourceclaims",
                                            namespaced=True, status_subresource=True, strategic_merge=False))


def _comparable(obj: dict[str, Any]) -> tuple[str, Any]:
    spec = copy.deepcopy(obj.get("spec") or {})
    spec.get("pool", {}).pop("generation", None)
    return obj["metadata"]["name"], spec


class SlicePublisher:
    def __init__(self, cluster: Cluster, node_name: str, driver: str) -> None:
        self.cluster = cluster
        self.node_name = node_name
        self.driver = driver

    def current(self) -> list[dict[str, Any]]:
        return [s for s in self.cluster.list("ResourceSlice")
                if (s.get("spec") or {}).get("nodeName") == self.node_name
                and (s.get("spec") or {}).get("driver") == self.driver]

    def publish(self, desired: list[dict[str, Any]]) -> int | None:
        """Make the API match `desired`; the new pool generation, or None when nothing had to change."""
        existing = {s["metadata"]["name"]: s for s in self.current()}
        if sorted(map(_comparable, existing.values()), key=repr) == sorted(map(_comparable, desired), key=repr):
            return None
        generation = 1 + max((int(s["spec"]["pool"].get("generation", 0)) for s in existing.values()), default=0)
        for obj in desired:
            obj = copy.deepcopy(obj)
            obj["spec"]["pool"]["generation"] = generation
            name = obj["metadata"]["name"]
            old = existing.pop(name, None)
            if old is None:
                self.cluster.create(obj)
            else:
                patch = dict(obj["spec"])
                patch.update({key: None for key in old.get("spec", {}) if key not in patch})
                self.cluster.patch("ResourceSlice", name, {"spec": patch})
        for name in existing:
            with contextlib.suppress(NotFound):
                self.cluster.delete("ResourceSlice", name)
        return generation
