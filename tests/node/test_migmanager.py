"""The MIG manager on the real node: a pod waits for a MIG device nobody offers; labelling the Node
`nvidia.com/mig.config=all-1g.10gb` makes `kubegpu mig-manager` re-cut the GPUs, the device plugin (mixed
strategy) offers the new devices to the real kubelet, and the waiting pod runs on one of them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.testing.nodepods import (
    NodeSession,
    pod_log,
    probe_pod,
    probe_result,
    running,
    unique,
    until,
    wait_allocatable,
    wait_phase,
)


@pytest.fixture
def fresh_gpus(real_node: NodeSession) -> Iterator[SimulatedBackend]:
    yield SimulatedBackend.create(real_node.node.node_file, real_node.node.gpus, node_name="real-node-0")
    SimulatedBackend.create(real_node.node.node_file, real_node.node.gpus, node_name="real-node-0")
    real_node.cluster.patch("Node", "real-node-0", {"metadata": {"labels": {
        "nvidia.com/mig.config": None, "nvidia.com/mig.config.state": None}}})


def test_mig_manager_recut_lets_a_waiting_mig_pod_run(real_node: NodeSession, node_ns: str,
                                                      fresh_gpus: SimulatedBackend) -> None:
    cluster = real_node.cluster
    name = unique("waits-for-mig")
    with running(real_node.device_plugin("--mig-strategy", "mixed", name="dp-mig-manager")) as plugin:
        plugin.wait_log("registered nvidia.com/gpu")
        wait_allocatable(cluster, "nvidia.com/gpu", 2)
        cluster.create(probe_pod(name, node_ns, {"nvidia.com/mig-1g.10gb": 1}))
        until(lambda: real_node.real.unschedulable_message(name, node_ns), "kube-scheduler to report no fit")
        cluster.patch("Node", "real-node-0", {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}})
        manager = real_node.agent("mig-manager", ["mig-manager", "--node-name", "real-node-0", "--gpu-backend",
                                                  real_node.node.gpu_backend, "--oneshot"])
        with running(manager):
            until(lambda: manager.process is not None and manager.process.poll() is not None, "mig-manager exits")
            assert manager.process is not None and manager.process.returncode == 0, manager.log()
        labels = cluster.get("Node", "real-node-0")["metadata"]["labels"]
        assert labels["nvidia.com/mig.config.state"] == "success"
        assert [len(fresh_gpus.mig_devices(i)) for i in (0, 1)] == [7, 7]
        wait_allocatable(cluster, "nvidia.com/mig-1g.10gb", 14)
        wait_phase(cluster, name, node_ns)
        seen = probe_result(pod_log(cluster, name, node_ns))
    assert seen.env["NVIDIA_VISIBLE_DEVICES"] in {m.uuid for i in (0, 1) for m in fresh_gpus.mig_devices(i)}
