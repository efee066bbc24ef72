"""DRA on the real control plane: the API server accepts our DeviceClasses and dynamic-MIG ResourceSlices (its own
validation, stricter than any schema), the real kube-scheduler allocates claims against them, and our allocator —
given the same slices, classes and claims in the same order — picks exactly the same devices (differential tests:
one hand-built sequence, and a few hundred generated claim sets, `kubegpu.testing.dragen`)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from kubegpu.dra.agent import DraAgent
from kubegpu.dra.classes import shipped_class_objects
from kubegpu.dra.driver import ClaimRef, DraDriver
from kubegpu.dra.publish import SlicePublisher
from kubegpu.dra.server import DraPluginServer
from kubegpu.errors import KubegpuError
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube.errors import ApiError, NotFound
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.scheduling.dra import allocate_in_order, parse_all
from kubegpu.testing import dragen, drareal
from kubegpu.testing.session import wait_for

if TYPE_CHECKING:
    from kubegpu.testing.session import RealCluster

pytestmark = pytest.mark.apiserver
register_kind(ResourceKind("DeviceClass", "resource.k8s.io", "v1", "deviceclasses", namespaced=False,
                           status_subresource=False, strategic_merge=False))
NODE = "dra-a100"
TAINT = {"key": "kubegpu.io/dra-test", "value": "true", "effect": "NoSchedule"}
PROFILE = "device.attributes['gpu.nvidia.com'].profile == '{}'"


def claim(name: str, namespace: str, requests: list[dict[str, Any]],
          constraints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": devices}}


def mig(name: str, profile: str, count: int = 1) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "mig.nvidia.com", "count": count,
                                      "selectors": [{"cel": {"expression": PROFILE.format(profile)}}]}}


def pod(name: str, namespace: str, claim_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                     "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}]}}


def claims_in_order(namespace: str) -> list[dict[str, Any]]:
    h100 = "device.attributes['gpu.nvidia.com'].productName.contains('H100')"
    return [
        claim("small", namespace, [mig("mig", "1g.10gb")]),
        claim("medium", namespace, [mig("mig", "3g.40gb")]),
        claim("whole", namespace, [{"name": "gpu", "firstAvailable": [
            {"name": "h100", "deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": h100}}]},
            {"name": "any", "deviceClassName": "gpu.nvidia.com"}]}]),
        claim("pair", namespace, [mig("a", "1g.10gb"), mig("b", "1g.10gb")],
              constraints=[{"matchAttribute": "gpu.nvidia.com/parentUUID"}]),
        # GPU 0 now holds 3g@0 and 1g@4..6 (slot 7 free, but a 2g starts at 0, 2 or 4); GPU 1 is taken whole
        claim("nofit", namespace, [mig("a", "2g.20gb")]),
        claim("toomuch", namespace, [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]),
    ]


def test_real_scheduler_allocates_our_slices_like_our_allocator(real_cluster: RealCluster, namespace: str,
                                                                tmp_path: Path) -> None:
    """The driver publishes its node's slices, kube-scheduler allocates claims against them (our allocator agrees
    device for device), and the driver prepares the real allocations: MIG instances at exactly those placements."""
    admin = real_cluster.admin
    real_cluster.add_gpu_node(NODE, gpus="2xA100-SXM4-80GB")
    admin.patch("Node", NODE, {"spec": {"taints": [TAINT]}})  # only this test's pods land here
    classes = shipped_class_objects()
    SimulatedBackend.create(tmp_path / "node.json", gpus="2xA100-SXM4-80GB", node_name=NODE)
    backend = SimulatedBackend(tmp_path / "node.json")

    def get_claim(ns: str, name: str) -> dict[str, Any] | None:
        try:
            return admin.get("ResourceClaim", name, ns)
        except NotFound:
            return None

    driver = DraDriver(backend, NODE, tmp_path / "plugin", tmp_path / "cdi", get_claim, dynamic_mig=True)
    publisher = SlicePublisher(admin, NODE, "gpu.nvidia.com")
    agent = DraAgent(driver, DraPluginServer(driver, tmp_path / "plugin", tmp_path / "registry"), publisher)
    try:
        for device_class in classes:
            with contextlib.suppress(ApiError):  # left by an earlier run of this session
                admin.delete("DeviceClass", device_class["metadata"]["name"])
            admin.create(device_class)
        assert agent.step() == 1  # the driver's slices: the API server accepts them
        objects = claims_in_order(namespace)
        real: dict[str, Any] = {}
        for obj in objects:
            name = obj["metadata"]["name"]
            admin.create(obj)
            admin.create(pod(name, namespace, name))
            if name in ("nofit", "toomuch"):
                message = wait_for(lambda n=name: real_cluster.unschedulable_message(n, namespace) or None,
                                   f"{name} unschedulable")
                assert "claim" in message.lower() or "device" in message.lower(), message
                continue
            assert real_cluster.wait_bound(name, namespace) == NODE
            allocation = wait_for(lambda n=name: (admin.get("ResourceClaim", n, namespace).get("status") or {})
                                  .get("allocation"), f"claim {name} allocated")
            real[f"{namespace}/{name}"] = [{k: r[k] for k in ("request", "driver", "pool", "device")}
                                           for r in allocation["devices"]["results"]]
        published = SlicePublisher(admin, NODE, "gpu.nvidia.com").current()
        ours = allocate_in_order(parse_all(published, "ResourceSlice", "api"),
                                 {c.name: c for c in parse_all(classes, "DeviceClass", "classes")},
                                 parse_all(objects, "ResourceClaim", "claims"))
        assert {k: o.to_json()["results"] for k, o in ours.items() if o.results is not None} == real
        assert ours[f"{namespace}/nofit"].results is None and ours[f"{namespace}/toomuch"].results is None
        # the node side: prepare what the scheduler allocated, as the kubelet would once the pods start
        refs = [ClaimRef(namespace, admin.get("ResourceClaim", key.split("/")[1], namespace)["metadata"]["uid"],
                         key.split("/")[1]) for key in real]
        prepared = driver.prepare(refs)
        assert all(result.error == "" for result in prepared.values()), prepared
        wanted = sorted((int(r["device"].split("-")[1]), int(r["device"].split("-")[4]), int(r["device"].split("-")[5]))
                        for results in real.values() for r in results if "-mig-" in r["device"])
        created = sorted((g, m.profile_id, m.start) for g in (0, 1) for m in backend.mig_devices(g)
                         if backend.devices()[g].mig_enabled)
        assert created == wanted  # exactly the placements kube-scheduler chose
        assert driver.unprepare(refs) == {ref.uid: "" for ref in refs}
        assert all(not backend.mig_devices(g) for g in (0, 1) if backend.devices()[g].mig_enabled)
    finally:
        for item in publisher.current():
            with contextlib.suppress(ApiError):
                admin.delete("ResourceSlice", item["metadata"]["name"])
        for device_class in classes:
            with contextlib.suppress(ApiError):
                admin.delete("DeviceClass", device_class["metadata"]["name"])
        real_cluster.delete_node(NODE)


# --- the differential test on generated claim sets --------------------------------------------------------------------

SETS = int(os.environ.get("KUBEGPU_DRA_DIFF_SETS", "200"))
SEED = int(os.environ.get("KUBEGPU_DRA_DIFF_SEED", "1"))


def test_generated_claim_sets_our_allocator_agrees_with_kube_scheduler(real_cluster: RealCluster,
                                                                        namespace: str) -> None:
    """SETS generated claim sets, each a bare node of its own with our driver's slices (whole GPUs, static or
    dynamic MIG, now and then a tainted GPU or a pool mid-publication) and one pod with 1-3 claims, a third of them
    after a holder pod took one device: kube-scheduler and our allocator (a pod's claims together, as the scheduler
    does) agree on which pods fit, on whether a misfit is "no fit" or a fatal claim error, and, for the pods that
    fit, on every device.

    A different seed or size: KUBEGPU_DRA_DIFF_SEED / KUBEGPU_DRA_DIFF_SETS."""
    api = drareal.RawApi(real_cluster.client())
    classes = shipped_class_objects()
    parsed = {c.name: c for c in parse_all(classes, "DeviceClass", "classes")}
    for device_class in classes:
        with contextlib.suppress(KubegpuError):  # left by the other test or an earlier run: same content
            api.create(device_class)
    prefix = f"drd{uuid.uuid4().hex[:5]}"
    began = time.monotonic()
    sets = dragen.generate(SETS, SEED, namespace, prefix)
    try:
        ours, real = drareal.differential(api, sets, namespace, prefix, parsed)
    finally:  # `gpu.nvidia.com` maps nvidia.com/gpu onto DRA: later tests' GPU pods must not meet it
        for device_class in classes:
            api.delete("DeviceClass", device_class["metadata"]["name"])
    result = dragen.compare(sets, ours, real)
    print(f"\nDRA differential (seed {SEED}, {len(sets)} claim sets, {sum(1 for s in sets if s.holder)} with a "
          f"holder pod first): {result.summary()}; {api.requests} API requests, {time.monotonic() - began:.1f}s")
    assert not result.disagree, "\n".join(result.disagree)
    assert not result.other_status, "\n".join(result.other_status)
    assert not result.other_devices, "\n".join(result.other_devices)
    assert len(result.inconclusive) <= result.total // 50, result.inconclusive  # a busy machine may time out a few
    decided = result.total - len(result.inconclusive)
    assert decided // 5 <= result.bound <= decided * 4 // 5, "the generator should give both fitting and not"
