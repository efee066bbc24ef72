"""The quota controller charging ResourceClaims on the in-memory cluster: charge holders created (the store stands in
for the ResourceQuota plugin, refusing what exceeds a namespace's limit), gates lifted only once every claim is held,
an over-quota pod kept gated with a condition and an Event and let through when the charge frees, a shared claim
charged once, a crash between a holder's create and the lift converging without a second charge, and a pod that only
squats on a holder's name never taken for one."""

from __future__ import annotations

import contextlib
from typing import Any

from kubegpu.clock import VirtualClock
from kubegpu.dra.classes import shipped_class_objects
from kubegpu.errors import KubegpuError
from kubegpu.kube import MemoryCluster
from kubegpu.kube.errors import ApiError
from kubegpu.quota.claims import HOLDER_LABEL, parse_classes, pod_claim_charges
from kubegpu.quota.controller import QuotaController
from kubegpu.quota.holders import CONDITION, EXCEEDED, has_claim_gate, holder_pod
from kubegpu.quota.policy import table_configmap
from kubegpu.scheduling import parse_quantity
from kubegpu.sharing.charges import ChargeTable

MEM = "kubegpu.io/gpu-memory"
GIB = 1 << 30
MIG_40 = "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"


class QuotaStore(MemoryCluster):
    """The in-memory API with a ResourceQuota plugin's verdict on `kubegpu.io/gpu-memory` requests per namespace."""

    def __init__(self, limits: dict[str, int]) -> None:
        super().__init__(VirtualClock(1000.0))
        self.limits = limits

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        namespace = obj["metadata"].get("namespace")
        if obj.get("kind") == "Pod" and namespace in self.limits:
            used = sum(_requested(p) for p in self.list("Pod", namespace))
            wanted = _requested(obj)
            if wanted and used + wanted > self.limits[namespace]:
                raise ApiError(f'pods "{obj["metadata"]["name"]}" is forbidden: exceeded quota: gpu, requested: '
                               f"requests.{MEM}={wanted // GIB}Gi", code=403, reason="Forbidden")
        return super().create(obj)


def _requested(pod: dict[str, Any]) -> int:
    return sum(int(parse_quantity(c.get("resources", {}).get("requests", {}).get(MEM, "0")))
               for c in pod["spec"].get("containers") or ())


def _cluster(limit_gib: int = 100) -> QuotaStore:
    cluster = QuotaStore({"ns": limit_gib * GIB})
    for obj in shipped_class_objects():
        cluster.create(obj)
    cluster.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "mig-40", "namespace": "ns"},
                    "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": {
                        "deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression": MIG_40}}]}}]}}}})
    return cluster


def _pod(cluster: MemoryCluster, name: str, claim: dict[str, str] | None = None) -> dict[str, Any]:
    entry = claim or {"name": "mig", "resourceClaimTemplateName": "mig-40"}
    return cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
                           "spec": {"schedulingGates": [{"name": "kubegpu.io/gpu-memory"}, {"name": "other"}],
                                    "resourceClaims": [entry], "containers": [{"name": "c", "image": "x"}]}})


def _holders(cluster: MemoryCluster) -> list[dict[str, Any]]:
    return [p for p in cluster.list("Pod", "ns") if HOLDER_LABEL in (p["metadata"].get("labels") or {})]


def _condition(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["status"]["conditions"] if c["type"] == CONDITION)


def test_charged_pods_go_through_an_over_quota_one_waits_until_the_charge_frees() -> None:
    cluster = _cluster()
    for name in ("p0", "p1", "p2"):
        _pod(cluster, name)
    controller = QuotaController(cluster, leader_elect=False)
    try:
        result = controller.tick(1000.0).claims
        assert result is not None and (result.charged, result.lifted, result.waiting) == (2, 2, 1)
        gates = {p["metadata"]["name"]: p["spec"].get("schedulingGates") for p in cluster.list("Pod", "ns")
                 if not p["metadata"]["name"].startswith("kubegpu-charge-")}
        assert gates == {"p0": [{"name": "other"}], "p1": [{"name": "other"}],   # only our gate goes
                         "p2": [{"name": "kubegpu.io/gpu-memory"}, {"name": "other"}]}
        holders = _holders(cluster)
        assert [h["spec"]["containers"][0]["resources"] for h in holders] == [
            {"requests": {MEM: "40Gi"}, "limits": {MEM: "40Gi"}}] * 2
        assert all(has_claim_gate(h) for h in holders)   # never scheduled
        assert {h["metadata"]["ownerReferences"][0]["name"] for h in holders} == {"p0", "p1"}
        waiting = _condition(cluster.get("Pod", "p2", "ns"))
        assert (waiting["status"], waiting["reason"]) == ("False", EXCEEDED) and "exceeded quota" in waiting["message"]
        assert [e["reason"] for e in cluster.list("Event", "ns")] == [EXCEEDED]
        assert controller.tick(1001.0).claims.lifted == 0  # type: ignore[union-attr]
        assert len(cluster.list("Event", "ns")) == 1  # nothing new to say: no second Event

        # p0 goes; the garbage collector takes its holder (the store has none: done by hand), p2 is charged
        cluster.delete("Pod", "p0", "ns")
        cluster.delete("Pod", next(h["metadata"]["name"] for h in holders
                                   if h["metadata"]["ownerReferences"][0]["name"] == "p0"), "ns")
        assert controller.tick(1002.0).claims.lifted == 1  # type: ignore[union-attr]
        assert not has_claim_gate(cluster.get("Pod", "p2", "ns"))
        assert _condition(cluster.get("Pod", "p2", "ns"))["status"] == "True"
    finally:
        controller.close()


def test_a_holder_takes_its_pods_priority_class_for_quotas_scoped_to_it() -> None:
    cluster = _cluster()
    pod = _pod(cluster, "p0")
    cluster.patch("Pod", "p0", {"spec": {"priorityClassName": "high"}}, namespace="ns")
    controller = QuotaController(cluster, leader_elect=False)
    try:
        assert controller.tick(1000.0).claims.lifted == 1  # type: ignore[union-attr]
        [holder] = _holders(cluster)
        assert holder["spec"]["priorityClassName"] == "high" and pod["metadata"]["uid"] in {
            o["uid"] for o in holder["metadata"]["ownerReferences"]}
    finally:
        controller.close()


def test_a_crash_after_the_holder_is_created_converges_without_a_second_charge() -> None:
    cluster = _cluster()
    _pod(cluster, "p0")
    crashing = QuotaController(cluster, leader_elect=False)
    original = cluster.patch

    def crash(kind: str, name: str, patch: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if kind == "Pod" and "spec" in patch:
            raise KubegpuError("the controller died before lifting the gate")
        return original(kind, name, patch, *args, **kwargs)

    cluster.patch = crash  # type: ignore[method-assign]
    try:
        with contextlib.suppress(KubegpuError):
            crashing.tick(1000.0)
    finally:
        crashing.close()
        cluster.patch = original  # type: ignore[method-assign]
    assert len(_holders(cluster)) == 1 and has_claim_gate(cluster.get("Pod", "p0", "ns"))
    restarted = QuotaController(cluster, leader_elect=False)
    try:
        result = restarted.tick(1001.0).claims
        assert result is not None and (result.charged, result.lifted) == (0, 1)
        assert len(_holders(cluster)) == 1 and not has_claim_gate(cluster.get("Pod", "p0", "ns"))
    finally:
        restarted.close()


def test_a_shared_claim_is_charged_once_for_all_its_pods() -> None:
    cluster = _cluster(limit_gib=200)
    cluster.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"name": "team", "namespace": "ns"},
                    "spec": {"devices": {"requests": [{"name": "g",
                                                       "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
    for name in ("a", "b"):
        _pod(cluster, name, {"name": "g", "resourceClaimName": "team"})
    controller = QuotaController(cluster, leader_elect=False)
    try:
        assert controller.tick(1000.0).claims.lifted == 2  # type: ignore[union-attr]
        [holder] = _holders(cluster)
        owner = holder["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("ResourceClaim", "team")
        assert holder["spec"]["containers"][0]["resources"]["requests"][MEM] == "180Gi"  # any GPU: the largest
    finally:
        controller.close()


def test_a_pod_squatting_on_a_holders_name_is_not_taken_for_a_charge() -> None:
    cluster = _cluster()
    pod = _pod(cluster, "p0")
    controller = QuotaController(cluster, leader_elect=False)
    try:
        template = cluster.get("ResourceClaimTemplate", "mig-40", "ns")
        [charge] = pod_claim_charges(pod, {"mig-40": template}, {}, parse_classes(shipped_class_objects()))
        fake = holder_pod(pod, charge)
        fake["metadata"]["labels"] = {}
        fake["spec"]["containers"][0]["resources"] = {}
        fake["spec"]["schedulingGates"] = []
        cluster.create(fake)
        assert controller.tick(1000.0).claims.lifted == 0  # type: ignore[union-attr]
        assert has_claim_gate(cluster.get("Pod", "p0", "ns"))
        assert _condition(cluster.get("Pod", "p0", "ns"))["reason"] == "GPUMemoryChargeBlocked"
    finally:
        controller.close()


def test_a_finished_pod_gives_its_charge_back_and_the_next_goes_through() -> None:
    """A Succeeded pod holds no device any more (its generated claim is deallocated): its holder is evicted in the
    next pass and the charge goes to the pod that waited for it."""
    cluster = _cluster(limit_gib=40)
    _pod(cluster, "p0")
    _pod(cluster, "p1")
    controller = QuotaController(cluster, leader_elect=False)
    try:
        assert controller.tick(1000.0).claims.lifted == 1  # type: ignore[union-attr]
        [first] = [n for n in ("p0", "p1") if not has_claim_gate(cluster.get("Pod", n, "ns"))]
        cluster.patch("Pod", first, {"status": {"phase": "Succeeded"}}, namespace="ns", subresource="status")
        result = controller.tick(1001.0).claims
        assert result is not None and (result.released, result.lifted) == (1, 1)
        [holder] = _holders(cluster)
        assert holder["metadata"]["ownerReferences"][0]["name"] != first
    finally:
        controller.close()


def test_claims_pay_by_the_clusters_table_as_whole_gpus_do() -> None:
    """The controller reads the admission policy's table ConfigMap (the operator keeps it to the cluster's GPUs): on
    a cluster of A100-80GB a whole-GPU claim pays 80Gi, as `nvidia.com/gpu: 1` does there, not the catalogue's
    largest."""
    cluster = _cluster(limit_gib=200)
    cluster.create(table_configmap(ChargeTable.for_models(["A100-SXM4-80GB"])))
    cluster.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "gpu", "namespace": "ns"},
                    "spec": {"spec": {"devices": {"requests": [{"name": "g", "exactly": {
                        "deviceClassName": "gpu.nvidia.com"}}]}}}})
    _pod(cluster, "p0", {"name": "g", "resourceClaimTemplateName": "gpu"})
    controller = QuotaController(cluster, leader_elect=False, lease_namespace="kubegpu")
    try:
        assert controller.tick(1000.0).claims.lifted == 1  # type: ignore[union-attr]
        [holder] = _holders(cluster)
        assert holder["spec"]["containers"][0]["resources"]["requests"][MEM] == "80Gi"
    finally:
        controller.close()


def test_a_holder_for_less_than_the_charge_is_replaced_before_the_pod_goes() -> None:
    """A holder made when the charge was smaller (the table grew since, a crash in between) is not taken for the
    charge: it is evicted and made again at the charge before the gate is lifted."""
    cluster = _cluster()
    pod = _pod(cluster, "p0")
    template = cluster.get("ResourceClaimTemplate", "mig-40", "ns")
    [charge] = pod_claim_charges(pod, {"mig-40": template}, {}, parse_classes(shipped_class_objects()))
    small = holder_pod(pod, charge)
    small["spec"]["containers"][0]["resources"] = {"requests": {MEM: "10Gi"}, "limits": {MEM: "10Gi"}}
    cluster.create(small)
    controller = QuotaController(cluster, leader_elect=False)
    try:
        assert controller.tick(1000.0).claims.lifted == 0  # type: ignore[union-attr]
        assert _condition(cluster.get("Pod", "p0", "ns"))["reason"] == "GPUMemoryChargePending"
        assert controller.tick(1001.0).claims.lifted == 1  # type: ignore[union-attr]
        [holder] = _holders(cluster)
        assert holder["spec"]["containers"][0]["resources"]["requests"][MEM] == "40Gi"
    finally:
        controller.close()
