"""`GpuBackend` on real GPUs through NVML (`nvidia-ml-py`, module `pynvml`).

A thin adapter: each method is a few NVML calls, translated into the backend's dataclasses. Profiles and placements
are read from the driver (never from the `Ngb` name), MIG devices are created at an exact placement with
`nvmlDeviceCreateGpuInstanceWithPlacement` plus one compute instance spanning the GI, and XID critical errors
arrive through an NVML event set. The module is a constructor argument, so tests drive this code with
`tests/fakes/fake_pynvml.py` and no GPU. Every NVML failure becomes one `GpuBackendError` line; a missing
library or driver is `BackendUnavailable("NVML library not found: ...")`.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubegpu.clock import Clock, RealClock
from kubegpu.errors import ConfigError
from kubegpu.files import read_text
from kubegpu.gpu.backend import (
    BackendUnavailable,
    GpuBackendError,
    GpuDevice,
    GpuProcess,
    GpuSample,
    MigDevice,
    XidEvent,
)
from kubegpu.gpu.catalog import find_model

MIB = 1024 * 1024
NO_INSTANCE = 0xFFFFFFFF  # NVML's "not attributed to a GPU/compute instance"
MAX_PLACEMENTS = 16
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"  # the kernel's random ID of this boot
# Full compute instance for a GI of N SM slices: the NVML CI profile enum with that many slices.
_CI_PROFILE_FOR_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
# GI profile enums to probe; unsupported ones fail with NOT_SUPPORTED / INVALID_ARGUMENT and are skipped.
_GI_PROFILE_ENUMS = range(0, 18)

ResetRunner = Callable[[int], None]


@dataclass(frozen=True)
class _ProfileInfo:
    profile_id: int
    name: str
    slice_count: int
    memory_mib: int
    multiprocessors: int


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _nvidia_smi_reset(index: int) -> None:
    """GPU reset is not in the public NVML API; `nvidia-smi --gpu-reset` is how mig-parted does it."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        raise GpuBackendError(f"cannot reset GPU {index}: nvidia-smi not found on PATH")
    result = subprocess.run([binary, "--gpu-reset", "-i", str(index)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stdout + result.stderr).strip().splitlines()
        reason = detail[-1] if detail else f"exit status {result.returncode}"
        raise GpuBackendError(f"nvidia-smi --gpu-reset -i {index} failed: {reason}")


class NvmlBackend:
    """The `GpuBackend` protocol over an NVML module (the real `pynvml` unless one is injected)."""

    def __init__(self, module: Any = None, clock: Clock | None = None, reset_runner: ResetRunner | None = None) -> None:
        if module is None:
            try:
                import pynvml as module  # type: ignore[no-redef]
            except ImportError as exc:
                raise BackendUnavailable(f"NVML library not found: the nvidia-ml-py package is not installed ({exc})") \
                    from exc
        self._nvml = module
        self._clock: Clock = clock or RealClock()
        self._reset_runner: ResetRunner = reset_runner or _nvidia_smi_reset
        self._event_set: Any = None
        self._events: list[XidEvent] = []
        self._profiles: dict[int, dict[int, _ProfileInfo]] = {}
        try:
            module.nvmlInit()
        except module.NVMLError as exc:
            missing = (module.NVML_ERROR_LIBRARY_NOT_FOUND, module.NVML_ERROR_DRIVER_NOT_LOADED)
            if getattr(exc, "value", None) in missing:
                raise BackendUnavailable(f"NVML library not found: {exc} (is the NVIDIA driver installed?)") from exc
            raise BackendUnavailable(f"NVML initialisation failed: {exc}") from exc

    # -- helpers --

    @contextmanager
    def _calls(self, what: str) -> Iterator[None]:
        """Turn any NVML error inside into one GpuBackendError line that says what was being done."""
        try:
            yield
        except self._nvml.NVMLError as exc:
            raise GpuBackendError(f"{what}: NVML error: {exc}") from exc

    def _is(self, exc: BaseException, *codes: str) -> bool:
        values = {getattr(self._nvml, code, None) for code in codes} - {None}
        return getattr(exc, "value", None) in values

    def _handle(self, index: int) -> Any:
        with self._calls(f"GPU {index}"):
            count = self._nvml.nvmlDeviceGetCount()
            if not 0 <= index < count:
                raise GpuBackendError(f"no GPU {index} on this node ({count} GPUs)")
            return self._nvml.nvmlDeviceGetHandleByIndex(index)

    def _optional(self, call: Callable[[], Any], default: Any) -> Any:
        """Counters a GPU or driver may not offer (not supported, not found, no permission, a function older drivers
        lack) read as `default`."""
        try:
            return call()
        except self._nvml.NVMLError as exc:
            if self._is(exc, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NOT_FOUND", "NVML_ERROR_NO_PERMISSION",
                        "NVML_ERROR_FUNCTION_NOT_FOUND"):
                return default
            raise

    def _gi_profiles(self, index: int) -> dict[int, _ProfileInfo]:
        """GI profiles the driver offers on this GPU, keyed by profile id (cached: they never change at runtime)."""
        if index not in self._profiles:
            handle = self._handle(index)
            found: dict[int, _ProfileInfo] = {}
            for enum in _GI_PROFILE_ENUMS:
                try:
                    info = self._nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, enum)
                except self._nvml.NVMLError as exc:
                    if self._is(exc, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"):
                        continue
                    raise GpuBackendError(f"GPU {index}: reading MIG profiles: NVML error: {exc}") from exc
                name = _text(info.name).removeprefix("MIG ").strip()
                found[int(info.id)] = _ProfileInfo(int(info.id), name, int(info.sliceCount),
                                                   int(info.memorySizeMB), int(info.multiprocessorCount))
            if not found:
                return found  # MIG disabled: the driver lists no profiles yet, so do not remember that
            self._profiles[index] = found
        return self._profiles[index]

    # -- GpuBackend --

    def driver_version(self) -> str:
        with self._calls("driver version"):
            return _text(self._nvml.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> tuple[int, int]:
        with self._calls("CUDA driver version"):
            version = int(self._nvml.nvmlSystemGetCudaDriverVersion())
        return version // 1000, version % 1000 // 10

    def devices(self) -> list[GpuDevice]:
        with self._calls("listing GPUs"):
            count = self._nvml.nvmlDeviceGetCount()
        return [self._device(index) for index in range(count)]

    def _device(self, index: int) -> GpuDevice:
        nvml = self._nvml
        handle = self._handle(index)
        with self._calls(f"GPU {index}"):
            product = _text(nvml.nvmlDeviceGetName(handle))
            pci = nvml.nvmlDeviceGetPciInfo(handle)
            pci_device_id = f"0x{int(pci.pciDeviceId) & 0xFFFFFFFF:08X}"
            model = find_model(product) or find_model(pci_device_id)
            mode = self._optional(lambda: nvml.nvmlDeviceGetMigMode(handle), None)
            attributes = self._optional(lambda: nvml.nvmlDeviceGetAttributes(handle), None)
            multiprocessors = int(attributes.multiprocessorCount) if attributes is not None else (
                model.multiprocessors if model else 0)
            numa = self._optional(lambda: nvml.nvmlDeviceGetNumaNodeId(handle), None)
            device_minor = self._optional(lambda: nvml.nvmlDeviceGetMinorNumber(handle), None)
            current, pending = (int(mode[0]), int(mode[1])) if mode is not None else (0, 0)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            return GpuDevice(
                index=index, uuid=_text(nvml.nvmlDeviceGetUUID(handle)), product_name=product,
                model_key=model.key if model else None,
                memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
                pci_bus_id=_text(pci.busId), pci_device_id=pci_device_id,
                numa_node=int(numa) if numa is not None and int(numa) >= 0 else None,
                compute_capability=(int(major), int(minor)),
                multiprocessors=multiprocessors, mig_capable=mode is not None,
                mig_enabled=current == nvml.NVML_DEVICE_MIG_ENABLE, mig_pending=current != pending,
                minor_number=int(device_minor) if device_minor is not None else None,
            )

    def set_mig_mode(self, index: int, enabled: bool) -> bool:
        nvml = self._nvml
        handle = self._handle(index)
        wanted = nvml.NVML_DEVICE_MIG_ENABLE if enabled else nvml.NVML_DEVICE_MIG_DISABLE
        with self._calls(f"setting MIG mode {'on' if enabled else 'off'} on GPU {index}"):
            nvml.nvmlDeviceSetMigMode(handle, wanted)
            current, pending = nvml.nvmlDeviceGetMigMode(handle)
        self._profiles.pop(index, None)
        return bool(int(current) != int(pending))

    def reset_gpu(self, index: int) -> None:
        self._handle(index)
        self._reset_runner(index)
        self._profiles.pop(index, None)

    def mig_devices(self, index: int) -> list[MigDevice]:
        nvml = self._nvml
        handle = self._handle(index)
        devices: list[MigDevice] = []
        with self._calls(f"listing MIG devices of GPU {index}"):
            mode = self._optional(lambda: nvml.nvmlDeviceGetMigMode(handle), None)
            if mode is None or int(mode[0]) != nvml.NVML_DEVICE_MIG_ENABLE:
                return []
            parent_uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
                mig = self._optional(partial(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot), None)
                if mig is not None:
                    devices.append(self._mig_device(index, handle, parent_uuid, mig))
        return sorted(devices, key=lambda d: (d.start, d.gi_id))

    def _mig_device(self, index: int, handle: Any, parent_uuid: str, mig: Any) -> MigDevice:
        nvml = self._nvml
        gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
        info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id))
        profile = self._gi_profiles(index).get(int(info.profileId))
        attributes = nvml.nvmlDeviceGetAttributes(mig)
        return MigDevice(
            gpu_index=index, gpu_uuid=parent_uuid, uuid=_text(nvml.nvmlDeviceGetUUID(mig)), gi_id=gi_id,
            ci_id=int(nvml.nvmlDeviceGetComputeInstanceId(mig)), profile_id=int(info.profileId),
            profile_name=profile.name if profile else f"profile-{int(info.profileId)}",
            start=int(info.placement.start), size=int(info.placement.size),
            memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(mig).total) // MIB,
            multiprocessors=int(attributes.multiprocessorCount),
        )

    def _placement_size(self, index: int, handle: Any, profile_id: int, start: int) -> int:
        """The memory-slot size of `profile_id` at `start`, from the driver's legal placements; error if illegal."""
        nvml = self._nvml
        placements = (nvml.c_nvmlGpuInstancePlacement_t * MAX_PLACEMENTS)()
        count = ctypes.c_uint(MAX_PLACEMENTS)
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, placements, ctypes.pointer(count))
        legal = [(int(placements[i].start), int(placements[i].size)) for i in range(count.value)]
        for legal_start, size in legal:
            if legal_start == start:
                return size
        starts = ",".join(str(s) for s, _ in legal) or "none"
        raise GpuBackendError(f"GPU {index}: profile {profile_id} cannot start at {start} (legal starts: {starts})")

    def create_mig_device(self, index: int, profile_id: int, start: int) -> MigDevice:
        nvml = self._nvml
        handle = self._handle(index)
        profile = self._gi_profiles(index).get(profile_id)
        if profile is None:
            known = ", ".join(f"{p.profile_id} ({p.name})" for p in self._gi_profiles(index).values()) or "none"
            raise GpuBackendError(f"GPU {index} has no MIG profile id {profile_id}; known: {known}")
        what = f"creating {profile.name}@{start} on GPU {index}"
        with self._calls(what):
            size = self._placement_size(index, handle, profile_id, start)
            placement = nvml.c_nvmlGpuInstancePlacement_t(start, size)
            gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id, ctypes.pointer(placement))
            try:
                ci_enum = _CI_PROFILE_FOR_SLICES[profile.slice_count]
                ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gpu_instance, ci_enum, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_info.id)
            except BaseException:
                nvml.nvmlGpuInstanceDestroy(gpu_instance)  # never leave a GI without its CI behind
                raise
            gi_id = int(nvml.nvmlGpuInstanceGetInfo(gpu_instance).id)
        for device in self.mig_devices(index):
            if device.gi_id == gi_id:
                return device
        raise GpuBackendError(f"{what}: the new GPU instance {gi_id} did not appear as a MIG device")

    def destroy_mig_device(self, index: int, gi_id: int) -> None:
        nvml = self._nvml
        handle = self._handle(index)
        ci_ids = [d.ci_id for d in self.mig_devices(index) if d.gi_id == gi_id]
        with self._calls(f"destroying GPU instance {gi_id} on GPU {index}"):
            gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            for ci_id in ci_ids:
                nvml.nvmlComputeInstanceDestroy(nvml.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id))
            nvml.nvmlGpuInstanceDestroy(gpu_instance)

    def processes(self, index: int) -> list[GpuProcess]:
        nvml = self._nvml
        handle = self._handle(index)
        with self._calls(f"listing processes on GPU {index}"):
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            result = []
            for proc in running:
                gi = getattr(proc, "gpuInstanceId", NO_INSTANCE)
                used = proc.usedGpuMemory
                name = self._optional(partial(nvml.nvmlSystemGetProcessName, proc.pid), "")
                result.append(GpuProcess(pid=int(proc.pid), gpu_index=index,
                                         gi_id=None if gi is None or int(gi) == NO_INSTANCE else int(gi),
                                         used_memory_mib=int(used) // MIB if used is not None else 0,
                                         name=_text(name)))
        return result

    def sample(self, index: int, gi_id: int | None = None) -> GpuSample:
        """Counters of a GPU, or of one of its MIG devices (memory is per device; NVML does not split utilization
        per MIG device, so a MIG device reports the parent's utilization — DCGM profiling would be needed)."""
        nvml = self._nvml
        handle = self._handle(index)
        with self._calls(f"sampling GPU {index}"):
            memory_handle = handle if gi_id is None else self._mig_handle(index, handle, gi_id)
            memory = nvml.nvmlDeviceGetMemoryInfo(memory_handle)
            rates = self._optional(lambda: nvml.nvmlDeviceGetUtilizationRates(handle), None)
            util = float(rates.gpu) if rates is not None else 0.0
            xids = [e.xid for e in self._drain_events() if e.gpu_index == index]
            return GpuSample(
                gpu_util=util, mem_copy_util=float(rates.memory) if rates is not None else 0.0,
                memory_used_mib=int(memory.used) // MIB, memory_free_mib=int(memory.free) // MIB,
                temperature_c=float(self._optional(
                    lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU), 0)),
                power_w=float(self._optional(lambda: nvml.nvmlDeviceGetPowerUsage(handle), 0)) / 1000.0,
                sm_clock_mhz=int(self._optional(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM), 0)),
                mem_clock_mhz=int(self._optional(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM), 0)),
                energy_mj=int(self._optional(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle), 0)),
                xid_last=xids[-1] if xids else self._last_xid(index),
                pcie_replay=int(self._optional(lambda: nvml.nvmlDeviceGetPcieReplayCounter(handle), 0)),
                graphics_engine_active=util / 100.0,
            )

    def _mig_handle(self, index: int, handle: Any, gi_id: int) -> Any:
        nvml = self._nvml
        for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            mig = self._optional(partial(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot), None)
            if mig is not None and int(nvml.nvmlDeviceGetGpuInstanceId(mig)) == gi_id:
                return mig
        raise GpuBackendError(f"GPU {index} has no GPU instance {gi_id}")

    def _last_xid(self, index: int) -> int:
        return next((e.xid for e in reversed(self._events) if e.gpu_index == index), 0)

    def xid_events(self, since: float) -> list[XidEvent]:
        self._drain_events()
        return [event for event in self._events if event.timestamp > since]

    def _ensure_event_set(self) -> Any:
        """Register every GPU for XID critical errors once (GPUs that do not support events are left out)."""
        nvml = self._nvml
        if self._event_set is None:
            with self._calls("creating the XID event set"):
                event_set = nvml.nvmlEventSetCreate()
                for index in range(int(nvml.nvmlDeviceGetCount())):
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    register = partial(nvml.nvmlDeviceRegisterEvents, handle, nvml.nvmlEventTypeXidCriticalError,
                                       event_set)
                    self._optional(register, None)
            self._event_set = event_set
        return self._event_set

    def _drain_events(self) -> list[XidEvent]:
        """Collect every queued XID event without blocking (a zero-timeout wait ends with NVML_ERROR_TIMEOUT)."""
        nvml = self._nvml
        event_set = self._ensure_event_set()
        new: list[XidEvent] = []
        while True:
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, 0)
            except nvml.NVMLError as exc:
                if self._is(exc, "NVML_ERROR_TIMEOUT"):
                    break
                raise GpuBackendError(f"waiting for XID events: NVML error: {exc}") from exc
            if int(data.eventType) != nvml.nvmlEventTypeXidCriticalError:
                continue
            gi = int(data.gpuInstanceId)
            with self._calls("reading an XID event"):
                index = int(nvml.nvmlDeviceGetIndex(data.device))
            new.append(XidEvent(gpu_index=index, xid=int(data.eventData), timestamp=self._clock.now(),
                                gi_id=None if gi == NO_INSTANCE else gi))
        self._events.extend(new)
        del self._events[:-1000]
        return new

    def boot_id(self) -> str:
        try:
            return read_text(BOOT_ID_FILE, limit=256).strip()
        except (OSError, ConfigError):
            return ""

    def close(self) -> None:
        nvml = self._nvml
        try:
            if self._event_set is not None:
                nvml.nvmlEventSetFree(self._event_set)
                self._event_set = None
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            raise GpuBackendError(f"closing NVML: {exc}") from exc
