"""The plugin end to end, in-process: a sim node, the manager, and a fake kubelet over real unix sockets."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from kubegpu.config.deviceplugin import effective_device_plugin_config
from kubegpu.deviceplugin.health import HealthPolicy
from kubegpu.deviceplugin.manager import DevicePluginManager, PluginSettings
from kubegpu.gpu.simulated import SimulatedBackend
from kubegpu.metrics import HEALTH_METRIC, health_registry
from kubegpu.sharing.mps import write_slices

pytestmark = pytest.mark.integration


class Plugin:
    """A running manager plus the files it reads, so tests can change them."""

    def __init__(self, manager: DevicePluginManager, backend: SimulatedBackend, config_file: Path) -> None:
        self.manager, self.backend, self.config_file = manager, backend, config_file

    def write_config(self, data: dict[str, Any]) -> None:
        self.config_file.write_text(yaml.safe_dump(data))


@pytest.fixture
def node(short_tmp: Path) -> SimulatedBackend:
    return SimulatedBackend.create(short_tmp / "node.json", gpus="8xA100-SXM4-80GB")


@pytest.fixture
async def start_plugin(short_tmp: Path, kubelet: Any, node: SimulatedBackend) -> AsyncIterator[Callable[..., Any]]:
    stops: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    async def start(config: dict[str, Any], quiet_period: float = 300.0, **settings: Any) -> Plugin:
        config_file = short_tmp / "config.yaml"
        config_file.write_text(yaml.safe_dump(config))
        manager = DevicePluginManager(
            node,
            lambda: effective_device_plugin_config(config_file, {}, {}),
            PluginSettings(plugin_dir=short_tmp, kubelet_socket=kubelet.socket, cdi_dir=short_tmp / "cdi",
                           relist_interval_s=0.1, health_interval_s=0.05, config_file=config_file, **settings),
            HealthPolicy(quiet_period_s=quiet_period),
        )
        await manager.start()
        stop = asyncio.Event()
        stops.append((stop, asyncio.create_task(manager.run(stop))))
        return Plugin(manager, node, config_file)

    yield start
    for stop, task in stops:
        stop.set()
        await task


def time_slicing(replicas: int, **extra: Any) -> dict[str, Any]:
    return {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": replicas, **extra}]}}}


async def test_registration_and_full_list_with_numa(kubelet: Any, start_plugin: Any, node: SimulatedBackend) -> None:
    await start_plugin({"version": "v1"})
    devices = await kubelet.wait_for_devices("nvidia.com/gpu", 8, healthy=8)
    [registration] = kubelet.registrations
    assert (registration.version, registration.endpoint, registration.resource) == (
        "v1beta1", "nvidia-gpu.sock", "nvidia.com/gpu")
    assert registration.options.get_preferred_allocation_available
    plugin = kubelet.plugins["nvidia.com/gpu"]
    assert plugin.options.get_preferred_allocation_available and not plugin.options.pre_start_required
    assert set(devices) == {g.uuid for g in node.devices()}
    assert sorted(n for ids in plugin.numa.values() for n in ids) == [0] * 4 + [1] * 4


async def test_time_slicing_8_gpus_x4_gives_32_ids(kubelet: Any, start_plugin: Any) -> None:
    await start_plugin(time_slicing(4))
    devices = await kubelet.wait_for_devices("nvidia.com/gpu", 32, healthy=32)
    assert all("::" in d for d in devices)


async def test_per_gpu_mixed_sharing(kubelet: Any, start_plugin: Any) -> None:
    config = {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4, "devices": [0, 1], "rename": "gpu-quarter"},
        {"name": "nvidia.com/gpu", "replicas": 2, "devices": [2, 3], "rename": "gpu-half"}]}}}
    await start_plugin(config)
    await kubelet.wait_for(lambda: kubelet.summary() == {
        "nvidia.com/gpu": (4, 4), "nvidia.com/gpu-quarter": (8, 8), "nvidia.com/gpu-half": (4, 4)})
    assert {r.endpoint for r in kubelet.registrations} == {
        "nvidia-gpu.sock", "nvidia-gpu-quarter.sock", "nvidia-gpu-half.sock"}


async def test_mig_mixed_all_balanced_and_relist(kubelet: Any, start_plugin: Any, node: SimulatedBackend) -> None:
    for index in range(8):
        node.set_mig_mode(index, True)
        node.reset_gpu(index)
        for profile_id, start in ((9, 4), (14, 0), (19, 2), (19, 3)):  # 3g.40gb, 2g.20gb, 1g.10gb x2
            node.create_mig_device(index, profile_id, start)
    await start_plugin({"version": "v1", "flags": {"migStrategy": "mixed"}})
    await kubelet.wait_for(lambda: kubelet.summary() == {
        "nvidia.com/mig-3g.40gb": (8, 8), "nvidia.com/mig-2g.20gb": (8, 8), "nvidia.com/mig-1g.10gb": (16, 16)})
    # the MIG manager takes one 1g.10gb away: a re-list, not a restart, updates the same stream
    gi = next(m.gi_id for m in node.mig_devices(0) if m.profile_id == 19)
    node.destroy_mig_device(0, gi)
    await kubelet.wait_for_devices("nvidia.com/mig-1g.10gb", 15)
    assert len(kubelet.registrations) == 3
    # an XID attributed to one GPU instance takes down every MIG device of that GPU, in every resource
    node.inject_xid(1, 79, gi_id=node.mig_devices(1)[0].gi_id)
    await kubelet.wait_for(lambda: kubelet.summary() == {
        "nvidia.com/mig-3g.40gb": (8, 7), "nvidia.com/mig-2g.20gb": (8, 7), "nvidia.com/mig-1g.10gb": (15, 13)})
    gpu1 = {m.uuid for m in node.mig_devices(1)}
    unhealthy = {i for p in kubelet.plugins.values() for i, h in p.devices.items() if h == "Unhealthy"}
    assert unhealthy == gpu1


async def test_allocate_envvar_and_shared_request_rule(kubelet: Any, start_plugin: Any, node: SimulatedBackend) -> None:
    await start_plugin(time_slicing(2, devices=[0]) | {"flags": {"plugin": {"passDeviceSpecs": True}}})
    devices = await kubelet.wait_for_devices("nvidia.com/gpu", 9)
    gpu0 = node.devices()[0].uuid
    response = await kubelet.allocate("nvidia.com/gpu", [f"{gpu0}::0"], [f"{gpu0}::1"])
    assert [c.envs["NVIDIA_VISIBLE_DEVICES"] for c in response.container_responses] == [gpu0, gpu0]
    specs = [d.container_path for d in response.container_responses[0].devices]
    assert specs[:2] == ["/dev/nvidiactl", "/dev/nvidia-uvm"] and specs[-1] == "/dev/nvidia0"
    # time-slicing default: more than one replica in one container is allowed, de-duplicated to one GPU
    both = await kubelet.allocate("nvidia.com/gpu", [f"{gpu0}::0", f"{gpu0}::1"])
    assert both.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == gpu0
    assert len(devices) == 9


async def test_fail_requests_greater_than_one(kubelet: Any, start_plugin: Any, node: SimulatedBackend) -> None:
    await start_plugin(time_slicing(2) | {"sharing": {"timeSlicing": {
        "failRequestsGreaterThanOne": True, "resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}})
    await kubelet.wait_for_devices("nvidia.com/gpu", 16)
    gpu0 = node.devices()[0].uuid
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.allocate("nvidia.com/gpu", [f"{gpu0}::0", f"{gpu0}::1"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "maximum request size for shared resources is 1; found 2" in (err.value.details() or "")


async def test_unknown_id_is_invalid_argument_naming_it(kubelet: Any, start_plugin: Any) -> None:
    await start_plugin({"version": "v1"})
    await kubelet.wait_for_devices("nvidia.com/gpu", 8)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.allocate("nvidia.com/gpu", ["GPU-does-not-exist"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown device: GPU-does-not-exist" in (err.value.details() or "")
    # the server is still fine afterwards
    assert len((await kubelet.allocate("nvidia.com/gpu", [next(iter(kubelet.plugins["nvidia.com/gpu"].devices))]))
               .container_responses) == 1


@pytest.mark.parametrize("strategy", ["volume-mounts", "cdi-annotations", "cdi-cri"])
async def test_allocate_device_list_strategies(kubelet: Any, start_plugin: Any, node: SimulatedBackend,
                                               short_tmp: Path, strategy: str) -> None:
    await start_plugin({"version": "v1", "flags": {"plugin": {"deviceListStrategy": [strategy]}}})
    await kubelet.wait_for_devices("nvidia.com/gpu", 8)
    uuids = [g.uuid for g in node.devices()[:2]]
    [container] = (await kubelet.allocate("nvidia.com/gpu", uuids)).container_responses
    if strategy == "volume-mounts":
        assert container.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
        assert [(m.container_path, m.host_path) for m in container.mounts] == [
            (f"/var/run/nvidia-container-devices/{u}", "/dev/null") for u in uuids]
        return
    assert "NVIDIA_VISIBLE_DEVICES" not in container.envs
    names = [f"k8s.device-plugin.nvidia.com/gpu={u}" for u in uuids]  # NVIDIA's CDI vendor and class
    if strategy == "cdi-annotations":
        [(key, value)] = container.annotations.items()
        assert key.startswith("cdi.k8s.io/nvidia-device-plugin_") and value == ",".join(names)
    else:
        assert [d.name for d in container.cdi_devices] == names
    spec = json.loads((short_tmp / "cdi" / "kubegpu-k8s.device-plugin.nvidia.com-gpu.json").read_text())
    assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu" and spec["cdiVersion"]
    assert {d["name"] for d in spec["devices"]} == {g.uuid for g in node.devices()}


async def test_mps_allocate_sets_pipe_and_per_container_limits(kubelet: Any, start_plugin: Any,
                                                               node: SimulatedBackend) -> None:
    await start_plugin({"version": "v1", "flags": {"mpsRoot": "/run/nvidia/mps"},
                        "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}})
    await kubelet.wait_for_devices("nvidia.com/gpu", 32)
    gpu = node.devices()[3]
    [container] = (await kubelet.allocate("nvidia.com/gpu", [f"{gpu.uuid}::2"])).container_responses
    assert container.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
    assert container.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={gpu.memory_mib // 4}M"
    assert container.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert ("/run/nvidia/mps/nvidia.com/gpu/pipe", "/mps/nvidia.com/gpu/pipe") in [
        (m.host_path, m.container_path) for m in container.mounts]
    with pytest.raises(grpc.aio.AioRpcError):  # MPS: failRequestsGreaterThanOne defaults to true
        await kubelet.allocate("nvidia.com/gpu", [f"{gpu.uuid}::0", f"{gpu.uuid}::1"])


async def test_xid_79_marks_every_replica_then_recovers(kubelet: Any, start_plugin: Any,
                                                         node: SimulatedBackend) -> None:
    plugin = await start_plugin(time_slicing(4), quiet_period=0.4)
    await kubelet.wait_for_devices("nvidia.com/gpu", 32, healthy=32)
    node.inject_xid(2, 13)  # ignored by default (application error)
    node.inject_xid(5, 79)  # fallen off the bus
    devices = await kubelet.wait_for_devices("nvidia.com/gpu", 32, healthy=28)
    gpu5 = node.devices()[5].uuid
    assert sorted(i for i, h in devices.items() if h == "Unhealthy") == [f"{gpu5}::{k}" for k in range(4)]
    scrape = health_registry(plugin.manager.health_snapshot)
    assert scrape.get_sample_value(HEALTH_METRIC, {"resource": "nvidia.com/gpu", "device": f"{gpu5}::0"}) == 0.0
    await kubelet.wait_for_devices("nvidia.com/gpu", 32, healthy=32, timeout=5)
    assert scrape.get_sample_value(HEALTH_METRIC, {"resource": "nvidia.com/gpu", "device": f"{gpu5}::0"}) == 1.0


async def test_kubelet_restart_leads_to_reregistration(kubelet: Any, start_plugin: Any) -> None:
    await start_plugin({"version": "v1"})
    await kubelet.wait_for_devices("nvidia.com/gpu", 8)
    await kubelet.restart()
    await kubelet.wait_for(lambda: len(kubelet.registrations) == 2)
    await kubelet.wait_for_devices("nvidia.com/gpu", 8, healthy=8)
    response = await kubelet.allocate("nvidia.com/gpu", [next(iter(kubelet.plugins["nvidia.com/gpu"].devices))])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")


async def test_config_reload_keeps_servers_and_rejects_bad_config(kubelet: Any, start_plugin: Any,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    plugin = await start_plugin(time_slicing(2, devices=[0, 1], rename="gpu-half"))
    await kubelet.wait_for(lambda: kubelet.summary() == {"nvidia.com/gpu": (6, 6), "nvidia.com/gpu-half": (4, 4)})
    gpu_server = plugin.manager.servers["nvidia.com/gpu"]
    plugin.write_config(time_slicing(4, devices=[0, 1], rename="gpu-quarter"))
    await kubelet.wait_for(lambda: kubelet.summary().get("nvidia.com/gpu-quarter") == (8, 8))
    assert plugin.manager.servers["nvidia.com/gpu"] is gpu_server  # unchanged resource: same server, same stream
    assert "nvidia.com/gpu-half" not in plugin.manager.servers
    assert [r.resource for r in kubelet.registrations].count("nvidia.com/gpu") == 1
    caplog.set_level(logging.INFO, logger="kubegpu.deviceplugin")
    caplog.clear()
    plugin.write_config({"version": "v1", "flags": {"migStrategy": "sideways"}})
    for _ in range(50):
        if any(r.levelno >= logging.ERROR for r in caplog.records):
            break
        await asyncio.sleep(0.05)
    [rejection] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "config reload rejected" in rejection and "flags.migStrategy" in rejection and "\n" not in rejection
    assert set(plugin.manager.servers) == {"nvidia.com/gpu", "nvidia.com/gpu-quarter"}
    assert kubelet.summary() == {"nvidia.com/gpu": (6, 6), "nvidia.com/gpu-quarter": (8, 8),
                                 "nvidia.com/gpu-half": (4, 0)}  # the stopped resource: gone from allocatable


async def test_preferred_allocation_whole_gpus_and_replicas(kubelet: Any, start_plugin: Any,
                                                            node: SimulatedBackend) -> None:
    plugin = await start_plugin({"version": "v1"})
    await kubelet.wait_for_devices("nvidia.com/gpu", 8)
    uuids = [g.uuid for g in node.devices()]
    # GPUs 0-3 on NUMA 0, 4-7 on NUMA 1: with GPU 5 required, the pair stays on NUMA 1
    chosen = await kubelet.preferred("nvidia.com/gpu", uuids, [uuids[5]], 2)
    assert uuids[5] in chosen and all(uuids.index(c) >= 4 for c in chosen)
    plugin.write_config(time_slicing(4))
    await kubelet.wait_for_devices("nvidia.com/gpu", 32)
    available = list(kubelet.plugins["nvidia.com/gpu"].devices)
    spread = await kubelet.preferred("nvidia.com/gpu", available, [], 3)
    assert len({c.split("::")[0] for c in spread}) == 3


async def test_plugin_started_before_the_kubelet_registers_when_it_appears(kubelet: Any, start_plugin: Any) -> None:
    await kubelet.stop()
    await start_plugin({"version": "v1"})
    assert kubelet.registrations == []
    await kubelet.start()
    await kubelet.wait_for_devices("nvidia.com/gpu", 8, healthy=8)
    assert [r.resource for r in kubelet.registrations] == ["nvidia.com/gpu"]


async def test_refused_registration_is_retried(kubelet: Any, start_plugin: Any) -> None:
    kubelet.refuse.add("nvidia.com/gpu")
    await start_plugin({"version": "v1"})
    assert kubelet.refused == ["nvidia.com/gpu"] and kubelet.registrations == []
    kubelet.refuse.clear()
    await kubelet.wait_for_devices("nvidia.com/gpu", 8, healthy=8)
    assert [r.resource for r in kubelet.registrations] == ["nvidia.com/gpu"]


async def test_a_registration_in_flight_is_not_sent_again(kubelet: Any, start_plugin: Any,
                                                           node: SimulatedBackend) -> None:
    # a busy kubelet answers Register after the watcher's 1 s retry tick: a second Register for the same socket
    # would make a real kubelet refuse that socket until it restarts (CI's MIG tests on the real node)
    await start_plugin({"version": "v1", "flags": {"migStrategy": "mixed"}})
    await kubelet.wait_for_devices("nvidia.com/gpu", 8)
    kubelet.register_delay = 1.5
    node.set_mig_mode(0, True)
    node.reset_gpu(0)
    node.create_mig_device(0, 19, 0)  # a new resource appears on re-list: nvidia.com/mig-1g.10gb
    await kubelet.wait_for_devices("nvidia.com/mig-1g.10gb", 1)
    await asyncio.sleep(1.2)  # past another retry tick
    assert [r.resource for r in kubelet.registrations].count("nvidia.com/mig-1g.10gb") == 1


async def test_mps_slices_file_is_followed_by_relist(kubelet: Any, start_plugin: Any, node: SimulatedBackend,
                                                     short_tmp: Path) -> None:
    slices = short_tmp / "slices.json"
    await start_plugin({"version": "v1"}, mps_slices_file=slices)
    await kubelet.wait_for_devices("nvidia.com/gpu", 8)
    slices.write_text(json.dumps({"0": [10, 10, 20]}))
    await kubelet.wait_for(lambda: kubelet.summary() == {
        "nvidia.com/gpu": (7, 7), "nvidia.com/gpu-10gb": (2, 2), "nvidia.com/gpu-20gb": (1, 1)})
    gpu0 = node.devices()[0].uuid
    assert set(kubelet.plugins["nvidia.com/gpu-10gb"].devices) == {f"{gpu0}::mps-10gb-0", f"{gpu0}::mps-10gb-1"}
    [container] = (await kubelet.allocate("nvidia.com/gpu-20gb", [f"{gpu0}::mps-20gb-0"])).container_responses
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == gpu0
    assert container.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert container.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu-20gb/pipe"
    slices.write_text("not json")  # a broken file is reported and the slices stay as they were
    await asyncio.sleep(0.4)
    assert kubelet.summary()["nvidia.com/gpu-10gb"] == (2, 2)
    write_slices(slices, {0: [10, 10, 20]})
    slices.write_text(slices.read_text().replace("20", "30"))  # tampered: its checksum no longer matches
    await asyncio.sleep(0.4)
    assert "nvidia.com/gpu-30gb" not in kubelet.summary() and kubelet.summary()["nvidia.com/gpu-20gb"] == (1, 1)
