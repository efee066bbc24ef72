"""Controller + partition agent + the real device plugin over a fake kubelet (unix sockets), on a simulated node
file shared by agent and plugin, with the in-memory cluster: a pending 2g pod on a node cut all-1g.10gb, three 1g
in use, becomes schedulable; the plugin's ListAndWatch shows the 2g device; the instances in use keep their UUIDs."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.clock import VirtualClock
from kubegpu.config.deviceplugin import effective_device_plugin_config
from kubegpu.deviceplugin.health import HealthPolicy
from kubegpu.deviceplugin.manager import DevicePluginManager, PluginSettings
from kubegpu.gpu.catalog import get_model
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube import MemoryCluster
from kubegpu.partitionagent import annotations as ann
from kubegpu.partitionagent.agent import PartitionAgent
from kubegpu.partitioner.controller import PartitionerController
from kubegpu.scheduling import fits, node_info
from tests.fakes.fake_kubelet import FakeKubelet

pytestmark = pytest.mark.integration
P1G = get_model("A100-SXM4-80GB").profile("1g.10gb").profile_id


@pytest.fixture
def short_tmp() -> Any:
    directory = Path(tempfile.mkdtemp(prefix="kgpt-", dir="/tmp"))  # unix socket paths must stay short
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def kubelet(short_tmp: Path) -> AsyncIterator[FakeKubelet]:
    fake = FakeKubelet(short_tmp)
    await fake.start()
    yield fake
    await fake.stop()


async def test_pending_2g_pod_becomes_schedulable_end_to_end(short_tmp: Path, kubelet: FakeKubelet) -> None:
    node = SimulatedBackend.create(short_tmp / "node.json", gpus="1xA100-SXM4-80GB", node_name="gpu-node")
    if node.set_mig_mode(0, True):
        node.reset_gpu(0)
    for start in range(7):
        mig = node.create_mig_device(0, P1G, start)
        if start < 3:
            node.add_process(0, 100 + start, 1000, gi_id=mig.gi_id)
    in_use = {m.uuid: (m.profile_id, m.start) for m in node.mig_devices(0) if m.start < 3}

    config_file = short_tmp / "config.yaml"
    config_file.write_text(yaml.safe_dump({"version": "v1", "flags": {"migStrategy": "mixed"}}))
    manager = DevicePluginManager(
        node, lambda: effective_device_plugin_config(config_file, {}, {}),
        PluginSettings(plugin_dir=short_tmp, kubelet_socket=kubelet.socket, relist_interval_s=0.1,
                       health_interval_s=0.05, config_file=config_file),
        HealthPolicy(quiet_period_s=300.0),
    )
    await manager.start()
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        await kubelet.wait_for_devices("nvidia.com/mig-1g.10gb", 7)
        assert "nvidia.com/mig-2g.20gb" not in kubelet.plugins

        clock = VirtualClock(1000)
        cluster = MemoryCluster(clock)
        cluster.create({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": "gpu-node", "labels": {ann.PARTITIONING_LABEL: "mig"}},
                        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110",
                                                   "nvidia.com/mig-1g.10gb": "7"}}})
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wants-2g", "namespace": "default"},
               "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-2g.20gb": "1"}}}]},
               "status": {"phase": "Pending"}}
        cluster.create(pod)
        agent = PartitionAgent(cluster, SimulatedBackend(short_tmp / "node.json"), "gpu-node")
        agent.tick()  # first report
        controller = PartitionerController(cluster, batch_timeout=60, batch_idle=10)
        controller.tick(1000)
        planned = controller.tick(1010)
        assert planned.written == ["gpu-node"]
        report = await asyncio.to_thread(agent.tick)
        assert report is not None and report.refused == [] and len(report.created) == 1

        devices = await kubelet.wait_for_devices("nvidia.com/mig-2g.20gb", 1, healthy=1)
        await kubelet.wait_for_devices("nvidia.com/mig-1g.10gb", 5)
        after = {m.uuid: (m.profile_id, m.start) for m in node.mig_devices(0)}
        assert all(after.get(uuid) == where for uuid, where in in_use.items())  # untouched, same UUIDs
        assert len(devices) == 1

        # the scheduler's view of the node now that the plugin advertises the 2g: the pod fits
        allocatable = {"cpu": "64", "memory": "256Gi", "pods": "110",
                       **{r: str(kubelet.allocatable(r)) for r in kubelet.plugins}}
        assert fits(pod, node_info({"metadata": {"name": "gpu-node"}, "status": {"allocatable": allocatable}})).ok
        status = cluster.get("Node", "gpu-node")["metadata"]["annotations"]
        assert status[ann.STATUS_PLAN] == planned.plan_id
        assert status["kubegpu.io/status-gpu-0-1g.10gb-used"] == "3"
    finally:
        stop.set()
        await task


async def test_mps_slices_reach_the_plugin_through_the_slices_file(short_tmp: Path, kubelet: FakeKubelet) -> None:
    node = SimulatedBackend.create(short_tmp / "node.json", gpus="1xA100-SXM4-80GB", node_name="mps-node")
    slices = short_tmp / "slices.json"
    config_file = short_tmp / "config.yaml"
    config_file.write_text(yaml.safe_dump({"version": "v1"}))
    manager = DevicePluginManager(
        node, lambda: effective_device_plugin_config(config_file, {}, {}),
        PluginSettings(plugin_dir=short_tmp, kubelet_socket=kubelet.socket, relist_interval_s=0.1,
                       health_interval_s=0.05, config_file=config_file, mps_slices_file=slices),
        HealthPolicy(quiet_period_s=300.0),
    )
    await manager.start()
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        cluster = MemoryCluster(VirtualClock(0))
        cluster.create({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": "mps-node", "labels": {ann.PARTITIONING_LABEL: "mps"}}})
        cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wants-30", "namespace": "default"},
                        "spec": {"containers": [{"name": "c",
                                                 "resources": {"limits": {"nvidia.com/gpu-30gb": "2"}}}]},
                        "status": {"phase": "Pending"}})
        agent = PartitionAgent(cluster, SimulatedBackend(short_tmp / "node.json"), "mps-node", slices)
        agent.tick()
        controller = PartitionerController(cluster, batch_idle=0)
        assert controller.tick(0).written == ["mps-node"]
        report = await asyncio.to_thread(agent.tick)
        assert report is not None and report.created == ["gpu0:30gb", "gpu0:30gb"]
        devices = await kubelet.wait_for_devices("nvidia.com/gpu-30gb", 2, healthy=2)
        assert all("::mps-30gb-" in device_id for device_id in devices)
    finally:
        stop.set()
        await task
