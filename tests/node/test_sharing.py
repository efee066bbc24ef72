"""MIG (mixed and single strategies) and MPS through `kubegpu device-plugin` on the real kubelet: the Node's
resources and what the container received (MIG UUIDs, MIG capability device nodes, MPS directories and limits)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.sharing.cdi import mig_cap_minors
from kubegpu.testing.nodepods import (
    NodeSession,
    probe_pod,
    run_probe,
    running,
    unique,
    wait_allocatable,
)

GPU_NODE = re.compile(r"^/dev/nvidia\d+$")


@pytest.fixture
def gpus(real_node: NodeSession) -> Iterator[SimulatedBackend]:
    """The node's simulated GPUs, fresh, for a test to re-cut; fresh (no MIG) again afterwards."""
    yield SimulatedBackend.create(real_node.node.node_file, real_node.node.gpus, node_name="real-node-0")
    SimulatedBackend.create(real_node.node.node_file, real_node.node.gpus, node_name="real-node-0")


def enable_mig(backend: SimulatedBackend, index: int, profile_id: int, starts: list[int]) -> None:
    backend.set_mig_mode(index, True)
    backend.reset_gpu(index)  # Ampere: the mode change takes effect at reset
    for start in starts:
        backend.create_mig_device(index, profile_id, start)


def test_mig_mixed_gives_a_pod_its_mig_device(real_node: NodeSession, node_ns: str, gpus: SimulatedBackend) -> None:
    enable_mig(gpus, 0, 19, [0, 1])  # two 1g.10gb on GPU 0; GPU 1 stays whole
    cluster = real_node.cluster
    with running(real_node.device_plugin("--mig-strategy", "mixed", "--device-list-strategy", "envvar,cdi-cri",
                                         name="dp-mig-mixed")) as plugin:
        plugin.wait_log("registered nvidia.com/mig-1g.10gb")
        allocatable = wait_allocatable(cluster, "nvidia.com/mig-1g.10gb", 2)
        assert allocatable["nvidia.com/gpu"] == "1"
        result = run_probe(cluster, probe_pod(unique("mig"), node_ns, {"nvidia.com/mig-1g.10gb": 1}))
    migs = {m.uuid: m for m in gpus.mig_devices(0)}
    mig = migs[result.env["NVIDIA_VISIBLE_DEVICES"]]  # a MIG UUID of GPU 0
    gi_cap, ci_cap = mig_cap_minors(0, mig.gi_id, mig.ci_id)
    assert [d for d in result.nvidia_devices() if GPU_NODE.match(d)] == ["/dev/nvidia0"]
    assert {f"/dev/nvidia-caps/nvidia-cap{gi_cap}", f"/dev/nvidia-caps/nvidia-cap{ci_cap}"} <= set(result.dev)


def test_mig_single_advertises_mig_devices_as_gpus(real_node: NodeSession, node_ns: str,
                                                   gpus: SimulatedBackend) -> None:
    for index in (0, 1):
        enable_mig(gpus, index, 9, [0, 4])  # 2x 3g.40gb on each GPU
    cluster = real_node.cluster
    with running(real_node.device_plugin("--mig-strategy", "single", name="dp-mig-single")) as plugin:
        plugin.wait_log("registered nvidia.com/gpu")
        allocatable = wait_allocatable(cluster, "nvidia.com/gpu", 4)
        # no MIG resource of this plugin (the kubelet keeps a stopped plugin's capacity a while, never allocatable)
        assert not any(name.startswith("nvidia.com/mig-") and allocatable[name] != "0" for name in allocatable)
        result = run_probe(cluster, probe_pod(unique("single"), node_ns, {"nvidia.com/gpu": 1}))
    assert result.env["NVIDIA_VISIBLE_DEVICES"] in {m.uuid for i in (0, 1) for m in gpus.mig_devices(i)}


def test_mps_pod_gets_its_daemon_directories_and_limits(real_node: NodeSession, node_ns: str,
                                                        tmp_path: Path) -> None:
    mps_root = real_node.node.paths.directory / "mps"
    # what the MPS control daemon makes on a GPU host (a simulated node runs none): pipe and log dirs, shared memory
    for path in ("nvidia.com/gpu/pipe", "nvidia.com/gpu/log", "shm"):
        (mps_root / path).mkdir(parents=True, exist_ok=True)
    config = tmp_path / "mps.yaml"
    config.write_text(yaml.safe_dump({"version": "v1", "sharing": {"mps": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 2}]}}}))
    cluster = real_node.cluster
    with running(real_node.device_plugin("--config", str(config), "--mps-root", str(mps_root),
                                         name="dp-mps")) as plugin:
        plugin.wait_log("registered nvidia.com/gpu")
        wait_allocatable(cluster, "nvidia.com/gpu", 4)
        result = run_probe(cluster, probe_pod(unique("mps"), node_ns, {"nvidia.com/gpu": 1},
                                              script="echo pipe: $(ls -d /mps/nvidia.com/gpu/pipe)"))
    env = result.env
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert env["CUDA_MPS_LOG_DIRECTORY"] == "/mps/nvidia.com/gpu/log"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"  # half of an 80 GB A100 per replica
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert "pipe: /mps/nvidia.com/gpu/pipe" in result.log  # the daemon's pipe directory, mounted
