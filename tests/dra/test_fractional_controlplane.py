"""Fractional GPUs on the real control plane: the API server accepts the `--fractional` driver's shared devices
(allowMultipleAllocations, a consumable `compute` with its requestPolicy) and the fraction DeviceClass, and the real
kube-scheduler packs shares exactly as our allocator does — same device and same consumedCapacity for every claim,
and the same claims left without room."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kubegpu.dra.classes import shipped_class_objects
from kubegpu.dra.devices import gpu_offers, read_node
from kubegpu.dra.slices import build_slices
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube.errors import ApiError
from kubegpu.scheduling.dra import allocate_in_order, parse_all
from kubegpu.scheduling.quantity import parse_quantity
from kubegpu.testing.session import wait_for
from tests.dra.test_controlplane import pod

if TYPE_CHECKING:
    from kubegpu.testing.session import RealCluster

pytestmark = pytest.mark.apiserver
NODE = "dra-fraction"
FRACTION_TAINT = {"key": "kubegpu.io/dra-fraction-test", "value": "true", "effect": "NoSchedule"}


def tainted_pod(name: str, namespace: str, taint: dict[str, str]) -> dict[str, Any]:
    """A pod that tolerates one test's taint alone: another test's pods left unschedulable (their namespace still
    terminating) can never take this test's GPUs, nor this test's pods theirs."""
    out = pod(name, namespace, name)
    out["spec"]["tolerations"] = [{"key": taint["key"], "operator": "Exists", "effect": "NoSchedule"}]
    return out


def share(name: str, namespace: str, thousandths: int | None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "fraction.gpu.kubegpu.io"}
    if thousandths is not None:
        exactly["capacity"] = {"requests": {"compute": str(thousandths)}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


def summary(results: list[dict[str, Any]]) -> list[tuple[str, dict[str, float]]]:
    return [(r["device"], {k: parse_quantity(v) for k, v in r["consumedCapacity"].items()}) for r in results]


def test_real_scheduler_packs_shares_like_our_allocator(real_cluster: RealCluster, namespace: str,
                                                        tmp_path: Path) -> None:
    admin = real_cluster.admin
    real_cluster.add_gpu_node(NODE, gpus="2xA100-SXM4-80GB")
    admin.patch("Node", NODE, {"spec": {"taints": [FRACTION_TAINT]}})  # only this test's pods land here
    backend = SimulatedBackend.create(tmp_path / "node.json", gpus="2xA100-SXM4-80GB", node_name=NODE)
    slices = build_slices(NODE, gpu_offers(read_node(backend), dynamic_mig=False, fractional=True))
    classes = shipped_class_objects()
    # 300 + 700 fill gpu-0; 100 opens gpu-1; a claim naming no share takes a whole GPU (none left whole);
    # the capacity named with its domain is not the published `compute` (1.37 matches names as written);
    # 900 fills gpu-1; 1 finds no thousandth left
    qualified = share("qualified", namespace, 1)
    qualified["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"gpu.nvidia.com/compute": "1"}}
    objects = [share(name, namespace, amount) for name, amount in
               (("a", 300), ("b", 700), ("c", 100), ("whole", None))]
    objects += [qualified, share("d", namespace, 900), share("e", namespace, 1)]
    try:
        for device_class in classes:
            with contextlib.suppress(ApiError):
                admin.create(device_class)
        for item in slices:
            admin.create(item)
        real: dict[str, Any] = {}
        for obj in objects:
            name = obj["metadata"]["name"]
            admin.create(obj)
            admin.create(tainted_pod(name, namespace, FRACTION_TAINT))
            if name in ("whole", "qualified", "e"):
                wait_for(lambda n=name: real_cluster.unschedulable_message(n, namespace) or None,
                         f"{name} unschedulable")
                continue
            assert real_cluster.wait_bound(name, namespace) == NODE
            allocation = wait_for(lambda n=name: (admin.get("ResourceClaim", n, namespace).get("status") or {})
                                  .get("allocation"), f"claim {name} allocated")
            results = allocation["devices"]["results"]
            assert all(r.get("shareID") for r in results)
            real[f"{namespace}/{name}"] = summary(results)
        ours = allocate_in_order(parse_all(slices, "ResourceSlice", "slices"),
                                 {c.name: c for c in parse_all(classes, "DeviceClass", "classes")},
                                 parse_all(objects, "ResourceClaim", "claims"))
        assert {k: summary(o.to_json()["results"]) for k, o in ours.items() if o.results is not None} == real
        assert real[f"{namespace}/a"] == [("gpu-0", {"compute": 300.0, "memory": 0.0})]
        assert all(ours[f"{namespace}/{n}"].results is None for n in ("whole", "qualified", "e"))
    finally:
        for item in slices:
            with contextlib.suppress(ApiError):
                admin.delete("ResourceSlice", item["metadata"]["name"])
        for device_class in classes:  # `gpu.nvidia.com` maps nvidia.com/gpu onto DRA: later tests must not meet it
            with contextlib.suppress(ApiError):
                admin.delete("DeviceClass", device_class["metadata"]["name"])
        real_cluster.delete_node(NODE)


CAPACITY_NODE = "dra-capacity"
CAPACITY_TAINT = {"key": "kubegpu.io/dra-capacity-test", "value": "true", "effect": "NoSchedule"}
BY_INDEX = "device.attributes['gpu.nvidia.com'].index == {}"


def shared_gpu(index: int, compute_policy: dict[str, Any]) -> dict[str, Any]:
    return {"name": f"gpu-{index}", "allowMultipleAllocations": True,
            "attributes": {"type": {"string": "gpu"}, "index": {"int": index}},
            "capacity": {"compute": {"value": "1000", "requestPolicy": compute_policy},
                         "memory": {"value": "80Gi", "requestPolicy": {"default": "0", "validValues": ["0"]}}}}


def asks(name: str, namespace: str, *requests: tuple[str, int | None, int, int | None]) -> dict[str, Any]:
    """A claim of fraction requests: (request name, thousandths, count, GPU index to select or None)."""
    out = []
    for request, amount, count, index in requests:
        exactly: dict[str, Any] = {"deviceClassName": "fraction.gpu.kubegpu.io", "count": count}
        if amount is not None:
            exactly["capacity"] = {"requests": {"compute": str(amount)}}
        if index is not None:
            exactly["selectors"] = [{"cel": {"expression": BY_INDEX.format(index)}}]
        out.append({"name": request, "exactly": exactly})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": {"requests": out}}}


def test_real_scheduler_and_our_allocator_agree_on_capacity_rules(real_cluster: RealCluster, namespace: str) -> None:
    """Request policies and share rules, claim by claim, against the real kube-scheduler: a step grid rounds up
    (150 -> 200), validValues round up to the next value (300 -> 500), two requests of one claim may share one
    device, the slots of one request may not, above max or beyond the values never fits, a request naming no share
    takes the default (the whole GPU)."""
    admin = real_cluster.admin
    real_cluster.add_gpu_node(CAPACITY_NODE, gpus="2xA100-SXM4-80GB")
    admin.patch("Node", CAPACITY_NODE, {"spec": {"taints": [CAPACITY_TAINT]}})
    item = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{CAPACITY_NODE}-gpu.nvidia.com-000"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": CAPACITY_NODE,
                     "pool": {"name": CAPACITY_NODE, "generation": 1, "resourceSliceCount": 1},
                     "devices": [shared_gpu(0, {"default": "1000", "validRange": {"min": "100", "max": "1000",
                                                                                  "step": "100"}}),
                                 shared_gpu(1, {"default": "1000", "validValues": ["250", "500", "1000"]})]}}
    classes = shipped_class_objects()
    objects = [asks("round", namespace, ("gpu", 150, 1, None)),
               asks("values", namespace, ("gpu", 300, 1, 1)),
               asks("pair", namespace, ("a", 400, 1, None), ("b", 400, 1, None)),
               asks("twoslots", namespace, ("gpu", 250, 2, 1)),
               asks("over", namespace, ("gpu", 1001, 1, None)),
               asks("default", namespace, ("gpu", None, 1, 1)),
               asks("last", namespace, ("gpu", 250, 1, 1))]
    misfits = ("twoslots", "over", "default")
    try:
        for device_class in classes:
            with contextlib.suppress(ApiError):
                admin.create(device_class)
        admin.create(item)
        real: dict[str, Any] = {}
        for obj in objects:
            name = obj["metadata"]["name"]
            admin.create(obj)
            admin.create(tainted_pod(name, namespace, CAPACITY_TAINT))
            if name in misfits:
                wait_for(lambda n=name: real_cluster.unschedulable_message(n, namespace) or None,
                         f"{name} unschedulable")
                continue
            assert real_cluster.wait_bound(name, namespace) == CAPACITY_NODE
            allocation = wait_for(lambda n=name: (admin.get("ResourceClaim", n, namespace).get("status") or {})
                                  .get("allocation"), f"claim {name} allocated")
            real[f"{namespace}/{name}"] = [(r["request"], *summary([r])[0])
                                           for r in allocation["devices"]["results"]]
        ours = allocate_in_order(parse_all([item], "ResourceSlice", "slices"),
                                 {c.name: c for c in parse_all(classes, "DeviceClass", "classes")},
                                 parse_all(objects, "ResourceClaim", "claims"))
        assert {k: [(r["request"], *summary([r])[0]) for r in o.to_json()["results"]]
                for k, o in ours.items() if o.results is not None} == real
        assert all(ours[f"{namespace}/{n}"].results is None for n in misfits)
        assert real[f"{namespace}/round"] == [("gpu", "gpu-0", {"compute": 200.0, "memory": 0.0})]
        assert real[f"{namespace}/values"] == [("gpu", "gpu-1", {"compute": 500.0, "memory": 0.0})]
        assert [device for _, device, _ in real[f"{namespace}/pair"]] == ["gpu-0", "gpu-0"]  # one device, twice
    finally:
        with contextlib.suppress(ApiError):
            admin.delete("ResourceSlice", item["metadata"]["name"])
        for device_class in classes:
            with contextlib.suppress(ApiError):
                admin.delete("DeviceClass", device_class["metadata"]["name"])
        real_cluster.delete_node(CAPACITY_NODE)
