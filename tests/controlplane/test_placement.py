"""`kubegpu place` on the real control plane: beside kube-scheduler, a sequence of GPU pods (shares of one GPU and
whole GPUs, one through a claim template) lands on the node and GPUs the placement core predicts when it runs over
the same sequence here, on the same state; the claims it allocates are accepted by the real API server (shareID,
consumedCapacity, node selector, reservedFor) and a claim kube-scheduler allocated on the same GPUs counts. The
controller runs with the shipped ServiceAccount's token (deploy/kubernetes/dra/place.yaml): its RBAC is enough."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import lightkube
import pytest
import yaml
from lightkube import codecs
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.authentication_v1 import TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, ServiceAccount

from kubegpu.dra.classes import shipped_class_objects
from kubegpu.dra.devices import gpu_offers, read_node
from kubegpu.dra.slices import build_slices
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube.errors import ApiError
from kubegpu.kube.informer import InformedCluster
from kubegpu.kube.lightkube_cluster import LightkubeCluster
from kubegpu.kube.resources import ResourceKind, register_kind
from kubegpu.placement.controller import KINDS, PlacementController
from kubegpu.placement.objects import build_state, inventory, pod_claim_names, pod_request
from kubegpu.scheduling.placement import Placement, choose, make_policy
from kubegpu.testing.session import wait_for

if TYPE_CHECKING:
    from kubegpu.testing.session import RealCluster

pytestmark = pytest.mark.apiserver
NODES = {"place-a": "2xA100-SXM4-80GB", "place-b": "1xA100-SXM4-80GB"}
register_kind(ResourceKind("ResourceClaimTemplate", "resource.k8s.io", "v1", "resourceclaimtemplates",
                           namespaced=True, status_subresource=False, strategic_merge=False))
TAINT = {"key": "kubegpu.io/place-test", "value": "true", "effect": "NoSchedule"}


def claim_spec(thousandths: int | None, count: int = 1) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "fraction.gpu.kubegpu.io", "count": count}
    if thousandths is not None:
        exactly["capacity"] = {"requests": {"compute": str(thousandths)}}
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def pod(name: str, namespace: str, claim: dict[str, str], scheduler: str = "kubegpu") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "tolerations": [{"key": TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}],
        "resourceClaims": [{"name": "gpu", **claim}],
        "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "2", "memory": "4Gi"},
                                                                       "claims": [{"name": "gpu"}]}}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy/kubernetes/dra/place.yaml"
ACCOUNT_NAMESPACE = "kubegpu"


@pytest.fixture
def place_account(real_cluster: RealCluster) -> Iterator[LightkubeCluster]:
    """The shipped ServiceAccount and RBAC of `kubegpu place` applied; a cluster client holding its token."""
    admin = real_cluster.client()
    created_namespace = False
    try:
        admin.create(Namespace(metadata=ObjectMeta(name=ACCOUNT_NAMESPACE)))
        created_namespace = True
    except lightkube.ApiError as exc:
        if exc.status.code != 409:
            raise
    objects = [codecs.from_dict(d) for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] in (
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    for obj in objects:
        admin.apply(obj, field_manager="kubegpu-test", force=True)
    try:
        request = ServiceAccount.Token(metadata=ObjectMeta(name="kubegpu-place", namespace=ACCOUNT_NAMESPACE),
                                       spec=TokenRequestSpec(audiences=[], expirationSeconds=1800))
        token = admin.create(request, "kubegpu-place", namespace=ACCOUNT_NAMESPACE).status.token
        config = yaml.safe_load(real_cluster.kubeconfig.read_text())
        config["users"] = [{"name": "place", "user": {"token": token}}]
        config["contexts"][0]["context"]["user"] = "place"
        yield LightkubeCluster(lightkube.Client(config=KubeConfig.from_dict(config), trust_env=False))
    finally:
        for obj in reversed(objects):
            with contextlib.suppress(lightkube.ApiError):
                admin.delete(type(obj), obj.metadata.name, namespace=obj.metadata.namespace)
        if created_namespace:
            with contextlib.suppress(lightkube.ApiError):
                admin.delete(Namespace, ACCOUNT_NAMESPACE)


def with_claim(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod once every claim it names exists (a template's claim is generated by kube-controller-manager)."""
    return pod if all(pod_claim_names(pod)) else None


def test_pods_land_where_the_placement_core_predicts(real_cluster: RealCluster, namespace: str, tmp_path: Path,
                                                    place_account: LightkubeCluster) -> None:
    admin = real_cluster.admin
    classes = shipped_class_objects()
    slices: list[dict[str, Any]] = []
    informed = InformedCluster(place_account, KINDS)
    try:
        for device_class in classes:
            with contextlib.suppress(ApiError):
                admin.create(device_class)
        for node, gpus in NODES.items():
            real_cluster.add_gpu_node(node, gpus=gpus)
            admin.patch("Node", node, {"spec": {"taints": [TAINT]}})
            backend = SimulatedBackend.create(tmp_path / f"{node}.json", gpus=gpus, node_name=node)
            for item in build_slices(node, gpu_offers(read_node(backend), dynamic_mig=False, fractional=True)):
                slices.append(admin.create(item))
        controller = PlacementController(informed, make_policy("kubegpu"), lease_namespace=ACCOUNT_NAMESPACE)
        # the prediction: the placement core over the same sequence, on the state read before any pod
        state = build_state([admin.get("Node", n) for n in NODES], inventory(slices), [], [])
        wait_for(lambda: len(inventory(informed.list("ResourceSlice"))) == len(NODES) or None, "slices informed")
        predicted = make_policy("kubegpu")
        sequence: list[tuple[str, int | None, int, str]] = [
            ("p1", 300, 1, "claim"), ("p2", 700, 1, "template"), ("theirs", 500, 1, "kube-scheduler"),
            ("p3", None, 2, "claim"), ("p4", 400, 1, "claim"), ("p5", 600, 1, "claim"), ("p6", 200, 1, "claim")]
        landed: dict[str, tuple[str, list[str]]] = {}
        expected: dict[str, tuple[str, list[str]]] = {}
        for name, share, count, how in sequence:
            if how == "template":
                admin.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                              "metadata": {"name": name, "namespace": namespace},
                              "spec": {"spec": claim_spec(share, count)}})
                admin.create(pod(name, namespace, {"resourceClaimTemplateName": name}))
            else:
                admin.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                              "metadata": {"name": name, "namespace": namespace}, "spec": claim_spec(share, count)})
                admin.create(pod(name, namespace, {"resourceClaimName": name},
                                 *(("default-scheduler",) if how == "kube-scheduler" else ())))
            if how == "kube-scheduler":  # placed by kube-scheduler (its node scoring, then first fit of devices):
                # the prediction takes it as given, and kubegpu place must count it
                bound = real_cluster.wait_bound(name, namespace)
                got = wait_for(lambda n=name: (admin.get("ResourceClaim", n, namespace).get("status") or {})
                               .get("allocation"), "kube-scheduler's allocation")
                devices = [r["device"] for r in got["devices"]["results"]]
                current = admin.get("Pod", name, namespace)
                ask = pod_request(current, admin.get("ResourceClaim", name, namespace))
                state.apply(ask.request, Placement(state.names.index(bound),
                                                   tuple(int(d.removeprefix("gpu-")) for d in devices)))
                continue
            current = wait_for(lambda n=name: with_claim(admin.get("Pod", n, namespace)), f"pod {name}'s claim")
            [claim_name] = pod_claim_names(current)
            ask = pod_request(current, admin.get("ResourceClaim", str(claim_name), namespace))
            placement = choose(ask.request, state, predicted)
            if placement is not None:
                state.apply(ask.request, placement)
                expected[name] = (state.names[placement.node], [f"gpu-{g}" for g in placement.gpus])

            def bound(n: str = name) -> str | None:
                controller.tick(time.time())
                return (admin.get("Pod", n, namespace).get("spec") or {}).get("nodeName")

            def reported(n: str = name) -> bool | None:
                controller.tick(time.time())
                return any(e.get("reason") == "FailedScheduling" and (e.get("involvedObject") or {}).get("name") == n
                           for e in admin.list("Event", namespace)) or None

            if placement is None:  # the controller must leave it pending: it reports why
                wait_for(reported, f"{name} reported unplaceable")
                assert not (admin.get("Pod", name, namespace).get("spec") or {}).get("nodeName")
                continue
            node = wait_for(bound, f"pod {name} bound by kubegpu place")
            allocation = admin.get("ResourceClaim", str(claim_name), namespace)["status"]["allocation"]
            landed[name] = (node, [r["device"] for r in allocation["devices"]["results"]])
            assert all(r.get("shareID") and r.get("consumedCapacity") for r in allocation["devices"]["results"])
        assert landed == expected
        assert len(expected) >= 4, expected
    finally:
        informed.stop()
        for item in slices:
            with contextlib.suppress(ApiError):
                admin.delete("ResourceSlice", item["metadata"]["name"])
        for device_class in classes:  # `gpu.nvidia.com` maps nvidia.com/gpu onto DRA: later tests must not meet it
            with contextlib.suppress(ApiError):
                admin.delete("DeviceClass", device_class["metadata"]["name"])
        for node in NODES:
            real_cluster.delete_node(node)
