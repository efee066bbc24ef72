"""The partitioner and the partition agent on the real node: a pod asking `nvidia.com/mig-2g.20gb` waits while GPU
0 is cut into seven 1g.10gb (three of them held by running pods, which the agent sees through the real kubelet's
PodResources socket); `kubegpu partitioner` plans a re-cut of the free slices, `kubegpu partition-agent` applies it,
the device plugin offers the new device to the real kubelet, and the waiting pod runs — the running pods untouched."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.partitionagent import annotations as ann
from kubegpu.testing.nodepods import (
    Agent,
    NodeSession,
    pod_log,
    probe_pod,
    probe_result,
    read_probe,
    running,
    unique,
    until,
    wait_allocatable,
    wait_phase,
)

P1G = 19  # 1g.10gb on an A100-80GB


@pytest.fixture
def cut_gpus(real_node: NodeSession) -> Iterator[SimulatedBackend]:
    backend = SimulatedBackend.create(real_node.node.node_file, real_node.node.gpus, node_name="real-node-0")
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)
    for start in range(7):
        backend.create_mig_device(0, P1G, start)
    yield backend
    SimulatedBackend.create(real_node.node.node_file, real_node.node.gpus, node_name="real-node-0")
    labels = {ann.PARTITIONING_LABEL: None}
    real_node.cluster.patch("Node", "real-node-0", {"metadata": {"labels": labels, "annotations": {
        key: None for key in (real_node.cluster.get("Node", "real-node-0")["metadata"].get("annotations") or {})
        if key.startswith(ann.PREFIX)}}})


def once(real_node: NodeSession, name: str, args: list[str]) -> Agent:
    agent = real_node.agent(name, args)
    with running(agent):
        until(lambda: agent.process is not None and agent.process.poll() is not None, f"kubegpu {args[0]} exits")
    assert agent.process is not None and agent.process.returncode == 0, agent.log()[-1500:]
    return agent


def test_partitioner_recut_lets_a_waiting_pod_run(real_node: NodeSession, node_ns: str,
                                                  cut_gpus: SimulatedBackend) -> None:
    cluster = real_node.cluster
    backend = ["--gpu-backend", real_node.node.gpu_backend]
    once(real_node, "discover-partitioner", ["discover", *backend, "--kubernetes", "--node-name", "real-node-0",
                                             "--oneshot", "--mig-strategy", "mixed"])
    cluster.patch("Node", "real-node-0", {"metadata": {"labels": {ann.PARTITIONING_LABEL: "mig"}}})
    small = [unique(f"small{i}") for i in range(3)]
    with running(real_node.device_plugin("--mig-strategy", "mixed", name="dp-partitioner")) as plugin:
        plugin.wait_log("registered nvidia.com/mig-1g.10gb")
        wait_allocatable(cluster, "nvidia.com/mig-1g.10gb", 7)
        for name in small:
            cluster.create(probe_pod(name, node_ns, {"nvidia.com/mig-1g.10gb": 1}, sleep=600))
        held = {}
        for name in small:
            wait_phase(cluster, name, node_ns, ("Running",))
            held[name] = read_probe(cluster, name, node_ns).env["NVIDIA_VISIBLE_DEVICES"]
        wanted = unique("wants-2g")
        cluster.create(probe_pod(wanted, node_ns, {"nvidia.com/mig-2g.20gb": 1}))
        message = until(lambda: real_node.real.unschedulable_message(wanted, node_ns), "kube-scheduler: no fit")
        assert "nvidia.com/mig-2g.20gb" in message
        agent = ["partition-agent", "--once", "--node-name", "real-node-0", *backend,
                 "--pod-resources-kubelet-socket", str(real_node.node.paths.pod_resources_socket)]
        once(real_node, "partition-agent-report", agent)  # reports the layout and what the pods hold
        once(real_node, "partitioner", ["partitioner", "--once", "--batch-window-idle", "0",
                                        "--batch-window-timeout", "0", "--identity", "partitioner-0",
                                        "--lease-namespace", node_ns])
        plan = until(lambda: (real_node.real.admin.get("Node", "real-node-0")["metadata"].get("annotations")
                              or {}).get(ann.SPEC_PLAN), "the partitioner's plan on the Node")
        once(real_node, "partition-agent-apply", agent)  # applies the plan
        assert cluster.get("Node", "real-node-0")["metadata"]["annotations"][ann.STATUS_PLAN] == plan
        wait_phase(cluster, wanted, node_ns)
        seen = probe_result(pod_log(cluster, wanted, node_ns))
        two_g = {m.uuid for i in (0, 1) for m in cut_gpus.mig_devices(i) if m.profile_name == "2g.20gb"}
        assert seen.env["NVIDIA_VISIBLE_DEVICES"] in two_g
        remaining = {m.uuid for m in cut_gpus.mig_devices(0)}
        for name in small:  # every held instance survived and its pod still runs, never restarted
            assert held[name] in remaining
            status = cluster.get("Pod", name, node_ns)["status"]["containerStatuses"][0]
            assert status["state"].get("running") and status["restartCount"] == 0
