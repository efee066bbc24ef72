"""/dev/nvidia<N> carries the driver's minor number, which need not be the NVML index (PCI probe order differs)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.clock import VirtualClock
from kubegpu.config.deviceplugin import effective_device_plugin_config
from kubegpu.deviceplugin.allocate import AllocateOptions, allocate_container, device_nodes
from kubegpu.deviceplugin.health import HealthPolicy
from kubegpu.deviceplugin.manager import DevicePluginManager, PluginSettings
from kubegpu.gpu.nvml import NvmlBackend
from kubegpu.sharing.cdi import cdi_spec
from kubegpu.sharing.devices import AnnotatedDevice, devices_by_resource
from tests.fakes.fake_pynvml import FakeNvml

SPECS = AllocateOptions(pass_device_specs=True, control_devices=())


def test_device_specs_cdi_and_mig_capabilities_follow_the_minor(node: Any) -> None:
    gpus = [dataclasses.replace(node.gpu(i, mig_enabled=i == 1), minor_number=minor)
            for i, minor in enumerate((5, 2))]
    mixed = {"version": "v1", "flags": {"migStrategy": "mixed"}}
    listed = devices_by_resource(gpus, {1: node.balanced(gpus[1])}, mixed)
    [whole] = listed["nvidia.com/gpu"]
    response = allocate_container("nvidia.com/gpu", [whole.id], {whole.id: whole}, SPECS)
    assert [(d.container_path, d.host_path) for d in response.devices] == [("/dev/nvidia5", "/dev/nvidia5")]
    [mig] = listed["nvidia.com/mig-3g.40gb"]
    response = allocate_container("nvidia.com/mig-3g.40gb", [mig.id], {mig.id: mig}, SPECS)
    # GPU minor 2, GI 2, CI 0 in the driver's nvidia-caps table: 3 + (2 * 15 + 2) * 9 = 291, then 292 for CI 0
    # (with the index, 1, it would have been 156/157: another GPU's instance)
    assert [d.container_path for d in response.devices] == [
        "/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap291", "/dev/nvidia-caps/nvidia-cap292"]
    spec = cdi_spec([whole, mig])
    assert [[n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]] == [
        ["/dev/nvidia5"], ["/dev/nvidia2", "/dev/nvidia-caps/nvidia-cap291", "/dev/nvidia-caps/nvidia-cap292"]]


def test_a_gpu_without_a_known_minor_uses_its_index(gpus: Any) -> None:
    listed = devices_by_resource(gpus(3), {}, {"version": "v1"})["nvidia.com/gpu"]
    assert [device_nodes(d) for d in listed] == [["/dev/nvidia0"], ["/dev/nvidia1"], ["/dev/nvidia2"]]
    bare = AnnotatedDevice(id="GPU-x", resource="nvidia.com/gpu", gpu_index=4, gpu_uuid="GPU-x", mig=None,
                           replica=None, replicas=1, numa_node=None)  # built without a minor at all
    assert device_nodes(bare) == ["/dev/nvidia4"]


@pytest.mark.integration
async def test_plugin_on_nvml_names_the_drivers_minor(short_tmp: Path, kubelet: Any) -> None:
    fake = FakeNvml()  # 8x A100 whose minors run backwards: NVML index 1 is /dev/nvidia6
    backend = NvmlBackend(module=fake, clock=VirtualClock(0.0), reset_runner=fake.fake_reset_gpu)
    config_file = short_tmp / "config.yaml"
    config_file.write_text(yaml.safe_dump({"version": "v1", "flags": {"plugin": {"passDeviceSpecs": True}}}))
    manager = DevicePluginManager(
        backend, lambda: effective_device_plugin_config(config_file, {}, {}),
        PluginSettings(plugin_dir=short_tmp, kubelet_socket=kubelet.socket, relist_interval_s=0.1,
                       health_interval_s=0.05, config_file=config_file, control_devices=()),
        HealthPolicy(quiet_period_s=300.0),
    )
    await manager.start()
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run(stop))
    try:
        await kubelet.wait_for_devices("nvidia.com/gpu", 8, healthy=8)
        uuids = [d.uuid for d in backend.devices()]
        response = await kubelet.allocate("nvidia.com/gpu", [uuids[1]], [uuids[0], uuids[7]])
        paths = [[d.container_path for d in c.devices] for c in response.container_responses]
        assert paths == [["/dev/nvidia6"], ["/dev/nvidia7", "/dev/nvidia0"]]
        assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuids[1]
    finally:
        stop.set()
        await task
        backend.close()
