"""Per-node configs end to end, in-process: the config-manager follows the Node's `nvidia.com/device-plugin.config`
label and the running plugin (same manager, same process: no restart) re-registers what the new config serves."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.config.deviceplugin import effective_device_plugin_config
from kubegpu.configmanager.manager import ConfigManager, Settings
from kubegpu.deviceplugin.health import HealthPolicy
from kubegpu.deviceplugin.manager import DevicePluginManager, PluginSettings
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.kube.memory import MemoryCluster

pytestmark = pytest.mark.integration
LABEL = "nvidia.com/device-plugin.config"


def sliced(replicas: int, rename: bool = False) -> dict[str, Any]:
    return {"version": "v1", "sharing": {"timeSlicing": {"renameByDefault": rename, "resources": [
        {"name": "nvidia.com/gpu", "replicas": replicas}]}}}


CONFIGS = {"whole": {"version": "v1"}, "ts-2": sliced(2), "ts-4": sliced(4), "shared-3": sliced(3, rename=True)}


@pytest.fixture
async def setup(short_tmp: Path, kubelet: Any) -> AsyncIterator[tuple[MemoryCluster, DevicePluginManager]]:
    available = short_tmp / "available"
    available.mkdir()
    stamp = (1_700_000_000, 1_700_000_000)
    for name, config in CONFIGS.items():
        (available / name).write_text(yaml.safe_dump(config))
        os.utime(available / name, stamp)  # ts-2 and ts-4: same size, same mtime; only the inode tells them apart
    cluster = MemoryCluster()
    cluster.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {}}})
    dst = short_tmp / "config" / "config.yaml"
    config_manager = ConfigManager(cluster, Settings("n1", available, dst, default="whole"))
    config_manager.once()  # the init container: the plugin starts on the node's config
    node = SimulatedBackend.create(short_tmp / "node.json", gpus="2xA100-SXM4-80GB")
    plugin = DevicePluginManager(
        node, lambda: effective_device_plugin_config(dst, {}, {}),
        PluginSettings(plugin_dir=short_tmp, kubelet_socket=kubelet.socket, relist_interval_s=0.1,
                       health_interval_s=0.05, config_file=dst),
        HealthPolicy(quiet_period_s=300))
    await plugin.start()
    stop, sidecar_stop = asyncio.Event(), threading.Event()
    task = asyncio.create_task(plugin.run(stop))
    sidecar = threading.Thread(target=config_manager.run, args=(sidecar_stop,), kwargs={"watch_timeout": 0.3},
                               daemon=True)
    sidecar.start()
    yield cluster, plugin
    sidecar_stop.set()
    stop.set()
    await task
    await asyncio.to_thread(sidecar.join, 5)


async def test_a_label_change_switches_the_running_plugins_config(setup: Any, kubelet: Any) -> None:
    cluster, plugin = setup
    await kubelet.wait_for(lambda: kubelet.summary() == {"nvidia.com/gpu": (2, 2)})
    server = plugin.servers["nvidia.com/gpu"]

    def label(value: str | None) -> None:
        cluster.patch("Node", "n1", {"metadata": {"labels": {LABEL: value}}})

    label("ts-2")
    await kubelet.wait_for(lambda: kubelet.summary() == {"nvidia.com/gpu": (4, 4)})
    label("ts-4")  # same size and mtime as ts-2
    await kubelet.wait_for(lambda: kubelet.summary() == {"nvidia.com/gpu": (8, 8)})
    assert plugin.servers["nvidia.com/gpu"] is server  # same resource: same server and stream, no re-registration
    assert [r.resource for r in kubelet.registrations] == ["nvidia.com/gpu"]
    label("shared-3")  # renamed resource: registered anew, the old one stops
    await kubelet.wait_for(lambda: kubelet.summary().get("nvidia.com/gpu.shared") == (6, 6))
    assert set(plugin.servers) == {"nvidia.com/gpu.shared"}
    assert kubelet.summary()["nvidia.com/gpu"][1] == 0
    label("no-such-config")  # a typo: the config-manager logs it; the plugin keeps serving what it serves
    await asyncio.sleep(0.8)
    assert set(plugin.servers) == {"nvidia.com/gpu.shared"} and kubelet.summary()["nvidia.com/gpu.shared"] == (6, 6)
    label(None)  # back to the default
    await kubelet.wait_for(lambda: kubelet.summary().get("nvidia.com/gpu") == (2, 2))
    assert [r.resource for r in kubelet.registrations] == ["nvidia.com/gpu", "nvidia.com/gpu.shared",
                                                           "nvidia.com/gpu"]
