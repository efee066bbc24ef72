"""`kubegpu discover --kubernetes` labels the real kubelet's Node (GFD's labels), next to the kubelet's own."""

from __future__ import annotations

from kubegpu.testing.nodepods import NodeSession, running, until


def test_discovery_labels_the_real_node(real_node: NodeSession) -> None:
    cluster = real_node.cluster
    agent = real_node.agent("discover", ["discover", "--gpu-backend", real_node.node.gpu_backend, "--kubernetes",
                                         "--node-name", "real-node-0", "--oneshot", "--mig-strategy", "mixed"])
    with running(agent):
        assert agent.process is not None
        until(lambda: agent.process is not None and agent.process.poll() is not None, "discover --oneshot exits")
        assert agent.process.returncode == 0, agent.log()
    labels = cluster.get("Node", "real-node-0")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels["kubernetes.io/hostname"] == "real-node-0"  # the kubelet's own labels stay
    assert labels["kubernetes.io/os"] == "linux"
