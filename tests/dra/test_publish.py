"""Publishing ResourceSlices: created once, untouched when nothing changed, republished with the generation bumped
when health or the MIG layout changes, surplus slices deleted."""

from __future__ import annotations

import copy
from typing import Any

from kubegpu.dra.devices import gpu_offers, read_node
from kubegpu.dra.publish import SlicePublisher
from kubegpu.dra.slices import GpuHealth, build_slices
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube.memory import MemoryCluster


def test_publish_republish_and_shrink() -> None:
    backend = SimulatedBackend(None, gpus="2xA100-SXM4-40GB", node_name="node-a")
    cluster = MemoryCluster()
    publisher = SlicePublisher(cluster, "node-a", "gpu.nvidia.com")
    dynamic = build_slices("node-a", gpu_offers(read_node(backend), dynamic_mig=True))
    assert publisher.publish(dynamic) == 1
    assert len(publisher.current()) == len(dynamic) == 3
    assert publisher.publish(dynamic) is None  # nothing changed, nothing written
    tainted = build_slices("node-a", gpu_offers(read_node(backend), dynamic_mig=True), {1: GpuHealth(79)})
    assert publisher.publish(tainted) == 2
    slices = publisher.current()
    assert {s["spec"]["pool"]["generation"] for s in slices} == {2}
    assert any("taints" in d for s in slices for d in s["spec"].get("devices", []))
    plain = build_slices("node-a", gpu_offers(read_node(backend), dynamic_mig=False))
    assert publisher.publish(plain) == 3
    slices = publisher.current()
    assert len(slices) == 1 and "sharedCounters" not in slices[0]["spec"]
    assert slices[0]["spec"]["pool"] == {"name": "node-a", "generation": 3, "resourceSliceCount": 1}
    other = SlicePublisher(cluster, "node-b", "gpu.nvidia.com")
    assert other.current() == []  # another node's slices are never touched


class DefaultingCluster(MemoryCluster):
    """Stores ResourceSlices the way a real API server does: quantities canonicalised (`81920Mi` -> `80Gi`), device
    taints stamped with `timeAdded`, and (``unknown_default``) a field we never send defaulted."""

    def __init__(self, unknown_default: bool = False) -> None:
        super().__init__()
        self.unknown_default = unknown_default

    def _default(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        spec = obj.get("spec") or {}
        for device in spec.get("devices") or []:
            for entry in (device.get("capacity") or {}).values():
                if isinstance(entry.get("value"), str) and entry["value"].endswith("Mi"):
                    mib = int(entry["value"][:-2])
                    entry["value"] = f"{mib // 1024}Gi" if mib % 1024 == 0 else entry["value"]
            for taint in device.get("taints") or []:
                taint.setdefault("timeAdded", "2026-11-27T03:00:00Z")
            if self.unknown_default:
                device.setdefault("allowMultipleAllocations", False)
        return obj

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return super().create(self._default(obj))

    def patch(self, kind: str, name: str, patch: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if kind == "ResourceSlice" and isinstance(patch, dict):
            patch = self._default(patch)
        return super().patch(kind, name, patch, *args, **kwargs)


def test_an_idle_pool_is_not_republished_when_the_server_canonicalises_it() -> None:
    """Issue 23: against a real API server the driver bumped pool.generation every few seconds with nothing
    changed, because the server hands back `80Gi` for our `81920Mi` (and stamps taints). The publisher compares
    canonical forms, so an idle pool keeps its generation."""
    backend = SimulatedBackend(None, gpus="2xA100-SXM4-80GB", node_name="node-a")
    cluster = DefaultingCluster()
    publisher = SlicePublisher(cluster, "node-a", "gpu.nvidia.com")
    slices = build_slices("node-a", gpu_offers(read_node(backend), dynamic_mig=True), {1: GpuHealth(79)})
    assert publisher.publish(slices) == 1
    stored = publisher.current()
    assert any(d.get("capacity", {}).get("memory", {}).get("value") == "80Gi"
               for s in stored for d in s["spec"].get("devices", []))  # the server did canonicalise
    for _ in range(5):
        assert publisher.publish(copy.deepcopy(slices)) is None
    assert {s["spec"]["pool"]["generation"] for s in publisher.current()} == {1}
    # a fresh publisher (a restarted driver) sees the same canonical pool: still no bump
    assert SlicePublisher(cluster, "node-a", "gpu.nvidia.com").publish(copy.deepcopy(slices)) is None
    # a real change still republishes
    healthy = build_slices("node-a", gpu_offers(read_node(backend), dynamic_mig=True))
    assert publisher.publish(healthy) == 2


def test_a_default_we_do_not_know_is_recognised_by_our_own_write() -> None:
    """A field the server defaults that the canonical form does not know (a newer API) still does not make an idle
    pool republish: the slice is at the resourceVersion our last write got, for the same desired content."""
    backend = SimulatedBackend(None, gpus="1xH100-SXM5-80GB", node_name="node-a")
    cluster = DefaultingCluster(unknown_default=True)
    publisher = SlicePublisher(cluster, "node-a", "gpu.nvidia.com")
    slices = build_slices("node-a", gpu_offers(read_node(backend), dynamic_mig=False))
    assert publisher.publish(slices) == 1
    assert publisher.publish(copy.deepcopy(slices)) is None
    assert publisher.publish(copy.deepcopy(slices)) is None
    # someone else rewrote the slice (resourceVersion moved): compared for real, and republished
    name = slices[0]["metadata"]["name"]
    cluster.patch("ResourceSlice", name, {"spec": {"devices": []}})
    assert publisher.publish(copy.deepcopy(slices)) == 2


def test_canonical_form_ignores_only_what_the_server_changes() -> None:
    from kubegpu.dra.publish import _canonical

    spec = {"devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "81920Mi"}},
                         "taints": [{"key": "k", "effect": "NoSchedule", "timeAdded": "t"}]}]}
    same = {"devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}},
                         "taints": [{"key": "k", "effect": "NoSchedule"}], "attributes": {}}]}
    assert _canonical(spec) == _canonical(same)
    other = {"devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "40Gi"}}}]}
    assert _canonical(spec) != _canonical(other)
    renamed = {"devices": [{"name": "gpu-1", "capacity": {"memory": {"value": "80Gi"}}}]}
    assert _canonical(other) != _canonical(renamed)
