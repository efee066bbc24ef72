"""One contract, three backends: the in-memory sim, the file-backed sim and NVML over the fake pynvml.

Each fixture gives the backend plus a `World` that plays what happens outside the GPU API (a process starts, the
hardware raises an XID), so the same assertions run against every implementation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubegpu.clock import VirtualClock
from kubegpu.gpu.backend import GpuBackend, GpuBackendError
from kubegpu.gpu.nvml import NvmlBackend
from kubegpu.gpu.simulated import SimulatedBackend
from tests.fakes.fake_pynvml import FakeNvml


@dataclass
class World:
    backend: GpuBackend
    clock: VirtualClock
    add_process: Callable[[int, int, int, int | None], None]
    inject_xid: Callable[[int, int], None]


def _sim_world(backend: SimulatedBackend, clock: VirtualClock) -> World:
    return World(backend, clock, lambda i, pid, mib, gi: backend.add_process(i, pid, mib, gi_id=gi),
                 lambda i, xid: backend.inject_xid(i, xid) and None)


@pytest.fixture(params=["sim-memory", "sim-file", "nvml-fake"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    clock = VirtualClock(1000.0)
    if request.param == "sim-memory":
        yield _sim_world(SimulatedBackend(None, gpus="8xA100-SXM4-80GB", clock=clock), clock)
    elif request.param == "sim-file":
        yield _sim_world(SimulatedBackend(tmp_path / "node.json", gpus="8xA100-SXM4-80GB", clock=clock), clock)
    else:
        fake = FakeNvml()
        backend = NvmlBackend(module=fake, clock=clock, reset_runner=fake.fake_reset_gpu)
        yield World(backend, clock, lambda i, pid, mib, gi: fake.fake_add_process(i, pid, mib, gi),
                    fake.fake_inject_xid)
        backend.close()


def _enable_mig(backend: GpuBackend, index: int) -> None:
    assert backend.set_mig_mode(index, True) is True  # Ampere: waits for a reset
    backend.reset_gpu(index)


def test_devices_describe_an_a100_node(world: World) -> None:
    devices = world.backend.devices()
    assert len(devices) == 8
    assert len({d.uuid for d in devices}) == 8
    assert [d.index for d in devices] == list(range(8))
    for device in devices:
        assert device.product_name == "NVIDIA A100-SXM4-80GB"
        assert device.model_key == "A100-SXM4-80GB"
        assert device.memory_mib == 81920
        assert device.compute_capability == (8, 0)
        assert device.pci_device_id == "0x20B210DE"
        assert device.multiprocessors == 108
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", device.pci_bus_id)
        assert device.numa_node in (0, 1)
        assert device.uuid.startswith("GPU-")
        assert (device.mig_capable, device.mig_enabled, device.mig_pending) == (True, False, False)
    assert world.backend.driver_version() == "550.54.15"
    assert world.backend.cuda_driver_version() == (12, 4)


def test_ampere_mig_mode_change_waits_for_reset(world: World) -> None:
    backend = world.backend
    assert backend.set_mig_mode(0, True) is True
    device = backend.devices()[0]
    assert (device.mig_enabled, device.mig_pending) == (False, True)
    with pytest.raises(GpuBackendError):
        backend.create_mig_device(0, 9, 4)
    backend.reset_gpu(0)
    device = backend.devices()[0]
    assert (device.mig_enabled, device.mig_pending) == (True, False)
    assert backend.set_mig_mode(0, True) is False  # already on
    assert backend.devices()[1].mig_enabled is False  # other GPUs untouched


def test_create_list_destroy_mig_devices_at_exact_placements(world: World) -> None:
    backend = world.backend
    _enable_mig(backend, 0)
    three = backend.create_mig_device(0, 9, 4)
    one = backend.create_mig_device(0, 19, 0)
    assert (three.profile_name, three.start, three.size, three.memory_mib, three.multiprocessors) == (
        "3g.40gb", 4, 4, 40192, 42)
    assert (one.profile_name, one.start, one.size) == ("1g.10gb", 0, 1)
    assert three.uuid.startswith("MIG-") and three.uuid != one.uuid
    assert three.gpu_uuid == backend.devices()[0].uuid
    listed = {(d.profile_id, d.start, d.gi_id, d.uuid) for d in backend.mig_devices(0)}
    assert listed == {(9, 4, three.gi_id, three.uuid), (19, 0, one.gi_id, one.uuid)}
    assert backend.mig_devices(1) == []
    backend.destroy_mig_device(0, three.gi_id)
    assert [d.gi_id for d in backend.mig_devices(0)] == [one.gi_id]
    # the freed half takes a 4g? no: 4g only starts at 0, where the 1g is; a 3g fits again at 4
    again = backend.create_mig_device(0, 9, 4)
    assert again.start == 4


def test_illegal_placements_are_refused_in_one_line(world: World) -> None:
    backend = world.backend
    _enable_mig(backend, 0)
    backend.create_mig_device(0, 9, 4)
    for profile_id, start in [(9, 2), (14, 4), (0, 0), (19, 7)]:
        with pytest.raises(GpuBackendError) as info:
            backend.create_mig_device(0, profile_id, start)
        assert "\n" not in str(info.value)
        assert "GPU 0" in str(info.value)
    assert [(d.profile_id, d.start) for d in backend.mig_devices(0)] == [(9, 4)]  # nothing half-created
    with pytest.raises(GpuBackendError):
        backend.create_mig_device(0, 42, 0)  # no such profile
    with pytest.raises(GpuBackendError):
        backend.destroy_mig_device(0, 99)


def test_in_use_instances_and_modes_are_protected(world: World) -> None:
    backend = world.backend
    _enable_mig(backend, 0)
    device = backend.create_mig_device(0, 14, 2)
    world.add_process(0, 4242, 5000, device.gi_id)
    processes = backend.processes(0)
    assert [(p.pid, p.gi_id, p.used_memory_mib) for p in processes] == [(4242, device.gi_id, 5000)]
    with pytest.raises(GpuBackendError):
        backend.destroy_mig_device(0, device.gi_id)
    assert [d.gi_id for d in backend.mig_devices(0)] == [device.gi_id]
    with pytest.raises(GpuBackendError):
        backend.set_mig_mode(0, False)  # instances (and a process) still there
    mig_sample = backend.sample(0, device.gi_id)
    assert mig_sample.memory_used_mib == 5000
    assert mig_sample.memory_used_mib + mig_sample.memory_free_mib == device.memory_mib


def test_processes_and_memory_on_a_full_gpu(world: World) -> None:
    backend = world.backend
    world.add_process(3, 100, 2048, None)
    world.add_process(3, 101, 1024, None)
    assert sorted((p.pid, p.gi_id, p.used_memory_mib) for p in backend.processes(3)) == [
        (100, None, 2048), (101, None, 1024)]
    reading = backend.sample(3)
    assert reading.memory_used_mib == 3072
    assert reading.memory_free_mib == 81920 - 3072
    assert backend.processes(2) == []


def test_xid_events_are_reported_once_with_their_gpu(world: World) -> None:
    backend = world.backend
    assert backend.xid_events(0.0) == []
    world.inject_xid(2, 79)
    events = backend.xid_events(0.0)
    assert [(e.gpu_index, e.xid, e.gi_id) for e in events] == [(2, 79, None)]
    assert events[0].timestamp == 1000.0
    world.clock.advance(5)
    world.inject_xid(5, 48)
    later = backend.xid_events(1000.0)
    assert [(e.gpu_index, e.xid) for e in later] == [(5, 48)]
    assert backend.sample(2).xid_last == 79
    assert backend.sample(0).xid_last == 0


def test_unknown_gpu_index_is_one_line_error(world: World) -> None:
    with pytest.raises(GpuBackendError) as info:
        world.backend.sample(8)
    assert "8" in str(info.value) and "\n" not in str(info.value)


def test_sample_is_sane(world: World) -> None:
    reading = world.backend.sample(0)
    assert 0.0 <= reading.gpu_util <= 100.0
    assert 0.0 <= reading.graphics_engine_active <= 1.0
    assert reading.memory_used_mib + reading.memory_free_mib == 81920
    assert reading.power_w > 0
    assert reading.temperature_c > 0
    assert reading.mem_clock_mhz > 0
    assert reading.energy_mj >= 0


def test_boot_id_names_the_current_boot(world: World) -> None:
    boot = world.backend.boot_id()
    assert boot and boot == world.backend.boot_id()  # stable within a boot (the DRA checkpoint compares it)
