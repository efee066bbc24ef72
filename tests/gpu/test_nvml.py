"""NVML-adapter specifics, against the fake pynvml (the shared contract is in test_backend_contract.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubegpu.clock import VirtualClock
from kubegpu.gpu.backend import BackendUnavailable, GpuBackendError
from kubegpu.gpu.catalog import CATALOG
from kubegpu.gpu.nvml import NvmlBackend
from tests.fakes.fake_pynvml import FakeNvml


def _backend(fake: FakeNvml) -> NvmlBackend:
    return NvmlBackend(module=fake, clock=VirtualClock(0.0), reset_runner=fake.fake_reset_gpu)


def test_missing_library_is_one_line() -> None:
    with pytest.raises(BackendUnavailable) as info:
        NvmlBackend(module=FakeNvml(library_present=False))
    message = str(info.value)
    assert message.startswith("NVML library not found: NVML Shared Library Not Found")
    assert "\n" not in message


def test_creation_uses_the_placement_api_with_a_full_compute_instance() -> None:
    fake = FakeNvml()
    backend = _backend(fake)
    backend.set_mig_mode(1, True)
    backend.reset_gpu(1)
    device = backend.create_mig_device(1, 15, 6)  # 1g double-memory at the last slots
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" in fake.calls
    assert "nvmlDeviceCreateGpuInstance" not in fake.calls
    assert "nvmlGpuInstanceCreateComputeInstance" in fake.calls
    assert (device.profile_name, device.start, device.size, device.ci_id) == ("1g.20gb", 6, 2, 0)
    assert device.gi_id == 6  # the driver's GI id, not one we made up
    assert fake.fake_gpu_instances(1) == [(6, 15, 6)]


def test_seven_g_gets_gpu_instance_zero() -> None:
    backend = _backend(FakeNvml())
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)
    device = backend.create_mig_device(0, 0, 0)
    assert device.gi_id == 0
    backend.destroy_mig_device(0, 0)
    assert backend.mig_devices(0) == []


def test_driver_profiles_agree_with_the_catalog() -> None:
    backend = _backend(FakeNvml())
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)
    model = CATALOG["A100-SXM4-80GB"]
    for profile in model.mig_profiles:
        start = profile.starts[-1]
        device = backend.create_mig_device(0, profile.profile_id, start)
        assert (device.profile_name, device.size, device.memory_mib, device.multiprocessors) == (
            profile.name, profile.memory_slots, profile.memory_mib, profile.multiprocessors)
        backend.destroy_mig_device(0, device.gi_id)


def test_illegal_start_names_the_legal_ones() -> None:
    backend = _backend(FakeNvml())
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)
    with pytest.raises(GpuBackendError, match=r"cannot start at 2 \(legal starts: 0,4\)"):
        backend.create_mig_device(0, 9, 2)


def test_failed_compute_instance_rolls_the_gpu_instance_back() -> None:
    fake = FakeNvml()
    backend = _backend(fake)
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)

    def refuse(instance: object, profile_id: int) -> object:
        raise fake.NVMLError_InsufficientResources()

    fake.nvmlGpuInstanceCreateComputeInstance = refuse  # type: ignore[method-assign]
    with pytest.raises(GpuBackendError, match="Insufficient Resources"):
        backend.create_mig_device(0, 9, 4)
    assert fake.fake_gpu_instances(0) == []


def test_unsupported_counters_read_as_zero_and_processes_get_names() -> None:
    fake = FakeNvml()
    backend = _backend(fake)
    fake.fake_set_load(4, 90, 1000)
    fake.fake_add_process(4, 55, 2000, name="trainer")
    reading = backend.sample(4)
    assert reading.pcie_replay == 0  # NOT_SUPPORTED on this board
    assert reading.gpu_util == 90.0 and reading.graphics_engine_active == pytest.approx(0.9)
    assert reading.memory_used_mib == 3000
    assert reading.power_w == pytest.approx(60.0 + 90 * 3.4)
    assert reading.sm_clock_mhz == 1410
    assert [(p.pid, p.name, p.gi_id) for p in backend.processes(4)] == [(55, "trainer", None)]


def test_xid_with_gpu_instance_and_close_releases_nvml() -> None:
    fake = FakeNvml()
    backend = _backend(fake)
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)
    device = backend.create_mig_device(0, 9, 0)
    backend.xid_events(0.0)  # registers the event set
    fake.fake_inject_xid(0, 94, gi_id=device.gi_id)
    assert [(e.xid, e.gi_id) for e in backend.xid_events(-1.0)] == [(94, device.gi_id)]
    assert "nvmlEventSetWait_v2" in fake.calls
    backend.close()
    assert "nvmlEventSetFree" in fake.calls
    with pytest.raises(fake.NVMLError):
        fake.nvmlDeviceGetCount()  # shut down


def test_nvml_errors_become_backend_errors() -> None:
    fake = FakeNvml()
    backend = _backend(fake)
    backend.set_mig_mode(0, True)
    backend.reset_gpu(0)
    fake.fake_add_process(0, 9, 10)
    with pytest.raises(GpuBackendError, match="setting MIG mode off on GPU 0: NVML error: In use by another client"):
        backend.set_mig_mode(0, False)


def test_minor_numbers_come_from_the_driver_not_the_index() -> None:
    fake = FakeNvml()
    devices = _backend(fake).devices()
    assert [(d.index, d.minor_number) for d in devices] == [(i, 7 - i) for i in range(8)]  # the fake's reversed order
    assert [d.device_minor for d in devices] == [7, 6, 5, 4, 3, 2, 1, 0]
    assert "nvmlDeviceGetMinorNumber" in fake.calls


def test_a_driver_without_minor_numbers_falls_back_to_the_index() -> None:
    fake = FakeNvml(gpu_count=2)

    def unsupported(handle: object) -> int:
        raise fake.NVMLError_NotSupported()

    fake.nvmlDeviceGetMinorNumber = unsupported  # type: ignore[method-assign]
    devices = _backend(fake).devices()
    assert [(d.minor_number, d.device_minor) for d in devices] == [(None, 0), (None, 1)]


def test_boot_id_is_the_kernels_and_empty_when_unreadable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    backend = _backend(FakeNvml())
    (tmp_path / "boot_id").write_text("0d9a2c5e-8f1b-4c3a-9e77-1234567890ab\n")
    monkeypatch.setattr("kubegpu.gpu.nvml.BOOT_ID_FILE", str(tmp_path / "boot_id"))
    assert backend.boot_id() == "0d9a2c5e-8f1b-4c3a-9e77-1234567890ab"
    monkeypatch.setattr("kubegpu.gpu.nvml.BOOT_ID_FILE", str(tmp_path / "missing"))
    assert backend.boot_id() == ""  # unknown: the DRA driver then keeps its checkpoint as it is
