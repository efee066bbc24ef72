"""The Cluster contract's checks that kmock cannot answer (selectors, watch resume, strategic-merge lists, status
isolation), run through LightkubeCluster against the real API server; tests/kube/test_contract.py runs the same
checks on MemoryCluster. The real server is shared by the session, so every object here carries a label of this
module's own (or lives in a fresh namespace) and every list and watch is narrowed to it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from kubegpu.kube import Cluster, LightkubeCluster
from kubegpu.testing.session import RealCluster
from tests.kube.test_contract import LABEL_SELECTOR_CASES

MARK = "kubegpu.io/contract-test"


@pytest.fixture
def cluster(real_cluster: RealCluster) -> Iterator[LightkubeCluster]:
    """The admin LightkubeCluster; the Nodes a test makes (labelled MARK) are deleted afterwards."""
    adapter = real_cluster.cluster()
    yield adapter
    for node in adapter.list("Node", label_selector=MARK):
        adapter.delete("Node", node["metadata"]["name"])
    adapter.client.close()


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"contract-{name}", "labels": {MARK: "node", **(labels or {})}}}


def pod(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """A pod kube-scheduler leaves alone (gated) unless it names its node."""
    gates = [] if "nodeName" in spec else [{"name": MARK}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "main", "image": "busybox"}], "schedulingGates": gates, **spec}}


def names(objs: list[dict[str, Any]]) -> list[str]:
    return [obj["metadata"]["name"].removeprefix("contract-") for obj in objs]


def test_label_selectors(cluster: LightkubeCluster) -> None:
    cluster.create(node("a100", {"gpu": "a100", "mig": "true"}))
    cluster.create(node("h100", {"gpu": "h100"}))
    cluster.create(node("cpu"))
    for selector, expected in LABEL_SELECTOR_CASES.items():
        assert names(cluster.list("Node", label_selector=f"{MARK},{selector}")) == expected, selector


def test_field_selectors(cluster: LightkubeCluster, real_cluster: RealCluster, namespace: str) -> None:
    elsewhere = real_cluster.create_namespace("contract-elsewhere")
    try:
        bound_to = real_cluster.nodes[0]
        cluster.create(pod("bound", namespace, nodeName=bound_to))
        cluster.create(pod("pending", namespace))
        cluster.create(pod("other", elsewhere, nodeName=bound_to))
        assert names(cluster.list("Pod", namespace, field_selector=f"spec.nodeName={bound_to}")) == ["bound"]
        assert names(cluster.list("Pod", namespace, field_selector="spec.nodeName=")) == ["pending"]
        assert names(cluster.list("Pod", namespace, field_selector=f"spec.nodeName!={bound_to}")) == ["pending"]
        assert names(cluster.list("Pod", field_selector=f"metadata.name=other,metadata.namespace=={elsewhere}")) \
            == ["other"]
        assert names(cluster.list("Node", field_selector="metadata.name=nothing")) == []
    finally:
        real_cluster.delete_namespace(elsewhere)


def test_strategic_merge_patch_merges_containers_by_name(cluster: LightkubeCluster, namespace: str) -> None:
    # A Pod's containers are immutable on a real server; a DaemonSet's template is the same list, merged by name.
    cluster.create({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds", "namespace": namespace},
                    "spec": {"selector": {"matchLabels": {"app": "ds"}},
                             "template": {"metadata": {"labels": {"app": "ds"}},
                                          "spec": {"nodeSelector": {MARK: "nowhere"},
                                                   "containers": [{"name": "main", "image": "busybox"}]}}}})
    patched = cluster.patch("DaemonSet", "ds", {"spec": {"template": {"spec": {"containers": [
        {"name": "sidecar", "image": "envoy"}]}}}}, namespace, patch_type="strategic")
    containers = patched["spec"]["template"]["spec"]["containers"]
    assert sorted((c["name"], c["image"]) for c in containers) == [("main", "busybox"), ("sidecar", "envoy")]


def test_status_subresource_patch(cluster: LightkubeCluster, namespace: str) -> None:
    cluster.create(pod("p1", namespace))
    patched = cluster.patch("Pod", "p1", {"status": {"phase": "Running"}}, namespace, subresource="status")
    assert patched["status"]["phase"] == "Running"
    assert cluster.get("Pod", "p1", namespace)["status"]["phase"] == "Running"
    after_main = cluster.patch("Pod", "p1", {"status": {"phase": "Failed"}, "metadata": {"labels": {"x": "y"}}},
                               namespace)
    assert after_main["status"]["phase"] == "Running"
    assert after_main["metadata"]["labels"] == {"x": "y"}
    after_status = cluster.patch("Pod", "p1", {"spec": {"nodeName": "n9"}, "status": {"phase": "Succeeded"}},
                                 namespace, subresource="status")
    assert "nodeName" not in after_status["spec"]
    assert after_status["status"]["phase"] == "Succeeded"


def configmap(name: str, namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": {MARK: "cm", **(labels or {})}}}


def take(cluster: Cluster, namespace: str, count: int, **watch: Any) -> list[tuple[str, str]]:
    """The first `count` events of this test's ConfigMaps (nothing else writes them, unlike Nodes, which the node
    lifecycle controller taints) as (type, name)."""
    events = cluster.watch("ConfigMap", namespace, timeout=0, **watch)
    return [(e.type, e.object["metadata"]["name"]) for e in itertools.islice(events, count)]


def test_watch_from_resource_version_skips_older_events(cluster: LightkubeCluster, namespace: str) -> None:
    cluster.create(configmap("old", namespace))
    _, version = cluster.list_with_version("ConfigMap", namespace, label_selector=MARK)
    cluster.create(configmap("new", namespace))
    cluster.patch("ConfigMap", "old", {"metadata": {"labels": {"a": "b"}}}, namespace)
    assert take(cluster, namespace, 10, label_selector=MARK, resource_version=version) == [
        ("ADDED", "new"), ("MODIFIED", "old")]


def test_watch_with_label_selector(cluster: LightkubeCluster, namespace: str) -> None:
    cluster.create(configmap("gpu", namespace, {"gpu": "true"}))
    cluster.create(configmap("cpu", namespace))
    assert take(cluster, namespace, 10, label_selector=f"{MARK},gpu=true") == [("ADDED", "gpu")]
