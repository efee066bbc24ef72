"""`kubegpu device-plugin` against the real kubelet: registration, capacity, what the container receives under each
device-list strategy, time-slicing with several pods on one GPU, XID health, restarts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.testing.nodepods import (
    NodeSession,
    delete_pod,
    node_resources,
    pod_log,
    probe_pod,
    probe_result,
    run_probe,
    running,
    unique,
    until,
    wait_allocatable,
    wait_phase,
)
from kubegpu.testing.realnode import DEVICE_PLUGIN_DIR

GPU = "nvidia.com/gpu"
CONTROL = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}
GPU_NODE = re.compile(r"^/dev/nvidia\d+$")


def uuids(real_node: NodeSession) -> list[str]:
    return [g.uuid for g in SimulatedBackend(real_node.node.node_file).devices()]


def config_file(tmp_path: Path, config: dict[str, object]) -> str:
    path = tmp_path / "device-plugin.yaml"
    path.write_text(yaml.safe_dump({"version": "v1", **config}))
    return str(path)


def test_whole_gpu_registration_capacity_and_env(real_node: NodeSession, node_ns: str) -> None:
    cluster = real_node.cluster
    with running(real_node.device_plugin()) as plugin:
        plugin.wait_log("registered nvidia.com/gpu")
        allocatable = wait_allocatable(cluster, GPU, 2)
        capacity, _ = node_resources(cluster)
        assert capacity[GPU] == allocatable[GPU] == "2"
        assert (DEVICE_PLUGIN_DIR / "nvidia-gpu.sock").is_socket()
        result = run_probe(cluster, probe_pod(unique("whole"), node_ns, {GPU: 1}))
        assert result.env["NVIDIA_VISIBLE_DEVICES"] in uuids(real_node)  # exactly one GPU, by UUID
        assert result.nvidia_devices() == []  # envvar strategy: the runtime hook (not here) would add the nodes


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
def test_cdi_strategies_inject_the_gpu_nodes(real_node: NodeSession, node_ns: str, tmp_path: Path,
                                             strategy: str) -> None:
    """containerd applies our CDI spec: the container gets /dev/nvidia<N> and the control devices (stand-ins for a
    simulated GPU), which it could not before (containerd refused the missing host /dev/nvidia*)."""
    with running(real_node.device_plugin("--device-list-strategy", strategy)) as plugin:
        plugin.wait_log("registered nvidia.com/gpu")
        wait_allocatable(real_node.cluster, GPU, 2)
        result = run_probe(real_node.cluster, probe_pod(unique(strategy), node_ns, {GPU: 1}))
    gpus = [d for d in result.nvidia_devices() if GPU_NODE.match(d)]
    assert len(gpus) == 1 and gpus[0] in ("/dev/nvidia0", "/dev/nvidia1")
    assert set(result.dev) >= CONTROL
    assert "NVIDIA_VISIBLE_DEVICES" not in result.env
    spec = next(real_node.node.paths.cdi_dir.glob("kubegpu-k8s.device-plugin.nvidia.com-gpu.json"))
    assert str(real_node.node.node_file) + ".dev/" in spec.read_text()  # hostPath: the stand-ins


def test_volume_mounts_strategy(real_node: NodeSession, node_ns: str) -> None:
    with running(real_node.device_plugin("--device-list-strategy", "volume-mounts")) as plugin:
        plugin.wait_log("registered nvidia.com/gpu")
        wait_allocatable(real_node.cluster, GPU, 2)
        result = run_probe(real_node.cluster, probe_pod(unique("volumes"), node_ns, {GPU: 1},
                                                        script="echo mounted: $(ls /var/run/nvidia-container-devices)"))
    assert result.env["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    [line] = [x for x in result.log.splitlines() if x.startswith("mounted: ")]
    assert line.removeprefix("mounted: ") in uuids(real_node)


def test_time_slicing_shares_one_gpu_between_pods(real_node: NodeSession, node_ns: str, tmp_path: Path) -> None:
    """replicas 2 with renameByDefault: the Node offers nvidia.com/gpu.shared 4; three pods run at once, so two of
    them share a GPU, and each sees the GPU's UUID (not a replica ID)."""
    config = config_file(tmp_path, {"sharing": {"timeSlicing": {"renameByDefault": True, "resources": [
        {"name": GPU, "replicas": 2}]}}})
    cluster = real_node.cluster
    with running(real_node.device_plugin("--config", config)) as plugin:
        plugin.wait_log("registered nvidia.com/gpu.shared")
        allocatable = wait_allocatable(cluster, f"{GPU}.shared", 4)
        assert int(allocatable.get(GPU, "0")) == 0
        pods = [probe_pod(unique(f"shared{i}"), node_ns, {f"{GPU}.shared": 1}, sleep=3) for i in range(3)]
        for pod in pods:
            cluster.create(pod)
        for pod in pods:
            wait_phase(cluster, pod["metadata"]["name"], node_ns, ("Running", "Succeeded"))
        seen = []
        for pod in pods:
            wait_phase(cluster, pod["metadata"]["name"], node_ns)
            seen.append(probe_result(pod_log(cluster, pod["metadata"]["name"], node_ns)).env)
    visible = [env["NVIDIA_VISIBLE_DEVICES"] for env in seen]
    assert set(visible) <= set(uuids(real_node)) and len(set(visible)) < len(visible)  # two pods, one GPU


def test_an_xid_lowers_allocatable(real_node: NodeSession, tmp_path: Path) -> None:
    cluster = real_node.cluster
    with running(real_node.device_plugin()) as plugin:
        plugin.wait_log("registered nvidia.com/gpu")
        wait_allocatable(cluster, GPU, 2)
        SimulatedBackend(real_node.node.node_file).inject_xid(1, 79)  # fell off the bus
        wait_allocatable(cluster, GPU, 1)
        capacity, _ = node_resources(cluster)
        assert capacity[GPU] == "2"
    SimulatedBackend.create(real_node.node.node_file, real_node.node.gpus, node_name="real-node-0")  # fresh GPUs


def test_plugin_restart_reregisters_without_disturbing_a_running_pod(real_node: NodeSession, node_ns: str) -> None:
    cluster = real_node.cluster
    name = unique("steady")
    with running(real_node.device_plugin()) as plugin:
        plugin.wait_log("registered nvidia.com/gpu")
        wait_allocatable(cluster, GPU, 2)
        cluster.create(probe_pod(name, node_ns, {GPU: 1}, sleep=600))
        wait_phase(cluster, name, node_ns, ("Running",))
        before = cluster.get("Pod", name, node_ns)["status"]["containerStatuses"][0]
    wait_allocatable(cluster, GPU, 0)  # the kubelet saw the plugin go
    with running(real_node.device_plugin(name="device-plugin-again")) as plugin:
        plugin.wait_log("registered nvidia.com/gpu")
        wait_allocatable(cluster, GPU, 2)
        after = cluster.get("Pod", name, node_ns)["status"]["containerStatuses"][0]
        assert after["state"].get("running") and after["restartCount"] == before["restartCount"] == 0
        assert after["containerID"] == before["containerID"]
    delete_pod(cluster, name, node_ns, wait=False)


def test_kubelet_restart_reregisters_the_plugin_without_disturbing_a_running_pod(real_node: NodeSession,
                                                                                 node_ns: str) -> None:
    from kubegpu.testing.realnode import restart_kubelet

    cluster = real_node.cluster
    name = unique("survivor")
    with running(real_node.device_plugin(name="device-plugin-kubelet-restart")) as plugin:
        plugin.wait_log("registered nvidia.com/gpu")
        wait_allocatable(cluster, GPU, 2)
        cluster.create(probe_pod(name, node_ns, {GPU: 1}, sleep=600))
        wait_phase(cluster, name, node_ns, ("Running",))
        before = cluster.get("Pod", name, node_ns)["status"]["containerStatuses"][0]
        registrations = plugin.log().count("registered nvidia.com/gpu")
        restart_kubelet(real_node.node.paths.directory)
        until(lambda: plugin.log().count("registered nvidia.com/gpu") > registrations,
              "the plugin registered again with the restarted kubelet")
        wait_allocatable(cluster, GPU, 2)
        after = cluster.get("Pod", name, node_ns)["status"]["containerStatuses"][0]
        assert after["state"].get("running") and after["restartCount"] == 0
        assert after["containerID"] == before["containerID"]
    delete_pod(cluster, name, node_ns, wait=False)
