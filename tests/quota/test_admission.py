"""deploy/kubernetes/quota on the real API server: the MutatingAdmissionPolicy adds the charge, the
ValidatingAdmissionPolicy refuses a smaller own value, and a stock ResourceQuota on `kubegpu.io/gpu-memory` holds one
A100-80GB's worth of any mix and refuses the next pod with the API server's own quota message."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import lightkube
import pytest
from lightkube import codecs
from lightkube.resources.core_v1 import Pod, ResourceQuota

from kubegpu.scheduling.quantity import parse_quantity
from kubegpu.sharing.charges import pod_charge
from kubegpu.testing.session import RealCluster, wait_for
from tests.quota.apply import apply_all, remove_all, shipped, until_admitted

GIB = 1 << 30
MEMORY = "kubegpu.io/gpu-memory"


def gpu_pod(namespace: str, limits: dict[str, Any], *, name: str | None = None, own: str | None = None,
            **spec: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": dict(limits)}
    if own is not None:
        resources["limits"][MEMORY] = own
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name or f"p-{uuid.uuid4().hex[:6]}", "namespace": namespace},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": resources}], **spec}}


def create(client: lightkube.Client, body: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    created = client.create(codecs.from_dict(body), dry_run=dry_run)
    return created.to_dict()  # type: ignore[no-any-return]


def stored_charge(pod: dict[str, Any]) -> dict[str, tuple[float, float]]:
    out = {}
    for container in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
        resources = container.get("resources") or {}
        request = (resources.get("requests") or {}).get(MEMORY)
        limit = (resources.get("limits") or {}).get(MEMORY)
        if request is not None:
            out[container["name"]] = (parse_quantity(request), parse_quantity(limit))
    return out


@pytest.fixture(scope="module")
def policy(real_cluster: RealCluster) -> Iterator[lightkube.Client]:
    """The shipped namespace, CRD, table and policies applied; active once a dry-run GPU pod comes back charged."""
    client = real_cluster.client()
    applied = apply_all(client, shipped())
    probe = gpu_pod("default", {"nvidia.com/gpu": 1})
    wait_for(lambda: stored_charge(until_admitted(lambda: create(client, probe, dry_run=True)) or {"spec": {
        "containers": []}}), "the charge policy to be active", 60)
    try:
        yield client
    finally:
        remove_all(client, applied)


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def _required(expressions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": expressions}]}}}}


KINDS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("whole-default", {"nvidia.com/gpu": 1}, {}),
    ("whole-selected", {"nvidia.com/gpu": 2}, {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-NVL"}}),
    ("whole-affinity", {"nvidia.com/gpu": 1}, {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                   "values": ["NVIDIA-L4", "Tesla-T4"]}]},
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                   "values": ["NVIDIA-A10G"]}]}]}}}}),
    ("whole-unknown-product", {"nvidia.com/gpu": 1}, {"nodeSelector": {"nvidia.com/gpu.product": "ACME-X"}}),
    ("whole-catalog-key", {"nvidia.com/gpu": 1}, {"nodeSelector": {"nvidia.com/gpu.product": "L4"}}),
    ("time-slicing", {"nvidia.com/gpu.shared": 3}, {}),
    ("shared-selected", {"nvidia.com/gpu.shared": 1}, {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}),
    ("mig", {"nvidia.com/mig-1g.10gb": 2}, {}),
    ("mig-big", {"nvidia.com/mig-7g.141gb": 1}, {}),
    ("mig-me", {"nvidia.com/mig-1g.12gb.me": 1}, {}),
    ("mps-slice", {"nvidia.com/gpu-20gb": 1}, {}),
    ("mixed", {"nvidia.com/gpu-5gb": 1, "nvidia.com/mig-3g.40gb": 1, "cpu": "1"}, {}),
    # pins through any label that names a GPU, with every operator of required node affinity
    ("instance-type", {"nvidia.com/gpu": 1}, {"nodeSelector": {"node.kubernetes.io/instance-type": "p5e.48xlarge"}}),
    ("karpenter-gpu-name", {"nvidia.com/gpu": 1}, {"nodeSelector": {"karpenter.k8s.aws/instance-gpu-name": "h200"}}),
    ("selector-and-unknown-label", {"nvidia.com/gpu.shared": 2},
     {"nodeSelector": {"karpenter.k8s.aws/instance-gpu-name": "l4", "team": "ml"}}),
    ("affinity-gt-notin", {"nvidia.com/gpu": 1}, _required(
        [_expr("nvidia.com/gpu.memory", "Gt", "100000"), _expr("nvidia.com/gpu.product", "NotIn", "NVIDIA-B200"),
         _expr("topology.kubernetes.io/zone", "In", "us-east-1a")])),
    ("affinity-lt", {"nvidia.com/gpu": 1}, _required([_expr("karpenter.k8s.aws/instance-gpu-memory", "Lt", "30000")])),
    ("affinity-exists", {"nvidia.com/gpu": 1}, _required(
        [_expr("karpenter.k8s.aws/instance-gpu-name", "Exists"),
         _expr("node.kubernetes.io/instance-type", "In", "g6.xlarge", "p4d.24xlarge")])),
    ("affinity-does-not-exist", {"nvidia.com/gpu": 1}, _required(
        [_expr("karpenter.k8s.aws/instance-gpu-name", "DoesNotExist"),
         _expr("nvidia.com/gpu.product", "In", "NVIDIA-L4", "NVIDIA-H200")])),
    ("affinity-unknown-value", {"nvidia.com/gpu": 1}, _required(
        [_expr("node.kubernetes.io/instance-type", "In", "a3-ultragpu-8g", "g6.xlarge")])),
    ("selector-unknown-value", {"nvidia.com/gpu": 1}, {"nodeSelector": {
        "karpenter.k8s.aws/instance-gpu-name": "l4", "node.kubernetes.io/instance-type": "g7.xlarge"}}),
    ("affinity-fields-only", {"nvidia.com/gpu": 1}, {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}),
]


@pytest.mark.parametrize(("kind", "limits", "spec"), KINDS, ids=[k[0] for k in KINDS])
def test_every_resource_kind_is_charged_as_the_core_says(policy: lightkube.Client, namespace: str, kind: str,
                                                         limits: dict[str, Any], spec: dict[str, Any]) -> None:
    body = gpu_pod(namespace, limits, **spec)
    stored = create(policy, body)
    expected = pod_charge(body).containers
    assert expected["main"] > 0
    assert stored_charge(stored) == {name: (float(b), float(b)) for name, b in expected.items()}


def test_init_and_several_containers_each_carry_their_own_charge(policy: lightkube.Client, namespace: str) -> None:
    body = gpu_pod(namespace, {"nvidia.com/mig-2g.20gb": 1})
    body["spec"]["containers"].append({"name": "cpu-only", "image": "busybox", "resources": {"limits": {"cpu": "1"}}})
    body["spec"]["containers"].append({"name": "second", "image": "busybox",
                                       "resources": {"limits": {"nvidia.com/gpu.shared": 1}}})
    body["spec"]["initContainers"] = [{"name": "warm", "image": "busybox",
                                       "resources": {"requests": {"nvidia.com/gpu-10gb": 1},
                                                     "limits": {"nvidia.com/gpu-10gb": 1}}}]
    # the replica of an unpinned GPU: a quarter of the catalog's largest (a B200)
    assert stored_charge(create(policy, body)) == {"warm": (10.0 * GIB,) * 2, "main": (20.0 * GIB,) * 2,
                                                   "second": (45.0 * GIB,) * 2}


def test_pods_without_gpus_are_left_alone(policy: lightkube.Client, namespace: str) -> None:
    body = gpu_pod(namespace, {"cpu": "1"})
    assert stored_charge(create(policy, body)) == {}


def test_own_value_kept_when_enough_refused_when_smaller(policy: lightkube.Client, namespace: str) -> None:
    kept = create(policy, gpu_pod(namespace, {"nvidia.com/mig-1g.10gb": 1}, own="30Gi"))
    assert stored_charge(kept) == {"main": (30.0 * GIB,) * 2}
    with pytest.raises(lightkube.ApiError) as refused:
        create(policy, gpu_pod(namespace, {"nvidia.com/mig-1g.10gb": 2}, name="too-small", own="5Gi"))
    message = refused.value.status.message or ""
    assert f"pod {namespace}/too-small" in message and "set it to at least 20Gi" in message, message


def _quota(client: lightkube.Client, namespace: str) -> None:
    client.create(codecs.from_dict({"apiVersion": "v1", "kind": "ResourceQuota",
                                    "metadata": {"name": "gpu", "namespace": namespace},
                                    "spec": {"hard": {f"requests.{MEMORY}": "80Gi"}}}))
    # the quota admission plugin enforces what the controller-manager has recorded in status.hard
    wait_for(lambda: (client.get(ResourceQuota, "gpu", namespace=namespace).status.hard or {}).get(
        f"requests.{MEMORY}"), "the ResourceQuota's status.hard", 60)


A100_80 = {"nodeSelector": {"node.kubernetes.io/instance-type": "p4de.24xlarge"}}
"""The mixes' pods pin an A100-80GB (an unpinned whole GPU or replica pays the catalog's largest, a B200)."""

MIXES = {
    "one-whole-gpu": [{"nvidia.com/gpu": 1}],
    "eight-1g.10gb": [{"nvidia.com/mig-1g.10gb": 1}] * 8,
    "four-replicas": [{"nvidia.com/gpu.shared": 1}] * 4,
    "mixed": [{"nvidia.com/mig-3g.40gb": 1}, {"nvidia.com/gpu.shared": 1}, {"nvidia.com/gpu-10gb": 2}],
}


@pytest.mark.parametrize("mix", list(MIXES))
def test_resource_quota_admits_one_a100_of_any_mix_then_refuses(policy: lightkube.Client, namespace: str,
                                                                 mix: str) -> None:
    _quota(policy, namespace)
    for limits in MIXES[mix]:
        create(policy, gpu_pod(namespace, limits, **A100_80))
    with pytest.raises(lightkube.ApiError) as refused:
        create(policy, gpu_pod(namespace, {"nvidia.com/mig-1g.10gb": 1}, name="one-too-many"))
    message = refused.value.status.message or ""
    assert refused.value.status.code == 403
    assert "exceeded quota: gpu" in message and f"requested: requests.{MEMORY}=10Gi" in message, message
    assert f"used: requests.{MEMORY}=80Gi" in message and f"limited: requests.{MEMORY}=80Gi" in message, message
    assert len(list(policy.list(Pod, namespace=namespace))) == len(MIXES[mix])


def test_limit_range_caps_a_containers_charge(policy: lightkube.Client, namespace: str) -> None:
    policy.create(codecs.from_dict({"apiVersion": "v1", "kind": "LimitRange",
                                    "metadata": {"name": "gpu", "namespace": namespace},
                                    "spec": {"limits": [{"type": "Container", "max": {MEMORY: "40Gi"},
                                                         "default": {MEMORY: "0"},
                                                         "defaultRequest": {MEMORY: "0"}}]}}))
    # without `default: 0` the API server would default it to `max`: every container, GPU or not, charged 40Gi
    assert stored_charge(create(policy, gpu_pod(namespace, {"nvidia.com/mig-3g.40gb": 1}))) == {
        "main": (40.0 * GIB,) * 2}
    assert stored_charge(create(policy, gpu_pod(namespace, {"cpu": "1"}))) == {"main": (0.0, 0.0)}
    with pytest.raises(lightkube.ApiError) as refused:
        create(policy, gpu_pod(namespace, {"nvidia.com/mig-7g.80gb": 1}, name="too-big"))
    message = refused.value.status.message or ""
    assert f"maximum {MEMORY} usage per Container is 40Gi, but limit is 80Gi" in message, message


def test_a_missing_table_refuses_gpu_pods_naming_it(policy: lightkube.Client, namespace: str) -> None:
    from lightkube.resources.core_v1 import ConfigMap

    from kubegpu.quota.policy import NAMESPACE, TABLE_NAME

    table = next(obj for obj in shipped(("20",)) if obj["kind"] == "ConfigMap")
    policy.delete(ConfigMap, TABLE_NAME, namespace=NAMESPACE)
    try:
        def refused() -> str | None:
            try:
                create(policy, gpu_pod(namespace, {"nvidia.com/gpu": 1}), dry_run=True)
            except lightkube.ApiError as exc:
                return exc.status.message or "(no message)"
            return None  # the API server's informer has not seen the delete yet

        message = wait_for(refused, "a GPU pod refused without the table", 30)
        assert f"the table ConfigMap {NAMESPACE}/{TABLE_NAME} is missing" in message, message
        with pytest.raises(lightkube.ApiError):  # an init container's GPUs too
            body = gpu_pod(namespace, {"cpu": "1"})
            body["spec"]["initContainers"] = [{"name": "warm", "image": "busybox",
                                               "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]
            create(policy, body, dry_run=True)
        assert stored_charge(create(policy, gpu_pod(namespace, {"cpu": "1"}))) == {}  # other pods are not affected
    finally:
        apply_all(policy, [table])
        wait_for(lambda: stored_charge(until_admitted(lambda: create(
            policy, gpu_pod(namespace, {"nvidia.com/gpu": 1}), dry_run=True)) or {"spec": {"containers": []}}),
                 "the charge policy to see the table again", 60)
