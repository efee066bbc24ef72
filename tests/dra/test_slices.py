"""ResourceSlices and DeviceClasses: NVIDIA's names and attributes, dynamic-MIG counters, pool splitting, health
taints, and strict schema validation against Kubernetes 1.34 and 1.35."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kubegpu.dra.classes import shipped_class_objects
from kubegpu.dra.devices import GpuOffer, NodeGpus, gpu_offers, read_node, semver
from kubegpu.dra.slices import MAX_DEVICES, MAX_DEVICES_ADVANCED, GpuHealth, build_slices
from kubegpu.gpu.catalog import CATALOG
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.gpu.xid import is_critical as critical
from kubegpu.sharing.names import GPU_RESOURCE

VERSIONS = ("1.34.0", "1.35.0")
REPO = Path(__file__).resolve().parents[2]


def node(gpus: str, mig: dict[int, list[tuple[str, int]]] | None = None) -> tuple[SimulatedBackend, NodeGpus]:
    backend = SimulatedBackend(None, gpus=gpus, node_name="node-a")
    for index, instances in (mig or {}).items():
        if backend.set_mig_mode(index, True):
            backend.reset_gpu(index)
        for profile, start in instances:
            backend.create_mig_device(index, CATALOG["A100-SXM4-40GB"].profile(profile).profile_id, start)
    return backend, read_node(backend)


def devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def validate(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_full_gpus_with_nvidia_names_and_attributes() -> None:
    _, inventory = node("2xH100-SXM5-80GB")
    slices = build_slices("node-a", gpu_offers(inventory, dynamic_mig=False))
    validate(slices)
    assert len(slices) == 1
    spec = slices[0]["spec"]
    assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert spec["nodeName"] == "node-a" and spec["driver"] == "gpu.nvidia.com"
    gpu0 = spec["devices"][0]
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    attrs = gpu0["attributes"]
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["architecture"] == {"string": "Hopper"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["uuid"]["string"].startswith("GPU-")
    assert attrs["resource.kubernetes.io/pciBusID"]["string"].count(":") == 2
    assert gpu0["capacity"] == {"memory": {"value": "81559Mi"}}


def test_static_mig_gpu_is_offered_as_its_mig_devices_only() -> None:
    _, inventory = node("2xA100-SXM4-40GB", {0: [("3g.20gb", 4), ("1g.5gb", 0)]})
    for dynamic in (False, True):  # existing MIG devices not made by claims stay static even with --dynamic-mig
        slices = build_slices("node-a", gpu_offers(inventory, dynamic_mig=dynamic))
        validate(slices)
        names = [d["name"] for d in devices(slices)]
        assert names[:2] == ["gpu-0-mig-1g5gb-19-0", "gpu-0-mig-3g20gb-9-4"]
        assert "gpu-0" not in names
        mig = devices(slices)[1]
        assert mig["attributes"]["profile"] == {"string": "3g.20gb"}
        assert mig["attributes"]["parentUUID"] == devices(slices)[0]["attributes"]["parentUUID"]
        assert {k for k in mig["capacity"] if k.startswith("memorySlice")} == {f"memorySlice{i}" for i in range(4, 8)}
        assert "consumesCounters" not in mig


def test_dynamic_mig_offers_every_placement_with_counters() -> None:
    _, inventory = node("1xH100-SXM5-80GB,1xL4")
    model = CATALOG["H100-SXM5-80GB"]
    for layout in ("split", "combined"):
        slices = build_slices("node-a", gpu_offers(inventory, dynamic_mig=True), layout=layout)
        validate(slices)
        names = [d["name"] for d in devices(slices)]
        placements = sum(len(p.starts) for p in model.mig_profiles)
        assert len(names) == 1 + placements + 1  # whole H100, every placement, the L4 (not MIG-capable)
        assert "gpu-0-mig-1g10gb-19-6" in names and "gpu-0-mig-1g10gb-me-20-0" in names and "gpu-1" in names
        counter_sets = [c for s in slices for c in s["spec"].get("sharedCounters", [])]
        assert [c["name"] for c in counter_sets] == ["gpu-0-counter-set"]
        counters = counter_sets[0]["counters"]
        assert counters["compute-slices"] == {"value": "7"} and counters["multiprocessors"] == {"value": "132"}
        assert {f"memory-slice-{i}" for i in range(8)} <= set(counters)
        three_g = next(d for d in devices(slices) if d["name"] == "gpu-0-mig-3g40gb-9-4")
        consumed = three_g["consumesCounters"][0]["counters"]
        assert {k for k in consumed if k.startswith("memory-slice")} == {f"memory-slice-{i}" for i in range(4, 8)}
        assert consumed["compute-slices"] == {"value": "3"}
        if layout == "split":
            assert "devices" not in slices[0]["spec"] and all("sharedCounters" not in s["spec"] for s in slices[1:])
        else:
            assert "sharedCounters" in slices[0]["spec"] and "devices" in slices[0]["spec"]


def test_pools_are_split_under_the_api_limits() -> None:
    _, inventory = node("1xL4")
    gpu = inventory.gpus[0]
    many = GpuOffer(gpu, tuple({"name": f"d-{i}"} for i in range(300)), None, {})
    plain = build_slices("node-a", [many])
    assert [len(s["spec"]["devices"]) for s in plain] == [MAX_DEVICES, MAX_DEVICES, 300 - 2 * MAX_DEVICES]
    tainted = build_slices("node-a", [many], {gpu.index: GpuHealth(79)})
    assert [len(s["spec"]["devices"]) for s in tainted] == [64, 64, 64, 64, 44]
    assert all(s["spec"]["pool"]["resourceSliceCount"] == 5 for s in tainted)
    assert len({s["metadata"]["name"] for s in tainted}) == 5
    _, big = node("9xA100-SXM4-40GB")
    dynamic = build_slices("node-a", gpu_offers(big, dynamic_mig=True))
    counter_slices = [s for s in dynamic if "sharedCounters" in s["spec"]]
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [8, 1]  # at most 8 counter sets a slice
    assert all(len(s["spec"].get("devices", [])) <= MAX_DEVICES_ADVANCED for s in dynamic)
    validate(dynamic)


def test_health_taints() -> None:
    _, inventory = node("2xA100-SXM4-40GB", {1: [("1g.5gb", 0)]})
    assert not critical(31) and critical(63)
    slices = build_slices("node-a", gpu_offers(inventory, dynamic_mig=False), {0: GpuHealth(79), 1: GpuHealth(63)},
                          generation=3)
    validate(slices)
    by_name = {d["name"]: d for d in devices(slices)}
    assert by_name["gpu-0"]["taints"] == [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}]
    assert by_name["gpu-1-mig-1g5gb-19-0"]["taints"][0]["effect"] == "NoSchedule"
    assert slices[0]["spec"]["pool"]["generation"] == 3
    healthy = build_slices("node-a", gpu_offers(inventory, dynamic_mig=False))
    assert all("taints" not in d for d in devices(healthy))


def test_shipped_device_classes() -> None:
    objects = shipped_class_objects()
    validate(objects)
    by_name = {o["metadata"]["name"]: o for o in objects}
    assert {"gpu.nvidia.com", "mig.nvidia.com"} <= set(by_name)
    assert by_name["gpu.nvidia.com"]["spec"]["extendedResourceName"] == GPU_RESOURCE
    deployed = list(yaml.safe_load_all((REPO / "deploy/kubernetes/dra/deviceclasses.yaml").read_text()))
    assert deployed == objects


@pytest.mark.parametrize(("text", "expected"), [("580.65.06", "580.65.6"), ("12.8", "12.8.0"), ("550", "550.0.0")])
def test_driver_versions_become_semver(text: str, expected: str) -> None:
    assert semver(text) == expected


def test_slice_names_sort_in_gpu_order_and_fit_the_api() -> None:
    from kubegpu.dra.slices import slice_name

    _, big = node("12xA100-SXM4-40GB")
    slices = build_slices("node-a", gpu_offers(big, dynamic_mig=True))
    names = [s["metadata"]["name"] for s in slices]
    assert names == sorted(names) and names[0] == "node-a-gpu.nvidia.com-000"
    long_node = "n" * 250
    assert len(slice_name(long_node, "gpu.nvidia.com", 7)) <= 253
    assert slice_name(long_node, "gpu.nvidia.com", 7) != slice_name(long_node[:-1] + "m", "gpu.nvidia.com", 7)
