"""Publishing the node's ResourceSlices through the Cluster interface, republishing on change.

The desired slices (from `slices.build_slices`) are compared with what the API holds for this node and driver,
ignoring the pool generation; when anything differs (MIG layout, health taints, a GPU gone) every slice is written
with the generation bumped past the highest one seen and surplus slices are deleted, so the scheduler never mixes
two versions of the pool. Nothing is written when nothing changed.

"What the API holds" is not byte for byte what was sent: a real API server canonicalises quantities (`81920Mi`
comes back as `80Gi`), stamps `timeAdded` on device taints and omits empty fields. Comparing raw objects made an
idle driver republish an identical pool with the generation bumped on every health tick (seen against a real
kubelet), so both sides are compared in a canonical form, and a slice the server still holds at the
resourceVersion of our own last write, for the same desired content, counts as unchanged whatever it defaulted.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from kubegpu.errors import KubegpuError
from kubegpu.kube.cluster import Cluster
from kubegpu.kube.errors import NotFound
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.scheduling.quantity import parse_quantity

RESOURCE_SLICE = register_kind(ResourceKind("ResourceSlice", "resource.k8s.io", "v1", "resourceslices",
                                            namespaced=False, status_subresource=False, strategic_merge=False))
RESOURCE_CLAIM = register_kind(ResourceKind("ResourceClaim", "resource.k8s.io", "v1", "resourceclaims",
                                            namespaced=True, status_subresource=True, strategic_merge=False))


_QUANTITY_MAPS = frozenset({"capacity", "counters"})  # name -> {"value": quantity, ...}
_SERVER_STAMPED = frozenset({"timeAdded"})  # set by the API server on device taints


def _canonical(value: Any, where: str = "") -> Any:
    """A spec as the API server would store it: quantities as numbers, empty fields and server stamps dropped.
    ``where``: "map" inside a capacity/counters map, "entry" inside one of its entries (whose `value` is a quantity)."""
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key in _SERVER_STAMPED:
            continue
        if where == "entry" and key == "value":
            try:
                out[key] = parse_quantity(item)
                continue
            except KubegpuError:
                pass
        inner = "map" if key in _QUANTITY_MAPS and where == "" else "entry" if where == "map" else ""
        canonical = _canonical(item, inner)
        if canonical not in (None, [], {}, ""):
            out[key] = canonical
    return out


def _comparable(obj: dict[str, Any]) -> tuple[str, Any]:
    spec = copy.deepcopy(obj.get("spec") or {})
    spec.get("pool", {}).pop("generation", None)
    return obj["metadata"]["name"], _canonical(spec)


class SlicePublisher:
    def __init__(self, cluster: Cluster, node_name: str, driver: str) -> None:
        self.cluster = cluster
        self.node_name = node_name
        self.driver = driver
        # slice name -> (resourceVersion the server gave our last write, the desired spec it carried)
        self._written: dict[str, tuple[str, Any]] = {}

    def _unchanged(self, existing: dict[str, dict[str, Any]], desired: list[dict[str, Any]]) -> bool:
        if sorted(map(_comparable, existing.values()), key=repr) == sorted(map(_comparable, desired), key=repr):
            return True
        if set(existing) != {d["metadata"]["name"] for d in desired}:
            return False
        for obj in desired:
            name = obj["metadata"]["name"]
            written = self._written.get(name)
            version = str((existing[name].get("metadata") or {}).get("resourceVersion") or "")
            if written is None or not version or written != (version, _comparable(obj)[1]):
                return False
        return True

    def current(self) -> list[dict[str, Any]]:
        return [s for s in self.cluster.list("ResourceSlice")
                if (s.get("spec") or {}).get("nodeName") == self.node_name
                and (s.get("spec") or {}).get("driver") == self.driver]

    def publish(self, desired: list[dict[str, Any]]) -> int | None:
        """Make the API match `desired`; the new pool generation, or None when nothing had to change."""
        existing = {s["metadata"]["name"]: s for s in self.current()}
        if self._unchanged(existing, desired):
            return None
        generation = 1 + max((int(s["spec"]["pool"].get("generation", 0)) for s in existing.values()), default=0)
        for obj in desired:
            obj = copy.deepcopy(obj)
            obj["spec"]["pool"]["generation"] = generation
            name = obj["metadata"]["name"]
            old = existing.pop(name, None)
            if old is None:
                written = self.cluster.create(obj)
            else:
                patch = dict(obj["spec"])
                patch.update({key: None for key in old.get("spec", {}) if key not in patch})
                written = self.cluster.patch("ResourceSlice", name, {"spec": patch})
            version = str(((written or {}).get("metadata") or {}).get("resourceVersion") or "")
            self._written[name] = (version, _comparable(obj)[1])
        for name in existing:
            self._written.pop(name, None)
            with contextlib.suppress(NotFound):
                self.cluster.delete("ResourceSlice", name)
        return generation
