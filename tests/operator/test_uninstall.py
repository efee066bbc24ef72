"""`kubegpu operator cleanup` (the chart's pre-delete hook) on an in-memory API: policies deleted first, operands
waited for, then only the stack's labels taken off the Nodes — the user's own labels stay."""

from __future__ import annotations

from typing import Any

from kubegpu.kube.memory import MemoryCluster
from kubegpu.operator.uninstall import cleanup, cleanup_patch

LABELS = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.deploy.device-plugin": "true",
    "nvidia.com/gpu.deploy.operator-validator": "true",
    "nvidia.com/gpu.deploy.gpu-feature-discovery": "paused-for-mig-change",
    "nvidia.com/gpu.count": "2",
    "nvidia.com/gpu.replicas": "4",
    "nvidia.com/mps.capable": "false",
    "nvidia.com/mig.config.state": "success",
    "nvidia.com/gfd.timestamp": "1700000000",
    # the user's
    "nvidia.com/device-plugin.config": "ts-4",
    "nvidia.com/mig.config": "all-1g.10gb",
    "nvidia.com/gpu.deploy.operands": "true",
    "kubernetes.io/hostname": "n1",
    "team": "ml",
}


def test_only_the_stacks_labels_and_annotations_go() -> None:
    labels, annotations = cleanup_patch(LABELS, {"kubegpu.io/mig-change-since": "1.0", "owner": "me"})
    assert set(labels) == {"nvidia.com/gpu.present", "nvidia.com/gpu.deploy.device-plugin",
                           "nvidia.com/gpu.deploy.operator-validator", "nvidia.com/gpu.deploy.gpu-feature-discovery",
                           "nvidia.com/gpu.count", "nvidia.com/gpu.replicas", "nvidia.com/mps.capable",
                           "nvidia.com/mig.config.state", "nvidia.com/gfd.timestamp"}
    assert all(value is None for value in labels.values())
    assert annotations == {"kubegpu.io/mig-change-since": None}


def test_cleanup_deletes_policies_waits_for_operands_then_cleans_nodes() -> None:
    cluster = MemoryCluster()
    cluster.create({"apiVersion": "kubegpu.io/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"}})
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": dict(LABELS)},
                    "status": {"conditions": [{"type": "Ready", "status": "True"},
                                              {"type": "AcceleratedHardwareReady", "status": "True"}]}})
    operand = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "kubegpu-device-plugin-x", "namespace": "kubegpu",
        "labels": {"app.kubernetes.io/managed-by": "kubegpu-operator"}}}
    cluster.create(operand)
    cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {  # the hook's own pod is not waited for
        "name": "kubegpu-operator-cleanup-y", "namespace": "kubegpu",
        "labels": {"app.kubernetes.io/managed-by": "Helm"}}})
    seen: list[Any] = []

    def sleep(_: float) -> None:  # the operand stops while the cleanup waits; labels are still on the Node then
        seen.append(dict(cluster.get("Node", "n1")["metadata"]["labels"]))
        cluster.delete("Pod", "kubegpu-device-plugin-x", "kubegpu")

    result = cleanup(cluster, "kubegpu", timeout=30, sleep=sleep)
    assert result.policies == ["cluster-policy"] and not cluster.list("ClusterPolicy")
    assert seen and seen[0]["nvidia.com/gpu.deploy.device-plugin"] == "true"
    left = cluster.get("Node", "n1")["metadata"]["labels"]
    assert left == {"nvidia.com/device-plugin.config": "ts-4", "nvidia.com/mig.config": "all-1g.10gb",
                    "nvidia.com/gpu.deploy.operands": "true", "kubernetes.io/hostname": "n1", "team": "ml"}
    assert "nvidia.com/gpu.present" in result.nodes["n1"]
    assert [c["type"] for c in cluster.get("Node", "n1")["status"]["conditions"]] == ["Ready"]
