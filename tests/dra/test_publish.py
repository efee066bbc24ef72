"""Publishing ResourceSlices: created once, untouched when nothing changed, republished with the generation bumped
when health or the MIG layout changes, surplus slices deleted."""

from __future__ import annotations

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
